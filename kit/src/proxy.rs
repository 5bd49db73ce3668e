//! A fault-injecting TCP proxy on every link.
//!
//! Every peer link (member i dials member j) and every client link (a client
//! "living" next to member i talks to member j) goes through a listener the
//! harness owns. A link can be *stalled* in either direction: bytes are left
//! unread, as packets dropped by a firewall would be, so TCP connections stay
//! open and deliver late after the heal (Raft must cope with stale messages)
//! while a stalled client sees a silent server and must time out. Nothing is
//! ever dropped mid-frame, so framing stays intact.
//!
//! Faults: [`Proxies::apply`] cuts by a grudge between members (peer links,
//! and client links that cross it); [`Proxies::isolate_peers`] cuts only
//! one member's peer links, both ways, and leaves every client link open
//! (its clients still reach it, it reaches no peer);
//! [`Proxies::stall_slot`] stalls one client slot; [`Proxies::heal`] opens
//! everything.
//!
//! Everything listens and connects on 127.0.0.1 only. A link's listener
//! stops when its [`Proxies`] is dropped (connections already forwarded
//! run until either side closes).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How often a stalled direction checks for the heal.
const STALL_POLL: Duration = Duration::from_millis(5);

/// One direction's switch.
#[derive(Default)]
pub struct Valve {
    blocked: AtomicBool,
}

impl Valve {
    pub fn set(&self, blocked: bool) {
        self.blocked.store(blocked, Ordering::SeqCst);
    }
    pub fn is_blocked(&self) -> bool {
        self.blocked.load(Ordering::SeqCst)
    }
    async fn wait_open(&self) {
        while self.is_blocked() {
            tokio::time::sleep(STALL_POLL).await;
        }
    }
}

/// Which link: peer traffic from member `from` to member `to`; or the
/// links of client slot `slot` (its sessions), which lives next to member
/// `home`, to member `to`; or the "storage" links of clients homed at
/// `home` (used to read and write the resource a lock protects; never
/// paused with a slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkId {
    Peer { from: u64, to: u64 },
    Client { slot: usize, home: u64, to: u64 },
    Storage { home: u64, to: u64 },
}

/// A proxied link: `listen` forwards to `target`.
pub struct Link {
    pub listen: SocketAddr,
    pub target: SocketAddr,
    /// Bytes from the dialer to the target.
    pub forward: Arc<Valve>,
    /// Bytes from the target back to the dialer.
    pub backward: Arc<Valve>,
    /// Connections open through it now, and when the last one opened.
    pub open: Arc<Opened>,
    /// The accept loop, stopped when the link is dropped.
    accept: tokio::task::AbortHandle,
}

/// Connections open through a link, and when the newest one was made (an
/// increasing stamp): which member a client slot's client talks to now
/// ([`Proxies::slot_member`]).
#[derive(Default)]
pub struct Opened {
    count: std::sync::atomic::AtomicUsize,
    newest: std::sync::atomic::AtomicU64,
}

static OPEN_STAMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Drop for Link {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// All links of a test run.
#[derive(Default)]
pub struct Proxies {
    pub links: HashMap<LinkId, Link>,
}

impl Proxies {
    /// Starts a proxy for `id` towards `target` on a free loopback port.
    pub async fn add(&mut self, id: LinkId, target: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let listen = listener.local_addr()?;
        let forward = Arc::new(Valve::default());
        let backward = Arc::new(Valve::default());
        let open = Arc::new(Opened::default());
        let accept =
            tokio::spawn(accept_loop(listener, target, forward.clone(), backward.clone(), open.clone())).abort_handle();
        self.links.insert(id, Link { listen, target, forward, backward, open, accept });
        Ok(listen)
    }

    /// The member client slot `slot`'s newest open connection leads to, if
    /// any (a client that picks its member itself, as a ZooKeeper client
    /// does, tells no one).
    pub fn slot_member(&self, slot: usize) -> Option<u64> {
        self.links
            .iter()
            .filter_map(|(id, l)| match *id {
                LinkId::Client { slot: s, to, .. } if s == slot && l.open.count.load(Ordering::SeqCst) > 0 => {
                    Some((l.open.newest.load(Ordering::SeqCst), to))
                }
                _ => None,
            })
            .max()
            .map(|(_, to)| to)
    }

    pub fn addr(&self, id: LinkId) -> Option<SocketAddr> {
        self.links.get(&id).map(|l| l.listen)
    }

    /// Opens every link in both directions.
    pub fn heal(&self) {
        for l in self.links.values() {
            l.forward.set(false);
            l.backward.set(false);
        }
    }

    /// Applies a "grudge": `cut(a, b)` true means member `a` cannot send to
    /// member `b`. Peer links follow it directly; a client homed at `a`
    /// cannot reach `b` when either direction between them is cut.
    pub fn apply(&self, cut: impl Fn(u64, u64) -> bool) {
        for (id, l) in &self.links {
            match *id {
                LinkId::Peer { from, to } => {
                    l.forward.set(cut(from, to));
                    l.backward.set(cut(to, from));
                }
                LinkId::Client { home, to, .. } | LinkId::Storage { home, to } => {
                    let blocked = home != to && (cut(home, to) || cut(to, home));
                    l.forward.set(blocked);
                    l.backward.set(blocked);
                }
            }
        }
    }

    /// Cuts every peer link of member `x`, both directions, and opens every
    /// other link: `x`'s clients (and everyone else's) still reach it, but it
    /// hears from no peer and no peer hears from it.
    pub fn isolate_peers(&self, x: u64) {
        for (id, l) in &self.links {
            let cut = matches!(*id, LinkId::Peer { from, to } if from == x || to == x);
            l.forward.set(cut);
            l.backward.set(cut);
        }
    }

    /// Stalls (or releases) every link of client slot `slot`: with its task
    /// frozen too, that is a paused client process (no keepalives, no
    /// progress) without pausing the harness.
    pub fn stall_slot(&self, slot: usize, stalled: bool) {
        for (id, l) in &self.links {
            if matches!(*id, LinkId::Client { slot: s, .. } if s == slot) {
                l.forward.set(stalled);
                l.backward.set(stalled);
            }
        }
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, fwd: Arc<Valve>, back: Arc<Valve>, open: Arc<Opened>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (fwd, back, open) = (fwd.clone(), back.clone(), open.clone());
        tokio::spawn(async move {
            // A connection opened while the link is cut waits, like a SYN
            // into a black hole, instead of failing fast.
            fwd.wait_open().await;
            let Ok(outbound) = TcpStream::connect(target).await else { return };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            open.count.fetch_add(1, Ordering::SeqCst);
            open.newest.store(OPEN_STAMP.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
            let (ir, iw) = inbound.into_split();
            let (or, ow) = outbound.into_split();
            let a = tokio::spawn(pump(ir, ow, fwd));
            let b = tokio::spawn(pump(or, iw, back));
            let _ = tokio::join!(a, b);
            open.count.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

async fn pump(mut r: tokio::net::tcp::OwnedReadHalf, mut w: tokio::net::tcp::OwnedWriteHalf, valve: Arc<Valve>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        valve.wait_open().await;
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Cut after the read: hold the bytes until the heal.
        valve.wait_open().await;
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}
