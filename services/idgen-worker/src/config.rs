//! The worker's configuration: one file plus environment, parsed and validated once in `main`.
//!
//! Everything about the generator (region, registry, leases, clock) is the library's
//! [`GeneratorConfig`], the same keys an embedded generator reads; the worker adds its listener:
//! `listen`, `health_listen`, `shutdown_grace_ms`, `[tls]`, `[quotas]` and `[limits]`. Environment variables override the
//! file: `IDGEN_WORKER_LISTEN=127.0.0.1:9000`, `IDGEN_WORKER_LEASE__FENCE_MS=5000` (a double
//! underscore enters a section).

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::path::Path;

use anyhow::Context;
use idgen::config::{GeneratorConfig, Role};
use idgen_server::{LimitsSection, QuotaSection, TlsSection};
use serde::Deserialize;

pub use idgen::config::{StoreKind, development_defaults};

/// The keys of the configuration that are the worker's own; every other key is the generator's.
const WORKER_KEYS: [&str; 6] = ["listen", "health_listen", "shutdown_grace_ms", "tls", "quotas", "limits"];

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Address to listen on; port 0 picks a free port (printed at start-up).
    pub listen: SocketAddr,
    /// The plain health listener, if any: its own port, no TLS, only `GET /healthz` (the same
    /// answer as the worker's own `/healthz`), for a load balancer that cannot present a client
    /// certificate.
    pub health_listen: Option<SocketAddr>,
    /// How long to let in-flight requests finish on shutdown before releasing the lease anyway.
    pub shutdown_grace_ms: u64,
    /// The listener's certificate and key, and the CA of client certificates (mutual TLS, the
    /// caller's identity). Required in production; re-read on SIGHUP.
    pub tls: TlsSection,
    /// IDs per second per caller; re-read on SIGHUP.
    pub quotas: QuotaSection,
    /// What a peer may hold of each listener: a connection cap and the deadlines.
    pub limits: LimitsSection,
    /// The generator the worker serves (its role: fleet, machine numbers 0–63 by default).
    pub generator: GeneratorConfig,
}

/// The worker's own keys.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
struct ListenerSection {
    /// Address to listen on; port 0 picks a free port (printed at start-up).
    listen: SocketAddr,
    /// The plain health listener, if any: its own port, no TLS, only `GET /healthz` (the same
    /// answer as the worker's own `/healthz`), for a load balancer that cannot present a client
    /// certificate.
    health_listen: Option<SocketAddr>,
    /// How long to let in-flight requests finish on shutdown before releasing the lease anyway.
    shutdown_grace_ms: u64,
    /// The listener's certificate and key, and the CA of client certificates (mutual TLS, the
    /// caller's identity). Required in production; re-read on SIGHUP.
    tls: TlsSection,
    /// IDs per second per caller; re-read on SIGHUP.
    quotas: QuotaSection,
    /// What a peer may hold of each listener: a connection cap and the deadlines.
    limits: LimitsSection,
}

impl Default for ListenerSection {
    fn default() -> Self {
        ListenerSection {
            listen: SocketAddr::from(([127, 0, 0, 1], 8701)),
            health_listen: None,
            shutdown_grace_ms: 10_000,
            tls: TlsSection::default(),
            quotas: QuotaSection::default(),
            limits: LimitsSection::default(),
        }
    }
}

impl Deref for WorkerConfig {
    type Target = GeneratorConfig;
    fn deref(&self) -> &GeneratorConfig {
        &self.generator
    }
}

impl DerefMut for WorkerConfig {
    fn deref_mut(&mut self) -> &mut GeneratorConfig {
        &mut self.generator
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig::with(GeneratorConfig::default())
    }
}

impl WorkerConfig {
    /// The worker's defaults around `generator`, which becomes a fleet generator.
    pub fn with(generator: GeneratorConfig) -> Self {
        let ListenerSection { listen, health_listen, shutdown_grace_ms, tls, quotas, limits } =
            ListenerSection::default();
        WorkerConfig {
            listen,
            health_listen,
            shutdown_grace_ms,
            tls,
            quotas,
            limits,
            generator: GeneratorConfig { role: Role::Fleet, ..generator },
        }
    }

    /// The keys of a worker's file: the listener's and the generator's, from their own source.
    pub fn keys() -> idgen::config::file::Keys {
        idgen::config::file::Keys::of::<ListenerSection>().and::<GeneratorConfig>()
    }

    /// `--print-config`: every key of a worker's file, with its default, unit and description.
    pub fn print() -> String {
        WorkerConfig::keys().print(
            "idgen worker: the fleet worker's configuration file (--config FILE).\n\
             IDGEN_WORKER_<KEY> and IDGEN_WORKER_<SECTION>__<KEY> override it, e.g. IDGEN_WORKER_LEASE__FENCE_MS=5000.",
        )
    }

    /// Development mode with nothing else set: what `idgen up` and the tests start from.
    pub fn development() -> Self {
        WorkerConfig::with(GeneratorConfig::development())
    }

    /// Reads the optional file, then the environment (`IDGEN_WORKER_…`), then validates.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        if let Some(file) = file {
            WorkerConfig::keys().check_file(file, Some("idgen worker --print-config"))?;
        }
        let raw: config::Map<String, config::Value> = idgen::config::sources(file, "IDGEN_WORKER")?
            .try_deserialize()
            .context("parsing the worker configuration")?;
        let (mut own, mut generator) = (config::Map::new(), config::Map::new());
        for (key, value) in raw {
            if WORKER_KEYS.contains(&key.as_str()) {
                own.insert(key, value)
            } else {
                generator.insert(key, value)
            };
        }
        let table = |map| config::Value::new(None, config::ValueKind::from(map));
        let own: ListenerSection = table(own).try_deserialize().context("parsing the worker configuration")?;
        let generator: GeneratorConfig =
            table(generator).try_deserialize().context("parsing the worker configuration")?;
        let ListenerSection { listen, health_listen, shutdown_grace_ms, tls, quotas, limits } = own;
        let config = WorkerConfig {
            listen,
            health_listen,
            shutdown_grace_ms,
            tls,
            quotas,
            limits,
            generator: GeneratorConfig { role: Role::Fleet, ..generator },
        };
        config.validate()?;
        Ok(config)
    }

    /// What a production worker must be told, and is not: the generator's settings, and mutual
    /// TLS on the listener. Empty in development mode.
    pub fn missing_for_production(&self) -> Vec<String> {
        let mut missing = self.generator.missing_for_production();
        if !self.development {
            missing.extend(self.tls.missing_for_production());
        }
        missing
    }

    /// `--check-config`: the configuration is valid (it was validated when loaded) and its TLS
    /// files load; returns what the worker would run with, one line each.
    pub fn check(&self) -> anyhow::Result<Vec<String>> {
        let listener = self.tls.check()?;
        let store = match self.lease.store {
            Some(StoreKind::Dynamodb) => format!(
                "DynamoDB in {}",
                self.lease.dynamodb.region.as_deref().unwrap_or(development_defaults::DYNAMODB_REGION)
            ),
            Some(StoreKind::Sqlite) | None => format!("SQLite at {}", self.sqlite_path().display()),
        };
        let lease = self.lease_config();
        let tables: Vec<String> =
            self.lease.tables.iter().map(|(layout, table)| format!("{layout}: {table}")).collect();
        Ok(vec![
            format!("mode: {}", if self.development { "DEVELOPMENT" } else { "production" }),
            format!("region: {}", self.region()),
            format!(
                "registry: {}",
                self.registry_url.as_deref().unwrap_or("none: the built-in schedule (development only)")
            ),
            format!("lease store: {store}; tables {}", tables.join(", ")),
            format!(
                "leases: {} ms, renewed every {} ms, fence {} ms; machine numbers from {} to {}",
                lease.lease_ms,
                lease.renew_interval_ms,
                lease.fence_ms,
                lease.machines.first,
                lease.machines.last.map_or("the layout's last".to_owned(), |last| last.to_string())
            ),
            format!(
                "clock: {}; {}",
                if self.clock.require_sync { "must be synchronized" } else { "NOT CHECKED" },
                if !self.clock.cpu_counter {
                    "read for every ID (cpu_counter = false)"
                } else if idgen::Clock::follows_cpu_counter(&idgen::SystemClock::new(false, 0)) {
                    "kept on the CPU's counter here (clocksource tsc): the request path checks the counter"
                } else {
                    "read for every ID (no TSC clocksource here)"
                }
            ),
            format!("listener: {} on {}", listener, self.listen),
            idgen_server::limits::describe_health_listen(self.health_listen),
            self.limits.describe(),
        ])
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        idgen::config::refuse_missing(self.missing_for_production())?;
        self.generator.validate_settings()?;
        self.tls.validate()?;
        self.tls.refuse_operator_ca("the worker")?;
        self.quotas.validate()?;
        self.limits.validate()?;
        idgen_server::limits::validate_health_listen(self.listen, self.health_listen)?;
        Ok(())
    }
}

impl idgen_server::ServiceConfig for WorkerConfig {
    const SERVICE: &'static str = "worker";

    fn print() -> String {
        WorkerConfig::print()
    }

    fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        WorkerConfig::load(file)
    }

    fn check(&self) -> anyhow::Result<Vec<String>> {
        WorkerConfig::check(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idgen::core::Layout;

    /// `--print-config` comes from the config structs' doc comments: every key has one, and the
    /// printed file, read back (in development mode), is the defaults.
    #[test]
    fn every_key_is_documented_and_the_printed_file_reads_back_as_the_defaults() {
        assert_eq!(WorkerConfig::keys().undocumented(), Vec::<String>::new());
        let printed = WorkerConfig::print();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("printed.toml");
        std::fs::write(&path, printed.replacen("development = false", "development = true", 1)).unwrap();
        let read = WorkerConfig::load(Some(&path)).unwrap();
        assert_eq!(format!("{read:?}"), format!("{:?}", WorkerConfig::development()), "{printed}");
    }

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
            "registry_url = \"https://registry.idgen.internal:8700\"\nregion = \"eu-west-1\"\nhome_region = false\n\
             schedule_cache = {cache:?}\n[lease]\nstore = \"dynamodb\"\n[lease.dynamodb]\nregion = \"eu-west-1\"\n\
             [tls]\ncert = \"/etc/idgen/tls/worker.pem\"\nkey = \"/etc/idgen/tls/worker-key.pem\"\n\
             client_ca = \"/etc/idgen/tls/ca.pem\"\nmetrics_readers = [\"spiffe://idgen.internal/idgen/metrics\"]\n"
        );
        load(dir.path(), &production).unwrap();
        for (line, named) in [
            ("registry_url = \"https://registry.idgen.internal:8700\"\n", "registry_url"),
            ("home_region = false\n", "home_region"),
            ("region = \"eu-west-1\"\nhome", "region"),
        ] {
            let text = production.replacen(line, if line.ends_with("home") { "home" } else { "" }, 1);
            let error = format!("{:#}", load(dir.path(), &text).unwrap_err());
            assert!(error.contains(named), "{named}: {error}");
        }
        // A plain-HTTP registry: the schedule (the layout and region bits of every ID) could be
        // changed on the way. Production reads it over https only, loopback included.
        for plain in ["http://registry.idgen.internal:8700", "http://127.0.0.1:8700"] {
            let text = production.replace("https://registry.idgen.internal:8700", plain);
            let error = format!("{:#}", load(dir.path(), &text).unwrap_err());
            assert!(error.contains("use https://"), "{plain}: {error}");
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
