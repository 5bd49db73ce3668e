//! ZooKeeper 3.8 as a target: a 3-server quorum from
//! `bench/rivals/zookeeper.sh`, driven through the `zookeeper-client` crate.
//!
//! The lock is ZooKeeper's documented recipe: an ephemeral sequential node
//! under the lock's folder, named with the session id (so a create whose
//! answer was lost is found again), then an exists-watch on the node just
//! ahead until this node is the lowest. The fencing token is its czxid.
//! Linearizable reads are `sync` + `getData`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zookeeper_client::{Acls, Client, CreateMode, Error, MultiWriteError};

pub use baton_jepsen::door::{ensure_path, persistent, write_surely_failed};

use super::{Kind, OpError, OpResult, ScriptCluster, ScriptTarget, Target, TargetClient};

const ROOT: &str = "/cmp";

/// Waiter wake-ups in this process: an exists-watch on the predecessor
/// fired (`scale` checks that a release wakes one waiter, not a herd).
static WAKEUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Lock waiters woken so far in this process.
pub fn wakeups() -> u64 {
    WAKEUPS.load(std::sync::atomic::Ordering::Relaxed)
}

pub struct ZkTarget {
    cluster: ScriptCluster,
}

impl ZkTarget {
    pub async fn start(dir: &Path) -> anyhow::Result<ZkTarget> {
        let dir = dir.to_path_buf();
        let cluster = tokio::task::spawn_blocking(move || ScriptCluster::start("zookeeper.sh", "zk-", &dir)).await??;
        Ok(ZkTarget { cluster })
    }
}

impl ScriptTarget for ZkTarget {
    fn script(&self) -> &ScriptCluster {
        &self.cluster
    }

    fn data_dir(&self, member: usize) -> PathBuf {
        self.cluster.dir.join(format!("zk-{}/data", member + 1))
    }
}

/// Errors no ZooKeeper server sends, counted since the process started
/// ([`off_protocol`]): an error code the client does not expect on the
/// wire. The rival tests' `protocol` checker fails a run that saw one.
static OFF_PROTOCOL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn off_protocol() -> u64 {
    OFF_PROTOCOL.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts `e` if no ZooKeeper server sends it.
fn note(e: &Error) {
    if matches!(e, Error::UnexpectedErrorCode(_)) {
        OFF_PROTOCOL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// True for an error's text (as a history records it) that
/// `zookeeper-client` gives for a code no ZooKeeper server sends.
pub(crate) fn off_protocol_text(e: &str) -> bool {
    e.contains("unexpected error code")
}

/// A ZooKeeper error as the harness's (writes: [`write_surely_failed`]).
fn op_err(e: Error, write: bool) -> OpError {
    note(&e);
    match e {
        Error::SessionExpired | Error::ClientClosed => OpError::SessionLost(e.to_string()),
        e if write && !write_surely_failed(&e) => OpError::Indeterminate(e.to_string()),
        e => OpError::Failed(e.to_string()),
    }
}

/// Sets `TCP_NODELAY` on this process's TCP sockets whose peer is one of
/// `endpoints`; returns how many it set. ZooKeeper's Java client and
/// server set it on every connection (`ClientCnxnSocketNIO`,
/// `NIOServerCnxn`); `zookeeper-client` 0.11 does not, and gives no handle
/// on its socket, so without this a request written while an earlier
/// segment is unacknowledged waits for that ACK (Nagle). The sockets are
/// found through /proc/self/fd. Called after each connect: a socket the
/// crate opens later, reconnecting after a member's loss (the failover
/// row), keeps Nagle's algorithm on.
pub fn nodelay_to(endpoints: &[String]) -> usize {
    let peers: Vec<std::net::SocketAddr> = endpoints.iter().filter_map(|e| e.parse().ok()).collect();
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else { return 0 };
    let mut set = 0;
    for fd in fds.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()) {
        if peer_v4(fd).is_some_and(|p| peers.contains(&p)) && nodelay(fd) {
            set += 1;
        }
    }
    set
}

/// The IPv4 peer of socket `fd`, or None (not a connected IPv4 socket).
fn peer_v4(fd: i32) -> Option<std::net::SocketAddr> {
    // SAFETY: getpeername writes at most `len` bytes into a local
    // sockaddr_in; an fd that is not a socket (or was closed meanwhile)
    // makes it fail, and the result is then not read.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let rc = unsafe { libc::getpeername(fd, &mut sa as *mut libc::sockaddr_in as *mut libc::sockaddr, &mut len) };
    if rc != 0 || i32::from(sa.sin_family) != libc::AF_INET {
        return None;
    }
    let ip = std::net::Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
    Some(std::net::SocketAddr::from((ip, u16::from_be(sa.sin_port))))
}

/// Sets `TCP_NODELAY` on socket `fd`; false if the kernel refused.
fn nodelay(fd: i32) -> bool {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a local.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// The 10-digit sequence ZooKeeper appended to a sequential node's name.
fn sequence(name: &str) -> &str {
    &name[name.len().saturating_sub(10)..]
}

pub struct ZkClient {
    client: Client,
    /// This session's id in hex: the lock nodes' name prefix.
    sid: String,
    /// A lock folder where this session may have left a node behind: a
    /// `lock` that failed after its create was sent (the answer lost in a
    /// failover), or an `unlock` that gave up. The node would sit in the
    /// queue for as long as the session lives and block every waiter after
    /// it, so the next `lock` removes this session's nodes there first
    /// (Curator's "protected" mode does the same).
    suspect: std::sync::Mutex<Option<String>>,
}

/// A held ZooKeeper lock: the lock node's path and czxid.
pub struct ZkLock {
    path: String,
    czxid: i64,
}

impl ZkClient {
    /// A session listing `endpoints[member]` first (the crate shuffles the
    /// list, so the first contact is any member).
    pub async fn connect_to(mut endpoints: Vec<String>, member: usize, ttl: Duration) -> anyhow::Result<ZkClient> {
        let n = endpoints.len().max(1);
        endpoints.rotate_left(member % n);
        let client = Client::connector().with_session_timeout(ttl).connect(&endpoints.join(",")).await?;
        nodelay_to(&endpoints);
        ensure_path(&client, ROOT).await?;
        let sid = format!("{:x}", client.session_id().0);
        Ok(ZkClient { client, sid, suspect: std::sync::Mutex::new(None) })
    }

    /// Creates this session's node in `dir`; returns (path, czxid). On a
    /// lost answer, looks for the node by the session-id prefix.
    async fn enqueue(&self, dir: &str) -> OpResult<(String, i64)> {
        let prefix = format!("{dir}/{}-lock-", self.sid);
        let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        for attempt in 0..3 {
            match self.client.create(&prefix, &[], &opts).await {
                Ok((stat, seq)) => return Ok((format!("{prefix}{seq}"), stat.czxid)),
                Err(Error::NoNode) if attempt < 2 => {
                    ensure_path(&self.client, dir).await.map_err(|e| op_err(e, true))?;
                }
                Err(Error::ConnectionLoss) if attempt < 2 => {
                    if let Some(found) = self.find_own(dir).await? {
                        return Ok(found);
                    }
                }
                Err(e) => return Err(op_err(e, true)),
            }
        }
        Err(OpError::Failed("could not create the lock node".into()))
    }

    fn set_suspect(&self, dir: Option<&str>) {
        *self.suspect.lock().unwrap_or_else(|p| p.into_inner()) = dir.map(str::to_string);
    }

    /// Deletes this session's lock nodes in the suspect folder, if any
    /// (this client holds no lock while it queues for one).
    async fn clean_suspect(&self) -> OpResult<()> {
        let Some(dir) = self.suspect.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            return Ok(());
        };
        while let Some((path, _)) = self.find_own(&dir).await? {
            match self.client.delete(&path, None).await {
                Ok(()) | Err(Error::NoNode) => {}
                Err(e) => return Err(op_err(e, true)),
            }
        }
        self.set_suspect(None);
        Ok(())
    }

    async fn find_own(&self, dir: &str) -> OpResult<Option<(String, i64)>> {
        let kids = match self.client.list_children(dir).await {
            Ok(k) => k,
            Err(Error::NoNode) => return Ok(None),
            Err(e) => return Err(op_err(e, false)),
        };
        let own = format!("{}-lock-", self.sid);
        for k in kids.iter().filter(|k| k.starts_with(&own)) {
            let path = format!("{dir}/{k}");
            if let Some(stat) = self.client.check_stat(&path).await.map_err(|e| op_err(e, false))? {
                return Ok(Some((path, stat.czxid)));
            }
        }
        Ok(None)
    }

    /// Queues for the lock in `dir`: this session's node, then an
    /// exists-watch on the node just ahead until it is the lowest.
    async fn queue(&self, dir: &str) -> OpResult<ZkLock> {
        let (path, czxid) = self.enqueue(dir).await?;
        let mine = path.rsplit('/').next().unwrap_or_default().to_string();
        // Once the node exists it is never abandoned while the session
        // lives: a connection loss is retried (the client reconnects),
        // otherwise a node left behind would block every waiter after it.
        loop {
            let mut kids = match self.client.list_children(dir).await {
                Ok(k) => k,
                Err(Error::SessionExpired) => return Err(OpError::SessionLost("session expired".into())),
                Err(e) => {
                    note(&e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            kids.sort_by(|a, b| sequence(a).cmp(sequence(b)));
            let Some(pos) = kids.iter().position(|k| *k == mine) else {
                return Err(OpError::SessionLost("lock node vanished (session expired)".into()));
            };
            if pos == 0 {
                return Ok(ZkLock { path, czxid });
            }
            let ahead = format!("{dir}/{}", kids[pos - 1]);
            match self.client.check_and_watch_stat(&ahead).await {
                Ok((None, _)) => continue,
                Ok((Some(_), w)) => {
                    w.changed().await;
                    WAKEUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(Error::SessionExpired) => return Err(OpError::SessionLost("session expired".into())),
                Err(e) => {
                    note(&e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

impl TargetClient for ZkClient {
    type Lock = ZkLock;

    async fn lock(&self, name: &str) -> OpResult<ZkLock> {
        let dir = format!("{ROOT}/locks/{name}");
        self.clean_suspect().await?;
        self.set_suspect(Some(&dir));
        let r = self.queue(&dir).await;
        if matches!(r, Ok(_) | Err(OpError::SessionLost(_))) {
            self.set_suspect(None);
        }
        r
    }

    async fn unlock(&self, held: ZkLock) -> OpResult<()> {
        // Retried through connection losses for the same reason.
        let mut failed = OpError::Indeterminate("could not delete the lock node".into());
        for _ in 0..200 {
            match self.client.delete(&held.path, None).await {
                Ok(()) | Err(Error::NoNode) => return Ok(()),
                Err(Error::ConnectionLoss) | Err(Error::Timeout) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    failed = op_err(e, true);
                    break;
                }
            }
        }
        // The node may still be there: the next `lock` clears it.
        let dir = held.path.rsplit_once('/').map(|(d, _)| d).unwrap_or_default();
        self.set_suspect(Some(dir));
        Err(failed)
    }

    async fn token(&self, held: &ZkLock) -> OpResult<u64> {
        Ok(held.czxid as u64)
    }

    async fn put(&self, key: &str, value: &[u8]) -> OpResult<()> {
        let path = format!("{ROOT}/{key}");
        match self.client.set_data(&path, value, None).await {
            Ok(_) => Ok(()),
            Err(Error::NoNode) => match self.client.create(&path, value, &persistent()).await {
                Ok(_) => Ok(()),
                Err(Error::NodeExists) => {
                    self.client.set_data(&path, value, None).await.map(|_| ()).map_err(|e| op_err(e, true))
                }
                Err(e) => Err(op_err(e, true)),
            },
            Err(e) => Err(op_err(e, true)),
        }
    }

    async fn get(&self, key: &str) -> OpResult<Option<Vec<u8>>> {
        let path = format!("{ROOT}/{key}");
        // sync makes the member catch up with the leader first: without it
        // ZooKeeper reads are only sequentially consistent.
        self.client.sync(&path).await.map_err(|e| op_err(e, false))?;
        match self.client.get_data(&path).await {
            Ok((data, _)) => Ok(Some(data)),
            Err(Error::NoNode) => Ok(None),
            Err(e) => Err(op_err(e, false)),
        }
    }

    async fn fenced_put(&self, held: &ZkLock, key: &str, value: &[u8]) -> OpResult<bool> {
        let path = format!("{ROOT}/{key}");
        for attempt in 0..3 {
            // Set, or create when the key is missing.
            let mut w = self.client.new_multi_writer();
            w.add_check_version(&held.path, -1).map_err(|e| op_err(e, false))?;
            if attempt % 2 == 0 {
                w.add_set_data(&path, value, None).map_err(|e| op_err(e, false))?;
            } else {
                w.add_create(&path, value, &persistent()).map_err(|e| op_err(e, false))?;
            }
            match w.commit().await {
                Ok(_) => return Ok(true),
                // The lock node is gone: refused by the fence.
                Err(MultiWriteError::OperationFailed { index: 0, .. }) => return Ok(false),
                Err(MultiWriteError::OperationFailed { source: Error::NoNode | Error::NodeExists, .. }) => continue,
                Err(MultiWriteError::OperationFailed { source, .. }) => return Err(op_err(source, true)),
                Err(MultiWriteError::RequestFailed { source }) => return Err(op_err(source, true)),
            }
        }
        Err(OpError::Failed(format!("{path} kept appearing and vanishing")))
    }

    async fn close(self) {
        drop(self.client);
    }
}

/// Asks a server for its role with the `srvr` four-letter word.
/// A four-letter word's answer (`srvr`, `mntr`, ...) from one server,
/// bounded by `bound`.
pub async fn zk_word(endpoint: &str, word: &str, bound: Duration) -> anyhow::Result<String> {
    let go = async {
        let mut s = tokio::net::TcpStream::connect(endpoint).await?;
        s.write_all(word.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        anyhow::Ok(out)
    };
    tokio::time::timeout(bound, go).await.map_err(|_| anyhow::anyhow!("four-letter word {word} timed out"))?
}

/// The value after `key` on the first line that starts with it (a
/// four-letter word's answer: `Mode:`, `zk_max_snapshottime`).
pub fn line_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string())
}

/// A server's `Mode:` (leader, follower, standalone), from `srvr`.
pub async fn mode(endpoint: &str, bound: Duration) -> Option<String> {
    line_value(&zk_word(endpoint, "srvr", bound).await.ok()?, "Mode:")
}

impl Target for ZkTarget {
    type Client = ZkClient;

    fn kind(&self) -> Kind {
        Kind::Zookeeper
    }

    fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints.clone()
    }

    async fn connect(&self, member: usize, ttl: Duration) -> anyhow::Result<ZkClient> {
        ZkClient::connect_to(self.cluster.endpoints.clone(), member, ttl).await
    }

    async fn leader(&self) -> anyhow::Result<usize> {
        for (i, ep) in self.cluster.endpoints.iter().enumerate() {
            if mode(ep, Duration::from_millis(500)).await.as_deref() == Some("leader") {
                return Ok(i);
            }
        }
        anyhow::bail!("no ZooKeeper server reports Mode: leader")
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `nodelay_to` finds this process's socket to a listed endpoint and
    /// turns Nagle off on it, and leaves a socket to another peer alone.
    #[test]
    fn nodelay_to_sets_it_on_sockets_to_the_endpoints_only() {
        let listed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let other = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let to_listed = std::net::TcpStream::connect(listed.local_addr().expect("addr")).expect("connect");
        let to_other = std::net::TcpStream::connect(other.local_addr().expect("addr")).expect("connect");
        assert!(!to_listed.nodelay().expect("nodelay"), "a new socket starts with Nagle on");
        let set = nodelay_to(&[listed.local_addr().expect("addr").to_string()]);
        assert!(set >= 1, "set on {set} sockets");
        assert!(to_listed.nodelay().expect("nodelay"));
        assert!(!to_other.nodelay().expect("nodelay"));
    }
}
