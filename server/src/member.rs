//! One member, assembled: the data dir, the four ports, every task, the
//! driver loop, and the order it all stops in. `batond` (main.rs) turns
//! its flags into [`Options`] and calls [`start`] then [`Member::run`];
//! tests start members in their own process the same way
//! (server/tests/member.rs).
//!
//! Rules:
//! - [`start`] opens the data dir and binds every port before it returns:
//!   a port in use or a damaged data dir is an error here, before any
//!   task runs; a data dir this start created is removed again on such an
//!   error (no empty RocksDB left behind). A port given as `:0` is bound
//!   to a free one; [`Member::addrs`] says which.
//! - Both client ports (native and ZooKeeper) share one
//!   `--max-connections` (finding Z7: each port had its own, twice the
//!   documented number).
//! - Local reads without a watch are answered by the listeners from the
//!   shared state (view.rs), except with deliberate bugs on: those act in
//!   the driver.
//! - [`Member::run`] runs the driver loop on the calling thread until
//!   [`Stopper::stop`] (main.rs wires SIGTERM and SIGINT to it), the
//!   member's removal, or a storage error; then it stops everything in
//!   shutdown.rs's order. A removed member's HTTP port answers "removed"
//!   for [`REMOVED_LINGER`] before `run` returns.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::config::Config;
use crate::kv::{Kv, RocksKv};
use crate::message::{Input, InputRx, InputTx};
use crate::node::Node;
use crate::shutdown::Shutdown;
use crate::transport::{PeerAuth, PeerTls};
use crate::zk::ZkSettings;

/// How long a removed member's HTTP listener goes on answering `/health`
/// and `/ready` with "removed" before [`Member::run`] returns.
pub const REMOVED_LINGER: Duration = Duration::from_secs(3);
/// How long connections get to write out their last answers at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Everything a member needs besides its [`Config`].
pub struct Options {
    pub cfg: Config,
    /// The HTTP port (metrics, `/health`, `/ready`), if any.
    pub http_addr: Option<String>,
    /// The ZooKeeper port, if any, and how it behaves.
    pub zk_addr: Option<String>,
    pub zk: ZkSettings,
    /// TLS on the client ports (both) and on the peer port.
    pub client_tls: Option<tokio_rustls::TlsAcceptor>,
    pub peer_tls: Option<PeerTls>,
    /// The runtime's worker threads (sockets, TLS, the listeners).
    pub io_threads: usize,
}

/// Where a started member listens (the ports actually bound).
#[derive(Debug, Clone)]
pub struct Addrs {
    pub client: SocketAddr,
    pub peer: SocketAddr,
    pub http: Option<SocketAddr>,
    pub zk: Option<SocketAddr>,
}

/// Asks a running member to stop (as SIGTERM does).
#[derive(Clone)]
pub struct Stopper(InputTx);

impl Stopper {
    pub fn stop(&self) {
        let _ = self.0.send(Input::Shutdown);
    }
}

/// A started member: its ports are bound and its tasks run; the driver
/// loop runs in [`Member::run`].
pub struct Member {
    rt: tokio::runtime::Runtime,
    node: Node,
    input: InputTx,
    inputs: InputRx,
    shutdown: Shutdown,
    http_stop: Shutdown,
    board: Option<crate::http::Board>,
    addrs: Addrs,
}

struct Bound {
    peer: TcpListener,
    client: TcpListener,
    http: Option<TcpListener>,
    zk: Option<TcpListener>,
}

async fn bind(what: &str, addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("binding {what} address {addr}"))
}

async fn bind_all(o: &Options) -> anyhow::Result<Bound> {
    let peer = bind("peer", &o.cfg.peer_addr).await?;
    let client = bind("client", &o.cfg.client_addr).await?;
    let http = match &o.http_addr {
        Some(a) => Some(bind("HTTP", a).await?),
        None => None,
    };
    let zk = match &o.zk_addr {
        Some(a) => Some(bind("ZooKeeper", a).await?),
        None => None,
    };
    Ok(Bound { peer, client, http, zk })
}

/// Opens the data dir, binds every port and starts every task (the
/// module doc has the rules).
pub fn start(o: Options) -> anyhow::Result<Member> {
    let cfg = o.cfg.clone();
    let dir = &cfg.data_dir;
    let fresh = !dir.exists();
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let kv = RocksKv::open_with(&dir.join("db"), cfg.faults.lenient_storage())
        .with_context(|| format!("opening RocksDB in {}", dir.display()));
    let bound = kv.and_then(|kv| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(o.io_threads).enable_all().build()?;
        let bound = rt.block_on(bind_all(&o))?;
        Ok((kv, rt, bound))
    });
    let (kv, rt, bound) = match bound {
        Ok(b) => b,
        Err(e) => {
            // A data dir this start made holds nothing yet: leave none
            // behind (a port in use must not leave an empty RocksDB).
            if fresh {
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(e);
        }
    };
    let local = |l: &TcpListener| l.local_addr().context("a bound port's address");
    let addrs = Addrs {
        client: local(&bound.client)?,
        peer: local(&bound.peer)?,
        http: bound.http.as_ref().map(local).transpose()?,
        zk: bound.zk.as_ref().map(local).transpose()?,
    };
    warn_plaintext("client", addrs.client, o.client_tls.is_some());
    warn_plaintext("peer", addrs.peer, o.peer_tls.is_some());

    let (input, inputs) = tokio::sync::mpsc::unbounded_channel::<Input>();
    let shutdown = Shutdown::new();
    let (transport, links, members) = crate::transport::transport(cfg.id);
    let kv: Arc<dyn Kv> = Arc::new(kv);
    let mut node = Node::new(cfg.clone(), kv.clone(), Box::new(transport), input.clone())?;
    // The HTTP listener stops last: a removed member's /health and /ready
    // say "removed" for REMOVED_LINGER after its client ports closed.
    let http_stop = Shutdown::new();
    let mut board = None;
    if let Some(l) = bound.http {
        // Process-wide: one member per process may have an HTTP port.
        let prom = crate::http::install_recorder()?;
        let b = crate::http::Board::default();
        node.set_board(b.clone());
        board = Some(b.clone());
        let stale = 3 * cfg.election_timeout();
        rt.spawn(crate::http::serve(l, prom, b, stale, http_stop.signal()));
    }
    let incarnations =
        Arc::new(crate::cluster::Incarnations::load(kv.clone()).context("reading this data dir's incarnation")?);
    let auth = PeerAuth { me: cfg.id, members, tls: o.peer_tls, state: node.shared_state(), incarnations };
    {
        let _g = rt.enter();
        crate::transport::start_senders(links, input.clone(), auth.clone(), shutdown.signal());
    }
    rt.spawn(crate::transport::serve(bound.peer, input.clone(), auth, shutdown.signal()));
    let open = Arc::new(tokio::sync::Semaphore::new(cfg.limits.max_connections));
    if let Some(l) = bound.zk {
        let (state, tls, open) = (node.shared_state(), o.client_tls.clone(), open.clone());
        rt.spawn(crate::zk::serve(l, input.clone(), cfg.clone(), o.zk, state, tls, open, shutdown.signal()));
    }
    let fast_reads = !cfg.faults.any();
    let (state, sig) = (node.shared_state(), shutdown.signal());
    rt.spawn(crate::listener::serve(
        bound.client,
        input.clone(),
        cfg.clone(),
        state,
        fast_reads,
        o.client_tls,
        open,
        sig,
    ));
    info!(id = cfg.id, client = %addrs.client, peer = %addrs.peer, "member up");
    Ok(Member { rt, node, input, inputs, shutdown, http_stop, board, addrs })
}

impl Member {
    /// The ports it listens on.
    pub fn addrs(&self) -> &Addrs {
        &self.addrs
    }

    /// A handle that stops it from another thread or task.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.input.clone())
    }

    /// Runs a task on the member's runtime (main.rs: the signal handler).
    pub fn spawn<F: std::future::Future<Output = ()> + Send + 'static>(&self, f: F) {
        self.rt.spawn(f);
    }

    /// Runs the driver loop until the member stops, then stops every task
    /// in order (shutdown.rs): the driver answers what is pending, every
    /// connection gets [`SHUTDOWN_GRACE`] to write out and close.
    pub fn run(self) -> anyhow::Result<()> {
        let Member { rt, node, input, inputs, shutdown, http_stop, board, .. } = self;
        drop(input);
        // The driver is a task on the I/O runtime (node.rs says why).
        let result = rt.block_on(async move {
            tokio::spawn(node.run(inputs)).await.unwrap_or_else(|e| Err(anyhow::anyhow!("the driver task failed: {e}")))
        });
        let removed = result.as_ref().is_err_and(|e| format!("{e:#}").contains(crate::node::REMOVED));
        if !rt.block_on(shutdown.finish(SHUTDOWN_GRACE)) {
            warn!("some connections were still open {SHUTDOWN_GRACE:?} after shutdown began");
        }
        if let Some(board) = board.filter(|_| removed) {
            board.set_removed();
            std::thread::sleep(REMOVED_LINGER);
        }
        rt.block_on(http_stop.finish(Duration::from_millis(200)));
        rt.shutdown_timeout(Duration::from_secs(1));
        result
    }
}

/// Warns loudly when a non-loopback address is served in plaintext.
fn warn_plaintext(what: &str, addr: SocketAddr, tls: bool) {
    if !tls && !addr.ip().is_loopback() {
        warn!(
            %addr,
            "PLAINTEXT {what} port on a non-loopback address: anyone who can reach {addr} can {}. \
             Configure TLS (docs/security.md).",
            if what == "peer" { "steer or crash this cluster" } else { "read and write every node" }
        );
    }
}
