//! A development CA: what `idgen up --tls` and the tests issue certificates with (rcgen, no
//! openssl). Production certificates come from a real CA (AWS Private CA); nothing here is used
//! to serve them.

use std::net::IpAddr;
use std::path::Path;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A self-signed CA that issues server and client certificates.
pub struct DevCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Issued {
    /// Writes `<name>.pem` and `<name>-key.pem` into `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> anyhow::Result<()> {
        std::fs::write(dir.join(format!("{name}.pem")), &self.cert_pem)?;
        write_private(&dir.join(format!("{name}-key.pem")), &self.key_pem)
    }
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

impl DevCa {
    pub fn new(name: &str) -> anyhow::Result<DevCa> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        Ok(DevCa { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate()?)? })
    }

    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for these DNS names and IP addresses.
    pub fn server(&self, names: &[&str]) -> anyhow::Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("idgen"));
        for name in names {
            params.subject_alt_names.push(match name.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*name).try_into()?),
            });
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A client certificate naming `identity`: as a URI SAN when it is one (`spiffe://…`),
    /// else as the subject CN.
    pub fn client(&self, identity: &str) -> anyhow::Result<Issued> {
        self.issue(client_params(identity)?)
    }

    /// A client certificate valid only from `not_before` until `not_after` (tests: expired, not
    /// yet valid).
    pub fn client_valid(
        &self,
        identity: &str,
        not_before: (i32, u8, u8),
        not_after: (i32, u8, u8),
    ) -> anyhow::Result<Issued> {
        let mut params = client_params(identity)?;
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> anyhow::Result<Issued> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

fn client_params(identity: &str) -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    if identity.contains("://") {
        params.subject_alt_names.push(SanType::URI(identity.try_into()?));
        params.distinguished_name.push(DnType::CommonName, "client");
    } else {
        params.distinguished_name.push(DnType::CommonName, identity);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    Ok(params)
}
