//! The clusters `scale` grows: Baton from the cluster kit with its caps
//! raised and /metrics served, ZooKeeper from `bench/rivals/zookeeper.sh`
//! with `maxClientCnxns=0` (its default of 60 connections per client IP
//! would refuse the 61st session from 127.0.0.1) and a bigger heap, etcd
//! from `bench/rivals/etcd.sh` as the script starts it (its defaults cap
//! neither connections nor memory at these sizes).
//!
//! Each is the plain target of `crate::targets` extended ([`Scalable`])
//! with what the dimensions need beyond [`Target`]: a member's pid (for
//! RSS and CPU from /proc), its data dir (for its size on disk), and a
//! kill -9 + start again of one member on the same data. Baton's target
//! does that itself; a rival's is wrapped in [`Relaunched`], which starts
//! the script's members again from here. Connecting, the ops, the leader
//! and pausing are the plain targets' own.
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

use crate::targets::baton::{BatonOpts, BatonTarget};
use crate::targets::etcd::{EtcdTarget, POLITE_KEEPALIVE};
use crate::targets::zookeeper::{mode, ZkTarget};
use crate::targets::{pid_with_arg, read_pid, signal, Kind, ScriptCluster, ScriptTarget, Target};

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

// ---- the extension --------------------------------------------------------

/// What the dimensions need beyond [`Target`], on any of the three
/// clusters: a member's pid, its data dir and a start after a kill -9.
pub trait Scalable: Target {
    fn pid(&self, member: usize) -> Option<i32>;
    fn data_dir(&self, member: usize) -> PathBuf;
    /// Starts a killed member again, on its data.
    fn start_member(&self, member: usize) -> anyhow::Result<()>;
}

// ---- Baton -----------------------------------------------------------------

/// A 3-member Baton cluster: the plain target with direct links, raised
/// caps and /metrics on.
async fn start_baton(dir: &Path) -> anyhow::Result<BatonTarget> {
    let opts = BatonOpts {
        extra_flags: BATON_CAPS.iter().map(|s| s.to_string()).collect(),
        http: true,
        ..BatonOpts::default()
    };
    BatonTarget::start_opts(dir, opts).await.context("baton cluster did not elect")
}

impl Scalable for BatonTarget {
    fn pid(&self, member: usize) -> Option<i32> {
        pid_with_arg(&format!("--data-dir={}", BatonTarget::data_dir(self, member)?.display()))
    }

    fn data_dir(&self, member: usize) -> PathBuf {
        BatonTarget::data_dir(self, member).map(Path::to_path_buf).unwrap_or_default()
    }

    fn start_member(&self, member: usize) -> anyhow::Result<()> {
        self.restart(member).map(|_| ())
    }
}

/// `GET /metrics` of `member` (Prometheus text).
pub async fn metrics(t: &BatonTarget, member: usize) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = t.http_addr(member).context("no --http-addr")?.to_string();
    let go = async {
        let mut s = tokio::net::TcpStream::connect(&addr).await?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        anyhow::Ok(String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), go).await.context("GET /metrics timed out")?
}

/// The value of a Prometheus sample `name` (with its labels as written,
/// e.g. `baton_snapshot_seconds_sum{kind="made"}`).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
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

// ---- the rivals: a plain target whose members start again -----------------

/// A rival's plain target ([`ScriptTarget`]) whose members this process
/// can kill -9 and start again ([`Relaunch`]); everything else is the
/// plain target's.
pub struct Relaunched<T: ScriptTarget> {
    plain: T,
    procs: Relaunch,
}

impl<T: ScriptTarget> Relaunched<T> {
    fn new(plain: T) -> anyhow::Result<Relaunched<T>> {
        let procs = Relaunch::capture(plain.script())?;
        Ok(Relaunched { plain, procs })
    }
}

impl<T: ScriptTarget> Target for Relaunched<T> {
    type Client = T::Client;

    fn kind(&self) -> Kind {
        self.plain.kind()
    }

    fn endpoints(&self) -> Vec<String> {
        self.plain.endpoints()
    }

    async fn connect(&self, member: usize, ttl: Duration) -> anyhow::Result<T::Client> {
        self.plain.connect(member, ttl).await
    }

    async fn leader(&self) -> anyhow::Result<usize> {
        self.plain.leader().await
    }

    fn kill(&self, member: usize) -> anyhow::Result<()> {
        self.procs.kill(member)
    }

    fn pause(&self, member: usize, paused: bool) -> anyhow::Result<()> {
        self.plain.pause(member, paused)
    }

    fn stop(&self) {
        self.procs.kill_all();
        self.plain.stop();
    }
}

impl<T: ScriptTarget> Scalable for Relaunched<T> {
    fn pid(&self, member: usize) -> Option<i32> {
        self.plain.script().pid(member).ok()
    }

    fn data_dir(&self, member: usize) -> PathBuf {
        self.plain.data_dir(member)
    }

    fn start_member(&self, member: usize) -> anyhow::Result<()> {
        self.procs.start(member)
    }
}

impl<T: ScriptTarget> Drop for Relaunched<T> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A 3-server ZooKeeper quorum with `maxClientCnxns=0` and [`ZK_HEAP`]:
/// started by the script, each server stopped, its zoo.cfg amended, and
/// started again from here.
async fn start_zk(dir: &Path) -> anyhow::Result<Relaunched<ZkTarget>> {
    std::env::set_var("ZK_HEAP", std::env::var("ZK_HEAP").unwrap_or_else(|_| ZK_HEAP.into()));
    let zk = Relaunched::new(ZkTarget::start(dir).await?)?;
    for m in 0..3 {
        zk.kill(m)?;
    }
    for m in 0..3 {
        let cfg = zk.plain.script().dir.join(format!("zk-{}/zoo.cfg", m + 1));
        let mut text = std::fs::read_to_string(&cfg).with_context(|| format!("reading {}", cfg.display()))?;
        text.push_str("# baton-bench scale: no cap on connections per client IP (all are 127.0.0.1)\n");
        text.push_str("maxClientCnxns=0\n");
        std::fs::write(&cfg, text)?;
    }
    for m in 0..3 {
        zk.start_member(m)?;
    }
    wait_quorum(&zk.endpoints()).await?;
    Ok(zk)
}

/// Waits until one server says it leads and two that they follow.
async fn wait_quorum(endpoints: &[String]) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_BOUND;
    while Instant::now() < deadline {
        let mut modes = Vec::new();
        for ep in endpoints {
            modes.push(mode(ep, Duration::from_secs(3)).await);
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

/// A 3-member etcd cluster as `bench/rivals/etcd.sh` starts it (etcd's
/// defaults cap neither connections nor memory at these sizes), its
/// clients within etcd's ping policy ([`POLITE_KEEPALIVE`]).
async fn start_etcd(dir: &Path) -> anyhow::Result<Relaunched<EtcdTarget>> {
    Relaunched::new(EtcdTarget::start_with(dir, POLITE_KEEPALIVE).await?)
}

/// One cluster of any kind.
pub enum Scaled {
    Baton(std::sync::Arc<BatonTarget>),
    Zk(std::sync::Arc<Relaunched<ZkTarget>>),
    Etcd(std::sync::Arc<Relaunched<EtcdTarget>>),
}

/// `$body` with `$t` bound to the cluster, whichever kind it is.
macro_rules! each {
    ($s:expr, $t:ident => $body:expr) => {
        match $s {
            Scaled::Baton($t) => $body,
            Scaled::Zk($t) => $body,
            Scaled::Etcd($t) => $body,
        }
    };
}

impl Scaled {
    pub async fn start(kind: Kind, dir: &Path) -> anyhow::Result<Scaled> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        Ok(match kind {
            Kind::Baton => Scaled::Baton(std::sync::Arc::new(start_baton(dir).await?)),
            Kind::Zookeeper => Scaled::Zk(std::sync::Arc::new(start_zk(dir).await?)),
            Kind::Etcd => Scaled::Etcd(std::sync::Arc::new(start_etcd(dir).await?)),
            Kind::BatonZk => anyhow::bail!("scale does not run baton-zk"),
        })
    }

    pub fn kind(&self) -> Kind {
        each!(self, t => t.kind())
    }

    pub fn endpoints(&self) -> Vec<String> {
        each!(self, t => t.endpoints())
    }

    pub fn pid(&self, member: usize) -> Option<i32> {
        each!(self, t => Scalable::pid(t.as_ref(), member))
    }

    pub fn data_dir(&self, member: usize) -> PathBuf {
        each!(self, t => Scalable::data_dir(t.as_ref(), member))
    }

    pub async fn leader(&self) -> anyhow::Result<usize> {
        each!(self, t => t.leader().await)
    }

    pub fn kill(&self, member: usize) -> anyhow::Result<()> {
        each!(self, t => t.kill(member))
    }

    pub fn start_member(&self, member: usize) -> anyhow::Result<()> {
        each!(self, t => t.start_member(member))
    }

    pub fn stop(&self) {
        each!(self, t => t.stop())
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
        assert_eq!(
            crate::targets::zookeeper::line_value("Zxid: 0x10\nMode: leader\n", "Mode:").as_deref(),
            Some("leader")
        );
    }
}
