//! Configuration: a TOML file plus `IDGEN_PUBLIC_IDS_…` environment variables.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PublicIdsConfig {
    pub listen: SocketAddr,
    /// `postgres://…` in production; `sqlite://…` as the embedded default.
    pub database_url: String,
    /// With a SQLite file: how long a start waits for other processes opening it at once (ms).
    pub sqlite_open_timeout_ms: u64,
    /// The KMS key that wraps the encrypted format's data keys; unset: no encrypted format.
    pub kms: Option<KmsSection>,
    /// The listener's certificate and key, and the CA of client certificates; re-read on SIGHUP.
    pub tls: idgen_server::TlsSection,
    /// Public IDs created or resolved per second, per caller; re-read on SIGHUP.
    pub quotas: idgen_server::QuotaSection,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KmsSection {
    pub key_id: String,
    #[serde(default = "default_region")]
    pub region: String,
    pub endpoint: Option<String>,
}

fn default_region() -> String {
    "us-east-1".into()
}

impl Default for PublicIdsConfig {
    fn default() -> Self {
        PublicIdsConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8709)),
            database_url: "sqlite://.idgen/public-ids.db".into(),
            sqlite_open_timeout_ms: idgen::open_lock::DEFAULT_OPEN_TIMEOUT.as_millis() as u64,
            kms: None,
            tls: idgen_server::TlsSection::default(),
            quotas: idgen_server::QuotaSection::default(),
        }
    }
}

impl KmsSection {
    pub fn settings(&self) -> idgen::dynamodb::AwsSettings {
        idgen::dynamodb::AwsSettings {
            region: self.region.clone(),
            endpoint: self.endpoint.clone(),
            ..Default::default()
        }
        .patient()
    }
}

impl PublicIdsConfig {
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let mut builder = config::Config::builder();
        if let Some(file) = file {
            builder = builder.add_source(config::File::from(file).required(true));
        }
        builder
            .add_source(
                config::Environment::with_prefix("IDGEN_PUBLIC_IDS")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()
            .context("reading the public-ID configuration")?
            .try_deserialize()
            .context("parsing the public-ID configuration")
    }

    /// `--check-config`: the TLS files load and the quotas are valid; returns what the service
    /// would run with, one line each, development defaults named as such.
    pub fn check(&self) -> anyhow::Result<Vec<String>> {
        self.quotas.validate()?;
        let listener = self.tls.check()?;
        let database = if self.database_url.starts_with("postgres") {
            format!("PostgreSQL at {}", idgen::config::redacted_url(&self.database_url))
        } else {
            format!("{} (a local file: development only)", self.database_url)
        };
        let kms = match &self.kms {
            Some(kms) => format!("key {} in {}", kms.key_id, kms.region),
            None => "none: the encrypted format is off".into(),
        };
        Ok(vec![
            format!("database: {database}"),
            format!("KMS: {kms}"),
            format!("listener: {listener} on {}", self.listen),
        ])
    }
}
