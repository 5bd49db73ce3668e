//! Free loopback ports.
//!
//! A port is picked at random below Linux's ephemeral range (32768-60999):
//! a port the kernel hands out for port 0 can also be taken meanwhile as
//! the source port of some outgoing connection. It is bound then released,
//! so a race remains: [`crate::Cluster::start`] starts the cluster again on
//! other ports when a member could not bind.

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::net::{SocketAddr, TcpListener};

/// Lowest port picked.
const LOW: u16 = 20_000;
/// How many ports above [`LOW`] are picked from (stays under 32768).
const SPAN: u16 = 12_000;

/// A free loopback port (see the module doc).
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = LOW + (rand_u64() % SPAN as u64) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// `n` distinct free loopback ports.
pub fn distinct_ports(n: usize) -> Vec<u16> {
    let mut p = Ports::default();
    (0..n).map(|_| p.port()).collect()
}

/// Hands out free ports, never the same one twice (a released port can be
/// picked again).
#[derive(Default)]
pub struct Ports {
    given: HashSet<u16>,
}

impl Ports {
    /// Also never hand out these (ports already in use by the cluster).
    pub fn avoiding(ports: impl IntoIterator<Item = u16>) -> Ports {
        Ports { given: ports.into_iter().collect() }
    }

    /// A free port not handed out before.
    pub fn port(&mut self) -> u16 {
        loop {
            let p = free_port();
            if self.given.insert(p) {
                return p;
            }
        }
    }

    /// [`Ports::port`] on 127.0.0.1.
    pub fn addr(&mut self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port()))
    }
}

fn rand_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_ports_are_distinct_and_below_the_ephemeral_range() {
        let v = distinct_ports(50);
        let set: HashSet<u16> = v.iter().copied().collect();
        assert_eq!(set.len(), 50);
        assert!(v.iter().all(|p| (LOW..LOW + SPAN).contains(p)), "{v:?}");
    }
}
