//! A development CA: what `idgen up --tls` and the tests issue certificates with (rcgen, no
//! openssl). Production certificates come from a real CA (AWS Private CA); nothing here is used
//! to serve them.

use std::net::IpAddr;
use std::path::Path;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason, RevokedCertParams, SanType,
    SerialNumber,
};

/// A self-signed CA that issues server and client certificates.
pub struct DevCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM, and its serial number (what a CRL names).
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub serial: Vec<u8>,
}

impl Issued {
    /// Writes `<name>.pem` and `<name>-key.pem` into `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> anyhow::Result<()> {
        std::fs::write(dir.join(format!("{name}.pem")), &self.cert_pem)?;
        write_private(&dir.join(format!("{name}-key.pem")), &self.key_pem)
    }
}

/// Writes a private file (a key, a token) readable by its owner only from the moment it exists:
/// made with mode 0600, never widened then narrowed; one that existed is narrowed before it is
/// written.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).with_context(|| format!("creating {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    file.set_len(0)?;
    std::io::Write::write_all(&mut file, text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

/// Creates a private file holding `text` (mode 0600 at creation) unless it exists: `false` if
/// another process (or an earlier run) made it first.
pub fn create_private(path: &Path, text: &str) -> anyhow::Result<bool> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(mut file) => {
            std::io::Write::write_all(&mut file, text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(true)
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(error) => Err(error).with_context(|| format!("creating {}", path.display())),
    }
}

/// Reads a private file, refusing one that others than its owner may read or write (a key or
/// token file copied with the wrong mode, or made by an older version): it is no longer secret.
pub fn read_private(path: &Path) -> anyhow::Result<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.permissions().mode();
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "{} may be read or written by others than its owner (mode {:o}): it is a secret. `chmod 600` it if \
                 no one else has read it, else remove it (it is made again)",
                path.display(),
                mode & 0o777
            );
        }
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

#[cfg(all(test, unix))]
mod private_files {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// Private files are 0600 from their creation, and one wider is refused.
    #[test]
    fn private_files_are_the_owners_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let token = dir.path().join("token");
        assert!(create_private(&token, "secret\n").unwrap());
        assert!(!create_private(&token, "another\n").unwrap(), "made once");
        assert_eq!((mode(&token), read_private(&token).unwrap().as_str()), (0o600, "secret\n"));
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        let said = format!("{:#}", read_private(&token).unwrap_err());
        assert!(said.contains("mode 644"), "{said}");
        let key = dir.path().join("key.pem");
        std::fs::write(&key, "old, wide").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&key, "new").unwrap();
        assert_eq!((mode(&key), std::fs::read_to_string(&key).unwrap().as_str()), (0o600, "new"));
    }
}

impl DevCa {
    pub fn new(name: &str) -> anyhow::Result<DevCa> {
        Ok(DevCa { issuer: CertifiedIssuer::self_signed(ca_params(name)?, KeyPair::generate()?)? })
    }

    /// A CA this one signs (tests: a private CA's subordinate, whose certificates chain to this
    /// one through it).
    pub fn subordinate(&self, name: &str) -> anyhow::Result<DevCa> {
        Ok(DevCa { issuer: CertifiedIssuer::signed_by(ca_params(name)?, KeyPair::generate()?, &self.issuer)? })
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

    /// A client certificate with exactly this subject CN (or none) and these URI SANs (tests:
    /// certificates naming nobody, or several callers).
    pub fn client_named(&self, common_name: Option<&str>, uris: &[&str]) -> anyhow::Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(common_name) = common_name {
            params.distinguished_name.push(DnType::CommonName, common_name);
        }
        for uri in uris {
            params.subject_alt_names.push(SanType::URI((*uri).try_into()?));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    /// A certificate revocation list of this CA revoking `revoked`, PEM (what `[tls] crl` reads).
    /// Its number is the time it is made (seconds), so a later list supersedes an earlier one.
    pub fn crl(&self, revoked: &[&Issued]) -> anyhow::Result<String> {
        let number = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
        let params = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(4096, 1, 1),
            crl_number: SerialNumber::from(number),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|issued| RevokedCertParams {
                    serial_number: SerialNumber::from(issued.serial.clone()),
                    revocation_time: rcgen::date_time_ymd(2020, 1, 1),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        Ok(params.signed_by(&self.issuer)?.pem()?)
    }

    fn issue(&self, params: CertificateParams) -> anyhow::Result<Issued> {
        use x509_cert::der::Decode;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let parsed = x509_cert::Certificate::from_der(cert.der())
            .map_err(|error| anyhow::anyhow!("reading back the certificate just issued: {error}"))?;
        let serial = parsed.tbs_certificate.serial_number.as_bytes().to_vec();
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem(), serial })
    }
}

fn ca_params(name: &str) -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    Ok(params)
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
