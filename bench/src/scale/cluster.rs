//! The clusters `scale` grows: Baton from the cluster kit with its caps
//! raised and /metrics served, ZooKeeper from `bench/rivals/zookeeper.sh`
//! with `maxClientCnxns=0` (its default of 60 connections per client IP
//! would refuse the 61st session from 127.0.0.1) and a bigger heap, etcd
//! from `bench/rivals/etcd.sh` as the script starts it (its defaults cap
//! neither connections nor memory at these sizes).
//!
//! All three offer what the dimensions need beyond [`Target`]: a member's
//! pid (for RSS and CPU from /proc), its data dir (for its size on disk),
//! and a kill -9 + start again of one member on the same data.
//!
//! Members' pids: Baton's kit keeps its processes private, so a member's
//! pid is found in /proc by its `--data-dir=` argument; ZooKeeper's and
//! etcd's are in the script's pid files (rewritten here on a restart, by
//! [`Relaunch`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use baton_client::member_status_with;
use baton_kit::{Bin, ClusterSpec, Links};

use crate::targets::baton::BatonClient;
use crate::targets::etcd::{leader_of, EtcdClient, POLITE_KEEPALIVE};
use crate::targets::zookeeper::ZkClient;
use crate::targets::{read_pid, signal, Kind, ScriptCluster, Target};

/// Baton's caps for the run (defaults: 10,000 connections per member,
/// 100,000 sessions, 100,000 watches per connection): the sessions
/// dimension opens 50,000 connections, ~17,000 on each member.
const BATON_CAPS: [&str; 3] = ["--max-connections=100000", "--max-sessions=200000", "--max-watches=1000000"];
/// ZooKeeper's heap (the rival script's default is 256 MB; 1M nodes need more).
pub const ZK_HEAP: &str = "2g";
/// How long a member gets to start, or the cluster to elect a leader.
const START_BOUND: Duration = Duration::from_secs(60);

// ---- /proc -----------------------------------------------------------------

/// Resident memory of `pid` in bytes (VmRSS).
pub fn rss_bytes(pid: i32) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("/proc/{pid}/status"))?;
    let kb = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .with_context(|| format!("no VmRSS for pid {pid}"))?;
    Ok(kb * 1024)
}

/// CPU seconds `pid` has used (utime + stime).
pub fn cpu_secs(pid: i32) -> anyhow::Result<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces, in parentheses):
    // state is field 3, utime 14, stime 15.
    let rest = s.rsplit_once(')').map(|(_, r)| r).context("bad /proc stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).context("bad /proc stat field");
    let (utime, stime) = (tick(11)?, tick(12)?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((utime + stime) as f64 / hz)
}

/// Bytes of the files under `dir` (0 if missing).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

/// The pid of the live process whose command line has the argument `arg`.
fn pid_with_arg(arg: &str) -> Option<i32> {
    let rd = std::fs::read_dir("/proc").ok()?;
    rd.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
    })
}

/// Raises this process's soft (and, as root, hard) open-file limit to
/// `want`: thousands of sessions are thousands of sockets here and in the
/// members, which inherit the limit. Returns the soft limit in force.
pub fn raise_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_cur >= want {
            return r.rlim_cur;
        }
        let both = libc::rlimit { rlim_cur: want, rlim_max: want.max(r.rlim_max) };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &both) != 0 {
            // Not root: as far as the hard limit allows.
            let soft = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            libc::setrlimit(libc::RLIMIT_NOFILE, &soft);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    r.rlim_cur
}

// ---- Baton -----------------------------------------------------------------

/// A 3-member Baton cluster (direct links, raised caps, /metrics on).
pub struct BatonScale {
    cluster: Mutex<baton_kit::Cluster>,
    endpoints: Vec<String>,
    data_dirs: Vec<PathBuf>,
    http: Vec<Option<String>>,
}

impl BatonScale {
    pub async fn start(dir: &Path) -> anyhow::Result<BatonScale> {
        let bin = baton_kit::locate(Bin::Batond)?;
        let spec = ClusterSpec {
            // `snapshot save` measures the backup: a local cluster, open
            // to admin operations.
            extra: BATON_CAPS.iter().map(|s| s.to_string()).chain(["--insecure-open-admin".to_string()]).collect(),
            env: vec![("RUST_LOG".into(), "warn".into())],
            http: true,
            links: Links::Direct,
            ..ClusterSpec::new(3, dir, &bin)
        };
        let cluster = baton_kit::Cluster::start(spec, START_BOUND).await.context("baton cluster did not elect")?;
        let endpoints = cluster.endpoints();
        let data_dirs = cluster.members.iter().map(|m| m.spec.data_dir.clone()).collect();
        let http = cluster.members.iter().map(|m| m.spec.http_addr.map(|a| a.to_string())).collect();
        Ok(BatonScale { cluster: Mutex::new(cluster), endpoints, data_dirs, http })
    }

    fn with<T>(&self, f: impl FnOnce(&mut baton_kit::Cluster) -> T) -> T {
        f(&mut self.cluster.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn pid(&self, member: usize) -> Option<i32> {
        pid_with_arg(&format!("--data-dir={}", self.data_dirs.get(member)?.display()))
    }

    pub fn data_dir(&self, member: usize) -> PathBuf {
        self.data_dirs[member].clone()
    }

    pub fn start_member(&self, member: usize) -> anyhow::Result<()> {
        self.with(|c| c.start_member(member as u64 + 1))
    }

    /// `GET /metrics` of `member` (Prometheus text).
    pub async fn metrics(&self, member: usize) -> anyhow::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.http.get(member).cloned().flatten().context("no --http-addr")?;
        let go = async {
            let mut s = tokio::net::TcpStream::connect(&addr).await?;
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await?;
            anyhow::Ok(String::from_utf8_lossy(&out).into_owned())
        };
        tokio::time::timeout(Duration::from_secs(5), go).await.context("GET /metrics timed out")?
    }
}

/// The value of a Prometheus sample `name` (with its labels as written,
/// e.g. `baton_snapshot_seconds_sum{kind="made"}`).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Target for BatonScale {
    type Client = BatonClient;

    fn kind(&self) -> Kind {
        Kind::Baton
    }

    fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    async fn connect(&self, member: usize, ttl: Duration) -> anyhow::Result<BatonClient> {
        BatonClient::connect_to(self.endpoints.clone(), member, ttl, None).await
    }

    async fn leader(&self) -> anyhow::Result<usize> {
        for (i, ep) in self.endpoints.iter().enumerate() {
            if let Ok(s) = member_status_with(ep, Duration::from_millis(500), None).await {
                if s.role == "leader" {
                    return Ok(i);
                }
            }
        }
        anyhow::bail!("no member reports itself leader")
    }

    fn kill(&self, member: usize) -> anyhow::Result<()> {
        self.with(|c| c.kill(member as u64 + 1));
        Ok(())
    }

    fn pause(&self, member: usize, paused: bool) -> anyhow::Result<()> {
        let id = member as u64 + 1;
        self.with(|c| if paused { c.pause(id) } else { c.resume(id) });
        Ok(())
    }

    fn stop(&self) {
        self.with(|c| c.kill_all());
    }
}

// ---- a script's members, started again from here ------------------------------

/// Kills and starts again the members a rival script started, on the same
/// command line, working dir and data. Once started here a member is a
/// child of this process (killed and reaped through its [`Child`]);
/// before that it is the script's (setsid'd, killed by its pid file).
/// Either way its pid is in the script's pid file, rewritten on a start.
pub struct Relaunch {
    /// The script's folder: `<prefix>N.pid` and `<prefix>N.log` live there.
    dir: PathBuf,
    /// The pid and log files' prefix (`zk-`, `etcd-`).
    prefix: &'static str,
    members: Mutex<Vec<Member>>,
}

/// How to start one member again.
struct Member {
    /// Its command line, as the script started it.
    argv: Vec<String>,
    /// Its working dir.
    cwd: PathBuf,
    /// Its process once this side started it (None: the script's, or dead).
    child: Option<Child>,
    /// Still the process the script started (setsid'd, not our child):
    /// killed by its pid file, once; after that the pid file's pid is not
    /// signalled again (it may belong to someone else by then).
    script_owned: bool,
}

impl Relaunch {
    /// Reads each running member's command line and working dir from /proc.
    fn capture(script: &ScriptCluster) -> anyhow::Result<Relaunch> {
        let mut members = Vec::new();
        for m in 0..script.endpoints.len() {
            let pid = script.pid(m)?;
            let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))?
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_else(|_| PathBuf::from("/"));
            members.push(Member { argv, cwd, child: None, script_owned: true });
        }
        Ok(Relaunch { dir: script.dir.clone(), prefix: script.pid_prefix, members: Mutex::new(members) })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Vec<Member>) -> T) -> T {
        f(&mut self.members.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn pid_file(&self, member: usize) -> PathBuf {
        self.dir.join(format!("{}{}.pid", self.prefix, member + 1))
    }

    /// Starts `member` again (same command line, config and data), its
    /// output appended to the script's log of it.
    pub fn start(&self, member: usize) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt as _;
        let log_path = self.dir.join(format!("{}{}.log", self.prefix, member + 1));
        let pid_path = self.pid_file(member);
        self.with(|members| {
            let s = members.get_mut(member).with_context(|| format!("no member {member}"))?;
            let (exe, args) = s.argv.split_first().context("empty command line")?;
            let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
            let c = Command::new(exe)
                .args(args)
                .current_dir(&s.cwd)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0)
                .spawn()
                .with_context(|| format!("starting {exe}"))?;
            std::fs::write(&pid_path, format!("{}\n", c.id()))?;
            s.child = Some(c);
            s.script_owned = false;
            anyhow::Ok(())
        })
    }

    /// kill -9 `member` and wait (at most 10 s) until it is gone.
    pub fn kill(&self, member: usize) -> anyhow::Result<()> {
        let (own, script_owned) = self.with(|members| match members.get_mut(member) {
            Some(m) => (m.child.take(), std::mem::replace(&mut m.script_owned, false)),
            None => (None, false),
        });
        if let Some(mut c) = own {
            let _ = c.kill();
            let _ = c.wait();
        } else if script_owned {
            if let Ok(pid) = read_pid(&self.pid_file(member)) {
                let _ = signal(pid, libc::SIGKILL);
                let deadline = Instant::now() + Duration::from_secs(10);
                while alive(pid) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        Ok(())
    }

    /// kill -9 every member (the script's still running, and this side's).
    fn kill_all(&self) {
        let n = self.with(|members| members.len());
        for m in 0..n {
            let _ = self.kill(m);
        }
    }
}

/// Is `pid` running (a zombie, dead but not yet reaped by its parent,
/// is not)?
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()), Some("Z" | "X")),
        Err(_) => false,
    }
}

// ---- ZooKeeper ---------------------------------------------------------------

/// A 3-server ZooKeeper quorum, restarted once after the script started it
/// so that `maxClientCnxns=0` is in force; its servers are then children
/// of this process (kill + start again on the same command line).
pub struct ZkScale {
    script: ScriptCluster,
    procs: Relaunch,
}

impl ZkScale {
    pub async fn start(dir: &Path) -> anyhow::Result<ZkScale> {
        // The script reads ZK_HEAP; nothing else in this process does.
        std::env::set_var("ZK_HEAP", std::env::var("ZK_HEAP").unwrap_or_else(|_| ZK_HEAP.into()));
        let d = dir.to_path_buf();
        let script = tokio::task::spawn_blocking(move || ScriptCluster::start("zookeeper.sh", "zk-", &d)).await??;
        let procs = Relaunch::capture(&script)?;
        let zk = ZkScale { script, procs };
        for m in 0..3 {
            zk.kill(m)?;
        }
        for m in 0..3 {
            let cfg = zk.script.dir.join(format!("zk-{}/zoo.cfg", m + 1));
            let mut text = std::fs::read_to_string(&cfg).with_context(|| format!("reading {}", cfg.display()))?;
            text.push_str("# baton-bench scale: no cap on connections per client IP (all are 127.0.0.1)\n");
            text.push_str("maxClientCnxns=0\n");
            std::fs::write(&cfg, text)?;
        }
        for m in 0..3 {
            zk.start_member(m)?;
        }
        zk.wait_quorum().await?;
        Ok(zk)
    }

    pub fn pid(&self, member: usize) -> Option<i32> {
        self.script.pid(member).ok()
    }

    pub fn data_dir(&self, member: usize) -> PathBuf {
        self.script.dir.join(format!("zk-{}/data", member + 1))
    }

    /// Starts server `member` again (same command line, config and data).
    pub fn start_member(&self, member: usize) -> anyhow::Result<()> {
        self.procs.start(member)
    }

    /// Until one server says leader and two follower.
    pub async fn wait_quorum(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_BOUND;
        while Instant::now() < deadline {
            let mut modes = Vec::new();
            for ep in &self.script.endpoints {
                modes.push(zk_word(ep, "srvr").await.ok().and_then(|s| line_value(&s, "Mode:")));
            }
            let leaders = modes.iter().filter(|m| m.as_deref() == Some("leader")).count();
            let followers = modes.iter().filter(|m| m.as_deref() == Some("follower")).count();
            if leaders == 1 && followers == 2 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::bail!("ZooKeeper: no leader and two followers within {START_BOUND:?}")
    }
}

/// A four-letter word's answer (`srvr`, `mntr`).
pub async fn zk_word(endpoint: &str, word: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let go = async {
        let mut s = tokio::net::TcpStream::connect(endpoint).await?;
        s.write_all(word.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        anyhow::Ok(out)
    };
    tokio::time::timeout(Duration::from_secs(3), go).await.context("four-letter word timed out")?
}

/// `Key: value` / `key\tvalue` lines.
pub fn line_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string())
}

impl Target for ZkScale {
    type Client = ZkClient;

    fn kind(&self) -> Kind {
        Kind::Zookeeper
    }

    fn endpoints(&self) -> Vec<String> {
        self.script.endpoints.clone()
    }

    async fn connect(&self, member: usize, ttl: Duration) -> anyhow::Result<ZkClient> {
        ZkClient::connect_to(self.script.endpoints.clone(), member, ttl).await
    }

    async fn leader(&self) -> anyhow::Result<usize> {
        for (i, ep) in self.script.endpoints.iter().enumerate() {
            if let Ok(s) = zk_word(ep, "srvr").await {
                if line_value(&s, "Mode:").as_deref() == Some("leader") {
                    return Ok(i);
                }
            }
        }
        anyhow::bail!("no ZooKeeper server reports Mode: leader")
    }

    fn kill(&self, member: usize) -> anyhow::Result<()> {
        self.procs.kill(member)
    }

    fn pause(&self, member: usize, paused: bool) -> anyhow::Result<()> {
        self.script.pause(member, paused)
    }

    fn stop(&self) {
        self.procs.kill_all();
        self.script.stop();
    }
}

impl Drop for ZkScale {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---- etcd ----------------------------------------------------------------------

/// A 3-member etcd cluster as `bench/rivals/etcd.sh` starts it (etcd's
/// defaults: fsync on, snapshot every 100,000 Raft entries, 2 GB backend
/// quota); a member killed here is started again on the script's command
/// line (the `--initial-cluster` flags are ignored on a data dir that
/// holds a member).
pub struct EtcdScale {
    script: ScriptCluster,
    procs: Relaunch,
}

impl EtcdScale {
    pub async fn start(dir: &Path) -> anyhow::Result<EtcdScale> {
        let d = dir.to_path_buf();
        let script = tokio::task::spawn_blocking(move || ScriptCluster::start("etcd.sh", "etcd-", &d)).await??;
        let procs = Relaunch::capture(&script)?;
        Ok(EtcdScale { script, procs })
    }

    pub fn pid(&self, member: usize) -> Option<i32> {
        self.script.pid(member).ok()
    }

    /// `--data-dir` of `member` (member/wal, member/snap/db).
    pub fn data_dir(&self, member: usize) -> PathBuf {
        self.script.dir.join(format!("etcd-{}", member + 1))
    }

    pub fn start_member(&self, member: usize) -> anyhow::Result<()> {
        self.procs.start(member)
    }
}

impl Target for EtcdScale {
    type Client = EtcdClient;

    fn kind(&self) -> Kind {
        Kind::Etcd
    }

    fn endpoints(&self) -> Vec<String> {
        self.script.endpoints.clone()
    }

    async fn connect(&self, member: usize, ttl: Duration) -> anyhow::Result<EtcdClient> {
        // Lock RPCs wait seconds in a long queue: pings within etcd's policy.
        EtcdClient::connect_to_with(self.script.endpoints.clone(), member, ttl, POLITE_KEEPALIVE).await
    }

    async fn leader(&self) -> anyhow::Result<usize> {
        leader_of(&self.script.endpoints).await
    }

    fn kill(&self, member: usize) -> anyhow::Result<()> {
        self.procs.kill(member)
    }

    fn pause(&self, member: usize, paused: bool) -> anyhow::Result<()> {
        self.script.pause(member, paused)
    }

    fn stop(&self) {
        self.procs.kill_all();
        self.script.stop();
    }
}

impl Drop for EtcdScale {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One cluster of any kind.
pub enum Scaled {
    Baton(std::sync::Arc<BatonScale>),
    Zk(std::sync::Arc<ZkScale>),
    Etcd(std::sync::Arc<EtcdScale>),
}

impl Scaled {
    pub async fn start(kind: Kind, dir: &Path) -> anyhow::Result<Scaled> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        Ok(match kind {
            Kind::Baton => Scaled::Baton(std::sync::Arc::new(BatonScale::start(dir).await?)),
            Kind::Zookeeper => Scaled::Zk(std::sync::Arc::new(ZkScale::start(dir).await?)),
            Kind::Etcd => Scaled::Etcd(std::sync::Arc::new(EtcdScale::start(dir).await?)),
            Kind::BatonZk => anyhow::bail!("scale does not run baton-zk"),
        })
    }

    pub fn kind(&self) -> Kind {
        match self {
            Scaled::Baton(_) => Kind::Baton,
            Scaled::Zk(_) => Kind::Zookeeper,
            Scaled::Etcd(_) => Kind::Etcd,
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        match self {
            Scaled::Baton(t) => t.endpoints(),
            Scaled::Zk(t) => t.endpoints(),
            Scaled::Etcd(t) => t.endpoints(),
        }
    }

    pub fn pid(&self, member: usize) -> Option<i32> {
        match self {
            Scaled::Baton(t) => t.pid(member),
            Scaled::Zk(t) => t.pid(member),
            Scaled::Etcd(t) => t.pid(member),
        }
    }

    pub fn data_dir(&self, member: usize) -> PathBuf {
        match self {
            Scaled::Baton(t) => t.data_dir(member),
            Scaled::Zk(t) => t.data_dir(member),
            Scaled::Etcd(t) => t.data_dir(member),
        }
    }

    pub async fn leader(&self) -> anyhow::Result<usize> {
        match self {
            Scaled::Baton(t) => t.leader().await,
            Scaled::Zk(t) => t.leader().await,
            Scaled::Etcd(t) => t.leader().await,
        }
    }

    pub fn kill(&self, member: usize) -> anyhow::Result<()> {
        match self {
            Scaled::Baton(t) => t.kill(member),
            Scaled::Zk(t) => t.kill(member),
            Scaled::Etcd(t) => t.kill(member),
        }
    }

    pub fn start_member(&self, member: usize) -> anyhow::Result<()> {
        match self {
            Scaled::Baton(t) => t.start_member(member),
            Scaled::Zk(t) => t.start_member(member),
            Scaled::Etcd(t) => t.start_member(member),
        }
    }

    pub fn stop(&self) {
        match self {
            Scaled::Baton(t) => t.stop(),
            Scaled::Zk(t) => t.stop(),
            Scaled::Etcd(t) => t.stop(),
        }
    }

    /// Each member's RSS in bytes (0 for a member not running).
    pub fn rss(&self) -> Vec<u64> {
        (0..3).map(|m| self.pid(m).and_then(|p| rss_bytes(p).ok()).unwrap_or(0)).collect()
    }

    /// Each member's CPU seconds so far.
    pub fn cpu(&self) -> Vec<f64> {
        (0..3).map(|m| self.pid(m).and_then(|p| cpu_secs(p).ok()).unwrap_or(0.0)).collect()
    }
}

impl Drop for Scaled {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_readings_of_this_process() {
        let me = std::process::id() as i32;
        assert!(rss_bytes(me).expect("rss") > 1 << 20);
        let t0 = cpu_secs(me).expect("cpu");
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(200) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(cpu_secs(me).expect("cpu") > t0);
        assert!(rss_bytes(-5).is_err());
    }

    #[test]
    fn a_killed_unreaped_child_is_not_alive() {
        assert!(alive(std::process::id() as i32));
        assert!(!alive(-5));
        let mut c = Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let pid = c.id() as i32;
        assert!(alive(pid));
        signal(pid, libc::SIGKILL).expect("kill");
        // Dead, not yet reaped: a zombie, which holds no port or file.
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(pid));
        let _ = c.wait();
    }

    #[test]
    fn prometheus_samples_and_dir_sizes() {
        let text = "# HELP x\nbaton_snapshot_seconds_sum{kind=\"made\"} 0.25\nbaton_nodes 12\n";
        assert_eq!(metric(text, "baton_snapshot_seconds_sum{kind=\"made\"}"), Some(0.25));
        assert_eq!(metric(text, "baton_nodes"), Some(12.0));
        assert_eq!(metric(text, "baton_node"), None);
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(d.path().join("a/b")).expect("mkdir");
        std::fs::write(d.path().join("a/b/f"), [0u8; 1000]).expect("write");
        std::fs::write(d.path().join("g"), [0u8; 24]).expect("write");
        assert_eq!(dir_bytes(d.path()), 1024);
        assert_eq!(dir_bytes(&d.path().join("missing")), 0);
        assert_eq!(line_value("Zxid: 0x10\nMode: leader\n", "Mode:").as_deref(), Some("leader"));
    }
}
