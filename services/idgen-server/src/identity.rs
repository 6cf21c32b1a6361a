//! Who is calling: taken once per connection, from the client certificate the TLS handshake
//! verified, and handed to every request of that connection.

use std::sync::Arc;

use x509_cert::Certificate;
use x509_cert::der::Decode;
use x509_cert::der::asn1::ObjectIdentifier;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;

/// The caller's identity: the certificate's first URI SAN when it has one (e.g.
/// `spiffe://corp/ns/orders/sa/api`), else its subject CN; `anonymous` over plain HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller(Arc<str>);

/// The one identity of plain-HTTP (development) connections.
pub const ANONYMOUS: &str = "anonymous";

const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const SUBJECT_ALT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");

impl Caller {
    pub fn anonymous() -> Self {
        Caller(ANONYMOUS.into())
    }

    pub fn named(name: &str) -> Self {
        Caller(name.into())
    }

    pub fn name(&self) -> &str {
        &self.0
    }

    /// The name as a shared key (no copy per request).
    pub(crate) fn key(&self) -> &Arc<str> {
        &self.0
    }

    /// The identity a verified client certificate names; `None` when it names nobody (no URI
    /// SAN and no CN), which the handshake then refuses.
    pub fn of_certificate(der: &[u8]) -> Option<Self> {
        let certificate = Certificate::from_der(der).ok()?;
        let tbs = &certificate.tbs_certificate;
        let uri = tbs.extensions.iter().flatten().filter(|e| e.extn_id == SUBJECT_ALT_NAME).find_map(|extension| {
            let names = SubjectAltName::from_der(extension.extn_value.as_bytes()).ok()?;
            names.0.into_iter().find_map(|name| match name {
                GeneralName::UniformResourceIdentifier(uri) => Some(uri.to_string()),
                _ => None,
            })
        });
        let common_name = || {
            tbs.subject
                .0
                .iter()
                .flat_map(|rdn| rdn.0.iter())
                .find(|atv| atv.oid == COMMON_NAME)
                .and_then(|atv| std::str::from_utf8(atv.value.value()).ok().map(str::to_owned))
        };
        uri.or_else(common_name).filter(|name| !name.is_empty()).map(|name| Caller(name.into()))
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
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

    fn certificate(common_name: &str, uris: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
        for uri in uris {
            params.subject_alt_names.push(rcgen::SanType::URI(rcgen::string::Ia5String::try_from(*uri).unwrap()));
        }
        params.subject_alt_names.push(rcgen::SanType::DnsName("orders.internal".try_into().unwrap()));
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_first_uri_san_else_the_common_name() {
        let spiffe = "spiffe://corp/ns/orders/sa/api";
        let named = Caller::of_certificate(&certificate("orders", &[spiffe, "spiffe://corp/other"])).unwrap();
        assert_eq!(named.name(), spiffe);
        assert_eq!(Caller::of_certificate(&certificate("ingest", &[])).unwrap().name(), "ingest");
        assert_eq!(Caller::of_certificate(&certificate("", &[])), None, "names nobody");
        assert_eq!(Caller::of_certificate(b"not a certificate"), None);
    }
}
