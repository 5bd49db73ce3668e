//! The benchmark: the same workloads, through the same
//! [`Target`] interface, against Baton, etcd and ZooKeeper.
//!
//! A run has a warm-up (operations run, nothing is recorded) and a measured
//! window; a figure is the median of several runs ([`summarize`]).
//! Latency is per operation: acquire + release for the uncontended and
//! independent locks, the wait from asking to being granted for the
//! contended lock, one put or one linearizable get for write/read.
//!
//! A run is closed-loop by default: each client starts its next operation
//! when its last one ends, so the offered load is whatever the target
//! gives back. With a rate ([`RunOpts::rate`]) it is open-loop: operation
//! k is due at `start + k / rate` whatever happened before it ([`Pacer`]),
//! the clients take the due operations in turn, and an operation's latency
//! runs from when it was due, not from when a client got to it, so time
//! spent queued behind a slow operation counts (no coordinated omission).
//! The operations due in the measured window are the ones measured; those
//! still not done [`DRAIN`] after the window are counted as late
//! ([`RunFigures::late`]): a load the target cannot keep up with shows as
//! late operations and an achieved rate below the offered one.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use tokio::io::AsyncBufReadExt;
use tokio::sync::Notify;

use super::targets::{Kind, OpError, Target, TargetClient};

/// Session timeout / lease TTL on every target.
pub const TTL: Duration = Duration::from_secs(5);
/// Value size of the write workload.
pub const VALUE_BYTES: usize = 256;

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum BenchWorkload {
    LockUncontended,
    LockContended,
    LockIndependent,
    Write,
    Read,
    Failover,
}

impl BenchWorkload {
    pub const ALL: [BenchWorkload; 6] = [
        BenchWorkload::LockUncontended,
        BenchWorkload::LockContended,
        BenchWorkload::LockIndependent,
        BenchWorkload::Write,
        BenchWorkload::Read,
        BenchWorkload::Failover,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BenchWorkload::LockUncontended => "lock-uncontended",
            BenchWorkload::LockContended => "lock-contended",
            BenchWorkload::LockIndependent => "lock-independent",
            BenchWorkload::Write => "write",
            BenchWorkload::Read => "read",
            BenchWorkload::Failover => "failover",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<BenchWorkload> {
        BenchWorkload::ALL.into_iter().find(|w| w.name() == s.trim()).with_context(|| format!("unknown workload {s:?}"))
    }

    /// Clients used when `--clients` is not given.
    pub fn default_clients(self) -> usize {
        match self {
            BenchWorkload::LockUncontended => 1,
            BenchWorkload::LockContended | BenchWorkload::Failover => 16,
            BenchWorkload::LockIndependent | BenchWorkload::Write | BenchWorkload::Read => 64,
        }
    }

    fn is_lock(self) -> bool {
        !matches!(self, BenchWorkload::Write | BenchWorkload::Read)
    }
}

/// What one run measured.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RunFigures {
    pub ops: u64,
    pub secs: f64,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
    /// failover: longest stretch with no grant around the leader's kill -9.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ms: Option<f64>,
    /// failover: a holder process's kill -9 to the next grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeover_ms: Option<f64>,
    /// CPU µs per operation of the target's members together (utime +
    /// stime of their processes over the measured seconds). None for
    /// failover (it kills a member) and when the pids are not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_cpu_us: Option<f64>,
    /// CPU µs per operation of this process (the clients), likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cpu_us: Option<f64>,
    /// 99.9th percentile latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p999_ms: Option<f64>,
    /// Open-loop runs: the offered rate ([`RunOpts::rate`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered_ops_per_sec: Option<f64>,
    /// Open-loop runs: operations due in the measured window that neither
    /// finished nor failed within [`DRAIN`] after it (module doc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late: Option<u64>,
    /// lock-contended: where a hand-off's time goes ([`handoff`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
}

/// A contended lock's hand-offs, from the clients' side: each measured
/// grant's (granted, release returned) instants, in grant order. A grant
/// to the next waiter is the holder's delete applied, so the period from
/// one grant to the next is the holder's release round trip (`release`)
/// plus what passes between that release returning to its holder and the
/// next grant reaching its waiter (`to_next`, negative when the grant came
/// first). p50 and p90 in µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Handoff {
    pub release_us: (f64, f64),
    pub to_next_us: (f64, f64),
    pub period_us: (f64, f64),
}

/// [`Handoff`] from (granted, release returned) pairs; None with fewer
/// than two grants.
pub fn handoff(mut grants: Vec<(Instant, Instant)>) -> Option<Handoff> {
    if grants.len() < 2 {
        return None;
    }
    grants.sort();
    let us = |a: Instant, b: Instant| {
        if b >= a {
            b.duration_since(a).as_secs_f64() * 1e6
        } else {
            -(a.duration_since(b).as_secs_f64() * 1e6)
        }
    };
    let q = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        (at(0.5), at(0.9))
    };
    let release = grants.iter().map(|(g, r)| us(*g, *r)).collect();
    let to_next = grants.windows(2).map(|w| us(w[0].1, w[1].0)).collect();
    let period = grants.windows(2).map(|w| us(w[0].0, w[1].0)).collect();
    Some(Handoff { release_us: q(release), to_next_us: q(to_next), period_us: q(period) })
}

/// CPU time (µs) of the members and of this process at one moment.
struct CpuMark {
    members: Vec<(i32, f64)>,
    client: f64,
}

impl CpuMark {
    fn take(pids: &[i32]) -> CpuMark {
        CpuMark {
            members: pids.iter().map(|p| (*p, crate::cost::cpu_us(&p.to_string()))).collect(),
            client: crate::cost::cpu_us("self"),
        }
    }

    /// (member, client) CPU µs per op from `self` to `later`; None when a
    /// member was not found or its time cannot be read any more.
    fn per_op(&self, later: &CpuMark, ops: u64) -> (Option<f64>, Option<f64>) {
        if ops == 0 {
            return (None, None);
        }
        let n = ops as f64;
        let client = Some((later.client - self.client).max(0.0) / n);
        let complete = !self.members.is_empty()
            && self.members.len() == later.members.len()
            && later.members.iter().all(|(_, us)| *us > 0.0);
        let member = complete.then(|| {
            let before: f64 = self.members.iter().map(|(_, us)| us).sum();
            let after: f64 = later.members.iter().map(|(_, us)| us).sum();
            (after - before).max(0.0) / n
        });
        (member, client)
    }
}

#[derive(Clone)]
pub struct RunOpts {
    pub workload: BenchWorkload,
    pub clients: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Folder for the failover holder's output.
    pub dir: PathBuf,
    /// Client i's first member is (i + offset) mod members. Runs use
    /// offsets 0, 1, 2, ...: with one client (lock-uncontended) each run
    /// sits on another member, so the median is not decided by whether the
    /// one member it used happened to be the leader.
    pub member_offset: usize,
    /// Open loop at this many operations per second (module doc); None for
    /// closed loop. Not for the contended lock or failover.
    pub rate: Option<f64>,
}

/// How long an open-loop run waits after its window for the operations
/// due in it.
pub const DRAIN: Duration = Duration::from_secs(10);

/// An open-loop run's schedule: ticket k is due at `start + k / rate`.
/// The window is the measured part: tickets due in it are measured.
pub struct Pacer {
    start: Instant,
    rate: f64,
    next: AtomicU64,
    window: (Instant, Instant),
}

impl Pacer {
    pub fn new(start: Instant, rate: f64, warmup: Duration, duration: Duration) -> Pacer {
        let from = start + warmup;
        Pacer { start, rate: rate.max(0.001), next: AtomicU64::new(0), window: (from, from + duration) }
    }

    /// The next operation's due time (each caller gets its own).
    pub fn ticket(&self) -> Instant {
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        self.start + Duration::from_secs_f64(k as f64 / self.rate)
    }

    pub fn in_window(&self, due: Instant) -> bool {
        due >= self.window.0 && due < self.window.1
    }

    pub fn after_window(&self, due: Instant) -> bool {
        due >= self.window.1
    }

    /// How many tickets fall due in the window.
    pub fn due_in_window(&self) -> u64 {
        let first = |t: Instant| ((t - self.start).as_secs_f64() * self.rate).ceil() as u64;
        first(self.window.1).saturating_sub(first(self.window.0))
    }
}

struct Shared {
    stop: AtomicBool,
    stopped: Notify,
    measuring: AtomicBool,
    /// Grant instants (failover only).
    grants: Mutex<Vec<Instant>>,
    record_grants: bool,
    /// lock-contended: measured grants' (granted, release returned).
    handoffs: Mutex<Vec<(Instant, Instant)>>,
    errors: AtomicU64,
    /// Open loop: the schedule; errors then count only for operations due
    /// in the window.
    pacer: Option<Pacer>,
}

impl Shared {
    async fn until_stopped(&self) {
        loop {
            let n = self.stopped.notified();
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            n.await;
        }
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("static histogram bounds")
}

/// One client's loop; returns its histogram (µs) of measured operations.
async fn client_loop<T: Target>(
    target: Arc<T>,
    member: usize,
    w: BenchWorkload,
    lock: String,
    key: String,
    sh: Arc<Shared>,
) -> Histogram<u64> {
    let mut hist = new_hist();
    let value = vec![b'v'; VALUE_BYTES];
    let mut client: Option<T::Client> = None;
    while !sh.stop.load(Ordering::SeqCst) {
        let c = match &client {
            Some(c) => c,
            None => {
                let made = tokio::select! {
                    c = target.connect(member, TTL) => c,
                    _ = sh.until_stopped() => break,
                };
                match made {
                    Ok(c) => {
                        if !w.is_lock() {
                            // The key exists before the first read.
                            let _ = c.put(&key, &value).await;
                        }
                        client = Some(c);
                        continue;
                    }
                    Err(_) => {
                        sh.errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
        // Open loop: the operation is due at its ticket, and its latency
        // runs from then (module doc).
        let due = match &sh.pacer {
            Some(p) => {
                let due = p.ticket();
                if p.after_window(due) {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(due.into()) => {}
                    _ = sh.until_stopped() => break,
                }
                Some(due)
            }
            None => None,
        };
        let measured = |sh: &Shared| match (&sh.pacer, due) {
            (Some(p), Some(due)) => p.in_window(due),
            _ => sh.measuring.load(Ordering::SeqCst),
        };
        let t = due.unwrap_or_else(Instant::now);
        let r: Result<Option<Duration>, OpError> = async {
            match w {
                BenchWorkload::Write => c.put(&key, &value).await.map(|_| None),
                BenchWorkload::Read => c.get(&key).await.map(|_| None),
                _ => {
                    let held = tokio::select! {
                        h = c.lock(&lock) => h?,
                        _ = sh.until_stopped() => return Ok(Some(Duration::ZERO)),
                    };
                    let waited = t.elapsed();
                    let granted = Instant::now();
                    if sh.record_grants && sh.measuring.load(Ordering::SeqCst) {
                        sh.grants.lock().unwrap_or_else(|p| p.into_inner()).push(granted);
                    }
                    c.unlock(held).await?;
                    if w == BenchWorkload::LockContended && sh.measuring.load(Ordering::SeqCst) {
                        sh.handoffs.lock().unwrap_or_else(|p| p.into_inner()).push((granted, Instant::now()));
                    }
                    let contended = matches!(w, BenchWorkload::LockContended | BenchWorkload::Failover);
                    Ok(contended.then_some(waited))
                }
            }
        }
        .await;
        match r {
            Ok(_) if sh.stop.load(Ordering::SeqCst) => break,
            Ok(lat) => {
                if measured(&sh) {
                    let us = lat.unwrap_or_else(|| t.elapsed()).as_micros().max(1) as u64;
                    let _ = hist.record(us);
                }
            }
            Err(e) => {
                if sh.pacer.is_none() || measured(&sh) {
                    sh.errors.fetch_add(1, Ordering::Relaxed);
                }
                if e.is_session_lost() {
                    if let Some(c) = client.take() {
                        c.close().await;
                    }
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
    if let Some(c) = client {
        let _ = tokio::time::timeout(Duration::from_secs(2), c.close()).await;
    }
    hist
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Runs one workload once on a running cluster.
pub async fn run_once<T: Target>(target: Arc<T>, o: &RunOpts) -> anyhow::Result<RunFigures> {
    if o.rate.is_some() && matches!(o.workload, BenchWorkload::LockContended | BenchWorkload::Failover) {
        anyhow::bail!("{} runs closed-loop only (its clients queue for one lock)", o.workload.name());
    }
    let run_id: u32 = rand::random();
    let lock_name = format!("bench-{run_id:08x}");
    let sh = Arc::new(Shared {
        stop: AtomicBool::new(false),
        stopped: Notify::new(),
        measuring: AtomicBool::new(false),
        grants: Mutex::new(Vec::new()),
        record_grants: o.workload == BenchWorkload::Failover,
        handoffs: Mutex::new(Vec::new()),
        errors: AtomicU64::new(0),
        pacer: o.rate.map(|r| Pacer::new(Instant::now(), r, o.warmup, o.duration)),
    });
    let members = target.members().max(1);
    let mut tasks = Vec::new();
    for i in 0..o.clients.max(1) {
        let lock = match o.workload {
            BenchWorkload::LockContended | BenchWorkload::Failover => lock_name.clone(),
            _ => format!("{lock_name}-{i}"),
        };
        let key = format!("bench-{run_id:08x}-k{i}");
        tasks.push(tokio::spawn(client_loop(
            target.clone(),
            (i + o.member_offset) % members,
            o.workload,
            lock,
            key,
            sh.clone(),
        )));
    }
    tokio::time::sleep(o.warmup).await;
    sh.errors.store(0, Ordering::SeqCst);
    let pids = if o.workload == BenchWorkload::Failover { Vec::new() } else { target.member_pids() };
    let cpu_before = CpuMark::take(&pids);
    sh.measuring.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let mut gap_ms = None;
    let mut takeover_ms = None;
    if o.workload == BenchWorkload::Failover {
        let (g, t) = failover(&*target, &sh, &lock_name, o).await?;
        gap_ms = Some(g);
        takeover_ms = t;
    } else {
        tokio::time::sleep(o.duration).await;
    }
    sh.measuring.store(false, Ordering::SeqCst);
    let mut secs = start.elapsed().as_secs_f64();
    let cpu_after = CpuMark::take(&pids);
    let mut hist = new_hist();
    let mut merge = |r: Result<Histogram<u64>, tokio::task::JoinError>| match r {
        Ok(h) => hist.add(&h).context("merging histograms"),
        Err(e) => anyhow::bail!("bench client panicked: {e}"),
    };
    if sh.pacer.is_some() {
        // Open loop: the clients stop at the first ticket due after the
        // window; the ones due in it get DRAIN to finish.
        secs = o.duration.as_secs_f64();
        let until = tokio::time::Instant::now() + DRAIN;
        let mut left = Vec::new();
        for mut t in tasks {
            match tokio::time::timeout_at(until, &mut t).await {
                Ok(r) => merge(r)?,
                Err(_) => left.push(t),
            }
        }
        tasks = left;
    }
    sh.stop.store(true, Ordering::SeqCst);
    sh.stopped.notify_waiters();
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(15), t).await {
            Ok(r) => merge(r)?,
            Err(_) => anyhow::bail!("a bench client did not stop within 15 s"),
        }
    }
    let handoffs = std::mem::take(&mut *sh.handoffs.lock().unwrap_or_else(|p| p.into_inner()));
    let handoff = handoff(handoffs);
    let ops = hist.len();
    let errors = sh.errors.load(Ordering::SeqCst);
    let late = sh.pacer.as_ref().map(|p| p.due_in_window().saturating_sub(ops + errors));
    let (member_cpu_us, client_cpu_us) = cpu_before.per_op(&cpu_after, ops);
    Ok(RunFigures {
        ops,
        secs,
        ops_per_sec: ops as f64 / secs.max(1e-9),
        p50_ms: if ops > 0 { ms(hist.value_at_quantile(0.5)) } else { 0.0 },
        p99_ms: if ops > 0 { ms(hist.value_at_quantile(0.99)) } else { 0.0 },
        errors,
        gap_ms,
        takeover_ms,
        member_cpu_us,
        client_cpu_us,
        p999_ms: (ops > 0).then(|| ms(hist.value_at_quantile(0.999))),
        offered_ops_per_sec: o.rate,
        late,
        handoff,
    })
}

fn grants_after(sh: &Shared, t: Instant) -> Option<Instant> {
    sh.grants.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().filter(|g| *g > t).min()
}

/// Waits (up to `limit`) for the first grant after `t`.
async fn next_grant(sh: &Shared, t: Instant, limit: Duration) -> Option<Instant> {
    let deadline = t + limit;
    while Instant::now() < deadline {
        if let Some(g) = grants_after(sh, t) {
            return Some(g);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// The failover run: contended load, kill -9 the leader, measure the
/// longest gap with no grant; then a holder process queues for the same
/// lock, is killed -9 once it holds it, and the time to the next grant is
/// the takeover. Leaves the cluster with a dead member (the caller starts a
/// fresh one per run).
async fn failover<T: Target>(target: &T, sh: &Shared, lock: &str, o: &RunOpts) -> anyhow::Result<(f64, Option<f64>)> {
    let limit = Duration::from_secs(60);
    // Steady state first.
    tokio::time::sleep(o.duration.min(Duration::from_secs(3))).await;
    let leader = target.leader().await.context("finding the leader")?;
    let killed_at = Instant::now();
    let killed_wall = std::time::SystemTime::now();
    target.kill(leader)?;
    eprintln!("    killed leader (member {}), waiting for grants to resume", leader + 1);
    let last_before = {
        let g = sh.grants.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().copied().filter(|x| *x <= killed_at).max().unwrap_or(killed_at)
    };
    if next_grant(sh, killed_at, limit).await.is_none() {
        anyhow::bail!("no grant within {limit:?} of the leader's kill -9");
    }
    // Clients that were on the dead member come back in their own time, and
    // a service may limp before it recovers: the gap is the longest stretch
    // with no grant from the last grant before the kill to 10 s after it.
    let window = Duration::from_secs(10);
    if let Some(rest) = (killed_at + window).checked_duration_since(Instant::now()) {
        tokio::time::sleep(rest).await;
    }
    let mut times: Vec<Instant> = {
        let g = sh.grants.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().copied().filter(|x| *x >= last_before && *x <= killed_at + window).collect()
    };
    times.push(killed_at + window);
    times.sort();
    let gap = times.windows(2).map(|w| w[1].duration_since(w[0])).max().unwrap_or_default();
    let dump: Vec<String> = {
        let g = sh.grants.lock().unwrap_or_else(|p| p.into_inner());
        g.iter()
            .map(|t| {
                format!(
                    "{:.1}",
                    t.checked_duration_since(killed_at)
                        .map(|d| d.as_secs_f64() * 1000.0)
                        .unwrap_or_else(|| -(killed_at.duration_since(*t).as_secs_f64() * 1000.0))
                )
            })
            .collect()
    };
    // Grant times in ms relative to the leader's kill, for a closer look,
    // and the kill's wall-clock time (Unix ms) to set the members' logs
    // against.
    let _ = std::fs::write(o.dir.join("grants-ms.txt"), dump.join("\n"));
    let unix_ms = killed_wall.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or_default();
    let _ = std::fs::write(o.dir.join("killed-at.txt"), format!("{unix_ms} member {}\n", leader + 1));
    // Holder kill.
    let takeover = holder_kill(target, sh, lock, o).await?;
    Ok((gap.as_secs_f64() * 1000.0, takeover))
}

/// Starts `baton-bench hold` on the same lock, waits for `held`, kills it
/// -9, and measures until the next grant. None if it never got the lock.
async fn holder_kill<T: Target>(target: &T, sh: &Shared, lock: &str, o: &RunOpts) -> anyhow::Result<Option<f64>> {
    let exe = std::env::current_exe()?;
    let log = std::fs::File::create(o.dir.join(format!("holder-{}.log", target.kind().name())))?;
    let mut child = tokio::process::Command::new(exe)
        .arg("hold")
        .arg(format!("--target={}", target.kind().name()))
        .arg(format!("--endpoints={}", target.endpoints().join(",")))
        .arg(format!("--name={lock}"))
        .arg(format!("--ttl-ms={}", TTL.as_millis()))
        .envs(target.child_env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting the holder process")?;
    let stdout = child.stdout.take().context("holder stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let held = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.starts_with("held") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if !held {
        let _ = child.kill().await;
        eprintln!("    the holder process never got the lock (see holder-{}.log)", target.kind().name());
        return Ok(None);
    }
    let killed_at = Instant::now();
    child.start_kill()?;
    let _ = child.wait().await;
    let next = next_grant(sh, killed_at, Duration::from_secs(60)).await;
    Ok(next.map(|g| g.duration_since(killed_at).as_secs_f64() * 1000.0))
}

/// Starts a target's cluster in `dir`.
pub enum AnyTarget {
    Baton(Arc<super::targets::baton::BatonTarget>),
    Etcd(Arc<super::targets::etcd::EtcdTarget>),
    Zookeeper(Arc<super::targets::zookeeper::ZkTarget>),
    BatonZk(Arc<super::targets::baton_zk::BatonZkTarget>),
}

impl AnyTarget {
    /// `baton_tls`: Baton's members and clients use TLS.
    pub async fn start(kind: Kind, dir: &Path, baton_tls: bool) -> anyhow::Result<AnyTarget> {
        std::fs::create_dir_all(dir)?;
        Ok(match kind {
            Kind::Baton => AnyTarget::Baton(Arc::new(super::targets::baton::BatonTarget::start(dir, baton_tls).await?)),
            Kind::Etcd => AnyTarget::Etcd(Arc::new(super::targets::etcd::EtcdTarget::start(dir).await?)),
            Kind::Zookeeper => AnyTarget::Zookeeper(Arc::new(super::targets::zookeeper::ZkTarget::start(dir).await?)),
            Kind::BatonZk => AnyTarget::BatonZk(Arc::new(super::targets::baton_zk::BatonZkTarget::start(dir).await?)),
        })
    }

    pub async fn run(&self, o: &RunOpts) -> anyhow::Result<RunFigures> {
        match self {
            AnyTarget::Baton(t) => run_once(t.clone(), o).await,
            AnyTarget::Etcd(t) => run_once(t.clone(), o).await,
            AnyTarget::Zookeeper(t) => run_once(t.clone(), o).await,
            AnyTarget::BatonZk(t) => run_once(t.clone(), o).await,
        }
    }

    pub fn stop(&self) {
        match self {
            AnyTarget::Baton(t) => t.stop(),
            AnyTarget::Etcd(t) => t.stop(),
            AnyTarget::Zookeeper(t) => t.stop(),
            AnyTarget::BatonZk(t) => t.stop(),
        }
    }
}

/// Median of several runs, with the spread.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub target: Kind,
    pub workload: BenchWorkload,
    pub clients: usize,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// How many runs the medians are taken over.
    pub runs: usize,
    /// Lowest and highest ops/s of the runs.
    pub ops_per_sec_min: f64,
    pub ops_per_sec_max: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeover_ms: Option<f64>,
    /// Medians of the runs' [`RunFigures::member_cpu_us`] and
    /// [`RunFigures::client_cpu_us`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_cpu_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cpu_us: Option<f64>,
    /// Median of the runs' [`RunFigures::p999_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p999_ms: Option<f64>,
    /// Open-loop rows: the offered load as a percentage of this target's
    /// own closed-loop median for the workload, and the rate it came to.
    /// None for a closed-loop row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_pct: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered_ops_per_sec: Option<f64>,
    /// Open-loop rows: the most late operations of any run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late: Option<u64>,
    #[serde(default)]
    pub per_run: Vec<RunFigures>,
    /// Runs that failed, with their error: left out of the figures, and
    /// reported beside them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
    /// When it was summed up, at the end of its runs (`YYYY-MM-DD HH:MM
    /// UTC`; absent in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn summarize(target: Kind, workload: BenchWorkload, clients: usize, runs: Vec<RunFigures>) -> Summary {
    let col = |f: fn(&RunFigures) -> f64| median(runs.iter().map(f).collect());
    let opt = |f: fn(&RunFigures) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    Summary {
        target,
        workload,
        clients,
        ops_per_sec: col(|r| r.ops_per_sec),
        p50_ms: col(|r| r.p50_ms),
        p99_ms: col(|r| r.p99_ms),
        runs: runs.len(),
        ops_per_sec_min: if runs.is_empty() {
            0.0
        } else {
            runs.iter().map(|r| r.ops_per_sec).fold(f64::INFINITY, f64::min)
        },
        ops_per_sec_max: runs.iter().map(|r| r.ops_per_sec).fold(0.0, f64::max),
        gap_ms: opt(|r| r.gap_ms),
        takeover_ms: opt(|r| r.takeover_ms),
        member_cpu_us: opt(|r| r.member_cpu_us),
        client_cpu_us: opt(|r| r.client_cpu_us),
        p999_ms: opt(|r| r.p999_ms),
        load_pct: None,
        offered_ops_per_sec: opt(|r| r.offered_ops_per_sec),
        late: runs.iter().filter_map(|r| r.late).max(),
        per_run: runs,
        failed: Vec::new(),
        date: Some(baton_jepsen::plot::utc_stamp(std::time::SystemTime::now())),
    }
}

pub fn describe(r: &RunFigures) -> String {
    let mut s = format!(
        "{:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms ({} ops in {:.1} s, {} errors)",
        r.ops_per_sec, r.p50_ms, r.p99_ms, r.ops, r.secs, r.errors
    );
    if let Some(g) = r.gap_ms {
        s.push_str(&format!(", gap {g:.0} ms"));
    }
    match r.takeover_ms {
        Some(t) => s.push_str(&format!(", takeover {t:.0} ms")),
        None if r.gap_ms.is_some() => s.push_str(", takeover n/a"),
        None => {}
    }
    if let Some(offered) = r.offered_ops_per_sec {
        s.push_str(&format!(
            ", offered {offered:.0} ops/s, p99.9 {:.2} ms, {} late",
            r.p999_ms.unwrap_or(0.0),
            r.late.unwrap_or(0)
        ));
    }
    if let (Some(m), Some(c)) = (r.member_cpu_us, r.client_cpu_us) {
        s.push_str(&format!(", CPU µs/op: members {m:.0}, clients {c:.0}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ops_per_sec: f64, p99_ms: f64, gap: Option<f64>) -> RunFigures {
        RunFigures {
            ops: 1,
            secs: 1.0,
            ops_per_sec,
            p50_ms: p99_ms / 2.0,
            p99_ms,
            errors: 0,
            gap_ms: gap,
            ..RunFigures::default()
        }
    }

    /// Grants reported out of order are put in grant order; the release
    /// round trip is each grant's own, the gap to the next grant runs from
    /// a release returning to the grant after it (negative when the grant
    /// reached its waiter first).
    #[test]
    fn handoffs_split_the_period_into_release_and_what_follows() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        // Grants at 0, 700, 1500, 2300 µs; each release returns 650, 750,
        // 700 and 700 µs after its grant; the next grant comes 50, 50, and
        // then 100 µs after the release.
        let pairs = vec![(at(1500), at(2200)), (at(0), at(650)), (at(2300), at(3000)), (at(700), at(1450))];
        let h = handoff(pairs).expect("four grants");
        assert_eq!(h.period_us, (800.0, 800.0), "periods 700, 800, 800");
        assert_eq!(h.release_us, (700.0, 750.0), "releases 650, 700, 700, 750");
        assert_eq!(h.to_next_us, (50.0, 100.0), "gaps 50, 50, 100");
        // A grant that reached its waiter before the release returned.
        let early = handoff(vec![(at(0), at(700)), (at(600), at(1300))]).expect("two grants");
        assert_eq!(early.to_next_us, (-100.0, -100.0));
        assert_eq!(handoff(vec![(at(0), at(1))]), None, "one grant has no hand-off");
    }

    #[test]
    fn cpu_per_op_over_the_members_and_this_process() {
        let mark = |members: &[(i32, f64)], client: f64| CpuMark { members: members.to_vec(), client };
        let before = mark(&[(10, 1_000.0), (11, 2_000.0), (12, 500.0)], 100.0);
        let after = mark(&[(10, 3_000.0), (11, 4_000.0), (12, 2_500.0)], 1_100.0);
        assert_eq!(before.per_op(&after, 100), (Some(60.0), Some(10.0)));
        // A member gone (its time unreadable) or none known: no member figure.
        let gone = mark(&[(10, 3_000.0), (11, 0.0), (12, 2_500.0)], 1_100.0);
        assert_eq!(before.per_op(&gone, 100), (None, Some(10.0)));
        assert_eq!(mark(&[], 0.0).per_op(&mark(&[], 50.0), 10), (None, Some(5.0)));
        assert_eq!(before.per_op(&after, 0), (None, None));
    }

    /// This process's own CPU time is read and grows with work.
    #[test]
    fn cpu_mark_reads_this_process() {
        let pid = std::process::id() as i32;
        let a = CpuMark::take(&[pid]);
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let b = CpuMark::take(&[pid]);
        let (m, c) = a.per_op(&b, 1);
        assert!(c.is_some_and(|c| c > 0.0), "client CPU {c:?}");
        assert!(m.is_some_and(|m| m > 0.0), "member CPU {m:?}");
    }

    #[test]
    fn medians_and_spread() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let s = summarize(
            Kind::Baton,
            BenchWorkload::Failover,
            16,
            vec![run(100.0, 9.0, Some(300.0)), run(300.0, 3.0, Some(100.0)), run(200.0, 5.0, None)],
        );
        assert_eq!(s.runs, 3);
        assert_eq!(s.ops_per_sec, 200.0);
        assert_eq!((s.ops_per_sec_min, s.ops_per_sec_max), (100.0, 300.0));
        assert_eq!(s.p99_ms, 5.0);
        // Only runs that measured a gap count for it.
        assert_eq!(s.gap_ms, Some(200.0));
        assert_eq!(s.takeover_ms, None);
    }

    /// Ticket k is due at start + k / rate whoever takes it, and the window
    /// holds rate x duration of them.
    #[test]
    fn the_pacer_schedules_by_rate_not_by_completion() {
        let start = Instant::now();
        let p = Pacer::new(start, 1000.0, Duration::from_secs(2), Duration::from_secs(3));
        let due: Vec<Instant> = (0..2001).map(|_| p.ticket()).collect();
        assert_eq!(due[0], start);
        assert_eq!(due[1] - start, Duration::from_millis(1));
        assert_eq!(due[1500] - start, Duration::from_millis(1500));
        assert!(!p.in_window(due[1999]), "warm-up tickets are not measured");
        assert!(p.in_window(due[2000]));
        assert!(p.in_window(start + Duration::from_millis(4999)));
        assert!(!p.in_window(start + Duration::from_secs(5)) && p.after_window(start + Duration::from_secs(5)));
        assert_eq!(p.due_in_window(), 3000);
        let odd = Pacer::new(start, 333.0, Duration::from_secs(1), Duration::from_secs(10));
        assert_eq!(odd.due_in_window(), 3330);
    }

    #[test]
    fn workload_names_round_trip() {
        for w in BenchWorkload::ALL {
            assert_eq!(BenchWorkload::parse(w.name()).ok(), Some(w));
        }
        assert!(BenchWorkload::parse("nope").is_err());
        assert_eq!(BenchWorkload::LockContended.default_clients(), 16);
        assert_eq!(BenchWorkload::LockUncontended.default_clients(), 1);
        assert_eq!(BenchWorkload::Write.default_clients(), 64);
    }
}
