//! Dialing a TCP address without connecting to ourselves.
//!
//! The rule: a TCP connection whose local address equals its peer address
//! is a self-connect and is dropped, with an error that says so. On
//! loopback, a dial to a port in the ephemeral range where nothing listens
//! yet can be given that very port as its source port; TCP's simultaneous
//! open then "connects" the socket to itself, and the dialer holds the port
//! the member it meant to reach needs to bind (issue 28, U7: a peer dialer
//! kept a new member from starting until the leader restarted). Every
//! dialer (peer links, the client library, the CLI's probes) connects
//! through [`connect`].

use std::io;

use tokio::net::TcpStream;

/// `TcpStream::connect(addr)`, refusing a self-connect
/// ([`refuse_self_connect`]).
pub async fn connect(addr: &str) -> io::Result<TcpStream> {
    refuse_self_connect(TcpStream::connect(addr).await?)
}

/// The error inside a refused self-connect.
#[derive(Debug, thiserror::Error)]
#[error("{0}: connected to itself (TCP self-connect: nothing listens there); dropped")]
pub struct SelfConnect(pub std::net::SocketAddr);

/// `s`, unless it is connected to itself: then it is dropped (closing
/// the port) and the error is `ConnectionRefused` (what the dial would
/// have met had the port not happened to be its source port) carrying a
/// [`SelfConnect`].
pub fn refuse_self_connect(s: TcpStream) -> io::Result<TcpStream> {
    match (s.local_addr(), s.peer_addr()) {
        (Ok(local), Ok(peer)) if local == peer => {
            Err(io::Error::new(io::ErrorKind::ConnectionRefused, SelfConnect(peer)))
        }
        _ => Ok(s),
    }
}

/// Whether `e` is a refused self-connect.
pub fn is_self_connect(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<SelfConnect>())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket bound to a port and connected to that same port is the
    /// self-connect a dial can fall into by chance; forced here (Linux
    /// completes it as a simultaneous open).
    #[tokio::test]
    async fn a_self_connect_is_refused_and_a_real_one_is_kept() {
        let sock = tokio::net::TcpSocket::new_v4().expect("socket");
        sock.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let me = sock.local_addr().expect("local addr");
        let s = sock.connect(me).await.expect("a self-connect completes");
        assert_eq!(s.local_addr().ok(), s.peer_addr().ok(), "the test made a self-connect");
        let e = refuse_self_connect(s).expect_err("a self-connect is refused");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert!(is_self_connect(&e) && e.to_string().contains("connected to itself"), "{e}");

        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let addr = l.local_addr().expect("addr").to_string();
        let s = connect(&addr).await.expect("a real connection is kept");
        assert_ne!(s.local_addr().ok(), s.peer_addr().ok());
    }
}
