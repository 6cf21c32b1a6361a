//! TLS on a listener: the server certificate and key, and with `client_ca` mutual TLS; how a
//! client certificate names its caller (`identity`), which CA alone makes operators
//! (`operator_ca`) and which certificates are revoked (`crl`). The configuration in force can be
//! replaced while serving ([`Tls::reload`]): new connections handshake with the new one, an open
//! connection whose certificate the new one no longer accepts (revoked by a new CRL, its CA
//! dropped) is closed, and a file that does not load leaves the old configuration in force.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use arc_swap::ArcSwap;
use idgen::control::tls::{certificates, roots};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use serde::Deserialize;

use crate::identity::{Caller, IdentityForm, NoCaller};

/// `[tls]`: PEM files. Without `client_ca` a listener serves TLS without client certificates
/// (every caller is `anonymous`); with it, a connection must present a certificate from that CA
/// (or from `operator_ca`), valid now and not revoked by a `crl`, naming one caller in the
/// `identity` form, or the handshake is refused.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The server's certificate chain, leaf first.
    pub cert: Option<PathBuf>,
    /// The server certificate's private key (PEM).
    pub key: Option<PathBuf>,
    /// The CA bundle client certificates must chain to.
    pub client_ca: Option<PathBuf>,
    /// Which part of a client certificate names its caller: `uri_san` (the default; the only
    /// form production accepts) or `cn` (development).
    #[serde(default)]
    pub identity: IdentityForm,
    /// The CA of operators' certificates, kept apart from `client_ca` (the registry only): a
    /// caller is an operator only when this CA issued its certificate itself (verified without
    /// the intermediates the caller sends: the CA that issues operators' certificates, an
    /// intermediate if that is what issues them, is the one this file holds), so no certificate
    /// the callers' CA signs can make an operator, whatever it names, and neither can one of a
    /// subordinate CA the same root issued. A `client_ca` certificate this CA issued is refused
    /// at load. Its certificates are accepted at the handshake like the callers'.
    pub operator_ca: Option<PathBuf>,
    /// Certificate revocation lists (PEM, or DER as AWS Private CA publishes them) of the CAs
    /// above; re-read on SIGHUP with the rest. With any, every client certificate must be covered
    /// by a CRL of its issuer: one whose issuer has none here is refused
    /// (`revocation_status_unknown`), so a missing list fails closed.
    #[serde(default)]
    pub crl: Vec<PathBuf>,
    /// With `client_ca`: the caller identities that may read `/metrics` (the host's own scraper,
    /// say), which shows every caller's volumes; anyone else is answered 403. `"*"`: every
    /// identified caller. Unset: every caller, which production refuses. Taken at each
    /// connection's handshake (a reload applies to connections made after it).
    pub metrics_readers: Option<Vec<String>>,
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

    /// What a production listener lacks of mutual TLS, or asks for that production refuses, if
    /// anything (every listener's rule).
    pub fn missing_for_production(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !(self.cert.is_some() && self.key.is_some() && self.client_ca.is_some()) {
            missing.push("tls.cert, tls.key and tls.client_ca (production listeners use mutual TLS)".to_owned());
        }
        if self.client_ca.is_some() && self.metrics_readers.is_none() {
            missing.push(
                "tls.metrics_readers (who may read /metrics, which shows every caller's volumes: e.g. the host's own \
                 scraper; [\"*\"] for every identified caller)"
                    .to_owned(),
            );
        }
        if self.identity != IdentityForm::UriSan {
            missing.push(
                "tls.identity = \"uri_san\" (a CN is free text any certificate request writes: `cn` is for development)"
                    .to_owned(),
            );
        }
        missing
    }

    /// For `--check-config`: loads the files (as a start would) and says what the listener asks
    /// of its callers.
    pub fn check(&self) -> anyhow::Result<String> {
        if !self.enabled() {
            return Ok("plain HTTP (no [tls]: development only)".to_owned());
        }
        self.listener().context("loading the listener's TLS files")?;
        if !self.mutual() {
            return Ok("TLS without client certificates".to_owned());
        }
        let mut said = format!("mutual TLS (callers named by {}", self.identity.as_str());
        if self.operator_ca.is_some() {
            said += ", operators by their own CA";
        }
        if !self.crl.is_empty() {
            said += &format!(", {} CRL file(s)", self.crl.len());
        }
        Ok(said + ")")
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        match (&self.cert, &self.key) {
            (Some(_), Some(_)) | (None, None) => {}
            _ => bail!("tls.cert and tls.key go together"),
        }
        if self.client_ca.is_some() && self.cert.is_none() {
            bail!("tls.client_ca needs tls.cert and tls.key");
        }
        if self.operator_ca.is_some() && self.client_ca.is_none() {
            bail!("tls.operator_ca needs tls.client_ca (operators are callers of a mutual-TLS listener)");
        }
        if !self.crl.is_empty() && self.client_ca.is_none() {
            bail!("tls.crl needs tls.client_ca (the lists revoke client certificates)");
        }
        Ok(())
    }

    /// For the services without operators (the worker, the public-ID service): `operator_ca`
    /// there would only widen who may call.
    pub fn refuse_operator_ca(&self, service: &str) -> anyhow::Result<()> {
        if self.operator_ca.is_some() {
            bail!("tls.operator_ca is the registry's (its operators write there); {service} has no operators");
        }
        Ok(())
    }

    /// Builds the server configuration from the files as they are now.
    pub fn server_config(&self) -> anyhow::Result<Arc<ServerConfig>> {
        Ok(self.listener()?.config)
    }

    /// Everything a handshake needs, from the files as they are now.
    fn listener(&self) -> anyhow::Result<Listener> {
        self.validate()?;
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else { bail!("tls.cert and tls.key are not set") };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates(cert)?;
        let key =
            PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading the private key {}", key.display()))?;
        let crls = self.crl.iter().map(|path| crls(path)).collect::<anyhow::Result<Vec<_>>>()?.concat();
        let crl_next_update = crl_next_updates(&crls, &self.crl)?;
        let verifier_of = |roots: rustls::RootCertStore, what: &str| {
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .with_crls(crls.clone())
                .build()
                .with_context(|| format!("{what} (or a tls.crl file)"))
        };
        let (verifier, operators): (Arc<dyn ClientCertVerifier>, _) = match &self.client_ca {
            Some(ca) => {
                let mut accepted = roots(ca)?;
                let operators = match &self.operator_ca {
                    Some(operator_ca) => {
                        let operator_roots = roots(operator_ca)?;
                        let callers = certificates(ca)?;
                        let operator_certificates = certificates(operator_ca)?;
                        if operator_certificates.iter().any(|root| callers.contains(root)) {
                            bail!(
                                "tls.operator_ca {} shares a CA with tls.client_ca {}: the callers' CA could then make operators",
                                operator_ca.display(),
                                ca.display()
                            );
                        }
                        // A callers' CA the operators' CA issued (a private CA's export: one root,
                        // a subordinate for workloads) puts every caller's chain under the
                        // operators' root.
                        for caller in &callers {
                            if let Some(issuer) = operator_certificates.iter().find(|o| signed_by(caller, o, &provider))
                            {
                                bail!(
                                    "tls.client_ca {} holds {}, which {} of tls.operator_ca {} issued: the callers' \
                                     chains would run through the operators' CA. Give operators a CA of their own, \
                                     outside the callers' chain",
                                    ca.display(),
                                    subject(caller),
                                    subject(issuer),
                                    operator_ca.display()
                                );
                            }
                        }
                        accepted.roots.extend(operator_roots.roots.iter().cloned());
                        Some(verifier_of(operator_roots, &format!("operator CA bundle {}", operator_ca.display()))?)
                    }
                    None => None,
                };
                (verifier_of(accepted, &format!("client CA bundle {}", ca.display()))?, operators)
            }
            None => (WebPkiClientVerifier::no_client_auth(), None),
        };
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_client_cert_verifier(verifier.clone())
            .with_single_cert(chain, key)
            .context("the server certificate and key do not go together")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Listener {
            config: Arc::new(config),
            verifier,
            mutual: self.mutual(),
            identity: self.identity,
            operators,
            crl_next_update,
            metrics_readers: self
                .metrics_readers
                .as_ref()
                .filter(|list| !list.iter().any(|n| n == "*"))
                .map(|list| list.iter().map(|name| Arc::<str>::from(name.as_str())).collect()),
        })
    }
}

/// Whether `certificate`'s signature was made by `issuer`'s key (one link of a chain), by the
/// algorithms rustls verifies with. Unreadable certificates are no link.
fn signed_by(
    certificate: &CertificateDer<'_>,
    issuer: &CertificateDer<'_>,
    provider: &rustls::crypto::CryptoProvider,
) -> bool {
    use x509_cert::der::{Decode, Encode};
    use x509_cert::spki::AlgorithmIdentifierOwned;
    let (Ok(certificate), Ok(issuer)) =
        (x509_cert::Certificate::from_der(certificate), x509_cert::Certificate::from_der(issuer))
    else {
        return false;
    };
    if certificate.tbs_certificate.issuer != issuer.tbs_certificate.subject {
        return false;
    }
    // An AlgorithmIdentifier's contents (its OID and parameters), as rustls names algorithms.
    let contents = |algorithm: &AlgorithmIdentifierOwned| -> Option<Vec<u8>> {
        let mut der = algorithm.oid.to_der().ok()?;
        if let Some(parameters) = &algorithm.parameters {
            der.extend(parameters.to_der().ok()?);
        }
        Some(der)
    };
    let key = &issuer.tbs_certificate.subject_public_key_info;
    let (Some(signature_algorithm), Some(key_algorithm), Ok(signed)) =
        (contents(&certificate.signature_algorithm), contents(&key.algorithm), certificate.tbs_certificate.to_der())
    else {
        return false;
    };
    let signature = certificate.signature.raw_bytes();
    provider.signature_verification_algorithms.all.iter().any(|algorithm| {
        algorithm.signature_alg_id().as_ref() == signature_algorithm.as_slice()
            && algorithm.public_key_alg_id().as_ref() == key_algorithm.as_slice()
            && algorithm.verify_signature(key.subject_public_key.raw_bytes(), &signed, signature).is_ok()
    })
}

/// A certificate's subject, for messages.
fn subject(certificate: &CertificateDer<'_>) -> String {
    use x509_cert::der::Decode;
    x509_cert::Certificate::from_der(certificate)
        .map_or_else(|_| "an unreadable certificate".to_owned(), |c| format!("\"{}\"", c.tbs_certificate.subject))
}

/// The CRLs of a file: PEM (`-----BEGIN X509 CRL-----`, any number), else one DER CRL.
fn crls(path: &Path) -> anyhow::Result<Vec<CertificateRevocationListDer<'static>>> {
    let read = || format!("reading the CRL file {}", path.display());
    let pem = CertificateRevocationListDer::pem_file_iter(path)
        .with_context(read)?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing the CRL file {}", path.display()))?;
    if !pem.is_empty() {
        return Ok(pem);
    }
    let der = std::fs::read(path).with_context(read)?;
    // A DER CRL is a SEQUENCE; anything else is no CRL at all (the verifier parses it in full).
    if der.first() != Some(&0x30) {
        bail!("{} holds no CRL (PEM `X509 CRL` blocks or one DER CRL)", path.display());
    }
    Ok(vec![CertificateRevocationListDer::from(der)])
}

/// Each CRL's issuer and `nextUpdate` (Unix seconds; `None` for a CRL without one), refusing two
/// CRLs of one issuer (which of them would be in force is not said anywhere) and one that cannot
/// be read.
fn crl_next_updates(
    crls: &[CertificateRevocationListDer<'_>],
    files: &[PathBuf],
) -> anyhow::Result<Vec<(String, Option<i64>)>> {
    use x509_cert::der::Decode;
    let mut seen: Vec<(String, Option<i64>)> = Vec::with_capacity(crls.len());
    for crl in crls {
        let list = x509_cert::crl::CertificateList::from_der(crl)
            .map_err(|error| anyhow::anyhow!("a CRL of tls.crl {files:?} cannot be read: {error}"))?;
        let issuer = list.tbs_cert_list.issuer.to_string();
        if seen.iter().any(|(known, _)| *known == issuer) {
            bail!(
                "tls.crl {files:?} holds two CRLs of \"{issuer}\": keep its newest one only (which one is in force would \
                 otherwise be the verifier's choice)"
            );
        }
        let next = list.tbs_cert_list.next_update.map(|time| time.to_unix_duration().as_secs() as i64);
        seen.push((issuer, next));
    }
    Ok(seen)
}

/// A CRL's issuer, as its `nextUpdate` gauge is labelled.
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct IssuerLabel {
    pub issuer: String,
}

/// What one handshake runs with: the rustls configuration, and how its verified client
/// certificate becomes a [`Caller`].
pub(crate) struct Listener {
    config: Arc<ServerConfig>,
    /// What the handshake verifies a client certificate with (both CAs, the CRLs): asked again
    /// of every open connection on a reload.
    verifier: Arc<dyn ClientCertVerifier>,
    mutual: bool,
    identity: IdentityForm,
    /// The operator CA alone (with the CRLs): a caller's certificate is verified against it again
    /// after the handshake, without the intermediates it sent, to say whether the caller holds an
    /// operator's certificate.
    operators: Option<Arc<dyn ClientCertVerifier>>,
    /// Each CRL's issuer and `nextUpdate` (Unix seconds), for `idgen_tls_crl_next_update_seconds`.
    crl_next_update: Vec<(String, Option<i64>)>,
    /// Who may read `/metrics`; `None`: every caller.
    metrics_readers: Option<std::collections::HashSet<Arc<str>>>,
}

impl Listener {
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }

    /// The caller of a connection whose handshake presented `chain` (leaf first; none: `None`),
    /// or the `reason` it is refused under.
    pub(crate) fn caller(&self, chain: Option<&[CertificateDer<'static>]>) -> Result<Caller, &'static str> {
        let Some((leaf, _intermediates)) = chain.and_then(|chain| chain.split_first()) else {
            return if self.mutual { Err("no_client_certificate") } else { Ok(Caller::anonymous()) };
        };
        let caller = Caller::of_certificate(leaf, self.identity).map_err(|refused: NoCaller| refused.reason())?;
        // Issued by the operators' CA itself: a chain through a subordinate the caller sends (one
        // the same root issued for workloads) makes no operator.
        let operator = self
            .operators
            .as_ref()
            .is_some_and(|operators| operators.verify_client_cert(leaf, &[], UnixTime::now()).is_ok());
        let reads_metrics = self.metrics_readers.as_ref().is_none_or(|readers| readers.contains(caller.key()));
        Ok(caller.operator_certificate(operator).metrics_reader(reads_metrics))
    }

    /// Whether a connection opened with `chain` (as `caller`) would still be let in, as the same
    /// caller, by this configuration.
    fn still_accepts(&self, chain: &[CertificateDer<'static>], caller: &Caller) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else { return !self.mutual };
        self.verifier.verify_client_cert(leaf, intermediates, UnixTime::now()).is_ok()
            && self.caller(Some(chain)).is_ok_and(|now| {
                now.name() == caller.name() && now.has_operator_certificate() == caller.has_operator_certificate()
            })
    }
}

/// An open connection with a client certificate, for [`Tls::reload`] to check again.
#[derive(Clone)]
struct Live {
    /// The client's chain as far as [`kept_chain`] keeps it.
    chain: Arc<[CertificateDer<'static>]>,
    caller: Caller,
    activity: std::sync::Weak<crate::connection::Activity>,
}

/// What an open connection keeps of its client's chain for reloads to check again: the leaf,
/// and the intermediates after it while they come to at most [`KEPT_CHAIN_BYTES`] in all and
/// [`KEPT_CHAIN_CERTIFICATES`] in number. A client may send ~64 KiB of chain, and 4,096
/// connections would keep 256 MiB of it; a real path is a leaf and an intermediate or two. A
/// chain whose path needed more fails the check of a reload, and its connection is closed (its
/// client handshakes again, checked in full).
fn kept_chain(chain: Vec<CertificateDer<'static>>) -> Arc<[CertificateDer<'static>]> {
    let mut bytes = 0;
    let kept = chain.into_iter().enumerate().take_while(|(i, certificate)| {
        bytes += certificate.len();
        *i == 0 || bytes <= KEPT_CHAIN_BYTES
    });
    kept.map(|(_, certificate)| certificate).take(KEPT_CHAIN_CERTIFICATES).collect()
}

/// See [`kept_chain`].
const KEPT_CHAIN_BYTES: usize = 16 * 1024;
const KEPT_CHAIN_CERTIFICATES: usize = 4;

/// A connection's place among [`Tls`]'s open ones, given up when it closes.
pub(crate) struct Watched {
    tls: Arc<Tls>,
    id: u64,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.tls.live().remove(&self.id);
    }
}

/// The TLS configuration in force on a listener.
pub struct Tls {
    current: ArcSwap<Listener>,
    /// Where each CRL's `nextUpdate` is exported, once a listener serves with these files.
    crl_gauge: std::sync::OnceLock<Family<IssuerLabel, Gauge>>,
    /// The open connections with a client certificate, by a number of their own.
    live: std::sync::Mutex<std::collections::HashMap<u64, Live>>,
    next: std::sync::atomic::AtomicU64,
}

impl Tls {
    pub fn load(section: &TlsSection) -> anyhow::Result<Tls> {
        Ok(Tls {
            current: ArcSwap::from_pointee(section.listener()?),
            crl_gauge: Default::default(),
            live: Default::default(),
            next: Default::default(),
        })
    }

    /// Takes the files as they are now; on any error the configuration in force stays. Every
    /// open connection whose certificate the new configuration does not accept (revoked by a new
    /// CRL, of a CA no longer listed) is closed before it serves another request; returns how
    /// many.
    pub fn reload(&self, section: &TlsSection) -> anyhow::Result<usize> {
        let listener = Arc::new(section.listener()?);
        // What a caller is, and whether it must present a certificate at all, is the process's
        // from its start: a file edited (or a `development = true` let in) turns neither off.
        let current = self.current.load();
        if current.mutual && !listener.mutual {
            bail!(
                "the new [tls] has no client_ca: a reload never turns mutual TLS off (a restart does, if it is meant)"
            );
        }
        if current.identity != listener.identity {
            bail!(
                "tls.identity changes from {:?} to {:?}: what names a caller changes only on a restart",
                current.identity,
                listener.identity
            );
        }
        self.current.store(listener.clone());
        self.export_crls();
        // Checked outside the lock a finished handshake takes to register its connection ([`Self::watch`]):
        // one registered after this copy checks itself against the configuration just stored.
        let open: Vec<Live> = self.live().values().cloned().collect();
        let mut closed = 0;
        for live in open {
            if !listener.still_accepts(&live.chain, &live.caller)
                && let Some(activity) = live.activity.upgrade()
            {
                activity.revoke();
                closed += 1;
            }
        }
        if closed > 0 {
            tracing::warn!(closed, "closed open connections whose client certificate the new TLS files do not accept");
        }
        Ok(closed)
    }

    /// Closes every open connection whose caller `closes` picks (a role a reload took away from
    /// it), as a revocation closes one: before it serves another request. Returns how many.
    pub fn close_callers(&self, closes: impl Fn(&Caller) -> bool) -> usize {
        let mut closed = 0;
        for live in self.live().values() {
            if closes(&live.caller)
                && let Some(activity) = live.activity.upgrade()
            {
                activity.revoke();
                closed += 1;
            }
        }
        closed
    }

    /// Exports each CRL's `nextUpdate` in `family` from now on, reloads included.
    pub(crate) fn export_crls_to(&self, family: &Family<IssuerLabel, Gauge>) {
        let _ = self.crl_gauge.set(family.clone());
        self.export_crls();
    }

    fn export_crls(&self) {
        let Some(family) = self.crl_gauge.get() else { return };
        family.clear();
        for (issuer, next) in &self.current.load().crl_next_update {
            if let Some(next) = next {
                family.get_or_create(&IssuerLabel { issuer: issuer.clone() }).set(*next);
            }
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Live>> {
        self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps an open connection's certificate for the next reload to check again. A reload that
    /// came while the connection's handshake ran (under `handshake`, the configuration before it)
    /// swept the open connections without this one: it is checked against the configuration in
    /// force now, once registered, so that either the sweep or this check sees it (a reload
    /// stores the new configuration before it sweeps). A revoked operator holding a handshake
    /// half done across the reload finishes it into a closed connection.
    pub(crate) fn watch(
        self: &Arc<Self>,
        handshake: &Arc<Listener>,
        chain: Vec<CertificateDer<'static>>,
        caller: Caller,
        activity: &Arc<crate::connection::Activity>,
    ) -> Watched {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let chain = kept_chain(chain);
        let live = Live { chain: chain.clone(), caller: caller.clone(), activity: Arc::downgrade(activity) };
        self.live().insert(id, live);
        let now = self.current.load_full();
        if !Arc::ptr_eq(&now, handshake) && !now.still_accepts(&chain, &caller) {
            tracing::warn!(
                caller = caller.name(),
                "a connection whose handshake outlived a reload that no longer accepts its certificate: closing it"
            );
            activity.revoke();
        }
        Watched { tls: self.clone(), id }
    }

    pub fn mutual(&self) -> bool {
        self.current.load().mutual
    }

    /// What the next handshake runs with.
    pub(crate) fn listener(&self) -> Arc<Listener> {
        self.current.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{DevCa, Issued};

    struct Files {
        dir: tempfile::TempDir,
        callers: DevCa,
        operators: DevCa,
    }

    impl Files {
        fn new() -> Files {
            let dir = tempfile::tempdir().unwrap();
            let (callers, operators) = (DevCa::new("callers").unwrap(), DevCa::new("operators").unwrap());
            std::fs::write(dir.path().join("ca.pem"), callers.ca_pem()).unwrap();
            std::fs::write(dir.path().join("operators-ca.pem"), operators.ca_pem()).unwrap();
            callers.server(&["localhost"]).unwrap().write(dir.path(), "server").unwrap();
            Files { dir, callers, operators }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        fn section(&self) -> TlsSection {
            TlsSection {
                cert: Some(self.path("server.pem")),
                key: Some(self.path("server-key.pem")),
                client_ca: Some(self.path("ca.pem")),
                operator_ca: Some(self.path("operators-ca.pem")),
                ..TlsSection::default()
            }
        }
    }

    fn chain(issued: &Issued) -> Vec<CertificateDer<'static>> {
        vec![CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap()]
    }

    /// A connection keeps its leaf and at most 16 KiB and 4 certificates of its chain (before,
    /// it kept whatever the client sent, up to ~64 KiB each).
    #[test]
    fn a_connection_keeps_its_leaf_and_a_capped_path() {
        let certificate = |bytes: usize| CertificateDer::from(vec![7u8; bytes]);
        let long: Vec<_> = std::iter::once(certificate(40_000)).chain((0..10).map(|_| certificate(6_000))).collect();
        assert_eq!(kept_chain(long).len(), 1, "a leaf over the cap is kept alone");
        let usual = vec![certificate(1_200), certificate(1_100), certificate(1_300)];
        assert_eq!(&*kept_chain(usual.clone()), &usual[..], "a leaf and two intermediates, whole");
        let padded: Vec<_> = std::iter::once(certificate(1_000)).chain((0..10).map(|_| certificate(6_000))).collect();
        assert_eq!(kept_chain(padded).len(), 3, "1,000 + 6,000 + 6,000 bytes; the next passes 16 KiB");
        let many: Vec<_> = (0..10).map(|_| certificate(100)).collect();
        assert_eq!(kept_chain(many).len(), 4);
    }

    #[test]
    fn only_a_certificate_of_the_operator_ca_is_an_operators() {
        let files = Files::new();
        let listener = files.section().listener().unwrap();
        let name = "spiffe://corp/operator/ops-oncall";
        let operator = listener.caller(Some(&chain(&files.operators.client(name).unwrap()))).unwrap();
        assert_eq!((operator.name(), operator.has_operator_certificate()), (name, true));
        let impostor = listener.caller(Some(&chain(&files.callers.client(name).unwrap()))).unwrap();
        assert_eq!((impostor.name(), impostor.has_operator_certificate()), (name, false));
        assert_eq!(listener.caller(None), Err("no_client_certificate"));
        let cn_only = files.callers.client("ops-oncall").unwrap();
        assert_eq!(listener.caller(Some(&chain(&cn_only))), Err("certificate_names_nobody"), "uri_san by default");
        // Without an operator CA nobody holds an operator's certificate.
        let plain = TlsSection { operator_ca: None, ..files.section() }.listener().unwrap();
        let caller = plain.caller(Some(&chain(&files.callers.client(name).unwrap()))).unwrap();
        assert!(!caller.has_operator_certificate());
    }

    #[test]
    fn a_certificate_through_a_subordinate_of_the_operators_root_is_no_operators() {
        // A private CA's export: the operators' root also issued a subordinate CA for workloads.
        let files = Files::new();
        let workloads = files.operators.subordinate("workloads").unwrap();
        let name = "spiffe://corp/operator/ops-oncall";
        let workload = workloads.client(name).unwrap();
        let through =
            vec![chain(&workload)[0].clone(), CertificateDer::from_pem_slice(workloads.ca_pem().as_bytes()).unwrap()];
        let listener = files.section().listener().unwrap();
        let caller = listener.caller(Some(&through)).unwrap();
        assert_eq!((caller.name(), caller.has_operator_certificate()), (name, false));
        // The operators' own certificates still make operators.
        let operator = listener.caller(Some(&chain(&files.operators.client(name).unwrap()))).unwrap();
        assert!(operator.has_operator_certificate());
        // The subordinate as the callers' CA beside its root as the operators': refused at load.
        std::fs::write(files.path("workloads-ca.pem"), workloads.ca_pem()).unwrap();
        let chained = TlsSection { client_ca: Some(files.path("workloads-ca.pem")), ..files.section() };
        let said = format!("{:#}", chained.listener().err().unwrap());
        assert!(said.contains("which \"CN=operators\" of tls.operator_ca") && said.contains("CN=workloads"), "{said}");
        // An unrelated callers' CA is no link of the operators' chain.
        let provider = rustls::crypto::ring::default_provider();
        let der = |pem: String| CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let (root, sub) = (der(files.operators.ca_pem()), der(workloads.ca_pem()));
        assert!(signed_by(&sub, &root, &provider) && !signed_by(&root, &sub, &provider));
        assert!(!signed_by(&der(files.callers.ca_pem()), &root, &provider));
    }

    #[test]
    fn the_operator_ca_may_not_be_the_callers_and_crls_load_or_refuse() {
        let files = Files::new();
        let shared = TlsSection { operator_ca: Some(files.path("ca.pem")), ..files.section() };
        let said = format!("{:#}", shared.listener().err().unwrap());
        assert!(said.contains("shares a CA with tls.client_ca"), "{said}");

        std::fs::write(files.path("crl.pem"), files.callers.crl(&[]).unwrap()).unwrap();
        let with_crl = TlsSection { crl: vec![files.path("crl.pem")], ..files.section() };
        assert!(with_crl.check().unwrap().contains("1 CRL file(s)"));
        for (what, text) in [
            ("garbage", &b"not a CRL"[..]),
            ("a bad PEM CRL", b"-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"),
        ] {
            std::fs::write(files.path("crl.pem"), text).unwrap();
            assert!(with_crl.listener().is_err(), "{what} was taken as a CRL");
        }
        let without_client_ca = TlsSection { client_ca: None, operator_ca: None, ..with_crl };
        assert!(format!("{:#}", without_client_ca.validate().unwrap_err()).contains("tls.crl needs tls.client_ca"));
    }

    /// Each CRL's nextUpdate is exported by issuer (and again after a reload), and a
    /// file holding two CRLs of one issuer is refused.
    #[test]
    fn crls_export_their_next_update_and_one_issuer_has_one() {
        let files = Files::new();
        std::fs::write(files.path("crl.pem"), files.callers.crl(&[]).unwrap()).unwrap();
        let with_crl = TlsSection { crl: vec![files.path("crl.pem")], ..files.section() };
        let tls = Tls::load(&with_crl).unwrap();
        let family = Family::<IssuerLabel, Gauge>::default();
        tls.export_crls_to(&family);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("crl_next_update_seconds", "", family.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        // 4096-01-01T00:00:00Z, the development CA's nextUpdate.
        assert!(text.contains("crl_next_update_seconds{issuer=\"CN=callers\"} 67090118400"), "{text}");
        let two = format!("{}{}", files.callers.crl(&[]).unwrap(), files.callers.crl(&[]).unwrap());
        std::fs::write(files.path("crl.pem"), two).unwrap();
        let said = format!("{:#}", tls.reload(&with_crl).unwrap_err());
        assert!(said.contains("two CRLs of \"CN=callers\""), "{said}");
        std::fs::write(files.path("crl.pem"), files.operators.crl(&[]).unwrap()).unwrap();
        tls.reload(&with_crl).unwrap();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("issuer=\"CN=operators\"") && !text.contains("CN=callers"), "{text}");
    }

    /// Over mutual TLS only a listed identity reads `/metrics` (every caller without the
    /// key, as development runs; `"*"` every identified one).
    #[test]
    fn only_listed_callers_read_metrics() {
        let files = Files::new();
        let scraper = "spiffe://corp/host/scraper";
        let certificate = |name: &str| chain(&files.callers.client(name).unwrap());
        let listed = TlsSection { metrics_readers: Some(vec![scraper.into()]), ..files.section() }.listener().unwrap();
        assert!(listed.caller(Some(&certificate(scraper))).unwrap().reads_metrics());
        assert!(!listed.caller(Some(&certificate("spiffe://corp/ns/shop/sa/storefront"))).unwrap().reads_metrics());
        let every = TlsSection { metrics_readers: Some(vec!["*".into()]), ..files.section() }.listener().unwrap();
        assert!(every.caller(Some(&certificate("spiffe://corp/ns/shop/sa/storefront"))).unwrap().reads_metrics());
        assert!(files.section().listener().unwrap().caller(Some(&certificate(scraper))).unwrap().reads_metrics());
    }

    /// A reload of files that drop the client CA, or change what names a caller, is
    /// refused, and the listener in force stays.
    #[test]
    fn a_reload_never_turns_mutual_tls_off() {
        let files = Files::new();
        let tls = Tls::load(&files.section()).unwrap();
        let plain = TlsSection { client_ca: None, operator_ca: None, ..files.section() };
        let said = format!("{:#}", tls.reload(&plain).unwrap_err());
        assert!(said.contains("never turns mutual TLS off"), "{said}");
        let cn = TlsSection { identity: IdentityForm::Cn, ..files.section() };
        assert!(format!("{:#}", tls.reload(&cn).unwrap_err()).contains("tls.identity changes"));
        assert!(
            tls.listener().mutual && tls.listener().identity == IdentityForm::UriSan,
            "the listener in force stays"
        );
        assert_eq!(tls.reload(&files.section()).unwrap(), 0, "the same files reload");
    }

    #[test]
    fn production_reads_uri_sans_only_and_operator_ca_is_the_registrys() {
        let files = Files::new();
        let said = files.section().missing_for_production();
        assert!(said.len() == 1 && said[0].contains("tls.metrics_readers"), "{said:?}");
        let readers =
            TlsSection { metrics_readers: Some(vec!["spiffe://corp/host/scraper".into()]), ..files.section() };
        assert!(readers.missing_for_production().is_empty());
        let cn = TlsSection { identity: IdentityForm::Cn, ..files.section() };
        assert!(cn.missing_for_production().iter().any(|m| m.contains("tls.identity = \"uri_san\"")));
        assert!(files.section().refuse_operator_ca("the worker").is_err());
        let parsed: TlsSection = serde_json::from_str(r#"{"identity": "cn", "crl": ["a.pem"]}"#).unwrap();
        assert_eq!((parsed.identity, parsed.crl), (IdentityForm::Cn, vec![PathBuf::from("a.pem")]));
        assert_eq!(serde_json::from_str::<TlsSection>("{}").unwrap().identity, IdentityForm::UriSan);
        assert!(serde_json::from_str::<TlsSection>(r#"{"identity": "first_uri_else_cn"}"#).is_err());
    }
}
