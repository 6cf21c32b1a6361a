//! The CLI's side of TLS: the CA to trust for `https://` endpoints and the client certificate to
//! present (`--cacert`, `--cert`, `--key`, or `IDGEN_CACERT`, `IDGEN_CERT`, `IDGEN_KEY`).

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug, Clone, Default)]
pub struct ClientTls {
    /// The CA bundle to trust for https:// endpoints (with `idgen up --tls`: .idgen/tls/ca.pem).
    #[arg(long, global = true, env = "IDGEN_CACERT")]
    pub cacert: Option<PathBuf>,
    /// A client certificate to present (mutual TLS), e.g. .idgen/tls/operator.pem.
    #[arg(long, global = true, env = "IDGEN_CERT")]
    pub cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, global = true, env = "IDGEN_KEY")]
    pub key: Option<PathBuf>,
}

impl ClientTls {
    /// These settings as a configuration section.
    pub fn section(&self) -> idgen_server::ClientTlsSection {
        idgen_server::ClientTlsSection { ca: self.cacert.clone(), cert: self.cert.clone(), key: self.key.clone() }
    }

    /// An HTTP client with these settings (plain when none is given).
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        self.client_with_timeout(std::time::Duration::from_secs(30))
    }

    /// [`Self::client`] with another per-request timeout.
    pub fn client_with_timeout(&self, timeout: std::time::Duration) -> anyhow::Result<reqwest::Client> {
        let section = self.section();
        let builder = reqwest::Client::builder().timeout(timeout);
        Ok(match section.client_config()? {
            Some(config) => builder.use_preconfigured_tls(config),
            None => builder,
        }
        .build()?)
    }
}
