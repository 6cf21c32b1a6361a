//! `idgen leases …`: what the on-call engineer types at 3 a.m.
//!
//! The lease table is the one the worker configuration names (`--config`, plus `IDGEN_WORKER_…`
//! environment overrides), for the layout given by `--layout` (default: the one in force now).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use idgen::core::{Timestamp, format_unix_ms};
use idgen::{AuditEvent, Conditional, LeaseRow, LeaseStore, QUARANTINED};
use idgen_worker::config::{StoreKind, WorkerConfig};
use serde_json::json;

#[derive(Args, Debug)]
pub struct LeasesArgs {
    /// The worker configuration that names the lease store and tables.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Which layout's lease table (v1, v2, …); default: the layout in force now.
    #[arg(long, global = true)]
    layout: Option<String>,
    /// JSON instead of human-readable output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: LeasesCommand,
}

#[derive(Subcommand, Debug)]
enum LeasesCommand {
    /// Create the lease table and its audit table (idempotent): the operator step before the
    /// first worker starts.
    Init,
    /// Every machine number's lease: holder, epoch, expiry.
    List,
    /// One machine number's lease.
    Get { machine: u32 },
    /// Audit events (claims, failed renewals, releases, quarantines), oldest first.
    History {
        /// Only this machine number.
        machine: Option<u32>,
        /// Window start, Unix ms (default: 24 hours ago).
        #[arg(long)]
        from: Option<i64>,
        /// Window end, Unix ms (default: now).
        #[arg(long)]
        to: Option<i64>,
    },
    /// Take a machine number out of use: nobody can claim or renew it until released. The
    /// current holder's next renewal fails and it stops issuing under the number at once.
    Quarantine {
        machine: u32,
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
    /// Lift a quarantine. The number becomes claimable one full lease from now.
    ReleaseQuarantine {
        machine: u32,
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
}

pub async fn run(args: LeasesArgs) -> anyhow::Result<()> {
    let config = WorkerConfig::load(args.config.as_deref())?;
    let layout = match args.layout {
        Some(layout) => layout,
        None => {
            let now = Timestamp::from_unix_ms(idgen::system_unix_ms()).context("the clock is outside the ID range")?;
            config.schedule().entry_at(now).layout.name().to_owned()
        }
    };
    if let LeasesCommand::Init = args.command {
        return init(&config, &layout, args.json).await;
    }
    let store = idgen_worker::open_lease_store(&config, &layout).await?;
    let now = idgen::system_unix_ms();
    match args.command {
        LeasesCommand::Init => unreachable!("handled above"),
        LeasesCommand::List => {
            let rows = store.list().await?;
            print_rows(&rows, now, args.json);
        }
        LeasesCommand::Get { machine } => match store.get(machine).await? {
            Some(row) => print_rows(&[row], now, args.json),
            None if args.json => println!("{}", json!({"machine_id": machine, "lease": null})),
            None => println!("machine {machine}: never claimed"),
        },
        LeasesCommand::History { machine, from, to } => {
            let (from, to) = (from.unwrap_or(now - 86_400_000), to.unwrap_or(now));
            let events = store.history(machine, from, to).await?;
            print_history(&events, args.json);
        }
        LeasesCommand::Quarantine { machine, operator } => {
            let row = store.quarantine(machine, &operator, now).await?;
            if args.json {
                println!("{}", row_json(&row, now));
            } else {
                println!(
                    "machine {machine} quarantined (epoch {}): nobody can claim or renew it. Its last holder stops at its fence; take that host out of service too.",
                    row.lease_epoch
                );
            }
        }
        LeasesCommand::ReleaseQuarantine { machine, operator } => {
            let expiry = now + config.lease.lease_ms;
            match store.release_quarantine(machine, &operator, expiry, now).await? {
                Conditional::Applied if args.json => {
                    println!(
                        "{}",
                        json!({"machine_id": machine, "released": true, "claimable_after": format_unix_ms(expiry)})
                    )
                }
                Conditional::Applied => {
                    println!("machine {machine} released from quarantine; claimable after {}", format_unix_ms(expiry))
                }
                Conditional::ConditionFailed => bail!("machine {machine} is not quarantined"),
            }
        }
    }
    Ok(())
}

async fn init(config: &WorkerConfig, layout: &str, json: bool) -> anyhow::Result<()> {
    // A layout the registry added later has the default table, as the worker uses it.
    let table = &config.table_for(layout)?;
    let audit = format!("{table}-audit");
    match config.lease.store {
        StoreKind::Dynamodb => {
            let client = idgen::dynamodb::client(&config.lease.dynamodb.settings().patient()).await;
            idgen::DynamoDbLeaseStore::new(client, table).create_tables().await?;
        }
        StoreKind::Sqlite => {
            let _store: Arc<dyn LeaseStore> = idgen_worker::open_lease_store(config, layout).await?;
        }
    }
    if json {
        println!("{}", json!({"layout": layout, "table": table, "audit_table": audit, "ready": true}));
    } else {
        println!("lease table {table} and audit table {audit} are ready (layout {layout})");
    }
    Ok(())
}

fn state(row: &LeaseRow, now: i64) -> &'static str {
    if row.holder == QUARANTINED {
        "quarantined"
    } else if row.lease_expiry > now {
        "held"
    } else {
        "free"
    }
}

fn row_json(row: &LeaseRow, now: i64) -> serde_json::Value {
    json!({
        "machine_id": row.machine_id,
        "holder": row.holder,
        "lease_epoch": row.lease_epoch,
        "lease_expiry_ms": row.lease_expiry,
        "lease_expiry": format_unix_ms(row.lease_expiry),
        "state": state(row, now),
    })
}

fn print_rows(rows: &[LeaseRow], now: i64, json: bool) {
    if json {
        println!("{}", serde_json::Value::Array(rows.iter().map(|row| row_json(row, now)).collect()));
        return;
    }
    println!("{:>7}  {:<11}  {:>5}  {:<24}  HOLDER", "MACHINE", "STATE", "EPOCH", "EXPIRY");
    for row in rows {
        println!(
            "{:>7}  {:<11}  {:>5}  {:<24}  {}",
            row.machine_id,
            state(row, now),
            row.lease_epoch,
            format_unix_ms(row.lease_expiry),
            row.holder
        );
    }
}

fn print_history(events: &[AuditEvent], json: bool) {
    if json {
        let items = events
            .iter()
            .map(|e| {
                json!({
                    "machine_id": e.machine_id, "event": e.kind.as_str(), "holder": e.holder,
                    "lease_epoch": e.lease_epoch, "lease_expiry_ms": e.lease_expiry,
                    "lease_expiry": format_unix_ms(e.lease_expiry), "at_ms": e.at_unix_ms, "at": format_unix_ms(e.at_unix_ms),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(items));
        return;
    }
    println!("{:<24}  {:>7}  {:<18}  {:>5}  {:<24}  HOLDER", "AT", "MACHINE", "EVENT", "EPOCH", "EXPIRY");
    for e in events {
        println!(
            "{:<24}  {:>7}  {:<18}  {:>5}  {:<24}  {}",
            format_unix_ms(e.at_unix_ms),
            e.machine_id,
            e.kind.as_str(),
            e.lease_epoch,
            format_unix_ms(e.lease_expiry),
            e.holder
        );
    }
}
