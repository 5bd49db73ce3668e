//! One interface over the three coordination services the benchmark
//! compares: Baton, etcd 3.4 and ZooKeeper 3.8, each a 3-member cluster on
//! loopback with fsync on.
//!
//! A [`Target`] is a running cluster (start, stop, find and kill the leader)
//! that hands out [`TargetClient`]s: one session (Baton, ZooKeeper) or one
//! lease (etcd) each, connected to one chosen member first, with the
//! service's own lock recipe:
//! - Baton: its client's lock (ephemeral sequential node, predecessor watch);
//!   token = the Raft index that created the node.
//! - etcd: the v3lock `Lock` RPC (server-side `concurrency.Mutex`) under the
//!   client's lease; token = the lock key's create revision.
//! - ZooKeeper: the documented recipe (ephemeral sequential node under the
//!   lock's folder, exists-watch on the predecessor); token = czxid.
//! - baton-zk: Baton's members through their ZooKeeper port, driven by the
//!   ZooKeeper target's client and recipe (what the compatibility layer
//!   costs, next to real ZooKeeper).
//!
//! Reads are linearizable on every target: Baton's default (ReadIndex),
//! etcd's default range (quorum read), ZooKeeper `sync` + `getData`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;

pub mod baton;
pub mod baton_zk;
pub mod etcd;
pub mod zookeeper;

/// Which service.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Baton,
    Etcd,
    Zookeeper,
    /// Baton through its ZooKeeper port.
    #[value(name = "baton-zk")]
    #[serde(rename = "baton-zk")]
    BatonZk,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Baton => "baton",
            Kind::Etcd => "etcd",
            Kind::Zookeeper => "zookeeper",
            Kind::BatonZk => "baton-zk",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Kind> {
        match s.trim() {
            "baton" => Ok(Kind::Baton),
            "etcd" => Ok(Kind::Etcd),
            "zookeeper" | "zk" => Ok(Kind::Zookeeper),
            "baton-zk" => Ok(Kind::BatonZk),
            other => anyhow::bail!("unknown target {other:?} (baton, etcd, zookeeper, baton-zk)"),
        }
    }
}

/// How an operation failed, as the harness needs to know it.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// Definitely did not happen (refused, no leader, not sent).
    #[error("failed: {0}")]
    Failed(String),
    /// May have happened (a write whose answer was lost).
    #[error("indeterminate: {0}")]
    Indeterminate(String),
    /// The session/lease is gone; the client must be replaced.
    #[error("session lost: {0}")]
    SessionLost(String),
}

impl OpError {
    pub fn is_session_lost(&self) -> bool {
        matches!(self, OpError::SessionLost(_))
    }
}

pub type OpResult<T> = Result<T, OpError>;

/// One client session of a target.
pub trait TargetClient: Send + Sync + 'static {
    /// A held lock: what release and the fence need.
    type Lock: Send + Sync + 'static;
    /// Blocks until `name` is held by this client.
    fn lock(&self, name: &str) -> impl Future<Output = OpResult<Self::Lock>> + Send;
    fn unlock(&self, held: Self::Lock) -> impl Future<Output = OpResult<()>> + Send;
    /// The fencing token of a held lock (Baton: the Raft index that created
    /// the lock node; ZooKeeper: its czxid, both returned by the create;
    /// etcd: the lock key's create revision, one more read, which the
    /// benchmark does not do).
    fn token(&self, held: &Self::Lock) -> impl Future<Output = OpResult<u64>> + Send;
    /// Creates or overwrites `key` (a flat name: `[a-z0-9-]+`).
    fn put(&self, key: &str, value: &[u8]) -> impl Future<Output = OpResult<()>> + Send;
    /// Linearizable read.
    fn get(&self, key: &str) -> impl Future<Output = OpResult<Option<Vec<u8>>>> + Send;
    /// Writes `value` only if `held` still holds its lock, in one atomic
    /// operation (Baton: `check_fence` with the token in a multi; etcd: a txn
    /// comparing the lock key's create revision; ZooKeeper: a multi with a
    /// check on the lock node). Ok(false) = refused by the fence.
    fn fenced_put(&self, held: &Self::Lock, key: &str, value: &[u8]) -> impl Future<Output = OpResult<bool>> + Send;
    /// Ends the session / revokes the lease (best effort).
    fn close(self) -> impl Future<Output = ()> + Send;
    /// A switch that freezes this client from outside (its keepalives stop
    /// too, as a stopped process's would), for the lock-safety test's
    /// client pause. None: this client cannot be frozen in-process.
    fn freeze_switch(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicBool>> {
        None
    }
}

/// A running 3-member cluster of one service.
pub trait Target: Send + Sync + 'static {
    type Client: TargetClient;
    fn kind(&self) -> Kind;
    /// The members' client endpoints (`host:port`).
    fn endpoints(&self) -> Vec<String>;
    /// Member count.
    fn members(&self) -> usize {
        self.endpoints().len()
    }
    /// A new client whose first contact is `member` (mod members); it moves
    /// to another member on error. `ttl`: session timeout / lease TTL.
    fn connect(&self, member: usize, ttl: Duration) -> impl Future<Output = anyhow::Result<Self::Client>> + Send;
    /// Index of the current leader (asks the members).
    fn leader(&self) -> impl Future<Output = anyhow::Result<usize>> + Send;
    /// kill -9 one member.
    fn kill(&self, member: usize) -> anyhow::Result<()>;
    /// SIGSTOP / SIGCONT one member.
    fn pause(&self, member: usize, paused: bool) -> anyhow::Result<()>;
    /// Starts a killed member again; false when this target cannot (etcd.sh
    /// and zookeeper.sh start whole clusters only).
    fn restart(&self, _member: usize) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Whether [`Target::restart`] can start a killed member again.
    fn restart_supported(&self) -> bool {
        false
    }
    /// Cuts every peer link of one member, both directions (`cut`), or
    /// heals every link; its clients still reach it. False: this target's
    /// members talk directly, nothing to cut.
    fn isolate(&self, _member: usize, _cut: bool) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Stops every process it started (also done on drop).
    fn stop(&self);
    /// The live members' process ids, for their CPU time (`bench`'s CPU
    /// µs per operation); empty when not known.
    fn member_pids(&self) -> Vec<i32> {
        Vec::new()
    }
    /// Environment a holder process (`baton-bench hold`) needs.
    fn child_env(&self) -> Vec<(String, PathBuf)> {
        Vec::new()
    }
}

/// Runs as a separate process for the failover workload's holder kill:
/// connects to `endpoints`, queues for `name`, prints `held <token>` once
/// it holds it, then waits to be killed (kill -9: it never releases).
pub async fn hold(kind: Kind, endpoints: Vec<String>, name: &str, ttl: Duration) -> anyhow::Result<()> {
    async fn run<C: TargetClient>(c: C, name: &str) -> anyhow::Result<()> {
        let held = c.lock(name).await?;
        let token = c.token(&held).await.unwrap_or(0);
        println!("held {token}");
        use std::io::Write as _;
        std::io::stdout().flush()?;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(())
    }
    match kind {
        Kind::Baton => {
            run(baton::BatonClient::connect_to(endpoints, 0, ttl, baton::tls_from_env()?).await?, name).await
        }
        Kind::Etcd => run(etcd::EtcdClient::connect_to(endpoints, 0, ttl).await?, name).await,
        Kind::Zookeeper | Kind::BatonZk => run(zookeeper::ZkClient::connect_to(endpoints, 0, ttl).await?, name).await,
    }
}

/// The rival scripts (bench/rivals): `BATON_RIVALS_DIR` or the source tree.
pub fn rivals_dir() -> PathBuf {
    std::env::var_os("BATON_RIVALS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("rivals"))
}

/// Runs `bench/rivals/<script> <args>`; returns stdout.
pub(crate) fn rival_script(script: &str, args: &[&str]) -> anyhow::Result<String> {
    let path = rivals_dir().join(script);
    let out =
        Command::new("bash").arg(&path).args(args).output().with_context(|| format!("running {}", path.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "{} {} failed ({}):\n{}",
            path.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `endpoints: a,b,c` line a rival script prints.
pub(crate) fn parse_endpoints_line(out: &str) -> anyhow::Result<Vec<String>> {
    let line = out
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("endpoints: "))
        .context("rival script printed no 'endpoints:' line")?;
    Ok(line.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
}

/// Reads a pid file the rival scripts write.
pub(crate) fn read_pid(path: &Path) -> anyhow::Result<i32> {
    let s = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    s.trim().parse::<i32>().with_context(|| format!("bad pid in {}", path.display()))
}

/// The pid of the live process whose command line has the argument `arg`.
pub(crate) fn pid_with_arg(arg: &str) -> Option<i32> {
    let rd = std::fs::read_dir("/proc").ok()?;
    rd.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
    })
}

pub(crate) fn signal(pid: i32, sig: i32) -> anyhow::Result<()> {
    // SAFETY: kill(2) with a pid the scripts recorded for a server they started.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc != 0 {
        anyhow::bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Ports a rival script uses above its base (ZooKeeper's election ports are
/// base+21..23).
const PORT_BLOCK: u16 = 24;
/// Blocks tried before a start gives up.
const PORT_TRIES: usize = 3;

/// A base port whose block `base..base+len` is free on 127.0.0.1 now.
fn free_port_block(len: u16) -> anyhow::Result<u16> {
    for _ in 0..100 {
        let base = rand::random::<u16>() % 30_000 + 20_000;
        if (0..len).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return Ok(base);
        }
    }
    anyhow::bail!("no block of {len} free ports found on 127.0.0.1")
}

/// A rival's target: a cluster a script in bench/rivals started. What
/// `scale` builds its relaunching extension on (`scale::cluster::Relaunched`).
pub trait ScriptTarget: Target {
    /// The script's cluster: its folder, pid files and endpoints.
    fn script(&self) -> &ScriptCluster;
    /// `member`'s data folder.
    fn data_dir(&self, member: usize) -> PathBuf;
}

/// A rival cluster run by a script in bench/rivals (etcd.sh, zookeeper.sh):
/// installed when missing, started on a fresh folder, stopped on drop.
pub struct ScriptCluster {
    pub script: &'static str,
    /// Pid file prefix: DIR/<prefix>N.pid.
    pub pid_prefix: &'static str,
    pub dir: PathBuf,
    pub endpoints: Vec<String>,
    stopped: std::sync::atomic::AtomicBool,
}

impl ScriptCluster {
    /// Starts the cluster on a block of free ports (the scripts use base+1
    /// to base+23); a block taken meanwhile by someone else is given up for
    /// another, up to [`PORT_TRIES`] times.
    pub fn start(script: &'static str, pid_prefix: &'static str, dir: &Path) -> anyhow::Result<ScriptCluster> {
        // `install` is a no-op when the service is there (and needs root when not).
        rival_script(script, &["install"])?;
        let d = dir.to_string_lossy().into_owned();
        let mut tries = 0;
        let out = loop {
            let _ = std::fs::remove_dir_all(dir);
            std::fs::create_dir_all(dir)?;
            let base = free_port_block(PORT_BLOCK)?.to_string();
            match rival_script(script, &["start", &d, &base]) {
                Err(e) if tries + 1 < PORT_TRIES && format!("{e:#}").contains("already in use") => tries += 1,
                r => break r?,
            }
        };
        let endpoints = parse_endpoints_line(&out)?;
        Ok(ScriptCluster {
            script,
            pid_prefix,
            dir: dir.to_path_buf(),
            endpoints,
            stopped: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn pid(&self, member: usize) -> anyhow::Result<i32> {
        read_pid(&self.dir.join(format!("{}{}.pid", self.pid_prefix, member + 1)))
    }

    /// The pids of the members whose pid files name a live process.
    pub fn pids(&self) -> Vec<i32> {
        (0..self.endpoints.len())
            .filter_map(|m| self.pid(m).ok())
            .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            .collect()
    }

    pub fn kill(&self, member: usize) -> anyhow::Result<()> {
        signal(self.pid(member)?, libc::SIGKILL)
    }

    pub fn pause(&self, member: usize, paused: bool) -> anyhow::Result<()> {
        signal(self.pid(member)?, if paused { libc::SIGSTOP } else { libc::SIGCONT })
    }

    pub fn stop(&self) {
        if self.stopped.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        // A SIGSTOPped member would ignore SIGTERM until continued.
        for m in 0..self.endpoints.len() {
            let _ = self.pause(m, false);
        }
        let d = self.dir.to_string_lossy().into_owned();
        if let Err(e) = rival_script(self.script, &["stop", &d]) {
            eprintln!("warning: {e:#}");
        }
    }
}

impl Drop for ScriptCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
