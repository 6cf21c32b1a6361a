//! The embeddable generator: what a service links to mint IDs in-process, and what the fleet
//! worker is built on.
//!
//! Its front door is [`GeneratorConfig`] and [`EmbeddedGenerator`]; behind it are four rooms, each
//! a module that says at its top what it owns and what it must never do: [`clock`] (every reading
//! of time), [`lease`] (the machine numbers and their tables), [`issuing`] (the request path) and
//! [`control`] (the supervisor and the registry). [`metrics`] are shared by all of them.
//!
//! [`EmbeddedGenerator`] is the whole of it as one piece: started from one [`GeneratorConfig`],
//! it takes the region number and schedule from the registry, keeps the leases and the schedule
//! current, and issues. Underneath, [`IdGenerator`] wraps the pure core (`idgen-core`) with a [`Clock`] and metrics; a
//! [`LeaseKeeper`] per layout claims a machine number from a [`LeaseStore`], renews it, drops it
//! the moment a renewal fails its condition, and releases it on shutdown. The request path
//! ([`IdGenerator::next_ids`]) touches memory only: the lease store is called from the keeper's
//! loop, never per ID.

pub mod clock;
pub mod config;
pub mod control;
pub mod embedded;
pub mod issuing;
pub mod lease;
pub mod metrics;

pub use clock::{Clock, Discipline, ManualClock, SyncStatus, SystemClock, kernel_discipline, system_unix_ms};
pub use config::{GeneratorConfig, Role, StoreKind, open_lease_store, open_lease_store_for_operator};
pub use control::registry::RegistrySnapshot;
pub use embedded::{EmbeddedGenerator, StartOptions};
pub use idgen_aws::AwsSettings as DynamoDbSettings;
pub use idgen_core::generator::Refusal;
pub use issuing::{Health, IdGenerator};
#[cfg(feature = "dynamodb")]
pub use lease::dynamodb::DynamoDbLeaseStore;
pub use lease::keeper::{LeaseConfig, LeaseConfigError, LeaseKeeper, MachineRanges, Outcome};
#[cfg(feature = "sqlite")]
pub use lease::sqlite::SqliteLeaseStore;
pub use lease::{
    AuditEvent, AuditKind, ClaimOutcome, ClaimToken, Conditional, Genesis, GenesisHow, GenesisRequest, LeaseRow,
    LeaseStore, Lift, LiftOutcome, MAX_LEASE_MS, QUARANTINE_EXPIRY_UNIX_MS, QUARANTINED, StoreError,
};
pub use metrics::GeneratorMetrics;

pub use idgen_core as core;

/// `<host>/pid-<pid>/<process start Unix ms>/<nonce>`: a restarted process is a new holder.
pub fn default_holder(process_start_unix_ms: i64) -> String {
    holder(None, process_start_unix_ms)
}

/// `<name>/pid-<pid>/<process start Unix ms>/<nonce>`, `name` defaulting to the host name. Only
/// the name can be chosen. The nonce is 64 random bits drawn once per process: in containers the
/// name, PID 1 and the start millisecond can all be the same for two processes, and a lease
/// store tells holders apart by this string.
pub fn holder(name: Option<&str>, process_start_unix_ms: i64) -> String {
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let nonce = NONCE.get_or_init(rand::random);
    let name = name.map(str::trim).filter(|n| !n.is_empty()).map_or_else(hostname, str::to_owned);
    format!("{name}/pid-{}/{}/{nonce:016x}", std::process::id(), process_start_unix_ms)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_holder_name_never_makes_two_processes_one_holder() {
        let pid = std::process::id();
        let web = super::holder(Some("web-7"), 5);
        let (prefix, nonce) = web.rsplit_once('/').unwrap();
        assert_eq!(prefix, format!("web-7/pid-{pid}/5"));
        assert!(nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit()), "{web}");
        let default = super::default_holder(5);
        assert!(default.contains(&format!("/pid-{pid}/5/")) && !default.starts_with('/'), "{default}");
        assert_eq!(super::holder(Some("  "), 5), default, "a blank name is the host name");
        assert_ne!(super::holder(Some("web-7"), 5), super::holder(Some("web-7"), 6), "a restart is a new holder");
        assert_eq!(super::holder(Some("web-7"), 5), web, "one process is one holder");
    }
}
