//! A generator's configuration, the same for a fleet worker and an embedded generator: one
//! TOML file plus environment, parsed and validated once. A production generator never
//! improvises: outside `development = true`, every setting below that has a development default
//! must be configured ([`GeneratorConfig::missing_for_production`]).

pub mod file;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use idgen_core::{Layout, OPEN_HORIZON, Schedule};
use serde::Deserialize;

use crate::control::tls::ClientTlsSection;
use crate::lease::LeaseStore;
use crate::lease::keeper::{LeaseConfig, MachineRanges};

/// The file and the environment under `env_prefix`, as one configuration source.
pub fn sources(file: Option<&Path>, env_prefix: &str) -> anyhow::Result<config::Config> {
    let mut builder = config::Config::builder();
    if let Some(file) = file {
        builder = builder.add_source(config::File::from(file).required(true));
    }
    builder
        .add_source(
            config::Environment::with_prefix(env_prefix).prefix_separator("_").separator("__").try_parsing(true),
        )
        .build()
        .context("reading the configuration")
}

/// A start a production service refuses: a configuration that leaves out what production needs,
/// or a database it must not start on. The binaries exit with status 2 for it (as for a usage
/// error: `idgen_server::cli::exit_status`), and systemd units do not restart on it
/// (`RestartPreventExitStatus=2`): the same configuration would be refused again.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// One error naming everything a production generator was not told.
pub fn refuse_missing(missing: Vec<String>) -> anyhow::Result<()> {
    refuse_missing_for("generator", missing)
}

/// One error naming everything a production `service` (generator, registry, public-ID service)
/// was not told: a [`Refused`].
pub fn refuse_missing_for(service: &str, missing: Vec<String>) -> anyhow::Result<()> {
    if missing.is_empty() {
        return Ok(());
    }
    Err(Refused(format!(
        "refusing to start a production {service} with settings left to defaults: configure {}. \
         (For a local try-out, set development = true.)",
        missing.join("; ")
    ))
    .into())
}

/// What development mode fills in when the configuration leaves it out. Outside development mode
/// every one of these must be configured: a production generator never improvises them.
pub mod development_defaults {
    pub const REGION: &str = "local";
    pub const REGION_NUMBER: u32 = 0;
    pub const HOME_REGION: bool = true;
    pub const SQLITE_PATH: &str = ".idgen/leases.db";
    pub const DYNAMODB_REGION: &str = "us-east-1";
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GeneratorConfig {
    /// Development mode: what is not configured gets a local default (a SQLite file under
    /// `.idgen/`, region `local` as the home region, the built-in schedule when there is no
    /// registry) and the clock-sync check may be switched off. Said at start-up and in `/healthz`.
    /// Off by default: a production generator refuses to start with any of those left out.
    pub development: bool,
    /// This region's name; the registry gives its number.
    pub region: Option<String>,
    /// Without a registry (development only), this region's number.
    pub region_number: Option<u32>,
    /// Whether this is the home region, the only one that issues under layouts without a region
    /// field (v1). Required in production, and checked against the registry's answer.
    pub home_region: Option<bool>,
    /// The name in this generator's lease rows, instead of the host name. The process id, start
    /// time and a per-process random part are always appended, so processes sharing one
    /// configuration file are still different holders.
    pub holder: Option<String>,
    /// The region registry: where the region number, the schedule and the home region come
    /// from. Required in production; without it (development only) the generator uses
    /// `region_number`, `home_region` and the built-in schedule with an open horizon.
    pub registry_url: Option<String>,
    /// The last good copy of the registry's answer (development default
    /// `.idgen/schedule-<region>.json`; production: required, an absolute path).
    pub schedule_cache: Option<PathBuf>,
    /// How often to fetch the registry; a failed fetch changes nothing (the schedule's horizon
    /// makes the generator refuse if failures last).
    pub registry_refresh_ms: u64,
    /// How long before a cutover to claim a machine number under the next layout.
    pub preclaim_ms: i64,
    /// The machine-number leases: where the table is, and its timing.
    pub lease: LeaseSection,
    /// When the wall clock may be trusted to issue.
    pub clock: ClockSection,
    /// How to reach an `https://` registry: the CA to trust, the client certificate to present.
    pub registry_tls: ClientTlsSection,
    /// Fleet worker or embedded generator: decides the default machine range (0–63, or 64 up to
    /// each layout's highest). Set by whoever loads the configuration, not by the file.
    #[serde(skip)]
    pub role: Role,
}

/// Who runs a generator. Fleet workers take machine numbers 0–63 and embedded generators 64
/// and up (SPEC §2), so the two never compete for a number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    Fleet,
    #[default]
    Embedded,
}

#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Sqlite,
    Dynamodb,
}

/// Where the DynamoDB lease tables are.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DynamoDbSection {
    /// The AWS region of the tables (required in production).
    pub region: Option<String>,
    /// Unset for AWS; e.g. `http://127.0.0.1:5000` for a local DynamoDB-protocol server.
    pub endpoint: Option<String>,
    /// One DynamoDB call's limit; the SDK retries (standard mode: backoff with jitter) within
    /// `operation_timeout_ms`.
    pub attempt_timeout_ms: u64,
    /// One operation's limit, its retries included; then the keeper retries on its own schedule.
    pub operation_timeout_ms: u64,
    /// Attempts per operation, the first included.
    pub max_attempts: u32,
    /// The directory where audit records the audit table would not take wait, fsynced, until
    /// it answers (default: `audit-spool/` beside `schedule_cache`; production: an absolute
    /// path on local disk that survives a restart).
    pub audit_spool: Option<PathBuf>,
}

impl Default for DynamoDbSection {
    fn default() -> Self {
        let defaults = crate::DynamoDbSettings::default();
        DynamoDbSection {
            region: None,
            endpoint: defaults.endpoint,
            attempt_timeout_ms: defaults.attempt_timeout.as_millis() as u64,
            operation_timeout_ms: defaults.operation_timeout.as_millis() as u64,
            max_attempts: defaults.max_attempts,
            audit_spool: None,
        }
    }
}

impl DynamoDbSection {
    pub fn settings(&self) -> crate::DynamoDbSettings {
        crate::DynamoDbSettings {
            region: self.region.clone().unwrap_or_else(|| development_defaults::DYNAMODB_REGION.into()),
            endpoint: self.endpoint.clone(),
            attempt_timeout: std::time::Duration::from_millis(self.attempt_timeout_ms),
            operation_timeout: std::time::Duration::from_millis(self.operation_timeout_ms),
            max_attempts: self.max_attempts,
        }
    }
}

/// One layout's machine-number range, `[lease.machines.v2] first = 0, last = 63`.
#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MachineRangeSection {
    /// The lowest machine number this layout's generators claim.
    pub first: u32,
    /// The highest.
    pub last: u32,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseSection {
    /// `sqlite` or `dynamodb` (required in production).
    pub store: Option<StoreKind>,
    /// The SQLite lease file: an absolute path on a local filesystem in production.
    pub sqlite_path: Option<PathBuf>,
    /// How long a start waits for other processes opening the same SQLite file at once (ms).
    pub sqlite_open_timeout_ms: u64,
    /// The DynamoDB lease tables, when `store = "dynamodb"`.
    pub dynamodb: DynamoDbSection,
    /// Development only: the generator runs `idgen leases init` itself at start, making missing
    /// DynamoDB lease and audit tables and each table's genesis (production: the operator runs
    /// `idgen leases init` once, and no generator claims in a table without a genesis).
    pub create_tables: bool,
    /// Lease table per layout.
    pub tables: BTreeMap<String, String>,
    /// How long a claim or renewal holds the number. Checked at start-up: fence < renew
    /// interval < lease ≤ 1 h, and 2 × renew interval ≤ lease − fence.
    pub lease_ms: i64,
    /// How often the holder renews.
    pub renew_interval_ms: i64,
    /// The fence: no ID is issued with a timestamp at or after the lease's expiry minus this, so
    /// a holder that froze past its lease stops before a new one starts.
    pub fence_ms: i64,
    /// The machine-number range of every layout not listed in `machines` (default: fleet
    /// workers 0–63, embedded generators 64 up to the layout's highest).
    pub first_machine: Option<u32>,
    /// The highest machine number of that range.
    pub last_machine: Option<u32>,
    /// Per-layout ranges.
    pub machines: BTreeMap<String, MachineRangeSection>,
    /// The longest wait between claims while every number is taken (backoff with jitter).
    pub max_backoff_ms: i64,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClockSection {
    /// Refuse to issue unless the kernel reports the clock synchronized. Off only in development.
    pub require_sync: bool,
    /// The largest estimated error of the kernel's clock that `require_sync` accepts.
    pub max_error_ms: i64,
    /// A clock this far behind the last issued timestamp is waited out; further, refused.
    pub max_wait_behind_ms: i64,
    /// Where the kernel keeps the clock on the CPU's counter (clocksource `tsc`), the request
    /// path checks the counter against each millisecond's window instead of reading the clock
    /// for every ID. `false` reads the clock every time.
    pub cpu_counter: bool,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            development: false,
            region: None,
            region_number: None,
            home_region: None,
            holder: None,
            registry_url: None,
            schedule_cache: None,
            registry_refresh_ms: 30_000,
            preclaim_ms: 7 * 86_400_000,
            lease: LeaseSection::default(),
            clock: ClockSection::default(),
            registry_tls: ClientTlsSection::default(),
            role: Role::default(),
        }
    }
}

impl Default for LeaseSection {
    fn default() -> Self {
        let defaults = LeaseConfig::default();
        LeaseSection {
            store: None,
            sqlite_path: None,
            sqlite_open_timeout_ms: crate::lease::open_lock::DEFAULT_OPEN_TIMEOUT.as_millis() as u64,
            dynamodb: DynamoDbSection::default(),
            create_tables: false,
            tables: BTreeMap::from([("v1".into(), "idgen-leases".into()), ("v2".into(), "idgen-leases-v2".into())]),
            lease_ms: defaults.lease_ms,
            renew_interval_ms: defaults.renew_interval_ms,
            fence_ms: defaults.fence_ms,
            first_machine: None,
            last_machine: None,
            machines: BTreeMap::new(),
            max_backoff_ms: defaults.max_backoff_ms,
        }
    }
}

impl Default for ClockSection {
    fn default() -> Self {
        ClockSection { require_sync: true, max_error_ms: 5, max_wait_behind_ms: 5, cpu_counter: true }
    }
}

impl GeneratorConfig {
    /// Development mode with nothing else set.
    pub fn development() -> Self {
        GeneratorConfig { development: true, ..GeneratorConfig::default() }
    }

    /// An embedded generator's configuration: the optional TOML file, then the environment
    /// (`<PREFIX>_<KEY>`, `<PREFIX>_<SECTION>__<KEY>`, e.g. `IDGEN_LEASE__STORE=dynamodb`),
    /// validated.
    pub fn load(file: Option<&Path>, env_prefix: &str) -> anyhow::Result<Self> {
        if let Some(file) = file {
            GeneratorConfig::keys().check_file(file, None)?;
        }
        let config: GeneratorConfig =
            sources(file, env_prefix)?.try_deserialize().context("parsing the generator configuration")?;
        config.validate()?;
        Ok(config)
    }

    /// The keys of a generator's file, from this struct's own source ([`file`]).
    pub fn keys() -> file::Keys {
        file::Keys::of::<GeneratorConfig>()
    }

    /// This region's name.
    pub fn region(&self) -> &str {
        self.region.as_deref().unwrap_or(development_defaults::REGION)
    }

    /// This region's number when there is no registry (development only).
    pub fn region_number(&self) -> u32 {
        self.region_number.unwrap_or(development_defaults::REGION_NUMBER)
    }

    /// Whether this is the home region when there is no registry (development only).
    pub fn home_region(&self) -> bool {
        self.home_region.unwrap_or(development_defaults::HOME_REGION)
    }

    pub fn store_kind(&self) -> StoreKind {
        self.lease.store.unwrap_or(StoreKind::Sqlite)
    }

    pub fn sqlite_path(&self) -> PathBuf {
        self.lease.sqlite_path.clone().unwrap_or_else(|| PathBuf::from(development_defaults::SQLITE_PATH))
    }

    /// The schedule a generator without a registry issues under (development only): v1 from the
    /// epoch, v2 from 2028-01-01, and no horizon — so nothing guards it against a layout the
    /// registry added. Production generators always take the registry's.
    pub fn schedule(&self) -> Schedule {
        Schedule::default_with_horizon(OPEN_HORIZON).expect("the default schedule is valid")
    }

    pub fn schedule_cache_path(&self) -> PathBuf {
        self.schedule_cache.clone().unwrap_or_else(|| PathBuf::from(format!(".idgen/schedule-{}.json", self.region())))
    }

    /// Where DynamoDB audit records wait while the audit table refuses them: configured, or
    /// `audit-spool/` in the schedule copy's directory.
    pub fn audit_spool_dir(&self) -> PathBuf {
        if let Some(dir) = &self.lease.dynamodb.audit_spool {
            return dir.clone();
        }
        let cache = self.schedule_cache_path();
        cache.parent().unwrap_or(Path::new("")).join("audit-spool")
    }

    /// The lease table of a layout: configured, or `idgen-leases-<layout>` for layouts added later.
    pub fn table_for(&self, layout: &str) -> anyhow::Result<String> {
        if let Some(table) = self.lease.tables.get(layout) {
            return Ok(table.clone());
        }
        let table = crate::lease::default_table(layout);
        if table.ends_with("-audit") {
            bail!(
                "layout {layout}'s default table {table} would be an audit table's name: configure lease.tables.{layout}"
            );
        }
        Ok(table)
    }

    pub fn lease_config(&self) -> LeaseConfig {
        let defaults = match self.role {
            Role::Fleet => MachineRanges::fleet(),
            Role::Embedded => MachineRanges::embedded(),
        };
        let mut machines = MachineRanges {
            first: self.lease.first_machine.unwrap_or(defaults.first),
            last: self.lease.last_machine.or(defaults.last),
            layouts: BTreeMap::new(),
        };
        for (layout, range) in &self.lease.machines {
            machines = machines.with_layout(layout, range.first..=range.last);
        }
        LeaseConfig {
            lease_ms: self.lease.lease_ms,
            renew_interval_ms: self.lease.renew_interval_ms,
            fence_ms: self.lease.fence_ms,
            machines,
            max_backoff_ms: self.lease.max_backoff_ms,
        }
    }

    /// What a production generator must be told, and is not. Empty in development mode.
    pub fn missing_for_production(&self) -> Vec<String> {
        if self.development {
            return Vec::new();
        }
        let mut missing = Vec::new();
        let mut need = |what: &str| missing.push(what.to_owned());
        match self.registry_url.as_deref() {
            None => need("registry_url (the region number and the schedule come from the registry)"),
            Some(url) => {
                if let Err(why) = crate::control::registry::check_registry_url(url, false) {
                    need(&why);
                }
            }
        }
        if self.region_number.is_some() {
            need("no region_number (the registry assigns it; region_number is for development without one)");
        }
        if self.region.is_none() {
            need("region");
        }
        if self.home_region.is_none() {
            need("home_region (true or false; checked against the registry)");
        }
        if !self.schedule_cache.as_deref().is_some_and(Path::is_absolute) {
            need("schedule_cache (an absolute path: the registry copy a restart falls back on)");
        }
        match self.lease.store {
            None => need("lease.store (\"dynamodb\" or \"sqlite\")"),
            Some(StoreKind::Sqlite) if !self.lease.sqlite_path.as_deref().is_some_and(Path::is_absolute) => {
                need("lease.sqlite_path (an absolute path on a local filesystem)")
            }
            Some(StoreKind::Dynamodb) if self.lease.dynamodb.region.is_none() => need("lease.dynamodb.region"),
            Some(_) => {}
        }
        if self.lease.store == Some(StoreKind::Dynamodb) && !self.audit_spool_dir().is_absolute() {
            need(
                "lease.dynamodb.audit_spool (an absolute path: where audit records wait while the audit table is down)",
            );
        }
        if self.lease.create_tables {
            need("no lease.create_tables (development only; production runs `idgen leases init` once)");
        }
        if !self.clock.require_sync {
            need("clock.require_sync = true (it may be off in development only)");
        }
        if self.clock.max_error_ms > 5 || self.clock.max_wait_behind_ms > 5 {
            need(
                "clock.max_error_ms and clock.max_wait_behind_ms of at most 5 (SPEC §3; more is for development only)",
            );
        }
        missing
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        refuse_missing(self.missing_for_production())?;
        self.validate_settings()
    }

    /// Everything but the production requirements ([`Self::missing_for_production`]).
    pub fn validate_settings(&self) -> anyhow::Result<()> {
        let (store, compiled) = match self.store_kind() {
            StoreKind::Sqlite => ("sqlite", cfg!(feature = "sqlite")),
            StoreKind::Dynamodb => ("dynamodb", cfg!(feature = "dynamodb")),
        };
        if !compiled {
            bail!("lease.store = \"{store}\": this build of idgen does not include it (the cargo feature `{store}`)");
        }
        if self.store_kind() == StoreKind::Dynamodb {
            let d = &self.lease.dynamodb;
            if d.region.as_deref().is_some_and(|r| r.trim().is_empty())
                || d.attempt_timeout_ms == 0
                || d.operation_timeout_ms < d.attempt_timeout_ms
                || d.max_attempts == 0
            {
                bail!(
                    "lease.dynamodb needs a region, attempt_timeout_ms > 0, operation_timeout_ms ≥ attempt_timeout_ms and max_attempts ≥ 1"
                );
            }
        }
        if self.region().trim().is_empty() {
            bail!("region must not be empty");
        }
        if self.registry_refresh_ms < 100 || self.preclaim_ms < 0 {
            bail!("registry_refresh_ms must be at least 100 and preclaim_ms not negative");
        }
        if !(0..=idgen_core::MAX_WAIT_BEHIND_LIMIT_MS).contains(&self.clock.max_wait_behind_ms)
            || !(0..=10_000).contains(&self.clock.max_error_ms)
        {
            bail!("clock.max_wait_behind_ms must be 0–1000 and clock.max_error_ms 0–10000");
        }
        // One lease table per layout: two keepers of one process on one table would each see
        // the other's row as their own. A layout the registry adds later gets
        // `idgen-leases-<layout>`, so no configured table may take that name for another layout.
        let mut seen = std::collections::BTreeSet::new();
        for (layout, table) in &self.lease.tables {
            if table == "idgen-genesis" {
                bail!(
                    "lease.tables.{layout} = {table:?}: that name is the SQLite lease file's table of genesis records"
                );
            }
            if table.ends_with("-audit") {
                bail!(
                    "lease.tables.{layout} = {table:?}: names ending in -audit are the audit tables' (<table>-audit)"
                );
            }
            if !seen.insert(table.as_str()) {
                bail!("lease.tables names table {table:?} for two layouts: every layout needs its own");
            }
            if let Some(other) = table.strip_prefix("idgen-leases-")
                && other != layout
            {
                bail!("lease.tables gives layout {layout} the table {table:?}, the default table of layout {other}");
            }
        }
        let schedule = self.schedule();
        for entry in schedule.entries() {
            let layout: &Layout = &entry.layout;
            if !self.lease.tables.contains_key(layout.name()) {
                bail!("lease.tables has no table for layout {}", layout.name());
            }
            self.lease_config()
                .validate(layout)
                .with_context(|| format!("lease settings for layout {}", layout.name()))?;
            if self.registry_url.is_none() && layout.region_bits() > 0 && self.region_number() > layout.max_region() {
                bail!(
                    "region_number {} does not fit layout {} (0–{})",
                    self.region_number(),
                    layout.name(),
                    layout.max_region()
                );
            }
        }
        idgen_core::GeneratorConfig {
            fence_ms: self.lease.fence_ms,
            max_wait_behind_ms: self.clock.max_wait_behind_ms,
        }
        .validate()?;
        self.registry_tls.client_config().context("registry_tls")?;
        Ok(())
    }

    /// The core's settings.
    pub fn core_config(&self) -> idgen_core::GeneratorConfig {
        idgen_core::GeneratorConfig { fence_ms: self.lease.fence_ms, max_wait_behind_ms: self.clock.max_wait_behind_ms }
    }
}

/// The lease table of `layout` as the configuration describes it (created first when
/// `lease.create_tables` is set, or always for SQLite, whose tables are part of its file).
pub async fn open_lease_store(config: &GeneratorConfig, layout: &str) -> anyhow::Result<Arc<dyn LeaseStore>> {
    open_store(config, layout, true).await
}

/// [`open_lease_store`] for an operator's command: a DynamoDB audit table that does not exist
/// is only warned about (the command's records wait in the audit spool), so that a quarantine
/// is never held up by the audit table. A generator's start refuses it instead.
pub async fn open_lease_store_for_operator(
    config: &GeneratorConfig,
    layout: &str,
) -> anyhow::Result<Arc<dyn LeaseStore>> {
    open_store(config, layout, false).await
}

async fn open_store(
    config: &GeneratorConfig,
    layout: &str,
    #[cfg_attr(not(feature = "dynamodb"), allow(unused_variables))] audit_required: bool,
) -> anyhow::Result<Arc<dyn LeaseStore>> {
    // A layout the registry added later (v3, …) gets `idgen-leases-<layout>` unless configured.
    let table = config.table_for(layout)?;
    match config.store_kind() {
        #[cfg(feature = "sqlite")]
        StoreKind::Sqlite => open_sqlite(config, &table).await,
        #[cfg(feature = "dynamodb")]
        StoreKind::Dynamodb => open_dynamodb(config, &table, audit_required).await,
        #[allow(unreachable_patterns)]
        kind => bail!("cannot open lease table {table}: this build of idgen has no {kind:?} support (a cargo feature)"),
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(config: &GeneratorConfig, table: &str) -> anyhow::Result<Arc<dyn LeaseStore>> {
    let path = &config.sqlite_path();
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let within = std::time::Duration::from_millis(config.lease.sqlite_open_timeout_ms);
    let store = crate::lease::sqlite::SqliteLeaseStore::open_waiting(path, table, within)
        .await
        .with_context(|| format!("opening lease table {table} in {}", path.display()))?;
    Ok(Arc::new(store))
}

#[cfg(feature = "dynamodb")]
async fn open_dynamodb(
    config: &GeneratorConfig,
    table: &str,
    audit_required: bool,
) -> anyhow::Result<Arc<dyn LeaseStore>> {
    use crate::lease::dynamodb::DynamoDbLeaseStore;
    // An operator's command is one-off and may scan a whole table: patient timeouts, where a
    // generator's lease writes keep the configured ones.
    let settings = match audit_required {
        true => config.lease.dynamodb.settings(),
        false => config.lease.dynamodb.settings().patient(),
    };
    if config.lease.create_tables {
        let creator = DynamoDbLeaseStore::new(crate::lease::dynamodb::client(&settings.patient()).await, table);
        creator
            .create_tables()
            .await
            .with_context(|| format!("creating DynamoDB tables {table} and {}", creator.audit_table()))?;
    }
    let store = DynamoDbLeaseStore::new(crate::lease::dynamodb::client(&settings).await, table);
    let configured = config.audit_spool_dir();
    let (store, spool) = match store.clone().with_audit_spool(&configured) {
        Ok(store) => (store, configured),
        Err(error) if audit_required => {
            return Err(error).with_context(|| {
                format!("the audit spool directory {} (lease.dynamodb.audit_spool)", configured.display())
            });
        }
        // An operator's command runs as the operator, who may not write the workers' spool
        // (/var/lib/idgen belongs to the idgen user): their own spool, which their next
        // `idgen leases` command replays.
        Err(error) => {
            let own = std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state/idgen/audit-spool"));
            match own.as_deref().map(|dir| (dir, store.clone().with_audit_spool(dir))) {
                Some((dir, Ok(store))) => {
                    tracing::warn!(%error, configured = %configured.display(), spool = %dir.display(), "cannot write the configured audit spool: this command's records would wait in the operator's own");
                    (store, dir.to_owned())
                }
                _ => {
                    tracing::warn!(%error, configured = %configured.display(), "no audit spool: a record the audit table refuses is only logged");
                    (store, configured)
                }
            }
        }
    };
    match store.verify_lease_table().await {
        Ok(()) => {}
        Err(error @ crate::StoreError::Unavailable(_)) => {
            tracing::warn!(%error, table, "lease table unreachable at start-up: claiming once it answers")
        }
        Err(error) => {
            return Err(error).with_context(|| format!("lease table {table} in region {}", settings.region));
        }
    }
    let audit = store.audit_table().to_owned();
    match store.verify_audit_table().await {
        Ok(()) => {}
        Err(error @ crate::StoreError::Unavailable(_)) => {
            tracing::warn!(%error, table = audit, "audit table unreachable: its records wait in the audit spool")
        }
        Err(error @ crate::StoreError::Misconfigured(_)) if !audit_required => {
            tracing::warn!(%error, table = audit, spool = %spool.display(), "no audit table: the records of this command's changes wait in the audit spool")
        }
        Err(error) => {
            return Err(error).with_context(|| format!("audit table {audit} in region {}", settings.region));
        }
    }
    Ok(Arc::new(store))
}

/// `url` with its password (if any) replaced by `***`, for messages and logs: a database URL
/// in an error must not carry its credentials.
pub fn redacted_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let hidden = base.split_once("://").and_then(|(scheme, rest)| {
        let (credentials, host) = rest.rsplit_once('@')?;
        let (user, _password) = credentials.split_once(':')?;
        Some(format!("{scheme}://{user}:***@{host}"))
    });
    let base = hidden.unwrap_or_else(|| base.to_owned());
    let Some(query) = query else { return base };
    // A secret may be a parameter too (libpq's `password`, `sslpassword`, a token).
    let secret = |key: &str| {
        let key = key.to_ascii_lowercase();
        ["password", "passwd", "pass", "secret", "token"].iter().any(|word| key.contains(word))
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if secret(key) => format!("{key}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

#[cfg(test)]
mod redaction_tests {
    use super::redacted_url;

    #[test]
    fn a_password_never_survives_redaction() {
        assert_eq!(redacted_url("postgres://app:s3cret@db:5432/ids"), "postgres://app:***@db:5432/ids");
        assert_eq!(redacted_url("postgres://app:p@ss:w@db/ids"), "postgres://app:***@db/ids");
        assert_eq!(redacted_url("postgres://app@db/ids"), "postgres://app@db/ids");
        assert_eq!(redacted_url("sqlite://.idgen/registry.db"), "sqlite://.idgen/registry.db");
        // A password given as a query parameter, or in both places.
        assert_eq!(
            redacted_url("postgres://app@db/ids?sslmode=verify-full&password=s3cret"),
            "postgres://app@db/ids?sslmode=verify-full&password=***"
        );
        assert_eq!(
            redacted_url("postgres://app:a@db/ids?PassWord=x@y&sslpassword=k&application_name=idgen"),
            "postgres://app:***@db/ids?PassWord=***&sslpassword=***&application_name=idgen"
        );
    }
}
