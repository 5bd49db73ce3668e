//! Throwaway certificates for a local TLS cluster (`batond cluster --tls`)
//! and for tests: one CA, one certificate per member (DNS names
//! `member-<id>.baton` and `localhost`, IP 127.0.0.1; used on both ports),
//! and client certificates. Made with rcgen; keys never leave `dir`.
//! Production certificates come from your own CA (docs/security.md).
//!
//! [`Authority::open_or_create`] keeps a CA it made before (`ca.pem` and
//! its key `ca.key`, mode 0600) and the certificates it signed, so running
//! `batond cluster --tls` again over a cluster's data dir leaves the flags
//! and files it printed the first time valid; `--new-certs` makes new ones.

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
    /// Opened from its files: certificates already in `dir` are its own
    /// and are kept.
    kept: bool,
}

/// The CA's parameters: the same for a new CA and a kept one (its issuer
/// name and key usages go into what it signs).
fn ca_params(name: &str) -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

impl Authority {
    /// Creates a new CA named `name` in `dir` (`<dir>/ca.pem`, its key
    /// `<dir>/ca.key`), replacing any there.
    pub fn create(dir: &Path, name: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let key = KeyPair::generate()?;
        let params = ca_params(name)?;
        let cert = params.self_signed(&key)?;
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, cert.pem())?;
        write_private(&dir.join("ca.key"), key.serialize_pem().as_bytes())?;
        Ok(Authority { dir: dir.to_path_buf(), issuer: Issuer::new(params, key), ca, kept: false })
    }

    /// The CA already in `dir` (its `ca.pem` and `ca.key`) with the
    /// certificates it signed there, or a new one when there is none.
    pub fn open_or_create(dir: &Path, name: &str) -> anyhow::Result<Self> {
        let (ca, key_file) = (dir.join("ca.pem"), dir.join("ca.key"));
        if !(ca.exists() && key_file.exists()) {
            return Self::create(dir, name);
        }
        let pem = std::fs::read_to_string(&key_file)?;
        let key = KeyPair::from_pem(&pem).map_err(|e| anyhow::anyhow!("{}: {e}", key_file.display()))?;
        Ok(Authority { dir: dir.to_path_buf(), issuer: Issuer::new(ca_params(name)?, key), ca, kept: true })
    }

    /// Signs a certificate for `names` (DNS names or IP addresses), usable
    /// by servers and clients, as `<dir>/<file>.pem` and `<file>.key`; a
    /// kept CA's existing pair of files is returned as it is.
    pub fn sign(&self, file: &str, common_name: &str, names: &[String]) -> anyhow::Result<CertFiles> {
        let files = CertFiles { cert: self.dir.join(format!("{file}.pem")), key: self.dir.join(format!("{file}.key")) };
        if self.kept && files.cert.exists() && files.key.exists() {
            return Ok(files);
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use baton_proto::tls::rustls;
    use std::sync::Arc;

    /// Whether `cert` chains to the CA in `ca` (as a member checks a client).
    fn signed_by(ca: &Path, cert: &Path) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        for c in baton_proto::tls::load_certs(ca).expect("ca") {
            roots.add(c).expect("root");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let v = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .expect("verifier");
        let leaf = baton_proto::tls::load_certs(cert).expect("cert").remove(0);
        v.verify_client_cert(&leaf, &[], rustls::pki_types::UnixTime::now()).is_ok()
    }

    /// Finding A9: `batond cluster --tls` made a new CA on every run, so the
    /// certificates it printed before failed (BadSignature). A second open
    /// keeps the CA and the certificates; what it signs anew chains to the
    /// same CA; `create` (`--new-certs`) replaces it.
    #[test]
    fn an_existing_ca_and_its_certificates_are_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = Authority::open_or_create(dir.path(), "t").expect("create");
        let m1 = first.member(1).expect("member 1");
        let (ca_pem, m1_pem) = (std::fs::read(&first.ca).unwrap(), std::fs::read(&m1.cert).unwrap());
        let again = Authority::open_or_create(dir.path(), "t").expect("open");
        assert_eq!(std::fs::read(&again.ca).unwrap(), ca_pem, "the CA was replaced");
        assert_eq!(std::fs::read(&again.member(1).unwrap().cert).unwrap(), m1_pem, "member 1's certificate changed");
        let c = again.client("admin").expect("a new client certificate");
        assert!(signed_by(&first.ca, &c.cert), "a certificate the kept CA signed does not chain to it");
        assert!(signed_by(&first.ca, &m1.cert));
        let fresh = Authority::create(dir.path(), "t").expect("new");
        assert_ne!(std::fs::read(&fresh.ca).unwrap(), ca_pem);
        assert!(!signed_by(&fresh.ca, &m1.cert), "the old certificates chain to the new CA");
    }
}
