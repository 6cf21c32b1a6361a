//! The worker's configuration: one file plus environment, parsed and validated once in `main`.
//!
//! Environment variables override the file: `IDGEN_WORKER_LISTEN=127.0.0.1:9000`,
//! `IDGEN_WORKER_LEASE__FENCE_MS=5000` (a double underscore enters a section).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use idgen::core::{Layout, OPEN_HORIZON, Schedule};
use idgen::{LeaseConfig, MachineRanges};
use idgen_server::{ClientTlsSection, QuotaSection, TlsSection};
use serde::Deserialize;

/// What development mode fills in when the configuration leaves it out. Outside development mode
/// every one of these must be configured: a production worker never improvises them.
pub mod development_defaults {
    pub const REGION: &str = "local";
    pub const REGION_NUMBER: u32 = 0;
    pub const HOME_REGION: bool = true;
    pub const SQLITE_PATH: &str = ".idgen/leases.db";
    pub const DYNAMODB_REGION: &str = "us-east-1";
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Development mode: what is not configured gets a local default (a SQLite file under
    /// `.idgen/`, region `local` as the home region, the built-in schedule when there is no
    /// registry) and the clock-sync check may be switched off. Said at start-up and in `/healthz`.
    /// Off by default: a production worker refuses to start with any of those left out.
    pub development: bool,
    /// Address to listen on; port 0 picks a free port (printed at start-up).
    pub listen: SocketAddr,
    /// This region's name; the registry gives its number.
    pub region: Option<String>,
    /// Without a registry (development only), this region's number.
    pub region_number: Option<u32>,
    /// Whether this is the home region, the only one that issues under layouts without a region
    /// field (v1). Required in production, and checked against the registry's answer.
    pub home_region: Option<bool>,
    /// The name in this worker's lease rows, instead of the host name. The process id, start
    /// time and a per-process random part are always appended, so processes sharing one
    /// configuration file are still different holders.
    pub holder: Option<String>,
    /// How long to let in-flight requests finish on shutdown before releasing the lease anyway.
    pub shutdown_grace_ms: u64,
    /// The region registry: where the region number, the schedule and the home region come
    /// from. Required in production; without it (development only) the worker uses
    /// `region_number`, `home_region` and the built-in schedule with an open horizon.
    pub registry_url: Option<String>,
    /// The last good copy of the registry's answer (development default
    /// `.idgen/schedule-<region>.json`; production: required, an absolute path).
    pub schedule_cache: Option<PathBuf>,
    pub registry_refresh_ms: u64,
    /// How long before a cutover to claim a machine number under the next layout.
    pub preclaim_ms: i64,
    pub lease: LeaseSection,
    pub clock: ClockSection,
    /// The listener's certificate and key, and the CA of client certificates (mutual TLS, the
    /// caller's identity). Required in production; re-read on SIGHUP.
    pub tls: TlsSection,
    /// IDs per second per caller; re-read on SIGHUP.
    pub quotas: QuotaSection,
    /// How to reach an `https://` registry: the CA to trust, the client certificate to present.
    pub registry_tls: ClientTlsSection,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Sqlite,
    Dynamodb,
}

/// Where the DynamoDB lease tables are.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DynamoDbSection {
    /// The AWS region of the tables (required in production).
    pub region: Option<String>,
    /// Unset for AWS; e.g. `http://127.0.0.1:5000` for a local DynamoDB-protocol server.
    pub endpoint: Option<String>,
    pub attempt_timeout_ms: u64,
    pub operation_timeout_ms: u64,
    pub max_attempts: u32,
}

impl Default for DynamoDbSection {
    fn default() -> Self {
        let defaults = idgen::DynamoDbSettings::default();
        DynamoDbSection {
            region: None,
            endpoint: defaults.endpoint,
            attempt_timeout_ms: defaults.attempt_timeout.as_millis() as u64,
            operation_timeout_ms: defaults.operation_timeout.as_millis() as u64,
            max_attempts: defaults.max_attempts,
        }
    }
}

impl DynamoDbSection {
    pub fn settings(&self) -> idgen::DynamoDbSettings {
        idgen::DynamoDbSettings {
            region: self.region.clone().unwrap_or_else(|| development_defaults::DYNAMODB_REGION.into()),
            endpoint: self.endpoint.clone(),
            attempt_timeout: std::time::Duration::from_millis(self.attempt_timeout_ms),
            operation_timeout: std::time::Duration::from_millis(self.operation_timeout_ms),
            max_attempts: self.max_attempts,
        }
    }
}

/// One layout's machine-number range, `[lease.machines.v2] first = 0, last = 63`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MachineRangeSection {
    pub first: u32,
    pub last: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseSection {
    /// `sqlite` or `dynamodb` (required in production).
    pub store: Option<StoreKind>,
    /// The SQLite lease file: an absolute path on a local filesystem in production.
    pub sqlite_path: Option<PathBuf>,
    pub dynamodb: DynamoDbSection,
    /// Create missing DynamoDB lease and audit tables at start-up (development only; production
    /// creates them once with `idgen leases init`).
    pub create_tables: bool,
    /// Lease table per layout.
    pub tables: BTreeMap<String, String>,
    pub lease_ms: i64,
    pub renew_interval_ms: i64,
    pub fence_ms: i64,
    /// The machine-number range of every layout not listed in `machines` (fleet workers: 0–63).
    pub first_machine: u32,
    pub last_machine: u32,
    /// Per-layout ranges.
    pub machines: BTreeMap<String, MachineRangeSection>,
    pub max_backoff_ms: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClockSection {
    /// Refuse to issue unless the kernel reports the clock synchronized. Off only in development.
    pub require_sync: bool,
    pub max_error_ms: i64,
    /// A clock this far behind the last issued timestamp is waited out; further, refused.
    pub max_wait_behind_ms: i64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            development: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 8701)),
            region: None,
            region_number: None,
            home_region: None,
            holder: None,
            shutdown_grace_ms: 10_000,
            registry_url: None,
            schedule_cache: None,
            registry_refresh_ms: 30_000,
            preclaim_ms: 7 * 86_400_000,
            lease: LeaseSection::default(),
            clock: ClockSection::default(),
            tls: TlsSection::default(),
            quotas: QuotaSection::default(),
            registry_tls: ClientTlsSection::default(),
        }
    }
}

impl Default for LeaseSection {
    fn default() -> Self {
        let defaults = LeaseConfig::default();
        let fleet = MachineRanges::fleet();
        LeaseSection {
            store: None,
            sqlite_path: None,
            dynamodb: DynamoDbSection::default(),
            create_tables: false,
            tables: BTreeMap::from([("v1".into(), "idgen-leases".into()), ("v2".into(), "idgen-leases-v2".into())]),
            lease_ms: defaults.lease_ms,
            renew_interval_ms: defaults.renew_interval_ms,
            fence_ms: defaults.fence_ms,
            first_machine: fleet.first,
            last_machine: fleet.last.unwrap_or(63),
            machines: BTreeMap::new(),
            max_backoff_ms: defaults.max_backoff_ms,
        }
    }
}

impl Default for ClockSection {
    fn default() -> Self {
        ClockSection { require_sync: true, max_error_ms: 5, max_wait_behind_ms: 5 }
    }
}

impl WorkerConfig {
    /// Development mode with nothing else set: what `idgen up` and the tests start from.
    pub fn development() -> Self {
        WorkerConfig { development: true, ..WorkerConfig::default() }
    }

    /// Reads the optional file, then the environment (`IDGEN_WORKER_…`), then validates.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let mut builder = config::Config::builder();
        if let Some(file) = file {
            builder = builder.add_source(config::File::from(file).required(true));
        }
        let config: WorkerConfig = builder
            .add_source(
                config::Environment::with_prefix("IDGEN_WORKER")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()
            .context("reading the worker configuration")?
            .try_deserialize()
            .context("parsing the worker configuration")?;
        config.validate()?;
        Ok(config)
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

    /// The schedule a worker without a registry issues under (development only): v1 from the
    /// epoch, v2 from 2028-01-01, and no horizon — so nothing guards it against a layout the
    /// registry added. Production workers always take the registry's.
    pub fn schedule(&self) -> Schedule {
        Schedule::default_with_horizon(OPEN_HORIZON).expect("the default schedule is valid")
    }

    pub fn schedule_cache_path(&self) -> PathBuf {
        self.schedule_cache.clone().unwrap_or_else(|| PathBuf::from(format!(".idgen/schedule-{}.json", self.region())))
    }

    /// The lease table of a layout: configured, or `idgen-leases-<layout>` for layouts added later.
    pub fn table_for(&self, layout: &str) -> anyhow::Result<String> {
        if let Some(table) = self.lease.tables.get(layout) {
            return Ok(table.clone());
        }
        let table = format!("idgen-leases-{layout}");
        if table.ends_with("-audit") {
            bail!(
                "layout {layout}'s default table {table} would be an audit table's name: configure lease.tables.{layout}"
            );
        }
        Ok(table)
    }

    pub fn lease_config(&self) -> LeaseConfig {
        let mut machines = MachineRanges::everywhere(self.lease.first_machine..=self.lease.last_machine);
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

    /// What a production worker must be told, and is not. Empty in development mode.
    fn missing_for_production(&self) -> Vec<String> {
        if self.development {
            return Vec::new();
        }
        let mut missing = Vec::new();
        let mut need = |what: &str| missing.push(what.to_owned());
        if self.registry_url.is_none() {
            need("registry_url (the region number and the schedule come from the registry)");
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
        if self.lease.create_tables {
            need("no lease.create_tables (development only; production runs `idgen leases init` once)");
        }
        if !self.clock.require_sync {
            need("clock.require_sync = true (it may be off in development only)");
        }
        if !(self.tls.cert.is_some() && self.tls.key.is_some() && self.tls.client_ca.is_some()) {
            need("tls.cert, tls.key and tls.client_ca (production listeners use mutual TLS)");
        }
        if self.clock.max_error_ms > 5 || self.clock.max_wait_behind_ms > 5 {
            need(
                "clock.max_error_ms and clock.max_wait_behind_ms of at most 5 (SPEC §3; more is for development only)",
            );
        }
        missing
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let missing = self.missing_for_production();
        if !missing.is_empty() {
            bail!(
                "refusing to start a production worker with settings left to defaults: configure {}. \
                 (For a local try-out, set development = true.)",
                missing.join("; ")
            );
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
        if !(0..=idgen::core::MAX_WAIT_BEHIND_LIMIT_MS).contains(&self.clock.max_wait_behind_ms)
            || !(0..=10_000).contains(&self.clock.max_error_ms)
        {
            bail!("clock.max_wait_behind_ms must be 0–1000 and clock.max_error_ms 0–10000");
        }
        // One lease table per layout: two keepers of one process on one table would each see
        // the other's row as their own. A layout the registry adds later gets
        // `idgen-leases-<layout>`, so no configured table may take that name for another layout.
        let mut seen = std::collections::BTreeSet::new();
        for (layout, table) in &self.lease.tables {
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
        idgen::core::GeneratorConfig {
            fence_ms: self.lease.fence_ms,
            max_wait_behind_ms: self.clock.max_wait_behind_ms,
        }
        .validate()?;
        self.tls.validate()?;
        self.quotas.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(dir: &Path, text: &str) -> anyhow::Result<WorkerConfig> {
        let path = dir.join("worker.toml");
        std::fs::write(&path, text).unwrap();
        WorkerConfig::load(Some(&path))
    }

    #[test]
    fn defaults_are_the_spec_defaults_and_valid_in_development() {
        let config = WorkerConfig::development();
        config.validate().unwrap();
        let lease = config.lease_config();
        assert_eq!((lease.lease_ms, lease.renew_interval_ms, lease.fence_ms), (300_000, 10_000, 5_000));
        assert_eq!(lease.machines.for_layout(&Layout::v1()), 0..=63, "fleet workers take 0–63");
        assert_eq!(lease.machines.for_layout(&Layout::v2()), 0..=63);
        assert!(config.clock.require_sync, "even in development the clock check is on unless switched off");
        assert_eq!((config.region(), config.region_number(), config.home_region()), ("local", 0, true));
    }

    #[test]
    fn a_production_worker_missing_a_line_refuses_to_start_and_says_which() {
        // Before, no configuration at all gave a worker on the built-in schedule with an open
        // horizon, as home region 0, on a SQLite file at a relative path: a private lease table.
        let error = format!("{:#}", WorkerConfig::default().validate().unwrap_err());
        for named in [
            "registry_url",
            "region",
            "home_region",
            "schedule_cache",
            "lease.store",
            "tls.client_ca",
            "development = true",
        ] {
            assert!(error.contains(named), "{named} missing from: {error}");
        }
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("schedule.json");
        let production = format!(
            "registry_url = \"http://127.0.0.1:8700\"\nregion = \"eu-west-1\"\nhome_region = false\n\
             schedule_cache = {cache:?}\n[lease]\nstore = \"dynamodb\"\n[lease.dynamodb]\nregion = \"eu-west-1\"\n\
             [tls]\ncert = \"/etc/idgen/tls/worker.pem\"\nkey = \"/etc/idgen/tls/worker-key.pem\"\n\
             client_ca = \"/etc/idgen/tls/ca.pem\"\n"
        );
        load(dir.path(), &production).unwrap();
        for (line, named) in [
            ("registry_url = \"http://127.0.0.1:8700\"\n", "registry_url"),
            ("home_region = false\n", "home_region"),
            ("region = \"eu-west-1\"\nhome", "region"),
        ] {
            let text = production.replacen(line, if line.ends_with("home") { "home" } else { "" }, 1);
            let error = format!("{:#}", load(dir.path(), &text).unwrap_err());
            assert!(error.contains(named), "{named}: {error}");
        }
        let relative = production.replace("store = \"dynamodb\"", "store = \"sqlite\"\nsqlite_path = \"leases.db\"");
        let error = format!("{:#}", load(dir.path(), &relative).unwrap_err());
        assert!(error.contains("lease.sqlite_path (an absolute path"), "{error}");
        let absolute = relative.replace("\"leases.db\"", &format!("{:?}", dir.path().join("leases.db")));
        load(dir.path(), &absolute).unwrap();
        let error = format!(
            "{:#}",
            load(dir.path(), &production.replace("[lease.dynamodb]\nregion = \"eu-west-1\"\n", "")).unwrap_err()
        );
        assert!(error.contains("lease.dynamodb.region"), "{error}");
        let error =
            format!("{:#}", load(dir.path(), &format!("{production}[clock]\nrequire_sync = false\n")).unwrap_err());
        assert!(error.contains("clock.require_sync"), "{error}");
        let error = format!("{:#}", load(dir.path(), &format!("region_number = 3\n{production}")).unwrap_err());
        assert!(error.contains("no region_number"), "{error}");
        let created = production.replace("store = \"dynamodb\"", "store = \"dynamodb\"\ncreate_tables = true");
        assert!(format!("{:#}", load(dir.path(), &created).unwrap_err()).contains("create_tables"));
        // The same file in development mode needs none of it.
        load(dir.path(), "development = true\n[clock]\nrequire_sync = false\n").unwrap();
    }

    #[test]
    fn machine_ranges_are_per_layout_and_validated() {
        let dir = tempfile::tempdir().unwrap();
        let embedded = "development = true\n[lease.machines.v1]\nfirst = 64\nlast = 1023\n[lease.machines.v2]\nfirst = 64\nlast = 511\n";
        let config = load(dir.path(), embedded).unwrap();
        let lease = config.lease_config();
        assert_eq!(lease.machines.for_layout(&Layout::v1()), 64..=1023);
        assert_eq!(lease.machines.for_layout(&Layout::v2()), 64..=511);
        let error = format!("{:#}", load(dir.path(), &embedded.replace("last = 511", "last = 1023")).unwrap_err());
        assert!(error.contains("layout v2") && error.contains("0–511"), "{error}");
        let error = format!(
            "{:#}",
            load(dir.path(), &embedded.replace("first = 64\nlast = 1023", "first = 9\nlast = 8")).unwrap_err()
        );
        assert!(error.contains("empty"), "{error}");
    }

    #[test]
    fn file_and_environment_are_read_and_validated() {
        let dir = tempfile::tempdir().unwrap();
        let config = load(
            dir.path(),
            "development = true\nlisten = \"127.0.0.1:0\"\n[lease]\nfence_ms = 200\nrenew_interval_ms = 1000\nlease_ms = 3000\n",
        )
        .unwrap();
        assert_eq!(config.lease.fence_ms, 200);

        let error = format!("{:#}", load(dir.path(), "development = true\n[lease]\nfence_ms = 20000\n").unwrap_err());
        assert!(error.contains("fence"), "{error}");

        assert!(
            load(dir.path(), "development = true\n[lease]\nlast_machine = 1024\n").is_err(),
            "1024 does not fit v1"
        );

        let config = load(
            dir.path(),
            "development = true\n[lease]\nstore = \"dynamodb\"\n[lease.dynamodb]\nendpoint = \"http://127.0.0.1:5000\"\n",
        )
        .unwrap();
        assert_eq!(config.store_kind(), StoreKind::Dynamodb);
        assert_eq!(config.lease.dynamodb.settings().endpoint.as_deref(), Some("http://127.0.0.1:5000"));

        let error = format!(
            "{:#}",
            load(
                dir.path(),
                "development = true\n[lease]\nlease_ms = 20000\nrenew_interval_ms = 16000\nfence_ms = 5000\n"
            )
            .unwrap_err()
        );
        assert!(error.contains("2 × renew interval ≤ lease − fence"), "one failed renewal would stop issuing: {error}");

        let error = format!(
            "{:#}",
            load(dir.path(), "development = true\n[lease.tables]\nv1 = \"leases\"\nv2 = \"leases\"\n").unwrap_err()
        );
        assert!(error.contains("for two layouts"), "{error}");
        let error = format!(
            "{:#}",
            load(
                dir.path(),
                "development = true\n[lease.tables]\nv1 = \"idgen-leases\"\nv2 = \"idgen-leases-audit\"\n"
            )
            .unwrap_err()
        );
        assert!(error.contains("audit tables"), "{error}");
        assert!(WorkerConfig::default().table_for("audit").is_err(), "idgen-leases-audit is v1's audit table");
        assert_eq!(WorkerConfig::default().table_for("v3").unwrap(), "idgen-leases-v3");
        let error = format!(
            "{:#}",
            load(
                dir.path(),
                "development = true\n[lease.tables]\nv1 = \"idgen-leases-v3\"\nv2 = \"idgen-leases-v2\"\n"
            )
            .unwrap_err()
        );
        assert!(error.contains("default table of layout v3"), "{error}");

        assert!(load(dir.path(), "development = true\nlisen = \"127.0.0.1:1\"\n").is_err(), "typos are errors");
    }
}
