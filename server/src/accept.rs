//! One accept loop for every port (the client port, the ZooKeeper port and
//! the peer port), one TLS sniff for the client ports, and one source of
//! connection ids.
//!
//! The loop ([`serve`]): accept until the shutdown signal. An accept error
//! (out of file descriptors, say) is logged and retried after
//! [`ACCEPT_RETRY`], not at once (that would spin). Each connection takes
//! a place among the port's `places` (the member's `--max-connections`,
//! shared by both client ports; on the peer port, the connections being
//! admitted) or is handed to the port's `full`, which answers or closes it.
//! Then it is served in a task of its own, which holds the place until it
//! drops [`Conn::place`] (the peer port gives it back once the connection
//! is admitted).
//!
//! Connection ids ([`next_conn`]) come from one counter for the process:
//! unique across ports, never 0. The driver keys each connection's state
//! by it.
//!
//! A client port with TLS ([`secure`]) looks at the first byte before the
//! handshake: a client that does not start one is handed back as
//! [`Secured::NotTls`] so the port can say so its own way (the native
//! port answers with an error frame; the ZooKeeper port closes, as a
//! ZooKeeper secure port does).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_proto::tls::BoxStream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::debug;

use crate::shutdown::Signal;

/// Time a new client connection has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed accept.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(20);

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// A new connection id, unique in this process (every port).
pub fn next_conn() -> u64 {
    NEXT_CONN.fetch_add(1, Ordering::Relaxed)
}

/// An accepted connection with its place.
pub struct Conn {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub id: u64,
    /// The connection's place among the port's; given back when dropped.
    pub place: OwnedSemaphorePermit,
}

/// Accepts on `listener` until `signal` (module doc). `port` names the
/// port in logs; `full(stream, peer)` runs (in a task) for a connection
/// that found no place; `serve(conn)` for every other.
pub async fn serve<S, SF, F, FF>(
    port: &'static str,
    listener: TcpListener,
    places: Arc<Semaphore>,
    mut signal: Signal,
    full: F,
    serve: S,
) where
    S: Fn(Conn) -> SF,
    SF: Future<Output = ()> + Send + 'static,
    F: Fn(TcpStream, SocketAddr) -> FF,
    FF: Future<Output = ()> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = signal.wait() => return,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                debug!(port, "accept: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            tokio::spawn(full(stream, peer));
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve(Conn { stream, peer, id: next_conn(), place }));
    }
}

/// What [`secure`] made of a client connection.
pub enum Secured {
    /// The stream to serve, and the common name of the client's
    /// certificate if it gave one (TLS only).
    Ready(BoxStream, Option<String>),
    /// The port takes TLS only and the client did not start a handshake.
    NotTls(TcpStream),
    /// The handshake failed or timed out (logged).
    Failed,
}

/// A client port's TLS (module doc): with `tls`, the handshake within
/// [`HANDSHAKE_TIMEOUT`]; without, the stream as it is.
pub async fn secure(
    stream: TcpStream,
    tls: Option<&tokio_rustls::TlsAcceptor>,
    conn: u64,
    peer: SocketAddr,
) -> Secured {
    let Some(tls) = tls else { return Secured::Ready(Box::new(stream), None) };
    if !speaks_tls(&stream).await {
        return Secured::NotTls(stream);
    }
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
        Ok(Ok(s)) => {
            let cert = s.get_ref().1.peer_certificates().and_then(|c| c.first());
            let name = cert.and_then(baton_proto::tls::common_name);
            Secured::Ready(Box::new(s), name)
        }
        Ok(Err(e)) => {
            debug!(conn, %peer, "client TLS handshake failed: {e}");
            Secured::Failed
        }
        Err(_) => {
            debug!(conn, %peer, "client TLS handshake timed out");
            Secured::Failed
        }
    }
}

/// True when the first byte the client sent starts a TLS handshake record
/// (0x16); a Baton frame starts with its length's high byte, 0 in practice
/// (a ZooKeeper connect frame too).
async fn speaks_tls(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(tokio::time::timeout(HANDSHAKE_TIMEOUT, s.peek(&mut b)).await, Ok(Ok(1)) if b[0] == 0x16)
}
