//! etcd 3.4 as a target: a 3-member cluster from `bench/rivals/etcd.sh`,
//! driven through the `etcd-client` crate.
//!
//! Each client holds one lease (the etcd analogue of a session, as
//! `concurrency.Session` does) kept alive every TTL/3, and talks to ONE
//! member at a time: etcd-client's multi-endpoint mode keeps sending to a
//! dead member, so on a transport error the client moves to the next one.
//! The lock is etcd's own Lock RPC (the server runs `concurrency.Mutex`
//! under the client's lease); its fencing token is the lock key's create
//! revision, which a fenced write compares in a txn.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tonic::Code;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, LockOptions, Txn, TxnOp};

use super::{Kind, OpError, OpResult, ScriptCluster, ScriptTarget, Target, TargetClient};

const PREFIX: &str = "/cmp/";

pub struct EtcdTarget {
    cluster: ScriptCluster,
    /// Every client connection's keepalive ([`FAST_KEEPALIVE`] unless
    /// started with [`EtcdTarget::start_with`]).
    keepalive: KeepAlive,
}

impl EtcdTarget {
    pub async fn start(dir: &Path) -> anyhow::Result<EtcdTarget> {
        EtcdTarget::start_with(dir, FAST_KEEPALIVE).await
    }

    /// A cluster whose clients connect with keepalive `ka`.
    pub async fn start_with(dir: &Path, ka: KeepAlive) -> anyhow::Result<EtcdTarget> {
        let dir = dir.to_path_buf();
        let cluster = tokio::task::spawn_blocking(move || ScriptCluster::start("etcd.sh", "etcd-", &dir)).await??;
        Ok(EtcdTarget { cluster, keepalive: ka })
    }
}

impl ScriptTarget for EtcdTarget {
    fn script(&self) -> &ScriptCluster {
        &self.cluster
    }

    fn data_dir(&self, member: usize) -> PathBuf {
        self.cluster.dir.join(format!("etcd-{}", member + 1))
    }
}

/// A connection's HTTP/2 keepalive: a ping every `.0` while a request is
/// open, the connection dropped when one is not answered within `.1`.
#[derive(Clone, Copy, Debug)]
pub struct KeepAlive(pub Duration, pub Duration);

/// The benchmark's: a paused or dead member is noticed within 2 s. But
/// etcd's server allows a ping only every `--grpc-keepalive-min-time` (5 s)
/// on a connection with no data moving: a request waiting longer than
/// ~3 s (a Lock RPC deep in a queue) loses its connection to GOAWAY
/// (too many pings).
pub const FAST_KEEPALIVE: KeepAlive = KeepAlive(Duration::from_secs(1), Duration::from_secs(1));
/// Within etcd's ping policy (`scale`: lock queues of 1,000 waiters,
/// thousands of connections in one process).
pub const POLITE_KEEPALIVE: KeepAlive = KeepAlive(Duration::from_secs(10), Duration::from_secs(5));

/// A client of the one member at `endpoint` (`host:port`) with
/// [`FAST_KEEPALIVE`]. The channel connects lazily: a member that is down
/// fails the first request (a transport error), not this call.
pub(crate) async fn connect_one(endpoint: &str) -> Result<Client, etcd_client::Error> {
    connect_with(endpoint, FAST_KEEPALIVE).await
}

/// [`connect_one`] with keepalive `ka`.
pub(crate) async fn connect_with(endpoint: &str, ka: KeepAlive) -> Result<Client, etcd_client::Error> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_keep_alive(ka.0, ka.1)
        .with_require_leader(true);
    Client::connect([format!("http://{endpoint}")], Some(opts)).await
}

/// Did the request certainly not take effect?
fn definite(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            !matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled)
                || s.message().contains("no leader")
        }
        etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => true,
        _ => false,
    }
}

/// Should the client move to another member?
pub(crate) fn member_trouble(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Unknown)
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

fn lease_gone(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("lease not found"))
}

struct Conn {
    member: usize,
    client: Client,
}

pub struct EtcdClient {
    endpoints: Vec<String>,
    /// Every connection's HTTP/2 keepalive.
    ka: KeepAlive,
    conn: Arc<Mutex<Conn>>,
    lease: i64,
    lost: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
    keepalive: tokio::task::JoinHandle<()>,
}

/// A held etcd lock: the key the Lock RPC returned and (once read) its
/// create revision.
pub struct EtcdLock {
    key: Vec<u8>,
    rev: OnceLock<i64>,
}

impl EtcdClient {
    /// A client (and its lease) on `endpoints[member]`, or the next member
    /// that answers.
    pub async fn connect_to(endpoints: Vec<String>, member: usize, ttl: Duration) -> anyhow::Result<EtcdClient> {
        EtcdClient::connect_to_with(endpoints, member, ttl, FAST_KEEPALIVE).await
    }

    /// [`Self::connect_to`] with keepalive `ka` on every connection it makes.
    pub async fn connect_to_with(
        endpoints: Vec<String>,
        member: usize,
        ttl: Duration,
        ka: KeepAlive,
    ) -> anyhow::Result<EtcdClient> {
        let n = endpoints.len().max(1);
        let mut last = None;
        for i in 0..n {
            let m = (member + i) % n;
            let mut client = match connect_with(&endpoints[m], ka).await {
                Ok(c) => c,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            let secs = ttl.as_secs().max(1) as i64;
            match client.lease_grant(secs, None).await {
                Ok(g) => {
                    let conn = Arc::new(Mutex::new(Conn { member: m, client }));
                    let lost = Arc::new(AtomicBool::new(false));
                    let frozen = Arc::new(AtomicBool::new(false));
                    let keepalive = tokio::spawn(keep_alive(
                        endpoints.clone(),
                        ka,
                        conn.clone(),
                        g.id(),
                        ttl,
                        lost.clone(),
                        frozen.clone(),
                    ));
                    return Ok(EtcdClient { endpoints, ka, conn, lease: g.id(), lost, frozen, keepalive });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(anyhow::anyhow!("no etcd member granted a lease: {last:?}"))
    }

    fn client(&self) -> (usize, Client) {
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        (c.member, c.client.clone())
    }

    /// Moves to the next member after trouble on `member`.
    async fn next_member(&self, member: usize) {
        move_on(&self.endpoints, self.ka, &self.conn, member).await;
    }

    /// Freezes the client as a process pause would: no keepalives go out
    /// until thawed (the harness's pause nemesis).
    pub fn freeze(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::SeqCst);
    }

    /// The flag [`Self::freeze`] sets, for a nemesis that pauses this client
    /// from outside.
    pub fn frozen_flag(&self) -> Arc<AtomicBool> {
        self.frozen.clone()
    }

    fn check_lease(&self) -> OpResult<()> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(OpError::SessionLost(format!("lease {:x} expired", self.lease)));
        }
        Ok(())
    }

    /// Maps an error of a write (`write`) or read.
    async fn fail(&self, member: usize, e: etcd_client::Error, write: bool) -> OpError {
        if lease_gone(&e) {
            self.lost.store(true, Ordering::SeqCst);
            return OpError::SessionLost(e.to_string());
        }
        if member_trouble(&e) {
            self.next_member(member).await;
        }
        if !write || definite(&e) {
            OpError::Failed(e.to_string())
        } else {
            OpError::Indeterminate(e.to_string())
        }
    }
}

async fn move_on(endpoints: &[String], ka: KeepAlive, conn: &Mutex<Conn>, member: usize) {
    let n = endpoints.len().max(1);
    {
        let c = conn.lock().unwrap_or_else(|p| p.into_inner());
        if c.member != member {
            return; // someone moved already
        }
    }
    let next = (member + 1) % n;
    if let Ok(client) = connect_with(&endpoints[next], ka).await {
        let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
        if c.member == member {
            *c = Conn { member: next, client };
        }
    }
}

/// Sends a keepalive every TTL/3 through the client's current member;
/// marks the lease lost when etcd says it expired.
async fn keep_alive(
    endpoints: Vec<String>,
    ka: KeepAlive,
    conn: Arc<Mutex<Conn>>,
    lease: i64,
    ttl: Duration,
    lost: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
) {
    let every = (ttl / 3).max(Duration::from_millis(100));
    let mut stream = None;
    loop {
        tokio::time::sleep(every).await;
        if frozen.load(Ordering::SeqCst) {
            continue;
        }
        let (member, mut client) = {
            let c = conn.lock().unwrap_or_else(|p| p.into_inner());
            (c.member, c.client.clone())
        };
        if stream.is_none() {
            match client.lease_keep_alive(lease).await {
                Ok(s) => stream = Some((member, s)),
                Err(e) => {
                    if lease_gone(&e) {
                        lost.store(true, Ordering::SeqCst);
                        return;
                    }
                    move_on(&endpoints, ka, &conn, member).await;
                    continue;
                }
            }
        }
        let Some((m, (keeper, responses))) = stream.as_mut() else { continue };
        let ok = match keeper.keep_alive().await {
            Ok(()) => match tokio::time::timeout(every, responses.message()).await {
                Ok(Ok(Some(r))) if r.ttl() <= 0 => {
                    lost.store(true, Ordering::SeqCst);
                    return;
                }
                Ok(Ok(Some(_))) => true,
                _ => false,
            },
            Err(_) => false,
        };
        if !ok {
            let m = *m;
            stream = None;
            move_on(&endpoints, ka, &conn, m).await;
        }
    }
}

impl TargetClient for EtcdClient {
    fn freeze_switch(&self) -> Option<Arc<AtomicBool>> {
        Some(self.frozen_flag())
    }

    type Lock = EtcdLock;

    async fn lock(&self, name: &str) -> OpResult<EtcdLock> {
        self.check_lease()?;
        let (m, mut c) = self.client();
        match c.lock(format!("{PREFIX}lock/{name}"), Some(LockOptions::new().with_lease(self.lease))).await {
            Ok(r) => Ok(EtcdLock { key: r.key().to_vec(), rev: OnceLock::new() }),
            Err(e) => Err(self.fail(m, e, true).await),
        }
    }

    async fn unlock(&self, held: EtcdLock) -> OpResult<()> {
        let (m, mut c) = self.client();
        match c.unlock(held.key).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.fail(m, e, true).await),
        }
    }

    async fn token(&self, held: &EtcdLock) -> OpResult<u64> {
        if let Some(r) = held.rev.get() {
            return Ok(*r as u64);
        }
        let (m, mut c) = self.client();
        match c.get(held.key.clone(), None).await {
            Ok(r) => match r.kvs().first() {
                Some(kv) => {
                    let rev = kv.create_revision();
                    let _ = held.rev.set(rev);
                    Ok(rev as u64)
                }
                None => Err(OpError::SessionLost("lock key gone (lease expired)".into())),
            },
            Err(e) => Err(self.fail(m, e, false).await),
        }
    }

    async fn put(&self, key: &str, value: &[u8]) -> OpResult<()> {
        let (m, mut c) = self.client();
        match c.put(format!("{PREFIX}{key}"), value.to_vec(), None).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.fail(m, e, true).await),
        }
    }

    async fn get(&self, key: &str) -> OpResult<Option<Vec<u8>>> {
        let (m, mut c) = self.client();
        match c.get(format!("{PREFIX}{key}"), None).await {
            Ok(r) => Ok(r.kvs().first().map(|kv| kv.value().to_vec())),
            Err(e) => Err(self.fail(m, e, false).await),
        }
    }

    async fn fenced_put(&self, held: &EtcdLock, key: &str, value: &[u8]) -> OpResult<bool> {
        let rev = match self.token(held).await {
            Ok(r) => r as i64,
            // The lock key is gone: the lease expired, the fence refuses.
            Err(OpError::SessionLost(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        let txn = Txn::new()
            .when([Compare::create_revision(held.key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::put(format!("{PREFIX}{key}"), value.to_vec(), None)]);
        let (m, mut c) = self.client();
        match c.txn(txn).await {
            Ok(r) => Ok(r.succeeded()),
            Err(e) => Err(self.fail(m, e, true).await),
        }
    }

    async fn close(self) {
        self.keepalive.abort();
        let (_, mut c) = self.client();
        let _ = tokio::time::timeout(Duration::from_secs(1), c.lease_revoke(self.lease)).await;
    }
}

impl Drop for EtcdClient {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// Index of the member in `endpoints` that reports itself leader (asks
/// each in turn, 0.5 s each).
pub(crate) async fn leader_of(endpoints: &[String]) -> anyhow::Result<usize> {
    for (i, ep) in endpoints.iter().enumerate() {
        let Ok(Ok(mut c)) = tokio::time::timeout(Duration::from_millis(500), connect_one(ep)).await else {
            continue;
        };
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_millis(500), c.status()).await {
            if s.header().is_some_and(|h| h.member_id() == s.leader()) {
                return Ok(i);
            }
        }
    }
    anyhow::bail!("no etcd member reports itself leader")
}

impl Target for EtcdTarget {
    type Client = EtcdClient;

    fn kind(&self) -> Kind {
        Kind::Etcd
    }

    fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints.clone()
    }

    async fn connect(&self, member: usize, ttl: Duration) -> anyhow::Result<EtcdClient> {
        EtcdClient::connect_to_with(self.cluster.endpoints.clone(), member, ttl, self.keepalive).await
    }

    async fn leader(&self) -> anyhow::Result<usize> {
        leader_of(&self.cluster.endpoints).await
    }

    fn kill(&self, member: usize) -> anyhow::Result<()> {
        self.cluster.kill(member)
    }

    fn pause(&self, member: usize, paused: bool) -> anyhow::Result<()> {
        self.cluster.pause(member, paused)
    }

    fn stop(&self) {
        self.cluster.stop();
    }

    fn member_pids(&self) -> Vec<i32> {
        self.cluster.pids()
    }
}
