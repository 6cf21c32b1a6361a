//! TLS on a listener: the server certificate and key, and with `client_ca` mutual TLS. The
//! configuration in force can be replaced while serving ([`Tls::reload`]): new connections
//! handshake with the new one, open connections keep theirs, and a file that does not load
//! leaves the old configuration in force.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use arc_swap::ArcSwap;
use idgen::tls::{certificates, roots};
use rustls::ServerConfig;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::WebPkiClientVerifier;
use serde::Deserialize;

/// `[tls]`: PEM files. Without `client_ca` a listener serves TLS without client certificates
/// (every caller is `anonymous`); with it, a connection must present a certificate from that CA,
/// valid now, or the handshake is refused.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The server's certificate chain, leaf first.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The CA bundle client certificates must chain to.
    pub client_ca: Option<PathBuf>,
}

impl TlsSection {
    /// Whether the section asks for TLS at all.
    pub fn enabled(&self) -> bool {
        self.cert.is_some() || self.key.is_some() || self.client_ca.is_some()
    }

    /// Whether it asks for mutual TLS.
    pub fn mutual(&self) -> bool {
        self.client_ca.is_some()
    }

    /// What a production listener lacks of mutual TLS, if anything (every listener's rule).
    pub fn missing_for_production(&self) -> Option<String> {
        let complete = self.cert.is_some() && self.key.is_some() && self.client_ca.is_some();
        (!complete).then(|| "tls.cert, tls.key and tls.client_ca (production listeners use mutual TLS)".to_owned())
    }

    /// For `--check-config`: loads the files (as a start would) and says what the listener asks
    /// of its callers.
    pub fn check(&self) -> anyhow::Result<&'static str> {
        if !self.enabled() {
            return Ok("plain HTTP (no [tls]: development only)");
        }
        self.server_config().context("loading the listener's TLS files")?;
        Ok(if self.mutual() { "mutual TLS" } else { "TLS without client certificates" })
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        match (&self.cert, &self.key) {
            (Some(_), Some(_)) | (None, None) => {}
            _ => bail!("tls.cert and tls.key go together"),
        }
        if self.client_ca.is_some() && self.cert.is_none() {
            bail!("tls.client_ca needs tls.cert and tls.key");
        }
        Ok(())
    }

    /// Builds the server configuration from the files as they are now.
    pub fn server_config(&self) -> anyhow::Result<Arc<ServerConfig>> {
        self.validate()?;
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else { bail!("tls.cert and tls.key are not set") };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates(cert)?;
        let key =
            PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading the private key {}", key.display()))?;
        let verifier = match &self.client_ca {
            Some(ca) => WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider.clone())
                .build()
                .with_context(|| format!("client CA bundle {}", ca.display()))?,
            None => WebPkiClientVerifier::no_client_auth(),
        };
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .context("the server certificate and key do not go together")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The TLS configuration in force on a listener.
pub struct Tls {
    current: ArcSwap<ServerConfig>,
    mutual: std::sync::atomic::AtomicBool,
}

impl Tls {
    pub fn load(section: &TlsSection) -> anyhow::Result<Tls> {
        Ok(Tls {
            current: ArcSwap::new(section.server_config()?),
            mutual: std::sync::atomic::AtomicBool::new(section.mutual()),
        })
    }

    /// Takes the files as they are now; on any error the configuration in force stays.
    pub fn reload(&self, section: &TlsSection) -> anyhow::Result<()> {
        let config = section.server_config()?;
        self.current.store(config);
        self.mutual.store(section.mutual(), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    pub fn mutual(&self) -> bool {
        self.mutual.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }
}
