//! Throwaway certificates for a local TLS cluster (`batond cluster --tls`)
//! and for tests: one CA, one certificate per member (DNS names
//! `member-<id>.baton` and `localhost`, IP 127.0.0.1; used on both ports),
//! and client certificates. Made with rcgen; keys never leave `dir`.
//! Production certificates come from your own CA (docs/security.md).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// Where the files of one certificate are.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA that signs certificates into its folder.
pub struct Authority {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM file).
    pub ca: PathBuf,
}

impl Authority {
    /// Creates a new CA named `name` in `dir` (`<dir>/ca.pem`).
    pub fn create(dir: &Path, name: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key)?;
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, cert.pem())?;
        Ok(Authority { dir: dir.to_path_buf(), issuer: Issuer::new(params, key), ca })
    }

    /// Signs a certificate for `names` (DNS names or IP addresses), usable
    /// by servers and clients, as `<dir>/<file>.pem` and `<file>.key`.
    pub fn sign(&self, file: &str, common_name: &str, names: &[String]) -> anyhow::Result<CertFiles> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = CertFiles { cert: self.dir.join(format!("{file}.pem")), key: self.dir.join(format!("{file}.key")) };
        std::fs::write(&files.cert, cert.pem())?;
        write_private(&files.key, key.serialize_pem().as_bytes())?;
        Ok(files)
    }

    /// A member's certificate: `member-<id>.baton`, `localhost`, 127.0.0.1.
    pub fn member(&self, id: u64) -> anyhow::Result<CertFiles> {
        let names = vec![baton_proto::tls::member_name(id), "localhost".into(), "127.0.0.1".into()];
        self.sign(&format!("member-{id}"), &format!("baton member {id}"), &names)
    }

    /// `batond` flags for member `id`: its certificate on both ports,
    /// client certificates required (signed by this CA).
    pub fn member_args(&self, id: u64) -> anyhow::Result<Vec<String>> {
        let m = self.member(id)?;
        let (cert, key, ca) = (m.cert.display(), m.key.display(), self.ca.display());
        Ok(vec![
            format!("--cert={cert}"),
            format!("--key={key}"),
            format!("--ca={ca}"),
            format!("--peer-cert={cert}"),
            format!("--peer-key={key}"),
            format!("--peer-ca={ca}"),
        ])
    }

    /// A client's certificate, named `<name>` (its identity).
    pub fn client(&self, name: &str) -> anyhow::Result<CertFiles> {
        self.sign(&format!("client-{name}"), name, &[format!("{name}.client.baton")])
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(bytes)
}
