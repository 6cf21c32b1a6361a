//! A service minting IDs in its own process: one [`EmbeddedGenerator`], started from one
//! configuration and held for the life of the process, shut down (releasing its lease) on
//! Ctrl-C or SIGTERM.
//!
//! ```sh
//! # Development: a SQLite lease file under .idgen/, the built-in schedule, no clock check.
//! cargo run -p idgen --example embedded
//! # Production: the configuration docs/embedding.md ("Embedding idgen") describes.
//! cargo run -p idgen --example embedded -- /etc/orders/idgen.toml
//! ```
//!
//! It takes an order every 200 ms, each with a fresh ID, prints the ID's fields, and once a
//! second the generator's health; `IDGEN_…` variables override the file (`IDGEN_LEASE__STORE`).

use std::time::Duration;

use idgen::{EmbeddedGenerator, GeneratorConfig, Health};
use prometheus_client::registry::Registry;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The application's own log (idgen logs through `tracing`, into whatever subscriber it has).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let config = match std::env::args_os().nth(1) {
        Some(file) => GeneratorConfig::load(Some(std::path::Path::new(&file)), "IDGEN")?,
        None => {
            let mut config = GeneratorConfig::development();
            // A throwaway table under .idgen/: the generator makes it (and its genesis) itself.
            config.lease.create_tables = true;
            // This is a try-out on a laptop: no NTP check. Never in production.
            config.clock.require_sync = false;
            config
        }
    };
    // The generator's metrics go into the service's own registry, under the worker's names.
    let mut metrics = Registry::default();
    let ids = EmbeddedGenerator::start(&config, &mut metrics).await?;
    ids.ready(Duration::from_secs(30)).await?;
    println!("issuing as {} in region {} (number {})", ids.holder(), ids.region(), ids.region_number());

    let mut orders = tokio::time::interval(Duration::from_millis(200));
    let mut health = tokio::time::interval(Duration::from_secs(1));
    let stop = stopped();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = orders.tick() => match ids.next_id().await {
                // A refusal is the generator keeping its promise (no lease, clock not trusted):
                // the order waits and is taken again; no ID is ever made up.
                Err(refusal) => eprintln!("order not taken: {refusal}"),
                Ok(id) => {
                    let fields = ids.decode(id)?;
                    let at = idgen::core::format_unix_ms(fields.timestamp.unix_ms());
                    println!("order {id}: layout {}, {at}, machine {}", fields.layout.name(), fields.machine);
                }
            },
            _ = health.tick() => {
                if let Health::Refusing { refusal, .. } = ids.health() {
                    eprintln!("refusing: {refusal}");
                }
                ids.refresh_metrics();
            }
            _ = &mut stop => break,
        }
    }
    ids.shutdown().await?;
    println!("lease released");
    Ok(())
}

/// Ctrl-C or SIGTERM, whichever comes first.
async fn stopped() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a process can listen for SIGTERM");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
