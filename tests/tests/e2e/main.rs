//! The end-to-end tests, one binary (each test still runs in a process of its own under
//! nextest): real `idgen` processes over loopback, a module per area. Where a new test goes is
//! ARCHITECTURE's "Where a test goes". One binary links the AWS SDK once, where a binary per area
//! linked it 21 times.

mod cli;
mod docs;
mod duplicates;
mod failover;
mod faults;
mod fleet;
mod hostile_peers;
mod identity;
mod infra_config;
mod operator_tokens;
mod production_start;
mod public_access;
mod public_ids;
mod public_probes;
mod public_storage;
mod regions;
mod runbooks;
mod service_metrics;
mod sqlite_open;
mod table_identity;
mod tls;
mod up;
