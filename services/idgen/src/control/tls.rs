//! TLS on the client side of a generator: reading an `https://` registry with the CA to trust
//! and the client certificate to present. rustls with ring, the one TLS stack.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// The certificates of a PEM file (a chain, or a CA bundle).
pub fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))?;
    if chain.is_empty() {
        bail!("{} holds no certificate", path.display());
    }
    Ok(chain)
}

/// A CA bundle as trust roots.
pub fn roots(path: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(path)? {
        roots.add(certificate).with_context(|| format!("a CA certificate in {}", path.display()))?;
    }
    Ok(roots)
}

/// `[…_tls]` of a client (a worker reading the registry, the CLI): the CA to trust, and the
/// client certificate and key to present.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClientTlsSection {
    /// The CA bundle (PEM) the server's certificate must chain to; without it, the system's roots.
    pub ca: Option<PathBuf>,
    /// The client certificate chain (PEM) to present, leaf first.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key: Option<PathBuf>,
}

impl ClientTlsSection {
    /// The rustls client configuration, or `None` when nothing is set (plain HTTP).
    pub fn client_config(&self) -> anyhow::Result<Option<rustls::ClientConfig>> {
        let Some(ca) = &self.ca else {
            if self.cert.is_some() || self.key.is_some() {
                bail!("a client certificate needs the CA to trust as well (ca)");
            }
            return Ok(None);
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_root_certificates(roots(ca)?);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(
                    certificates(cert)?,
                    PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?,
                )
                .context("the client certificate and key do not go together")?,
            (None, None) => builder.with_no_client_auth(),
            _ => bail!("a client certificate and its key go together"),
        };
        Ok(Some(config))
    }
}
