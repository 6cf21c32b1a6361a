//! The registry's configuration: a TOML file plus `IDGEN_REGISTRY_…` environment variables.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use idgen_core::{DEFAULT_V2_FROM, Layout, MAX_TIMESTAMP};
use idgen_server::database::RequestTimeouts;
use serde::Deserialize;

use crate::operators::{OperatorTokens, TokenHash};
use crate::store::{InitialSchedule, ScheduledLayout};

/// The operator name of the token in `operator_token_file`.
pub const OPERATOR_TOKEN_FILE_NAME: &str = "operator";

/// The longest `retire_grace_ms`: a year.
pub const MAX_RETIRE_GRACE_MS: i64 = 366 * 86_400_000;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// Development mode: a SQLite file under `.idgen/` when no database is configured, the
    /// database initialized at start-up, plain HTTP allowed. Off by default: a production
    /// registry refuses to start without its PostgreSQL database, mutual TLS and operators
    /// (each named when missing), and never initializes a database itself.
    pub development: bool,
    /// Address to listen on; port 0 picks a free port (printed at start-up).
    pub listen: SocketAddr,
    /// The plain health listener, if any: its own port, no TLS, only `GET /healthz` (the same
    /// answer as the registry's own `/healthz`), for a load balancer that cannot present a
    /// client certificate.
    pub health_listen: Option<SocketAddr>,
    /// `postgres://…` in production; unset in development: `sqlite://.idgen/registry.db`.
    pub database_url: Option<String>,
    /// With a SQLite file: how long a start waits for other processes opening it at once (ms).
    pub sqlite_open_timeout_ms: u64,
    /// How long a request waits for a free database connection before it is answered 503 with
    /// `Retry-After` (ms, default 1,000).
    pub database_acquire_timeout_ms: u64,
    /// PostgreSQL: how long one statement may run (`statement_timeout`, set on every connection)
    /// before it is cancelled and the request answered 503 with `Retry-After` (ms, default 3,000).
    pub database_statement_timeout_ms: u64,
    /// The one region allowed to issue under layouts without a region field (v1). Written into
    /// a new database by `idgen registry init`; a registry whose database names another refuses
    /// to start. Development default: `us-east-1`.
    pub home_region: Option<String>,
    /// The horizon is kept at least this far ahead of now (no cutover is ever scheduled closer).
    pub horizon_lead_ms: i64,
    /// A retirement takes effect no sooner than this after it is asked for (ms): the time to
    /// notice a wrong one and cancel it, and for the region's callers to move elsewhere.
    pub retire_grace_ms: i64,
    /// Operator name → the SHA-256 of their bearer token, `sha256:<64 hex digits>`, as
    /// `idgen registry token --name NAME` prints it (with the token, shown once). A token in
    /// clear is refused, and so are two names with one token.
    pub operators: BTreeMap<String, String>,
    /// A file holding one more token in clear (for the operator named `operator`), e.g. the one
    /// `idgen up` writes next to the CLI that uses it; only its hash is kept in memory.
    pub operator_token_file: Option<PathBuf>,
    /// For a new registry only: when v2 starts (ms since the epoch). Default: SPEC's 2028-01-01.
    pub initial_v2_from_ms: Option<u64>,
    /// The listener's certificate and key, and the CA of client certificates; re-read on SIGHUP.
    pub tls: idgen_server::TlsSection,
    /// Requests per second, per caller (each request counts one; `ids_per_second` is the
    /// shared field name), for every route but `/healthz` and `/metrics`; re-read on SIGHUP.
    pub quotas: idgen_server::QuotaSection,
    /// Callers whose client certificate makes them operators (by the identity it names, in the
    /// `tls.identity` form), as an alternative to a bearer token. Only a certificate of
    /// `tls.operator_ca` counts: the same name on a certificate of the callers' CA is refused
    /// (403 `not_an_operator_certificate`). Needs `tls.operator_ca`.
    pub certificate_operators: std::collections::BTreeSet<String>,
    /// What a peer may hold of each listener: a connection cap and the deadlines.
    pub limits: idgen_server::LimitsSection,
    /// For this long after `idgen registry init` made the database, `regions add` hands out no
    /// number (ms; default 120,000, four of a generator's default refreshes; 0 in development). A
    /// registry started over (a database made again, a backup restored) learns the numbers that
    /// generators still following the registry it replaced issue under from their reports at
    /// their next refresh, and withholds them: this is the time for them to report.
    pub new_registry_quiet_ms: Option<i64>,
    /// Callers (client-certificate identities of the callers' CA) that may record which table a
    /// region's lease table is, the first time only (`POST /v1/regions/{name}:record-lease-table`):
    /// the fleet's hosts, whose first boot runs `idgen leases init` with their own certificate. A
    /// recorded identity is changed only by an operator's move (`move-lease-table`).
    pub lease_table_recorders: std::collections::BTreeSet<String>,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            development: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 8700)),
            health_listen: None,
            database_url: None,
            sqlite_open_timeout_ms: idgen::lease::open_lock::DEFAULT_OPEN_TIMEOUT.as_millis() as u64,
            database_acquire_timeout_ms: RequestTimeouts::default().acquire.as_millis() as u64,
            database_statement_timeout_ms: RequestTimeouts::default().statement.as_millis() as u64,
            home_region: None,
            horizon_lead_ms: 30 * 86_400_000,
            retire_grace_ms: 86_400_000,
            operators: BTreeMap::new(),
            operator_token_file: None,
            initial_v2_from_ms: None,
            tls: idgen_server::TlsSection::default(),
            quotas: idgen_server::QuotaSection::default(),
            certificate_operators: std::collections::BTreeSet::new(),
            limits: idgen_server::LimitsSection::default(),
            new_registry_quiet_ms: None,
            lease_table_recorders: std::collections::BTreeSet::new(),
        }
    }
}

impl RegistryConfig {
    /// How long a request waits for the database (each key within
    /// [`RequestTimeouts::RANGE_MS`]).
    pub fn database_timeouts(&self) -> anyhow::Result<RequestTimeouts> {
        RequestTimeouts::from_keys(self.database_acquire_timeout_ms, self.database_statement_timeout_ms)
    }

    /// The keys of the file, from this struct's own source.
    pub fn keys() -> idgen::config::file::Keys {
        idgen::config::file::Keys::of::<RegistryConfig>()
    }

    /// `--print-config`: every key of the file, with its default, unit and description.
    pub fn print() -> String {
        RegistryConfig::keys().print(
            "idgen registry: the region registry's configuration file (--config FILE).\n\
             IDGEN_REGISTRY_<KEY> and IDGEN_REGISTRY_<SECTION>__<KEY> override it.",
        )
    }

    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        if let Some(file) = file {
            RegistryConfig::keys().check_file(file, Some("idgen registry --print-config"))?;
        }
        let mut builder = config::Config::builder();
        if let Some(file) = file {
            builder = builder.add_source(config::File::from(file).required(true));
        }
        let config: RegistryConfig = builder
            .add_source(
                config::Environment::with_prefix("IDGEN_REGISTRY")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()
            .context("reading the registry configuration")?
            .try_deserialize()
            .context("parsing the registry configuration")?;
        config.validate()?;
        Ok(config)
    }

    /// The development defaults of what a production registry must be told.
    pub const DEVELOPMENT_DATABASE_URL: &str = "sqlite://.idgen/registry.db";
    pub const DEVELOPMENT_HOME_REGION: &str = "us-east-1";

    /// A registry in development mode with every default (tests, `idgen up`).
    pub fn development() -> Self {
        RegistryConfig { development: true, ..Default::default() }
    }

    /// [`Self::new_registry_quiet_ms`], or its default for the mode.
    pub fn new_registry_quiet_ms(&self) -> i64 {
        self.new_registry_quiet_ms.unwrap_or(if self.development { 0 } else { 120_000 })
    }

    pub fn database_url(&self) -> &str {
        self.database_url.as_deref().unwrap_or(Self::DEVELOPMENT_DATABASE_URL)
    }

    pub fn home_region(&self) -> &str {
        self.home_region.as_deref().unwrap_or(Self::DEVELOPMENT_HOME_REGION)
    }

    /// What a production registry must be told, and is not. Empty in development mode.
    pub fn missing_for_production(&self) -> Vec<String> {
        if self.development {
            return Vec::new();
        }
        let mut missing = Vec::new();
        missing.extend(idgen_server::database::missing_postgres_url(self.database_url.as_deref(), "the registry's"));
        if self.home_region.is_none() {
            missing.push("home_region (the one region issuing under v1; checked against the database)".into());
        }
        missing.extend(self.tls.missing_for_production());
        if self.operators.is_empty() && self.operator_token_file.is_none() && self.certificate_operators.is_empty() {
            missing.push(
                "operators: certificate_operators, [operators] or operator_token_file (writes need an operator)".into(),
            );
        }
        missing
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        idgen::config::refuse_missing_for("registry", self.missing_for_production())?;
        self.tls.validate()?;
        self.quotas.validate()?;
        self.limits.validate()?;
        idgen_server::limits::validate_health_listen(self.listen, self.health_listen)?;
        self.database_timeouts()?;
        if !self.certificate_operators.is_empty() && self.tls.operator_ca.is_none() {
            bail!(
                "certificate_operators needs tls.operator_ca: only a certificate of the operators' own CA makes an \
                 operator (the callers' CA signs any name it is asked for)"
            );
        }
        for name in &self.certificate_operators {
            if idgen_server::Caller::is_reserved(name) {
                bail!(
                    "certificate_operators: {name:?} is reserved ({:?}); no certificate may name it",
                    idgen_server::RESERVED
                );
            }
            let token_named = self.operators.contains_key(name)
                || (self.operator_token_file.is_some() && name == OPERATOR_TOKEN_FILE_NAME);
            if token_named {
                bail!(
                    "certificate_operators: {name:?} is also the name of an operator token; the audit would not tell \
                     the two apart: give them different names"
                );
            }
        }
        if !crate::api::valid_region_name(self.home_region()) {
            bail!("home_region {:?} is not a region name", self.home_region());
        }
        // Workers refuse past the horizon they hold; a lead shorter than their refresh interval
        // would have the whole fleet refusing between two refreshes.
        if self.horizon_lead_ms < 1_000 {
            bail!("horizon_lead_ms must be at least 1000 (production: days; workers refuse past the horizon)");
        }
        if self.horizon_lead_ms < 3_600_000 {
            tracing::warn!(
                horizon_lead_ms = self.horizon_lead_ms,
                "a horizon less than an hour ahead: workers refuse once the registry has been unreachable that long"
            );
        }
        // A grace of extra zeros would have every retirement wait for years.
        if !(1_000..=MAX_RETIRE_GRACE_MS).contains(&self.retire_grace_ms) {
            bail!(
                "retire_grace_ms must be from 1000 (1 s) to {MAX_RETIRE_GRACE_MS} (a year), not {}",
                self.retire_grace_ms
            );
        }
        for name in &self.lease_table_recorders {
            if idgen_server::Caller::is_reserved(name) {
                bail!(
                    "lease_table_recorders: {name:?} is reserved ({:?}); no certificate may name it",
                    idgen_server::RESERVED
                );
            }
        }
        if !(0..=86_400_000).contains(&self.new_registry_quiet_ms()) {
            bail!("new_registry_quiet_ms must be from 0 to 86400000 (a day), not {}", self.new_registry_quiet_ms());
        }
        OperatorTokens::new(self.operator_hashes()?)?;
        Ok(())
    }

    /// `--check-config`: the configuration is valid (it was validated when loaded), its TLS files
    /// and operator token file load; returns what the registry would run with, one line each,
    /// development defaults named as such.
    pub fn check(&self) -> anyhow::Result<Vec<String>> {
        let listener = self.tls.check()?;
        let tokens = self.operator_tokens()?.len();
        let database = if self.database_url().starts_with("postgres") {
            format!("PostgreSQL at {}", idgen::config::redacted_url(self.database_url()))
        } else {
            format!("{} (a local file: development only)", self.database_url())
        };
        Ok(vec![
            format!(
                "mode: {}",
                match self.development {
                    true => "DEVELOPMENT (the database is initialized at start-up)",
                    false => "production (the database must have been initialized: idgen registry init)",
                }
            ),
            format!("database: {database}"),
            format!("home region: {}", self.home_region()),
            format!("horizon kept {} days ahead", self.horizon_lead_ms / 86_400_000),
            format!(
                "a retirement takes effect {} s after it is asked for, at the earliest",
                self.retire_grace_ms / 1000
            ),
            format!("operators: {tokens} by bearer token, {} by client certificate", self.certificate_operators.len()),
            format!("listener: {listener} on {}", self.listen),
            idgen_server::limits::describe_health_listen(self.health_listen),
            self.limits.describe(),
        ])
    }

    /// `[operators]` as (name, hash), every value a token hash.
    fn operator_hashes(&self) -> anyhow::Result<Vec<(String, TokenHash)>> {
        self.operators
            .iter()
            .map(|(name, value)| match TokenHash::parse(value) {
                Some(hash) => Ok((name.clone(), hash)),
                None => bail!(
                    "operators.{name} is not a token hash (sha256: and 64 hex digits): the configuration keeps only \
                     the SHA-256 of a token, never the token; `idgen registry token --name {name}` makes a new \
                     token and prints the line for [operators]"
                ),
            })
            .collect()
    }

    /// The operators known by token: `[operators]` and the token file's `operator`.
    pub fn operator_tokens(&self) -> anyhow::Result<OperatorTokens> {
        let mut hashes = self.operator_hashes()?;
        if let Some(file) = &self.operator_token_file {
            let token = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            let token = token.trim();
            if token.len() < 16 {
                bail!("the token in {} is shorter than 16 characters", file.display());
            }
            hashes.push((OPERATOR_TOKEN_FILE_NAME.into(), TokenHash::of(token)));
        }
        let tokens = OperatorTokens::new(hashes)?;
        if tokens.is_empty() && self.certificate_operators.is_empty() {
            tracing::warn!("no operator configured (token or certificate): every write will be refused (401)");
        }
        Ok(tokens)
    }

    pub fn initial_schedule(&self) -> anyhow::Result<InitialSchedule> {
        let mut initial = InitialSchedule::spec_default(self.home_region());
        if let Some(from) = self.initial_v2_from_ms {
            if from == 0 || from > MAX_TIMESTAMP {
                bail!("initial_v2_from_ms must be after the epoch and at most {MAX_TIMESTAMP} (2^41 − 1), not {from}");
            }
            initial.layouts[1] = ScheduledLayout { layout: Layout::v2(), from_ms: from };
        }
        debug_assert_eq!(InitialSchedule::spec_default("x").layouts[1].from_ms, DEFAULT_V2_FROM);
        Ok(initial)
    }
}

impl idgen_server::ServiceConfig for RegistryConfig {
    const SERVICE: &'static str = "registry";

    fn print() -> String {
        RegistryConfig::print()
    }

    fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        RegistryConfig::load(file)
    }

    fn check(&self) -> anyhow::Result<Vec<String>> {
        RegistryConfig::check(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--print-config` comes from the config structs' doc comments: every key has one, and the
    /// printed file, read back (in development mode), is the defaults.
    #[test]
    fn every_key_is_documented_and_the_printed_file_reads_back_as_the_defaults() {
        assert_eq!(RegistryConfig::keys().undocumented(), Vec::<String>::new());
        let printed = RegistryConfig::print();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("printed.toml");
        std::fs::write(&path, printed.replacen("development = false", "development = true", 1)).unwrap();
        let read = RegistryConfig::load(Some(&path)).unwrap();
        assert_eq!(format!("{read:?}"), format!("{:?}", RegistryConfig::development()), "{printed}");
    }

    #[test]
    fn the_horizon_lead_the_retire_grace_and_the_first_cutover_are_bounded() {
        let mut config = RegistryConfig::development();
        config.validate().unwrap();
        config.horizon_lead_ms = 0;
        assert!(format!("{:#}", config.validate().unwrap_err()).contains("at least 1000"));
        config.horizon_lead_ms = 5_000;
        config.validate().unwrap();

        for bad in [0, 999, MAX_RETIRE_GRACE_MS + 1] {
            config.retire_grace_ms = bad;
            assert!(format!("{:#}", config.validate().unwrap_err()).contains("retire_grace_ms"), "{bad}");
        }
        config.retire_grace_ms = 60_000;
        config.validate().unwrap();

        config.initial_v2_from_ms = Some(MAX_TIMESTAMP);
        config.initial_schedule().unwrap();
        config.initial_v2_from_ms = Some(MAX_TIMESTAMP + 1);
        assert!(format!("{:#}", config.initial_schedule().unwrap_err()).contains("2^41"));
        config.initial_v2_from_ms = Some(0);
        assert!(config.initial_schedule().is_err());
    }

    fn load(dir: &Path, text: &str) -> anyhow::Result<RegistryConfig> {
        let path = dir.join("registry.toml");
        std::fs::write(&path, text).unwrap();
        RegistryConfig::load(Some(&path))
    }

    #[test]
    fn production_names_everything_it_was_not_told_and_refuses_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let error = load(dir.path(), "listen = \"127.0.0.1:0\"\n").unwrap_err();
        assert!(error.chain().any(|e| e.is::<idgen::config::Refused>()), "exit status 2: {error:#}");
        let said = format!("{error:#}");
        for key in ["database_url", "home_region", "tls.client_ca", "operators"] {
            assert!(said.contains(key), "{key} not named: {said}");
        }
        let said = format!(
            "{:#}",
            load(dir.path(), "database_url = \"sqlite:///var/lib/idgen/registry.db\"\nhome_region = \"us-east-1\"\n")
                .unwrap_err()
        );
        assert!(said.contains("SQLite is for development only"), "{said}");
        assert!(!said.contains("home_region"), "{said}");
        // Development mode needs none of it.
        let config = load(dir.path(), "development = true\n").unwrap();
        assert_eq!((config.database_url(), config.home_region()), ("sqlite://.idgen/registry.db", "us-east-1"));
    }

    #[test]
    fn operators_are_token_hashes_and_no_two_share_one() {
        let dir = tempfile::tempdir().unwrap();
        let hash = |token: &str| TokenHash::of(token).to_string();
        let config = load(
            dir.path(),
            &format!("development = true\n[operators]\nalice = \"{}\"\nbob = \"{}\"\n", hash("a"), hash("b")),
        )
        .unwrap();
        let tokens = config.operator_tokens().unwrap();
        assert_eq!(
            (tokens.operator("a").as_deref(), tokens.operator("b").as_deref(), tokens.len()),
            (Some("alice"), Some("bob"), 2)
        );

        // A token in clear, as configurations held them before, is refused with what to do instead.
        let said = format!(
            "{:#}",
            load(dir.path(), "development = true\n[operators]\nalice = \"0123456789abcdef0123\"\n").unwrap_err()
        );
        assert!(
            said.contains("operators.alice is not a token hash") && said.contains("idgen registry token"),
            "{said}"
        );

        // One token for two operators: refused at load, naming both.
        let said = format!(
            "{:#}",
            load(dir.path(), &format!("development = true\n[operators]\nalice = \"{0}\"\nbob = \"{0}\"\n", hash("a")))
                .unwrap_err()
        );
        assert!(said.contains("\"alice\" and \"bob\" have the same token"), "{said}");

        // The token file's token is one of them too.
        let file = dir.path().join("operator-token");
        std::fs::write(&file, "the-token-in-the-file\n").unwrap();
        let text = format!(
            "development = true\noperator_token_file = \"{}\"\n[operators]\nalice = \"{}\"\n",
            file.display(),
            hash("the-token-in-the-file")
        );
        let said = format!("{:#}", load(dir.path(), &text).unwrap().operator_tokens().unwrap_err());
        assert!(said.contains("have the same token"), "{said}");
    }

    #[test]
    fn certificate_operators_need_the_operator_ca_and_names_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let tls = "[tls]\ncert = \"s.pem\"\nkey = \"k.pem\"\nclient_ca = \"ca.pem\"\n";
        let said = format!(
            "{:#}",
            load(dir.path(), &format!("development = true\ncertificate_operators = [\"ops\"]\n{tls}")).unwrap_err()
        );
        assert!(said.contains("certificate_operators needs tls.operator_ca"), "{said}");
        let with_ca = |operators: &str, extra: &str| {
            load(
                dir.path(),
                &format!(
                    "development = true\n{extra}certificate_operators = {operators}\n{tls}operator_ca = \"ops.pem\"\n"
                ),
            )
        };
        with_ca("[\"ops\"]", "").unwrap();
        let said = format!("{:#}", with_ca("[\"Anonymous\"]", "").unwrap_err());
        assert!(said.contains("reserved"), "{said}");
        let said = format!("{:#}", with_ca("[\"operator\"]", "operator_token_file = \"t\"\n").unwrap_err());
        assert!(said.contains("also the name of an operator token"), "{said}");
    }
}
