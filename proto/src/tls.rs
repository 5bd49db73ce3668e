//! TLS for both ports (rustls on `ring`; no OpenSSL), shared by members and
//! clients.
//!
//! - Peer port: mutual TLS, always. A member's certificate names it with
//!   the DNS subject alternative name [`member_name`]`(id)` =
//!   `member-<id>.baton`; both ends check it. The dialer verifies the
//!   acceptor's certificate for the name of the member it dialed; the
//!   acceptor verifies the dialer's chain, then that its certificate is
//!   valid for the name of the member its hello claims to be
//!   ([`cert_names_member`]).
//! - Client port: the server presents its certificate; clients verify it for
//!   the host they dialed (a DNS name or an IP address SAN). With a client
//!   CA configured, the server requires a client certificate chaining to it.
//! - Files are PEM: certificates (the chain, leaf first) and a PKCS#8, PKCS#1
//!   or SEC1 private key.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite};

pub use rustls;
pub use tokio_rustls;

/// A byte stream, plain TCP or TLS over it.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}
pub type BoxStream = Box<dyn Stream>;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The DNS name that identifies member `id` in its certificate.
pub fn member_name(id: u64) -> String {
    format!("member-{id}.baton")
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.to_path_buf(), msg: e.to_string() }
}

/// Reads the certificates in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "no certificate in the file"));
    }
    Ok(certs)
}

/// Reads the private key in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err(path, e))
}

fn roots(ca: &Path) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    for c in load_certs(ca)? {
        store.add(c).map_err(|e| file_err(ca, e))?;
    }
    Ok(Arc::new(store))
}

/// A server's TLS setup: its certificate and key, and (for mutual TLS) the
/// CA client certificates must chain to.
pub fn server_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let b = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let b = match client_ca {
        Some(ca) => {
            let v = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            b.with_client_cert_verifier(v)
        }
        None => b.with_no_client_auth(),
    };
    let cfg = b.with_single_cert(load_certs(cert)?, load_key(key)?).map_err(|e| file_err(cert, e))?;
    Ok(Arc::new(cfg))
}

/// A client's TLS setup: the CA that signed the servers' certificates and,
/// for mutual TLS, this client's certificate and key.
pub fn client_config(ca: &Path, cert_key: Option<(&Path, &Path)>) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots(ca)?);
    let cfg = match cert_key {
        Some((cert, key)) => {
            b.with_client_auth_cert(load_certs(cert)?, load_key(key)?).map_err(|e| file_err(cert, e))?
        }
        None => b.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// The server name to verify when dialing `endpoint` (`host:port`): the
/// host as an IP address or a DNS name.
pub fn server_name_of(endpoint: &str) -> Result<ServerName<'static>, TlsError> {
    let host = match endpoint.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => endpoint,
    };
    ServerName::try_from(host.to_string()).map_err(|e| TlsError::Config(format!("{endpoint}: {e}")))
}

/// True when `cert` (a member's leaf certificate, already verified against
/// the peer CA) names member `id`.
pub fn cert_names_member(cert: &CertificateDer<'_>, id: u64) -> bool {
    let Ok(ee) = webpki::EndEntityCert::try_from(cert) else { return false };
    let Ok(name) = ServerName::try_from(member_name(id)) else { return false };
    ee.verify_is_valid_for_subject_name(&name).is_ok()
}

/// The subject common name of a (verified) client certificate: the
/// client's `x509:` identity.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = c.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(cn)
}

/// Dials TLS over `tcp`, verifying the server for `name`.
pub async fn connect(
    cfg: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    tcp: tokio::net::TcpStream,
) -> std::io::Result<BoxStream> {
    let s = tokio_rustls::TlsConnector::from(cfg).connect(name, tcp).await?;
    Ok(Box::new(s))
}
