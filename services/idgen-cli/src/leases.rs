//! `idgen leases …`: what the on-call engineer types at 3 a.m.
//!
//! The lease table is the one the worker configuration names (`--config`, plus `IDGEN_WORKER_…`
//! environment overrides), for the layout given by `--layout`, or the one an ID given with
//! `--id` belongs to, or else the one in force now — by the registry's schedule when the
//! configuration names a registry (its copy on disk if the registry is down), as the worker
//! itself decides.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use idgen::core::{Schedule, Timestamp, format_unix_ms};
use idgen::{
    AuditEvent, GenesisHow, GenesisRequest, LeaseRow, LeaseStore, Lift, LiftOutcome, MAX_LEASE_MS, QUARANTINED,
    RegistrySnapshot,
};
use idgen_worker::config::{StoreKind, WorkerConfig};

use crate::table::Table;
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
    /// `init` with a registry: the operator token its record of the table's identity is written
    /// with (default: IDGEN_OPERATOR_TOKEN, then --token-file).
    #[arg(long, global = true, env = "IDGEN_OPERATOR_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[arg(long, global = true, default_value = ".idgen/operator-token")]
    token_file: PathBuf,
    /// An operator's client certificate for that write (instead of a token), with the CA to trust.
    #[command(flatten)]
    tls: crate::tls::ClientTls,
    #[command(subcommand)]
    command: LeasesCommand,
}

/// An operator's write to the registry: `init`'s record of which table the region's lease table
/// is (`POST /v1/regions/{name}:record-lease-table`).
pub struct RegistryWriter {
    pub http: reqwest::Client,
    /// An operator token; `None` when the client presents an operator's certificate.
    pub token: Option<String>,
}

impl RegistryWriter {
    /// The writer `args` describe: an operator's certificate where given, else the
    /// configuration's registry TLS (the host's own certificate: the registry's
    /// `lease_table_recorders` lets a fleet host record its table the first time); and the token
    /// from the flag, the environment or the file, where there is one.
    fn from_args(args: &LeasesArgs, config: &WorkerConfig) -> anyhow::Result<Self> {
        let http = match args.tls.cert {
            Some(_) => args.tls.client()?,
            None => idgen::control::supervisor::registry_http(config)?,
        };
        let token = match &args.token {
            Some(token) => Some(token.clone()),
            None => std::fs::read_to_string(&args.token_file).ok().map(|text| text.trim().to_owned()),
        };
        Ok(RegistryWriter { http, token })
    }

    /// Records `table_id` as region `region`'s `layout` table (its first init), or finds it
    /// recorded already (`false`). A second table of the same name is refused by the registry.
    pub async fn record_lease_table(
        &self,
        registry_url: &str,
        region: &str,
        layout: &str,
        table: &str,
        table_id: &str,
    ) -> anyhow::Result<bool> {
        let url = format!("{}/v1/regions/{region}:record-lease-table", registry_url.trim_end_matches('/'));
        let mut request = self
            .http
            .post(url)
            .json(&json!({"confirm": region, "layout": layout, "table": table, "table_id": table_id}));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.with_context(|| format!("reaching the registry at {registry_url}"))?;
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            bail!(
                "the registry refused to record lease table {table} (genesis {table_id}) as region {region}'s {layout} \
                 table: {status} {}. Recording it is an operator's write (--token, IDGEN_OPERATOR_TOKEN, \
                 --token-file, or an operator's --cert and --key), or a fleet host's whose certificate the \
                 registry lists in lease_table_recorders",
                body["error"]["message"].as_str().unwrap_or("(no message)")
            );
        }
        if !status.is_success() {
            bail!(
                "the registry refused to record lease table {table} (genesis {table_id}) as region {region}'s {layout} \
                 table: {status} {}",
                body["error"]["message"].as_str().unwrap_or("(no message)")
            );
        }
        Ok(body["recorded"].as_bool().unwrap_or(false))
    }
}

#[derive(Subcommand, Debug)]
enum LeasesCommand {
    /// Make this configuration's table the region's lease table: create it and its audit table
    /// where missing, and record its genesis, without which no generator claims in it (bound to
    /// the configuration's registry, which must name the table for the region). Idempotent; on a
    /// live table of an earlier release it records the genesis and changes no row. The operator
    /// step before the first worker starts.
    Init {
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
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
        #[arg(required_unless_present = "id", conflicts_with = "id")]
        machine: Option<u32>,
        /// The machine number (and layout) of this ID, e.g. a duplicate.
        #[arg(long)]
        id: Option<String>,
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
    /// Lift a quarantine. The number becomes claimable only when no holder the quarantine cut off
    /// can still be issuing: after its old expiry, and at least the longest lease any generator
    /// may hold (one hour) from now. A quarantine that kept no expiry (the design notes' AWS CLI
    /// command) is lifted only with --holder-stopped.
    ReleaseQuarantine {
        machine: u32,
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        /// You have seen that the number's last holder is stopped (its process gone, its host's
        /// clock synchronized): lift a quarantine that kept no expiry too.
        #[arg(long)]
        holder_stopped: bool,
    },
    /// Make the table this configuration names the fleet's lease table: a restored copy (a
    /// point-in-time restore or a backup makes a new table) or the table a fleet moves to. Every
    /// number of the layout is quarantined in the old table, so no holder there renews or claims
    /// again, and the expiry each row had is carried into the new table, so nobody claims a
    /// number there before its old holder has stopped; then the adoption is recorded in the new
    /// table. Generators claim in a restored copy only once it is adopted
    /// (runbooks/lease-table-restore.md).
    Adopt {
        /// The table the fleet used until now (it must still answer).
        #[arg(long, required_unless_present = "source_gone", conflicts_with = "source_gone")]
        from_table: Option<String>,
        /// The old table is gone (deleted, or unreachable for good): nobody can renew there,
        /// and nothing says until when its holders may issue, so this waits out the longest lease
        /// any generator may hold (one hour). Refused for a restored copy whose source table
        /// still exists: adopt it --from-table that table.
        #[arg(long)]
        source_gone: bool,
        /// With --source-gone: the longest lease any generator on the old table held, ms
        /// (default: the longest any generator may hold, 3600000: embedded generators share the
        /// table and may hold longer leases than the fleet). Give less only if you know every
        /// holder's configuration.
        #[arg(long, requires = "source_gone")]
        lease_ms: Option<i64>,
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
}

/// What the workers of this configuration issue under: the schedule, the numbers this region
/// has had (active or retired: their IDs still name them) and whether it is the home region.
struct Issuing {
    schedule: Schedule,
    region_numbers: Vec<u32>,
    home_region: bool,
    /// The registry's answer (or its copy on disk); none without a registry.
    registry: Option<RegistrySnapshot>,
}

/// The registry's answer (its copy on disk when it is down), as the workers take it; without a
/// registry (development), the configuration's own.
async fn issuing(config: &WorkerConfig) -> anyhow::Result<Issuing> {
    let Some(url) = &config.registry_url else {
        return Ok(Issuing {
            schedule: config.schedule(),
            region_numbers: vec![config.region_number()],
            home_region: config.home_region(),
            registry: None,
        });
    };
    let (snapshot, _) = idgen::control::supervisor::registry_answer(config, url).await?;
    Ok(Issuing {
        schedule: snapshot.schedule()?,
        region_numbers: snapshot.region_numbers(config.region()),
        home_region: snapshot.home_region == config.region(),
        registry: Some(snapshot),
    })
}

/// The layout and machine number an ID was issued under, if it was issued in this
/// configuration's region (whose lease tables these are).
fn machine_of(id: &str, issuing: &Issuing, config: &WorkerConfig) -> anyhow::Result<(String, u32)> {
    let value: u64 = id.trim().parse().with_context(|| format!("{id:?} is not a 63-bit ID"))?;
    let decoded = issuing.schedule.decode(value).with_context(|| format!("decoding {id}"))?;
    let region = config.region();
    match decoded.region_number {
        Some(made_in) if !issuing.region_numbers.contains(&made_in) => bail!(
            "ID {id} was issued in region number {made_in}; this configuration's lease tables are region \
             {region}'s ({:?}): run this with that region's worker configuration",
            issuing.region_numbers
        ),
        None if !issuing.home_region => bail!(
            "ID {id} is of layout {}, which only the home region issues, and {region} is not the home region: \
             run this with the home region's worker configuration",
            decoded.layout.name()
        ),
        _ => Ok((decoded.layout.name().to_owned(), decoded.machine)),
    }
}

pub async fn run(args: LeasesArgs) -> anyhow::Result<()> {
    let result = run_command(args).await;
    // A change that applied but whose audit record the table would not take: its record is in
    // the spool. Try once more, then say where it waits.
    if idgen::lease::audit_spool::flush_all(std::time::Duration::from_secs(5)).await > 0 {
        for (dir, table, waiting) in idgen::lease::audit_spool::waiting_spools() {
            eprintln!(
                "warning: {waiting} audit record(s) for {table} could not be written to the table. They are kept, \
                 fsynced, in {}; a worker or the next `idgen leases` command using that directory writes them \
                 once the table answers.",
                dir.display()
            );
        }
    }
    result
}

async fn run_command(args: LeasesArgs) -> anyhow::Result<()> {
    let config = WorkerConfig::load(args.config.as_deref())?;
    let id = match &args.command {
        LeasesCommand::Quarantine { id: Some(id), operator, .. } => Some((id.clone(), operator.clone())),
        _ => None,
    };
    // The registry is asked only when the table is not named: an explicit --layout and machine
    // number work while the registry is down and no copy is at hand.
    let layout = match (args.layout.clone(), id) {
        (Some(layout), None) => layout,
        (layout, Some((id, operator))) => {
            let (of_id, machine) = machine_of(&id, &issuing(&config).await?, &config)?;
            if let Some(layout) = layout.filter(|l| *l != of_id) {
                return Err(crate::Usage(format!(
                    "--layout {layout} contradicts the ID, which belongs to layout {of_id}"
                ))
                .into());
            }
            let store = idgen::open_lease_store_for_operator(&config, &of_id).await?;
            return quarantine_and_print(&*store, &of_id, machine, &operator, args.json).await;
        }
        (None, None) => {
            let now = Timestamp::from_unix_ms(idgen::system_unix_ms()).context("the clock is outside the ID range")?;
            issuing(&config).await?.schedule.entry_at(now).layout.name().to_owned()
        }
    };
    if let LeasesCommand::Init { operator } = &args.command {
        let writer = match config.registry_url {
            Some(_) => Some(RegistryWriter::from_args(&args, &config)?),
            None => None,
        };
        return init(&config, &layout, operator, writer.as_ref(), args.json).await;
    }
    if let LeasesCommand::Adopt { from_table, lease_ms, operator, .. } = &args.command {
        return adopt(&config, &layout, from_table.as_deref(), *lease_ms, operator, args.json).await;
    }
    let store = idgen::open_lease_store_for_operator(&config, &layout).await?;
    let now = idgen::system_unix_ms();
    match args.command {
        LeasesCommand::Init { .. } | LeasesCommand::Adopt { .. } => unreachable!("handled above"),
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
        LeasesCommand::Quarantine { machine, operator, .. } => {
            let machine = machine.ok_or_else(|| crate::Usage("give a machine number or --id".into()))?;
            quarantine_and_print(&*store, &layout, machine, &operator, args.json).await?;
        }
        LeasesCommand::ReleaseQuarantine { machine, operator, holder_stopped } => {
            let lift = Lift { min_expiry_unix_ms: now + MAX_LEASE_MS, holder_stopped };
            match store.release_quarantine(machine, &operator, lift, now).await? {
                LiftOutcome::Lifted(row) if args.json => println!(
                    "{}",
                    json!({
                        "machine_id": machine, "layout": layout, "released": true,
                        "claimable_after": format_unix_ms(row.lease_expiry), "claimable_after_ms": row.lease_expiry,
                    })
                ),
                LiftOutcome::Lifted(row) => println!(
                    "machine {machine} of layout {layout} released from quarantine; claimable after {}",
                    format_unix_ms(row.lease_expiry)
                ),
                LiftOutcome::NotQuarantined => bail!("machine {machine} of layout {layout} is not quarantined"),
                LiftOutcome::NoKeptExpiry => bail!(
                    "machine {machine} of layout {layout} was quarantined by a tool that kept no record of the \
                     expiry it replaced (the design notes' AWS CLI update-item; runbooks/duplicate-id.md has one that \
                     keeps it). Nothing bounds what its last holder may still believe it holds, and your clock \
                     cannot stand in for it: lifting now could hand the number to a successor while that holder \
                     still issues. Leave it quarantined, or make sure its last holder is stopped (`idgen leases \
                     history {machine}` names it: its last claim) and run this again with --holder-stopped."
                ),
            }
        }
    }
    Ok(())
}

async fn quarantine_and_print(
    store: &dyn LeaseStore,
    layout: &str,
    machine: u32,
    operator: &str,
    json: bool,
) -> anyhow::Result<()> {
    let now = idgen::system_unix_ms();
    let row = store.quarantine(machine, operator, now).await?;
    if json {
        let mut out = row_json(&row, now);
        out["layout"] = json!(layout);
        println!("{out}");
    } else {
        println!(
            "machine {machine} of layout {layout} quarantined (epoch {}): nobody can claim or renew it. Its last holder stops at its fence; take that host out of service too.",
            row.lease_epoch
        );
    }
    Ok(())
}

/// What `init` made of a layout's table.
pub struct Initialized {
    pub table: String,
    pub audit: String,
    /// Rows it held already (a live table of an earlier release), none changed.
    pub rows: usize,
    /// Its genesis; none for a restored copy, which becomes the fleet's by adoption.
    pub genesis: Option<idgen::Genesis>,
    /// With a registry: whether this init recorded the table's identity there (`false`: it held
    /// this one already).
    pub recorded: Option<bool>,
}

/// `idgen leases init` for one layout, without printing: the tables made where missing, the
/// genesis recorded (bound to the registry, which must name the table for the region), and, with a
/// registry, the table's identity recorded there by `writer` (the first init of the region's table
/// records it; a second table of the same name is refused). `idgen up` runs it for every region
/// and layout before it starts a worker.
pub async fn initialize(
    config: &WorkerConfig,
    layout: &str,
    operator: &str,
    writer: Option<&RegistryWriter>,
) -> anyhow::Result<Initialized> {
    // A layout the registry added later has the default table, as the worker uses it.
    let table = config.table_for(layout)?;
    let audit = format!("{table}-audit");
    let registry = issuing(config).await?.registry;
    // The registry names the region's table: init makes no other table the fleet's.
    if let Some(snapshot) = &registry {
        let development = config.development;
        snapshot.check_lease_table(config.region(), layout, &table, None, development).map_err(anyhow::Error::msg)?;
    }
    let store: Arc<dyn LeaseStore> = match config.store_kind() {
        StoreKind::Dynamodb => {
            let client = idgen::lease::dynamodb::client(&config.lease.dynamodb.settings().patient()).await;
            let store = idgen::DynamoDbLeaseStore::new(client, &table);
            // Tables that exist (the stack's) are only checked: init needs no CreateTable then.
            let exists = store.verify_lease_table().await.is_ok() && store.verify_audit_table().await.is_ok();
            if !exists {
                store.create_tables().await?;
            }
            let (created, restored) = store.origin().await?;
            let adopted = store.adoption().await?.is_some_and(|adoption| adoption.table_created_unix_ms == created);
            if restored.is_some() && !adopted {
                return Ok(Initialized {
                    table,
                    audit,
                    rows: store.list().await?.len(),
                    genesis: None,
                    recorded: None,
                });
            }
            Arc::new(store)
        }
        StoreKind::Sqlite => idgen_worker::open_lease_store(config, layout).await?,
    };
    let rows = store.list().await?.len();
    let request = GenesisRequest {
        how: GenesisHow::Init,
        by: operator.to_owned(),
        registry_id: registry.as_ref().and_then(|snapshot| snapshot.registry_id.clone()),
    };
    let genesis = store.record_genesis(&request, idgen::system_unix_ms()).await?;
    store.close().await;
    let Some(snapshot) = &registry else {
        return Ok(Initialized { table, audit, rows, genesis: Some(genesis), recorded: None });
    };
    // Which table of its name this is: recorded by the first init, refused for a second table.
    let url = config.registry_url.as_deref().unwrap_or_default();
    let writer = writer.context("a registry is configured: init records the table's identity there")?;
    let recorded = writer.record_lease_table(url, config.region(), layout, &table, &genesis.table_id).await?;
    // The registry's answer now holds it: the generators' check, as they will make it.
    let snapshot = match idgen::control::supervisor::registry_answer(config, url).await {
        Ok((fresh, true)) => fresh,
        _ => snapshot.clone(),
    };
    snapshot.check_lease_table(config.region(), layout, &table, Some(&genesis), true).map_err(anyhow::Error::msg)?;
    Ok(Initialized { table, audit, rows, genesis: Some(genesis), recorded: Some(recorded) })
}

async fn init(
    config: &WorkerConfig,
    layout: &str,
    operator: &str,
    writer: Option<&RegistryWriter>,
    json: bool,
) -> anyhow::Result<()> {
    let Initialized { table, audit, rows, genesis, recorded } = initialize(config, layout, operator, writer).await?;
    if json {
        let genesis = genesis.map(|genesis| {
            json!({
                "table_id": genesis.table_id, "registry_id": genesis.registry_id, "how": genesis.how.kind(),
                "by": genesis.by, "at": format_unix_ms(genesis.at_unix_ms),
            })
        });
        println!(
            "{}",
            json!({
                "layout": layout, "table": table, "audit_table": audit, "ready": true, "rows": rows, "genesis": genesis,
                "identity_recorded": recorded,
            })
        );
        return Ok(());
    }
    let Some(genesis) = genesis else {
        println!(
            "lease table {table} and audit table {audit} are ready (layout {layout}); it is a restored copy: no \
             genesis until it is adopted (`idgen leases adopt`, runbooks/lease-table-restore.md)"
        );
        return Ok(());
    };
    let bound = match (&genesis.registry_id, recorded) {
        (Some(id), Some(true)) => {
            format!("region {} of registry {id}, which now holds this table as the region's", config.region())
        }
        (Some(id), _) => format!("region {} of registry {id}, which holds this table as the region's", config.region()),
        (None, _) => "no registry (development, one host)".to_owned(),
    };
    println!(
        "lease table {table} and audit table {audit} are ready (layout {layout}); genesis {} by {} at {}, for \
         {bound}{}",
        genesis.table_id,
        genesis.by,
        format_unix_ms(genesis.at_unix_ms),
        if rows > 0 { format!("; its {rows} rows are as they were") } else { String::new() }
    );
    Ok(())
}

/// How many quarantines of the old table are in flight at once.
const ADOPT_PARALLEL: usize = 16;

/// `idgen leases adopt`: see [`LeasesCommand::Adopt`].
async fn adopt(
    config: &WorkerConfig,
    layout: &str,
    from_table: Option<&str>,
    lease_ms: Option<i64>,
    operator: &str,
    json: bool,
) -> anyhow::Result<()> {
    if config.store_kind() != StoreKind::Dynamodb {
        bail!(
            "adopt is for DynamoDB lease tables. A SQLite lease file put back from a copy is older than the leases \
             its generators hold: stop every generator that uses the file, wait one lease (lease_ms), then start \
             them (runbooks/lease-table-restore.md)"
        );
    }
    let table = config.table_for(layout)?;
    let issuing = issuing(config).await?;
    let Some(known) = issuing.schedule.layout(layout).cloned() else {
        bail!("layout {layout} is not in the schedule");
    };
    let client = idgen::lease::dynamodb::client(&config.lease.dynamodb.settings().patient()).await;
    let new = idgen::DynamoDbLeaseStore::new(client.clone(), &table);
    new.verify_lease_table().await.with_context(|| format!("the new lease table {table}"))?;
    let (_, restored) = new.origin().await?;
    // A restored copy names its source: adopting it from another table would quarantine the wrong
    // table and carry the wrong expiries, leaving the source's holders issuing.
    if let (Some(old), Some(source)) = (from_table, restored.as_ref().and_then(|r| r.source_table.as_deref()))
        && old != source
    {
        return Err(crate::Usage(format!(
            "{table} is a restored copy of {source}, not of {old}: adopting it --from-table {old} would leave the \
             holders in {source} issuing under numbers this table shows free. Give --from-table {source} (or \
             --source-gone if {source} no longer exists); nothing was changed"
        ))
        .into());
    }
    // Gone means gone: a restored copy names its source, and a source that still exists has
    // holders that may renew there (adopt it --from-table, which quarantines them).
    if from_table.is_none()
        && let Some(source) = restored.as_ref().and_then(|r| r.source_table.as_deref())
        && new.table_exists(source).await.with_context(|| format!("asking whether {source} still exists"))?
    {
        return Err(crate::Usage(format!(
            "{table} is a restored copy of {source}, which still exists: its holders may still renew there, and \
             --source-gone would only wait out their leases while they renew. Adopt it --from-table {source} (which \
             quarantines every number in {source}); nothing was changed"
        ))
        .into());
    }
    // Embedders share the table and may hold leases up to MAX_LEASE_MS: this configuration's own
    // lease says nothing of theirs.
    let wait_ms = lease_ms.unwrap_or(MAX_LEASE_MS).max(0);
    let mut quarantined = 0usize;
    let mut held = 0usize;
    let mut expiries_carried = 0usize;
    let mut carried = Vec::new();
    if let Some(old) = from_table {
        if old == table {
            return Err(crate::Usage(format!(
                "--from-table {old} is the table this configuration names: give the table the fleet used before"
            ))
            .into());
        }
        let old_store = Arc::new(idgen::DynamoDbLeaseStore::new(client, old));
        old_store.verify_lease_table().await.with_context(|| format!("the old lease table {old}"))?;
        let now = idgen::system_unix_ms();
        let before = old_store.list().await?;
        held = before.iter().filter(|row| state(row, now) == "held").count();
        // Quarantines an operator set there (a duplicate's number) hold in the new table too.
        carried = before.iter().filter(|row| row.holder == QUARANTINED).map(|row| row.machine_id).collect();
        // Every number the layout has, held or not: a generator still pointed at the old table
        // must not claim one that a generator on the new table may claim too.
        let numbers: Vec<u32> = (0..(1u32 << known.machine_bits())).collect();
        let by = format!("adopt:{operator}");
        // Each old quarantine as it was kept: one that kept no expiry stays one whose lift needs
        // its holder stopped.
        let old_quarantines: Vec<(u32, Option<i64>, u64)> = before
            .iter()
            .filter(|row| row.holder == QUARANTINED)
            .map(|row| (row.machine_id, row.expiry_before_quarantine, row.lease_epoch))
            .collect();
        let mut kept = Vec::new();
        for chunk in numbers.chunks(ADOPT_PARALLEL) {
            let mut writes = tokio::task::JoinSet::new();
            for &machine in chunk {
                let (store, by) = (old_store.clone(), by.clone());
                writes.spawn(async move { store.quarantine(machine, &by, idgen::system_unix_ms()).await });
            }
            while let Some(written) = writes.join_next().await {
                let row = written.context("a quarantine task failed")??;
                kept.push((row.machine_id, row.expiry_before_quarantine.unwrap_or(0), row.lease_epoch));
                quarantined += 1;
            }
        }
        // A holder renewed last before its row was quarantined (the quarantine writes only over
        // the row it read), so it stops issuing before the expiry the row had: the new table's
        // row gets that expiry, and the lease rule does the rest, as for any takeover. Every kept
        // expiry is carried, as it was: not only those later than this host's clock, which may run
        // ahead of the holders' (invariant 15: the operator's clock never moves a floor back), and
        // not capped by it either.
        let now = idgen::system_unix_ms();
        let carried_from = format!("carried-from:{old}");
        for &(machine, expiry, epoch) in kept.iter().filter(|(_, expiry, _)| *expiry > 0) {
            if new.carry_expiry(machine, &carried_from, expiry, epoch).await? {
                expiries_carried += 1;
            }
        }
        for &(machine, kept, epoch) in &old_quarantines {
            new.carry_quarantine(machine, operator, kept, epoch, now).await?;
        }
    }
    let source = from_table.unwrap_or("gone");
    // A margin for the holders' clocks running slower than this one (and for their fence).
    let wait = std::time::Duration::from_millis((wait_ms + wait_ms / 100 + 100) as u64);
    match from_table {
        Some(old) if !json => println!(
            "quarantined all {quarantined} numbers of layout {layout} in {old} ({held} were held): no holder there \
             renews or claims again\ncarried {expiries_carried} expiries into {table}: no number there is claimable \
             before its holder in {old} has stopped issuing under it"
        ),
        Some(_) => {}
        None => {
            if !json {
                println!(
                    "waiting {:.1} s: the longest lease a holder of the old table may still issue under",
                    wait.as_secs_f64()
                );
            }
            tokio::time::sleep(wait).await;
        }
    }
    let adoption = new.record_adoption(source, operator, idgen::system_unix_ms()).await?;
    // Adopted: the table's genesis, naming what it replaces (which a registry that moves the
    // region here checks), bound to the configuration's registry.
    let request = GenesisRequest {
        how: GenesisHow::Adopted { from: source.to_owned() },
        by: operator.to_owned(),
        registry_id: issuing.registry.as_ref().and_then(|snapshot| snapshot.registry_id.clone()),
    };
    let genesis = new.record_genesis(&request, idgen::system_unix_ms()).await?;
    // What the registry still names for the region, if not this table: the move that goes with it.
    let region = config.region();
    let named = issuing.registry.as_ref().and_then(|snapshot| {
        let entry = snapshot.active_region(region).ok()?.lease_tables.get(layout)?;
        (entry.table != table).then(|| entry.table.clone())
    });
    let move_command = named.as_ref().map(|named| {
        format!(
            "idgen regions --registry {} move-lease-table {region} --confirm {region} --layout {layout} --from {named} \
             --to {table} --table-id {}",
            config.registry_url.as_deref().unwrap_or_default(),
            genesis.table_id
        )
    });
    if json {
        println!(
            "{}",
            json!({
                "table": table, "layout": layout, "adopted": true, "adopted_from": adoption.source,
                "restored_from": restored.as_ref().map(|r| r.source.clone()),
                "restored_to": restored.as_ref().map(|r| format_unix_ms(r.restored_to_unix_ms)),
                "quarantined_in_old_table": quarantined, "held_in_old_table": held,
                "quarantines_carried": carried, "expiries_carried": expiries_carried,
                "waited_ms": if from_table.is_some() { 0 } else { wait.as_millis() as u64 },
                "genesis": genesis.table_id, "registry_move": move_command,
            })
        );
    } else {
        let what = match &restored {
            Some(r) => format!("a restored copy of {} as of {}", r.source, format_unix_ms(r.restored_to_unix_ms)),
            None => "not a restored copy".to_owned(),
        };
        if !carried.is_empty() {
            println!("quarantines carried over from {source}: machine numbers {carried:?}");
        }
        match &move_command {
            None => println!(
                "lease table {table} adopted ({what}): generators may claim in it now. Point the fleet at it; a \
                 generator still on the old table finds every number quarantined there"
            ),
            Some(command) => println!(
                "lease table {table} adopted ({what}). The registry still names {} for region {region}: generators \
                 claim in {table} once it is moved there too:\n  {command}\nPoint the fleet at it; a generator still \
                 on the old table finds every number quarantined there",
                named.as_deref().unwrap_or_default()
            ),
        }
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
    let mut table = Table::new(&["MACHINE", "STATE", "EPOCH", "EXPIRY", "HOLDER"]).right(&[0, 2]);
    for row in rows {
        table.row([
            row.machine_id.to_string(),
            state(row, now).to_string(),
            row.lease_epoch.to_string(),
            format_unix_ms(row.lease_expiry),
            row.holder.clone(),
        ]);
    }
    table.print();
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
    let mut table = Table::new(&["AT", "MACHINE", "EVENT", "EPOCH", "EXPIRY", "HOLDER"]).right(&[1, 3]);
    for e in events {
        table.row([
            format_unix_ms(e.at_unix_ms),
            e.machine_id.to_string(),
            e.kind.as_str().to_owned(),
            e.lease_epoch.to_string(),
            format_unix_ms(e.lease_expiry),
            e.holder.clone(),
        ]);
    }
    table.print();
}
