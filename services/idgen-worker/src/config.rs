//! The worker's configuration: one file plus environment, parsed and validated once in `main`.
//!
//! Environment variables override the file: `IDGEN_WORKER_LISTEN=127.0.0.1:9000`,
//! `IDGEN_WORKER_LEASE__FENCE_MS=5000` (a double underscore enters a section).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use idgen::LeaseConfig;
use idgen::core::{Layout, OPEN_HORIZON, Schedule};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Address to listen on; port 0 picks a free port (printed at start-up).
    pub listen: SocketAddr,
    /// This region's name and number (the registry assigns them; see issue 4).
    pub region: String,
    pub region_number: u32,
    /// Only the home region may issue under layouts without a region field (v1).
    pub home_region: bool,
    /// The name in this worker's lease rows, instead of the host name. The process id and start
    /// time are always appended (`<name>/pid-<pid>/<start ms>`), so processes sharing one
    /// configuration file are still different holders.
    pub holder: Option<String>,
    /// How long to let in-flight requests finish on shutdown before releasing the lease anyway.
    pub shutdown_grace_ms: u64,
    /// The region registry. When set, the region number, the schedule and the home region come
    /// from it (and `region_number`/`home_region` above are ignored); when unset, the worker
    /// uses those and the default schedule.
    pub registry_url: Option<String>,
    /// The last good copy of the registry's answer (default `.idgen/schedule-<region>.json`).
    pub schedule_cache: Option<PathBuf>,
    pub registry_refresh_ms: u64,
    /// How long before a cutover to claim a machine number under the next layout.
    pub preclaim_ms: i64,
    pub lease: LeaseSection,
    pub clock: ClockSection,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Sqlite,
    Dynamodb,
}

/// Where the DynamoDB lease tables are.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DynamoDbSection {
    pub region: String,
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
            region: defaults.region,
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
            region: self.region.clone(),
            endpoint: self.endpoint.clone(),
            attempt_timeout: std::time::Duration::from_millis(self.attempt_timeout_ms),
            operation_timeout: std::time::Duration::from_millis(self.operation_timeout_ms),
            max_attempts: self.max_attempts,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseSection {
    pub store: StoreKind,
    pub sqlite_path: PathBuf,
    pub dynamodb: DynamoDbSection,
    /// Create missing lease and audit tables at start-up (development; production creates them
    /// once with `idgen leases init`).
    pub create_tables: bool,
    /// Lease table per layout.
    pub tables: BTreeMap<String, String>,
    pub lease_ms: i64,
    pub renew_interval_ms: i64,
    pub fence_ms: i64,
    pub first_machine: u32,
    pub last_machine: u32,
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
            listen: SocketAddr::from(([127, 0, 0, 1], 8701)),
            region: "local".into(),
            region_number: 0,
            home_region: true,
            holder: None,
            shutdown_grace_ms: 10_000,
            registry_url: None,
            schedule_cache: None,
            registry_refresh_ms: 30_000,
            preclaim_ms: 7 * 86_400_000,
            lease: LeaseSection::default(),
            clock: ClockSection::default(),
        }
    }
}

impl Default for LeaseSection {
    fn default() -> Self {
        let defaults = LeaseConfig::default();
        LeaseSection {
            store: StoreKind::Sqlite,
            sqlite_path: PathBuf::from(".idgen/leases.db"),
            dynamodb: DynamoDbSection::default(),
            create_tables: false,
            tables: BTreeMap::from([("v1".into(), "idgen-leases".into()), ("v2".into(), "idgen-leases-v2".into())]),
            lease_ms: defaults.lease_ms,
            renew_interval_ms: defaults.renew_interval_ms,
            fence_ms: defaults.fence_ms,
            first_machine: *defaults.machines.start(),
            last_machine: *defaults.machines.end(),
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

    /// The schedule this worker issues under. Until the registry publishes one (issue 4), the
    /// default: v1 from the epoch, v2 from 2028-01-01, no cutover promised after that.
    pub fn schedule(&self) -> Schedule {
        Schedule::default_with_horizon(OPEN_HORIZON).expect("the default schedule is valid")
    }

    pub fn schedule_cache_path(&self) -> PathBuf {
        self.schedule_cache.clone().unwrap_or_else(|| PathBuf::from(format!(".idgen/schedule-{}.json", self.region)))
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
        LeaseConfig {
            lease_ms: self.lease.lease_ms,
            renew_interval_ms: self.lease.renew_interval_ms,
            fence_ms: self.lease.fence_ms,
            machines: self.lease.first_machine..=self.lease.last_machine,
            max_backoff_ms: self.lease.max_backoff_ms,
        }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.lease.store == StoreKind::Dynamodb {
            let d = &self.lease.dynamodb;
            if d.region.trim().is_empty()
                || d.attempt_timeout_ms == 0
                || d.operation_timeout_ms < d.attempt_timeout_ms
                || d.max_attempts == 0
            {
                bail!(
                    "lease.dynamodb needs a region, attempt_timeout_ms > 0, operation_timeout_ms ≥ attempt_timeout_ms and max_attempts ≥ 1"
                );
            }
        }
        if self.region.trim().is_empty() {
            bail!("region must not be empty");
        }
        if self.registry_refresh_ms < 100 || self.preclaim_ms < 0 {
            bail!("registry_refresh_ms must be at least 100 and preclaim_ms not negative");
        }
        if !(0..=1_000).contains(&self.clock.max_wait_behind_ms) || !(0..=10_000).contains(&self.clock.max_error_ms) {
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
            if layout.region_bits() > 0 && self.region_number > layout.max_region() {
                bail!(
                    "region_number {} does not fit layout {} (0–{})",
                    self.region_number,
                    layout.name(),
                    layout.max_region()
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_spec_defaults_and_valid() {
        let config = WorkerConfig::default();
        config.validate().unwrap();
        let lease = config.lease_config();
        assert_eq!((lease.lease_ms, lease.renew_interval_ms, lease.fence_ms), (300_000, 10_000, 5_000));
        assert_eq!(lease.machines, 0..=63);
        assert!(config.clock.require_sync, "production default requires a synchronized clock");
    }

    #[test]
    fn file_and_environment_are_read_and_validated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:0\"\n[lease]\nfence_ms = 200\nrenew_interval_ms = 1000\nlease_ms = 3000\n",
        )
        .unwrap();
        let config = WorkerConfig::load(Some(&path)).unwrap();
        assert_eq!(config.lease.fence_ms, 200);

        std::fs::write(&path, "[lease]\nfence_ms = 20000\n").unwrap();
        let error = format!("{:#}", WorkerConfig::load(Some(&path)).unwrap_err());
        assert!(error.contains("fence"), "{error}");

        std::fs::write(&path, "[lease]\nlast_machine = 1024\n").unwrap();
        assert!(WorkerConfig::load(Some(&path)).is_err(), "machine 1024 does not fit v1");

        std::fs::write(
            &path,
            "[lease]\nstore = \"dynamodb\"\n[lease.dynamodb]\nendpoint = \"http://127.0.0.1:5000\"\n",
        )
        .unwrap();
        let config = WorkerConfig::load(Some(&path)).unwrap();
        assert_eq!(config.lease.store, StoreKind::Dynamodb);
        assert_eq!(config.lease.dynamodb.settings().endpoint.as_deref(), Some("http://127.0.0.1:5000"));

        std::fs::write(&path, "[lease]\nlease_ms = 20000\nrenew_interval_ms = 16000\nfence_ms = 5000\n").unwrap();
        let error = format!("{:#}", WorkerConfig::load(Some(&path)).unwrap_err());
        assert!(error.contains("2 × renew interval ≤ lease − fence"), "one failed renewal would stop issuing: {error}");

        std::fs::write(&path, "[lease.tables]\nv1 = \"leases\"\nv2 = \"leases\"\n").unwrap();
        let error = format!("{:#}", WorkerConfig::load(Some(&path)).unwrap_err());
        assert!(error.contains("for two layouts"), "{error}");
        std::fs::write(&path, "[lease.tables]\nv1 = \"idgen-leases\"\nv2 = \"idgen-leases-audit\"\n").unwrap();
        let error = format!("{:#}", WorkerConfig::load(Some(&path)).unwrap_err());
        assert!(error.contains("audit tables"), "{error}");
        assert!(WorkerConfig::default().table_for("audit").is_err(), "idgen-leases-audit is v1's audit table");
        assert_eq!(WorkerConfig::default().table_for("v3").unwrap(), "idgen-leases-v3");
        std::fs::write(&path, "[lease.tables]\nv1 = \"idgen-leases-v3\"\nv2 = \"idgen-leases-v2\"\n").unwrap();
        let error = format!("{:#}", WorkerConfig::load(Some(&path)).unwrap_err());
        assert!(error.contains("default table of layout v3"), "{error}");

        std::fs::write(&path, "lisen = \"127.0.0.1:1\"\n").unwrap();
        assert!(WorkerConfig::load(Some(&path)).is_err(), "typos are errors, not silently ignored");
    }
}
