//! Configuration: a TOML file plus `IDGEN_PUBLIC_IDS_…` environment variables.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use crate::access::AccessSection;
use crate::format::Format;
use crate::store::{FallbackSettings, PoolSettings};
use crate::types::{TypeSection, Types};

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PublicIdsConfig {
    /// Development mode: a SQLite file under `.idgen/` when no database is configured, the
    /// database initialized at start-up, plain HTTP allowed, and the encrypted format's data key
    /// may be a local file (`development_key_file`). Off by default: a production service
    /// refuses to start without its PostgreSQL database, mutual TLS, and a KMS key when it
    /// offers the encrypted format (each named when missing), and never
    /// initializes a database or makes a data key by itself.
    pub development: bool,
    /// Address to listen on; port 0 picks a free port (printed at start-up).
    pub listen: SocketAddr,
    /// The plain health listener, if any: its own port, no TLS, only `GET /healthz` (the same
    /// answer as the service's own `/healthz`), for a load balancer that cannot present a client
    /// certificate.
    pub health_listen: Option<SocketAddr>,
    /// `postgres://…` in production; unset in development: `sqlite://.idgen/public-ids.db`.
    pub database_url: Option<String>,
    /// With a SQLite file: how long a start waits for other processes opening it at once (ms).
    pub sqlite_open_timeout_ms: u64,
    /// PostgreSQL: a read replica of `database_url` (a region's streaming replica, an Aurora
    /// reader). Resolves and lookups read it first; a miss or a failure there is read again on
    /// the primary, so replica lag never answers 404 for a mapping that exists. Creates always go
    /// to the primary. Its pool takes the same size and timeouts.
    pub read_database_url: Option<String>,
    /// PostgreSQL: how many resolves and lookups may read the primary at once after the
    /// replica missed or failed (default 4, at most `database_pool_size`), each caller at most
    /// half of them; more wait up to `database_acquire_timeout_ms`, then are answered 503 with
    /// `Retry-After` and counted, so a flood of unknown public IDs never takes the primary's
    /// connections from creates, nor one caller the reads of the others. With no replica the
    /// primary is where every read goes: half the pool (at least this many), each caller half.
    pub primary_fallback_reads: u32,
    /// With `read_database_url`: a UUIDv7 public ID made longer ago than this (ms, default
    /// 60,000) that the replica does not hold is not found, without asking the primary, while
    /// the replica's measured lag is below it.
    pub replica_lag_bound_ms: u64,
    /// PostgreSQL: the connections the service keeps to its database at most (default 16).
    pub database_pool_size: u32,
    /// PostgreSQL: how long a request waits for a free connection before it is answered 503
    /// with `Retry-After` (ms, default 1,000).
    pub database_acquire_timeout_ms: u64,
    /// PostgreSQL: how long one statement may run (`statement_timeout`, set on every connection)
    /// before it is cancelled and the request answered 503 with `Retry-After` (ms, default 3,000).
    pub database_statement_timeout_ms: u64,
    /// The formats this service offers (default: all three). A request for another is answered
    /// 400 `format_unavailable`.
    pub formats: Vec<String>,
    /// The KMS key that wraps the encrypted format's data keys. Required in production when
    /// `formats` has `encrypted`.
    pub kms: Option<KmsSection>,
    /// Development only, instead of `[kms]`: a local file holding the encrypted format's one data
    /// key (version 1), made on first start (`idgen up` keeps it under `./.idgen/`).
    pub development_key_file: Option<PathBuf>,
    /// The listener's certificate and key, and the CA of client certificates; re-read on SIGHUP.
    pub tls: idgen_server::TlsSection,
    /// Public IDs created or resolved per second, per caller; re-read on SIGHUP.
    pub quotas: idgen_server::QuotaSection,
    /// Who may create, resolve and look up public IDs, by caller identity, per operation and
    /// format; re-read on SIGHUP. Without the section a production service
    /// answers every such request 403 (nobody is listed), a development one answers everybody.
    pub access: Option<AccessSection>,
    /// How often the database is probed (`SELECT 1`, `idgen_public_database_up`), in ms.
    pub database_probe_ms: u64,
    /// How often KMS is probed (`Decrypt` of every stored data key version, as a start does;
    /// `idgen_public_kms_up`), in ms. Only with a `[kms]` key.
    pub kms_probe_ms: u64,
    /// What a peer may hold of each listener: a connection cap and the deadlines.
    pub limits: idgen_server::LimitsSection,
    /// The read cache of stored mappings.
    pub cache: CacheSection,
    /// Typed public IDs: `order = { number = 1, format = "opaque" }` makes
    /// `order_…` public IDs. A number is stored on each mapping in place of the name, so it is
    /// for ever; not re-read on SIGHUP. Empty by default: every public ID is untyped.
    pub types: BTreeMap<String, TypeSection>,
}

/// `[cache]`: how many entries the read cache keeps in memory.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSection {
    /// At most this many entries (a mapping known both ways, resolved and looked up, is two);
    /// 0 turns the cache off. Default 100,000.
    pub max_entries: u64,
}

impl Default for CacheSection {
    fn default() -> Self {
        CacheSection { max_entries: 100_000 }
    }
}

/// The shortest probe interval either probe takes: a probe is a health check, not load.
pub const MIN_PROBE_MS: u64 = 1_000;

/// The most connections `database_pool_size` takes (PostgreSQL's own default `max_connections`
/// is 100, shared by every instance).
pub const MAX_POOL_SIZE: u32 = 500;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KmsSection {
    /// The KMS key (ID or ARN) data keys are wrapped under: required with `[kms]`.
    pub key_id: String,
    /// The key's AWS region.
    #[serde(default = "default_region")]
    pub region: String,
    /// Unset for AWS; e.g. `http://127.0.0.1:5000` for a local KMS-protocol server.
    pub endpoint: Option<String>,
    /// KMS keys this deployment's data keys were wrapped under before `key_id` (after a move to
    /// a new KMS key). A stored data key wrapped under any other key is refused at start-up.
    #[serde(default)]
    pub previous_key_ids: Vec<String>,
}

fn default_region() -> String {
    "us-east-1".into()
}

impl Default for PublicIdsConfig {
    fn default() -> Self {
        PublicIdsConfig {
            development: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 8709)),
            health_listen: None,
            database_url: None,
            sqlite_open_timeout_ms: idgen::lease::open_lock::DEFAULT_OPEN_TIMEOUT.as_millis() as u64,
            read_database_url: None,
            primary_fallback_reads: FallbackSettings::default().reads,
            replica_lag_bound_ms: FallbackSettings::default().lag_bound.as_millis() as u64,
            database_pool_size: PoolSettings::default().connections,
            database_acquire_timeout_ms: PoolSettings::default().acquire_timeout.as_millis() as u64,
            database_statement_timeout_ms: PoolSettings::default().statement_timeout.as_millis() as u64,
            formats: ["opaque", "uuidv7", "encrypted"].map(String::from).to_vec(),
            kms: None,
            development_key_file: None,
            tls: idgen_server::TlsSection::default(),
            quotas: idgen_server::QuotaSection::default(),
            access: None,
            database_probe_ms: 15_000,
            kms_probe_ms: 300_000,
            limits: idgen_server::LimitsSection::default(),
            cache: CacheSection::default(),
            types: BTreeMap::new(),
        }
    }
}

impl KmsSection {
    pub fn settings(&self) -> idgen_aws::AwsSettings {
        idgen_aws::AwsSettings { region: self.region.clone(), endpoint: self.endpoint.clone(), ..Default::default() }
            .patient()
    }
}

impl PublicIdsConfig {
    /// The keys of the file, from this struct's own source.
    pub fn keys() -> idgen::config::file::Keys {
        idgen::config::file::Keys::of::<PublicIdsConfig>()
    }

    /// `--print-config`: every key of the file, with its default, unit and description.
    pub fn print() -> String {
        PublicIdsConfig::keys().print(
            "idgen public serve: the public-ID service's configuration file (--config FILE).\n\
             IDGEN_PUBLIC_IDS_<KEY> and IDGEN_PUBLIC_IDS_<SECTION>__<KEY> override it.",
        )
    }

    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        if let Some(file) = file {
            PublicIdsConfig::keys().check_file(file, Some("idgen public serve --print-config"))?;
        }
        let mut builder = config::Config::builder();
        if let Some(file) = file {
            builder = builder.add_source(config::File::from(file).required(true));
        }
        let config: PublicIdsConfig = builder
            .add_source(
                config::Environment::with_prefix("IDGEN_PUBLIC_IDS")
                    .prefix_separator("_")
                    .separator("__")
                    .list_separator(",")
                    .with_list_parse_key("formats")
                    .with_list_parse_key("access.create")
                    .with_list_parse_key("access.resolve")
                    .with_list_parse_key("access.lookup")
                    .try_parsing(true),
            )
            .build()
            .context("reading the public-ID configuration")?
            .try_deserialize()
            .context("parsing the public-ID configuration")?;
        config.validate()?;
        Ok(config)
    }

    pub const DEVELOPMENT_DATABASE_URL: &str = "sqlite://.idgen/public-ids.db";

    /// A service in development mode with every default (tests, `idgen up`).
    pub fn development() -> Self {
        PublicIdsConfig { development: true, ..Default::default() }
    }

    pub fn database_url(&self) -> &str {
        self.database_url.as_deref().unwrap_or(Self::DEVELOPMENT_DATABASE_URL)
    }

    /// The PostgreSQL pool's size and timeouts (validated at load).
    pub fn pool_settings(&self) -> PoolSettings {
        PoolSettings {
            connections: self.database_pool_size,
            acquire_timeout: Duration::from_millis(self.database_acquire_timeout_ms),
            statement_timeout: Duration::from_millis(self.database_statement_timeout_ms),
        }
    }

    /// How many resolves and lookups may read the primary at once: `primary_fallback_reads` with
    /// a replica (only its misses and failures come to the primary); without one, where every
    /// read the cache cannot answer goes there, half the pool (creates keep the other half),
    /// and never fewer than `primary_fallback_reads`. Each caller may hold half of them.
    pub fn primary_reads(&self) -> u32 {
        match self.read_database_url {
            Some(_) => self.primary_fallback_reads,
            None => self.primary_fallback_reads.max(self.database_pool_size.div_ceil(2)),
        }
    }

    /// What a replica's misses may cost the primary (validated at load).
    pub fn fallback_settings(&self) -> FallbackSettings {
        FallbackSettings {
            reads: self.primary_fallback_reads,
            lag_bound: Duration::from_millis(self.replica_lag_bound_ms),
        }
    }

    /// The formats offered, parsed (validated at load).
    pub fn offered(&self) -> Vec<Format> {
        self.formats.iter().filter_map(|f| Format::parse(f)).collect()
    }

    /// The configured types (validated at load).
    pub fn types(&self) -> anyhow::Result<Types> {
        Types::from_config(&self.types, &self.offered())
    }

    /// What a production service must be told, and is not. Empty in development mode.
    pub fn missing_for_production(&self) -> Vec<String> {
        if self.development {
            return Vec::new();
        }
        let mut missing = Vec::new();
        missing.extend(idgen_server::database::missing_postgres_url(self.database_url.as_deref(), "the service's"));
        missing.extend(self.tls.missing_for_production());
        if self.offered().contains(&Format::Encrypted) && self.kms.is_none() {
            missing.push("[kms] key_id (the encrypted format's data keys), or formats without \"encrypted\"".into());
        }
        if self.development_key_file.is_some() {
            missing.push("no development_key_file (a data key in a local file is for development only)".into());
        }
        missing
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        idgen::config::refuse_missing_for("public-ID service", self.missing_for_production())?;
        self.tls.refuse_operator_ca("the public-ID service")?;
        if let Some(unknown) = self.formats.iter().find(|f| Format::parse(f).is_none()) {
            anyhow::bail!("formats: {unknown:?} is not a format (opaque, uuidv7, encrypted)");
        }
        if self.formats.is_empty() {
            anyhow::bail!("formats is empty: a service offering no format serves nothing");
        }
        if self.kms.is_some() && self.development_key_file.is_some() {
            anyhow::bail!("[kms] and development_key_file both name a data key: keep one");
        }
        for (key, ms) in [("database_probe_ms", self.database_probe_ms), ("kms_probe_ms", self.kms_probe_ms)] {
            if ms < MIN_PROBE_MS {
                anyhow::bail!("{key} must be at least {MIN_PROBE_MS} (ms), not {ms}");
            }
        }
        if let Some(read) = &self.read_database_url
            && (!read.starts_with("postgres") || !self.database_url().starts_with("postgres"))
        {
            anyhow::bail!(
                "read_database_url is for a PostgreSQL read replica of a PostgreSQL database_url; got {} beside {}",
                idgen::config::redacted_url(read),
                idgen::config::redacted_url(self.database_url())
            );
        }
        if !(1..=MAX_POOL_SIZE).contains(&self.database_pool_size) {
            anyhow::bail!("database_pool_size must be 1 to {MAX_POOL_SIZE}, not {}", self.database_pool_size);
        }
        if !(1..=self.database_pool_size).contains(&self.primary_fallback_reads) {
            anyhow::bail!(
                "primary_fallback_reads must be 1 to database_pool_size ({}), not {}: it is how many of the pool's \
                 connections resolves the replica missed may take",
                self.database_pool_size,
                self.primary_fallback_reads
            );
        }
        if !(1_000..=86_400_000).contains(&self.replica_lag_bound_ms) {
            anyhow::bail!(
                "replica_lag_bound_ms must be 1,000 to 86,400,000 (a day), not {}",
                self.replica_lag_bound_ms
            );
        }
        idgen_server::database::RequestTimeouts::from_keys(
            self.database_acquire_timeout_ms,
            self.database_statement_timeout_ms,
        )?;
        if let Some(access) = &self.access {
            access.validate(self.development)?;
        }
        self.types()?;
        self.tls.validate()?;
        self.quotas.validate()?;
        self.limits.validate()?;
        idgen_server::limits::validate_health_listen(self.listen, self.health_listen)
    }

    /// `--check-config`: the TLS files load (the rest was validated when loaded); returns what
    /// the service would run with, one line each, development defaults named as such.
    pub fn check(&self) -> anyhow::Result<Vec<String>> {
        let listener = self.tls.check()?;
        let database = if self.database_url().starts_with("postgres") {
            format!(
                "PostgreSQL at {}: a pool of {} connections, {} ms to get one, {} ms a statement",
                idgen::config::redacted_url(self.database_url()),
                self.database_pool_size,
                self.database_acquire_timeout_ms,
                self.database_statement_timeout_ms
            )
        } else {
            format!("{} (a local file: development only)", self.database_url())
        };
        let kms = match (&self.kms, &self.development_key_file) {
            (Some(kms), _) => format!("key {} in {}", kms.key_id, kms.region),
            (None, Some(file)) => format!("none: a development data key in {}", file.display()),
            (None, None) => "none: the encrypted format is off".into(),
        };
        Ok(vec![
            format!(
                "mode: {}",
                match self.development {
                    true => "DEVELOPMENT (the database is initialized at start-up)",
                    false => "production (the database must have been initialized: idgen public init)",
                }
            ),
            format!("database: {database}"),
            match &self.read_database_url {
                Some(url) => format!(
                    "read replica: {} (resolves and lookups; a miss there is read again on the primary)",
                    idgen::config::redacted_url(url)
                ),
                None => "read replica: none (every read asks the primary)".into(),
            },
            format!("formats: {}", self.formats.join(", ")),
            format!("KMS: {kms}"),
            format!("listener: {listener} on {}", self.listen),
            idgen_server::limits::describe_health_listen(self.health_listen),
            self.limits.describe(),
            format!("access: {}", crate::access::describe(self.access.as_ref(), self.development)),
            match self.cache.max_entries {
                0 => "cache: off (every resolve and lookup asks the database)".into(),
                n => format!("cache: up to {n} entries of stored mappings in memory"),
            },
            self.types()?.describe(),
        ])
    }
}

impl idgen_server::ServiceConfig for PublicIdsConfig {
    const SERVICE: &'static str = "public-ID service";

    fn print() -> String {
        PublicIdsConfig::print()
    }

    fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        PublicIdsConfig::load(file)
    }

    fn check(&self) -> anyhow::Result<Vec<String>> {
        PublicIdsConfig::check(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--print-config` comes from the config structs' doc comments: every key has one, and the
    /// printed file, read back (in development mode), is the defaults.
    #[test]
    fn every_key_is_documented_and_the_printed_file_reads_back_as_the_defaults() {
        assert_eq!(PublicIdsConfig::keys().undocumented(), Vec::<String>::new());
        let printed = PublicIdsConfig::print();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("printed.toml");
        std::fs::write(&path, printed.replacen("development = false", "development = true", 1)).unwrap();
        let read = PublicIdsConfig::load(Some(&path)).unwrap();
        assert_eq!(format!("{read:?}"), format!("{:?}", PublicIdsConfig::development()), "{printed}");
    }

    /// With a replica the primary's reads are its fallbacks; without one, every read the cache
    /// cannot answer, so half the pool (never fewer than the fallback budget).
    #[test]
    fn the_primary_read_budget_is_half_the_pool_without_a_replica() {
        let mut config = PublicIdsConfig::development();
        assert_eq!((config.database_pool_size, config.primary_fallback_reads), (16, 4));
        assert_eq!(config.primary_reads(), 8);
        config.database_pool_size = 5;
        assert_eq!(config.primary_reads(), 4, "never fewer than primary_fallback_reads");
        config.read_database_url = Some("postgres://replica/db".into());
        assert_eq!(config.primary_reads(), 4, "with a replica, only its fallbacks");
    }

    fn load(dir: &Path, text: &str) -> anyhow::Result<PublicIdsConfig> {
        let path = dir.join("public-ids.toml");
        std::fs::write(&path, text).unwrap();
        PublicIdsConfig::load(Some(&path))
    }

    #[test]
    fn production_names_everything_it_was_not_told() {
        let dir = tempfile::tempdir().unwrap();
        let error = load(dir.path(), "listen = \"127.0.0.1:0\"\n").unwrap_err();
        assert!(error.chain().any(|e| e.is::<idgen::config::Refused>()), "exit status 2: {error:#}");
        let said = format!("{error:#}");
        for key in ["database_url", "tls.client_ca", "[kms] key_id"] {
            assert!(said.contains(key), "{key} not named: {said}");
        }
        // Without the encrypted format no KMS key is needed; SQLite and a local data key never.
        let said = format!(
            "{:#}",
            load(
                dir.path(),
                "database_url = \"sqlite://p.db\"\nformats = [\"opaque\"]\ndevelopment_key_file = \"k\"\n"
            )
            .unwrap_err()
        );
        assert!(said.contains("SQLite is for development only") && said.contains("development_key_file"), "{said}");
        assert!(!said.contains("[kms]"), "{said}");
        assert!(
            format!("{:#}", load(dir.path(), "development = true\nformats = [\"hex\"]\n").unwrap_err()).contains("hex")
        );
        let config = load(dir.path(), "development = true\n").unwrap();
        assert_eq!(config.database_url(), "sqlite://.idgen/public-ids.db");
        assert_eq!(config.cache.max_entries, 100_000, "the cache is on by default");
        let config = load(dir.path(), "development = true\n[cache]\nmax_entries = 0\n").unwrap();
        assert_eq!(config.cache.max_entries, 0);
        assert!(config.check().unwrap().iter().any(|line| line.starts_with("cache: off")));
        assert!(
            format!("{:#}", load(dir.path(), "development = true\n[cache]\nmax_entrys = 5\n").unwrap_err())
                .contains("max_entrys")
        );
        assert_eq!(config.offered(), vec![Format::Opaque, Format::Uuidv7, Format::Encrypted]);
    }

    #[test]
    fn types_are_checked_at_load_and_shown() {
        let dir = tempfile::tempdir().unwrap();
        let config = load(
            dir.path(),
            "development = true\n[types]\norder = { number = 1 }\nuser = { number = 2, format = \"uuidv7\" }\n",
        )
        .unwrap();
        let lines = config.check().unwrap();
        assert!(lines.contains(&"types: order_ (1, opaque), user_ (2, uuidv7)".to_owned()), "{lines:?}");
        assert!(
            load(dir.path(), "development = true\n")
                .unwrap()
                .check()
                .unwrap()
                .iter()
                .any(|l| l.starts_with("types: none"))
        );
        for (text, said) in [
            (
                "formats = [\"opaque\"]\n[types]\nuser = { number = 2, format = \"uuidv7\" }\n",
                "not among this service's formats",
            ),
            ("[types]\norder = { number = 1, colour = \"red\" }\n", "colour"),
            ("[types]\norder = { number = 1 }\ninvoice = { number = 1 }\n", "both have number 1"),
            ("[types]\n\"order-line\" = { number = 1 }\n", "a-z and _"),
        ] {
            let error = format!("{:#}", load(dir.path(), &format!("development = true\n{text}")).unwrap_err());
            assert!(error.contains(said), "{text}: {error}");
        }
    }
}
