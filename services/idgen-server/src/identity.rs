//! Who is calling: taken once per connection, from the client certificate the TLS handshake
//! verified, and handed to every request of that connection.
//!
//! A certificate names its caller in one form only, the one the listener is configured with
//! (`[tls] identity`): its URI SAN (`uri_san`, production: `spiffe://…`) or its subject CN (`cn`,
//! development). The other form is never looked at, so a certificate cannot pass for one caller
//! by its CN and for another by its URI. A certificate naming nobody, several callers, or a name
//! the services keep for themselves ([`RESERVED`]) is refused at the handshake.

use std::sync::Arc;

use serde::Deserialize;
use x509_cert::Certificate;
use x509_cert::der::Decode;
use x509_cert::der::asn1::ObjectIdentifier;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;

/// The caller's identity: what its certificate names (see [`IdentityForm`]); `anonymous` over
/// plain HTTP. With it, whether the certificate chains to the listener's operator CA (the only
/// way a certificate makes its caller an operator, see [`Caller::has_operator_certificate`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    name: Arc<str>,
    operator_certificate: bool,
    /// Whether it may read `/metrics` ([`Caller::reads_metrics`]).
    metrics_reader: bool,
}

/// The one identity of plain-HTTP (development) connections.
pub const ANONYMOUS: &str = "anonymous";

/// Names no certificate may carry, compared without regard to ASCII case: `anonymous` (every
/// caller over plain HTTP, and every caller of TLS without client certificates), `default` (the
/// quota of callers not listed, `[quotas] default`) and `other` (the label under which the
/// quota metrics count callers not listed). A certificate naming one would merge its caller with
/// those.
pub const RESERVED: [&str; 3] = [ANONYMOUS, "default", "other"];

/// `[tls] identity`: which part of a client certificate names its caller.
#[derive(Debug, Clone, Copy, Default, Deserialize, serde::Serialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum IdentityForm {
    /// Only the URI SAN (exactly one), e.g. `spiffe://corp/ns/orders/sa/api`; the CN is not
    /// read. The default, and the only form production accepts: a URI SAN is what a workload CA
    /// (SPIFFE, AWS Private CA templates) vouches for, where a CN is free text any requester
    /// writes.
    #[default]
    UriSan,
    /// Only the subject CN (exactly one): development CAs and `idgen up`.
    Cn,
}

impl IdentityForm {
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityForm::UriSan => "uri_san",
            IdentityForm::Cn => "cn",
        }
    }
}

/// Why a verified certificate names no caller; the reason is counted under
/// `idgen_tls_handshake_failures{reason}` and the handshake refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoCaller {
    /// No name in the configured form (a CN-only certificate under `uri_san`, say), an empty
    /// one, one with control characters, or a certificate that does not parse.
    #[error("the certificate names no caller in the configured form")]
    NamesNobody,
    /// More than one name in the configured form: which one would be the caller is a guess.
    #[error("the certificate names more than one caller")]
    NamesSeveral,
    /// A name in [`RESERVED`].
    #[error("the certificate names {0:?}, a name reserved by the services")]
    Reserved(String),
}

impl NoCaller {
    /// The `reason` label of the refusal.
    pub fn reason(&self) -> &'static str {
        match self {
            NoCaller::NamesNobody => "certificate_names_nobody",
            NoCaller::NamesSeveral => "certificate_names_several",
            NoCaller::Reserved(_) => "reserved_identity",
        }
    }
}

const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const SUBJECT_ALT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");

impl Caller {
    pub fn anonymous() -> Self {
        Caller { name: ANONYMOUS.into(), operator_certificate: false, metrics_reader: true }
    }

    /// A caller by name, its certificate from the callers' CA (tests, and services that take the
    /// caller from elsewhere).
    pub fn named(name: &str) -> Self {
        Caller { name: name.into(), operator_certificate: false, metrics_reader: true }
    }

    /// A caller whose certificate chains to the operator CA (tests of what an operator may do).
    pub fn with_operator_certificate(name: &str) -> Self {
        Caller { name: name.into(), operator_certificate: true, metrics_reader: true }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the caller's certificate chains to the listener's `operator_ca` (verified at the
    /// handshake, against that CA alone). A certificate from the callers' CA never does, whatever
    /// it names: the registry takes a caller as an operator only when this holds and the name is
    /// listed in `certificate_operators`.
    pub fn has_operator_certificate(&self) -> bool {
        self.operator_certificate
    }

    /// Whether the caller may read `/metrics`, which shows every caller's volumes: over mutual
    /// TLS only an identity `tls.metrics_readers` lists (every one where the key is unset, which
    /// production refuses); over plain HTTP (development), anybody.
    pub fn reads_metrics(&self) -> bool {
        self.metrics_reader
    }

    /// The same caller, allowed to read `/metrics` or not.
    pub(crate) fn metrics_reader(self, allowed: bool) -> Self {
        Caller { metrics_reader: allowed, ..self }
    }

    /// The name as a shared key (no copy per request).
    pub(crate) fn key(&self) -> &Arc<str> {
        &self.name
    }

    /// The same caller, vouched for (or not) by the operator CA.
    pub(crate) fn operator_certificate(self, verified: bool) -> Self {
        Caller { operator_certificate: verified, ..self }
    }

    /// Whether `name` is one no certificate may carry ([`RESERVED`], any ASCII case).
    pub fn is_reserved(name: &str) -> bool {
        RESERVED.iter().any(|reserved| reserved.eq_ignore_ascii_case(name))
    }

    /// The identity a verified client certificate names in `form`, or why it names none.
    pub fn of_certificate(der: &[u8], form: IdentityForm) -> Result<Self, NoCaller> {
        let certificate = Certificate::from_der(der).map_err(|_| NoCaller::NamesNobody)?;
        let tbs = &certificate.tbs_certificate;
        let names: Vec<String> = match form {
            IdentityForm::UriSan => tbs
                .extensions
                .iter()
                .flatten()
                .filter(|e| e.extn_id == SUBJECT_ALT_NAME)
                .map(|extension| SubjectAltName::from_der(extension.extn_value.as_bytes()).map(|names| names.0))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| NoCaller::NamesNobody)?
                .into_iter()
                .flatten()
                .filter_map(|name| match name {
                    GeneralName::UniformResourceIdentifier(uri) => Some(uri.to_string()),
                    _ => None,
                })
                .collect(),
            IdentityForm::Cn => tbs
                .subject
                .0
                .iter()
                .flat_map(|rdn| rdn.0.iter())
                .filter(|atv| atv.oid == COMMON_NAME)
                .map(|atv| std::str::from_utf8(atv.value.value()).map(str::to_owned).map_err(|_| NoCaller::NamesNobody))
                .collect::<Result<_, _>>()?,
        };
        let name = match names.as_slice() {
            [] => return Err(NoCaller::NamesNobody),
            [name] => name,
            _ => return Err(NoCaller::NamesSeveral),
        };
        if name.trim().is_empty() || name.chars().any(char::is_control) {
            return Err(NoCaller::NamesNobody);
        }
        if Caller::is_reserved(name) {
            return Err(NoCaller::Reserved(name.clone()));
        }
        Ok(Caller::named(name))
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// Handlers behind an axum router read the connection's caller as an extractor.
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Caller>().cloned().unwrap_or_else(Caller::anonymous))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate with these CNs (rcgen keeps one per attribute type: at most one here) and
    /// URI SANs.
    fn certificate(common_names: &[&str], uris: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for common_name in common_names {
            params.distinguished_name.push(rcgen::DnType::CommonName, *common_name);
        }
        for uri in uris {
            params.subject_alt_names.push(rcgen::SanType::URI(rcgen::string::Ia5String::try_from(*uri).unwrap()));
        }
        params.subject_alt_names.push(rcgen::SanType::DnsName("orders.internal".try_into().unwrap()));
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    const SPIFFE: &str = "spiffe://corp/ns/orders/sa/api";

    #[test]
    fn under_uri_san_only_the_one_uri_san_names_the_caller() {
        let of = |der: Vec<u8>| Caller::of_certificate(&der, IdentityForm::UriSan);
        assert_eq!(of(certificate(&["ops-oncall"], &[SPIFFE])).unwrap().name(), SPIFFE, "the CN is not read");
        assert_eq!(of(certificate(&["ops-oncall"], &[])), Err(NoCaller::NamesNobody), "a CN alone names nobody");
        assert_eq!(of(certificate(&[], &[SPIFFE, "spiffe://corp/other"])), Err(NoCaller::NamesSeveral));
        assert_eq!(of(b"not a certificate".to_vec()), Err(NoCaller::NamesNobody));
        assert_eq!(IdentityForm::default(), IdentityForm::UriSan, "the safe form is the default");
    }

    #[test]
    fn under_cn_only_the_one_cn_names_the_caller() {
        let of = |der: Vec<u8>| Caller::of_certificate(&der, IdentityForm::Cn);
        assert_eq!(of(certificate(&["ingest"], &[SPIFFE])).unwrap().name(), "ingest", "the URI is not read");
        assert_eq!(of(certificate(&[], &[SPIFFE])), Err(NoCaller::NamesNobody));
        assert_eq!(of(certificate(&[""], &[])), Err(NoCaller::NamesNobody), "an empty CN names nobody");
        assert_eq!(of(certificate(&["a\nb"], &[])), Err(NoCaller::NamesNobody), "no control characters");
    }

    #[test]
    fn reserved_names_are_refused_in_every_form_and_case() {
        for name in ["anonymous", "Anonymous", "default", "OTHER"] {
            let cn = Caller::of_certificate(&certificate(&[name], &[]), IdentityForm::Cn).unwrap_err();
            assert_eq!(cn, NoCaller::Reserved(name.to_owned()));
            assert_eq!(cn.reason(), "reserved_identity");
        }
        let uri = Caller::of_certificate(&certificate(&["x"], &["anonymous"]), IdentityForm::UriSan).unwrap_err();
        assert_eq!(uri, NoCaller::Reserved("anonymous".to_owned()));
        let named = Caller::of_certificate(&certificate(&["orders"], &[]), IdentityForm::Cn).unwrap();
        assert!(!named.has_operator_certificate(), "an operator only by the operator CA");
    }
}
