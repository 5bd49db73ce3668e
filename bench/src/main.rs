//! `baton-bench`: the benchmark's command line. One function per
//! subcommand ([`bench`], [`compare`], [`scale`], [`lock_safety`],
//! [`zk_register`]; [`hold`] and [`scale_sessions`] are children the
//! failover workload and scale's sessions dimension start), each returning
//! the process's exit code (`baton_jepsen::cli`); Ctrl-C stops a run and
//! tears its clusters down. Output folders default to `bench/store/`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use baton_bench::bench::{BenchWorkload, Summary};
use baton_bench::compare::{self, CompareOpts};
use baton_bench::locks::{self, Fault, LockKind, LocksOpts, WorkerOpts};
use baton_bench::rival_lock::{self, RivalLockOpts};
use baton_bench::scale::{self, Dim, ScaleOpts};
use baton_bench::targets::{self, Kind};
use baton_bench::zk_port_register::{self, ZkPortRegisterOpts};
use baton_jepsen::cli::{self, interruptible, stamp, verdict};
use baton_jepsen::door::ZkReads;
use baton_jepsen::nemesis::NemesisKind;
use clap::{Args, Parser, Subcommand};

const PROG: &str = "baton-bench";

#[derive(Parser)]
#[command(
    name = "baton-bench",
    version,
    about = "Baton next to etcd and ZooKeeper: benchmark, comparison, scale, the rivals' lock test"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Benchmark one workload on one target (starts its cluster; median of --runs runs).
    Bench(BenchArgs),
    /// What one operation costs a Baton cluster: CPU µs of the members and
    /// the clients, context switches, fsyncs, peer messages by type
    /// (docs/perf/per-op.md).
    Cost(CostArgs),
    /// Every workload on every target, the runs interleaved: compare.md,
    /// compare.json, compare.png.
    Compare(CompareArgs),
    /// How far one 3-member cluster goes, one dimension at a time (nodes,
    /// sessions, watches, fan-out, lock queue, clients): scale.md,
    /// scale.json, scale-<dim>.png (docs/scaling.md).
    Scale(ScaleArgs),
    /// The lock-safety test of a lock recipe, with and without a fence:
    /// etcd's Lock RPC, or ZooKeeper's recipe through Baton's ZooKeeper
    /// port (baton-zk), under member faults.
    LockSafety(LockSafetyArgs),
    /// Linearizability of reads and writes through Baton's ZooKeeper port
    /// under member faults (the harness's register checker).
    ZkRegister(ZkRegisterArgs),
    /// The seeds' comparison: a stock count in PostgreSQL decremented
    /// under each lock kind (PostgreSQL's, MariaDB's GET_LOCK, Redis's,
    /// Redlock, etcd's, ZooKeeper's, Baton's with and without a fence),
    /// with paused holders, killed lock services and cut links: locks.json,
    /// locks.md, locks.png (docs/locks-compared.md).
    Locks(LocksArgs),
    /// (Used by locks.) One worker: decrement under one lock kind until
    /// --secs pass, a line per decrement.
    #[command(hide = true)]
    LocksWorker(LocksWorkerArgs),
    /// (Used by the failover workload.) Hold a lock until killed.
    #[command(hide = true)]
    Hold(HoldArgs),
    /// (Used by scale's sessions dimension.) Open sessions with an
    /// ephemeral node each, say `ready`, wait to be killed.
    #[command(hide = true)]
    ScaleSessions(ScaleSessionsArgs),
}

/// What a fault test runs: the nemesis, for how long, with how many
/// clients (lock-safety and zk-register).
#[derive(Args)]
struct FaultRunArgs {
    /// none, pause, kill, partition, leader or all (a member at a time;
    /// lock-safety takes all but partition).
    #[arg(long, value_enum, default_value = "none")]
    nemesis: NemesisKind,
    /// Seconds of workload (setup and checking come on top).
    #[arg(long, default_value_t = 30)]
    time_limit: u64,
    /// Clients (zk-register: sessions, at least 3).
    #[arg(long, default_value_t = 5)]
    concurrency: usize,
    #[arg(long)]
    seed: Option<u64>,
    /// Run folder (default bench/store/<timestamp>-<target>-<test>-<seed>/).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct LockSafetyArgs {
    /// etcd or baton-zk.
    #[arg(long, value_enum)]
    target: Kind,
    #[command(flatten)]
    run: FaultRunArgs,
}

#[derive(Args)]
struct LocksArgs {
    /// Lock kinds (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    kinds: Vec<LockKind>,
    /// Worker processes per run (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "16")]
    workers: Vec<usize>,
    /// Faults (comma-separated): none, pause, kill, cut.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "none")]
    faults: Vec<Fault>,
    /// Seconds of each run.
    #[arg(long, default_value_t = 20)]
    time_limit: u64,
    #[arg(long)]
    seed: Option<u64>,
    /// Run folder (default bench/store/<timestamp>-locks-<seed>/).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run nothing: draw the PNG of this locks JSON again, beside it.
    #[arg(long, value_name = "JSON")]
    replot: Option<PathBuf>,
}

#[derive(Args)]
struct LocksWorkerArgs {
    #[arg(long, value_enum)]
    kind: LockKind,
    #[arg(long)]
    id: usize,
    #[arg(long)]
    pg: String,
    #[arg(long)]
    redis: String,
    /// MariaDB's URL (mariadb-get-lock).
    #[arg(long, default_value = "")]
    mariadb: String,
    /// Route the lock-service connections through a proxy in the worker
    /// (the cut fault).
    #[arg(long)]
    cut: bool,
    /// Redlock's servers, comma-separated.
    #[arg(long, value_delimiter = ',')]
    redlock: Vec<String>,
    /// Baton's endpoints, comma-separated.
    #[arg(long, value_delimiter = ',')]
    baton: Vec<String>,
    /// The rival kinds' service endpoints, comma-separated.
    #[arg(long, value_delimiter = ',')]
    rival: Vec<String>,
    #[arg(long)]
    secs: f64,
}

#[derive(Args)]
struct ZkRegisterArgs {
    #[command(flatten)]
    run: FaultRunArgs,
    /// How linearizable reads go through the ZooKeeper port (sync =
    /// `sync` then `getData`; linearizable = `getData` on members with
    /// `--zk-linearizable-reads`; local = plain `getData`, a control that
    /// is not linearizable under partition).
    #[arg(long, value_enum, default_value = "sync")]
    zk_reads: ZkReads,
    /// Run batond-faulty with this deliberate bug (repeatable; see
    /// server/src/faults.rs), e.g. stale-reads, zk-loss-reply.
    #[arg(long = "server-fault")]
    server_fault: Vec<String>,
}

#[derive(Args)]
struct BenchArgs {
    #[arg(long, value_enum, default_value = "baton")]
    target: Kind,
    #[arg(long, value_enum)]
    workload: BenchWorkload,
    /// Default: 1 (lock-uncontended), 16 (lock-contended, failover), 64 (others).
    #[arg(long)]
    clients: Option<usize>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Unmeasured seconds at the start of each run.
    #[arg(long, default_value_t = 5)]
    warmup: u64,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Open loop: operations due at this many per second, latency from when
    /// each was due (write, read, lock-uncontended, lock-independent).
    #[arg(long)]
    rate: Option<f64>,
    /// Write the summary (a one-element JSON array, as in compare.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Folder for cluster data and logs (default bench/store/bench-<ts>).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct CostArgs {
    #[arg(long, value_enum)]
    workload: BenchWorkload,
    /// Default: the workload's (as `bench`).
    #[arg(long)]
    clients: Option<usize>,
    /// Measured seconds.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Unmeasured seconds before them.
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// Open loop at this many operations per second (as `bench --rate`).
    #[arg(long)]
    rate: Option<f64>,
    /// Folder for cluster data and logs (default bench/store/cost-<ts>).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct CompareArgs {
    /// Comma-separated: baton, etcd, zookeeper.
    #[arg(long, default_value = "baton,etcd,zookeeper")]
    targets: String,
    /// Comma-separated subset of lock-uncontended, lock-contended,
    /// lock-independent, write, read, failover (default all).
    #[arg(long)]
    workloads: Option<String>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Unmeasured load once per cluster (ZooKeeper needs ~30 s).
    #[arg(long, default_value_t = 30)]
    warmup: u64,
    /// Unmeasured seconds at the start of every run.
    #[arg(long, default_value_t = 2)]
    run_warmup: u64,
    /// Runs of each workload on each target, interleaved (baton, etcd,
    /// zookeeper, baton, ...).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Output folder (default bench/store/compare-<ts>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Baton with TLS on both ports (a throwaway CA), every client too.
    #[arg(long)]
    baton_tls: bool,
    /// Open-loop loads for write and lock-independent, comma-separated
    /// percentages of each target's own closed-loop median; "none" for none.
    #[arg(long, default_value = "25,50,75")]
    open_loop: String,
    /// Runs of each open-loop load on each target, interleaved.
    #[arg(long, default_value_t = 3)]
    open_loop_runs: usize,
    /// Run nothing: draw DIR/compare.png again from DIR/compare.json.
    #[arg(long, value_name = "DIR")]
    replot: Option<PathBuf>,
}

#[derive(Args)]
struct ScaleArgs {
    /// Comma-separated: baton, zookeeper, etcd (etcd runs nodes, locks and
    /// clients only; the other dimensions are skipped for it).
    #[arg(long, default_value = "baton,zookeeper")]
    targets: String,
    /// Comma-separated subset of nodes, sessions, watches, fanout, locks,
    /// clients (default all).
    #[arg(long)]
    dims: Option<String>,
    /// Tree sizes (nodes of 100 bytes), filled cumulatively.
    #[arg(long, default_value = "10000,100000,1000000")]
    nodes: String,
    /// Live sessions, each with an ephemeral node (50,000 takes each
    /// member past the 20,000 open files a process may have here).
    #[arg(long, default_value = "1000,10000,25000")]
    sessions: String,
    /// One-shot watches registered (over 100 sessions).
    #[arg(long, default_value = "10000,100000")]
    watches: String,
    /// Sessions watching one node that is written once.
    #[arg(long, default_value = "1000,10000")]
    watchers: String,
    /// Clients queued on one lock.
    #[arg(long, default_value = "1,10,100,1000")]
    waiters: String,
    /// Concurrent clients for write and lock-independent.
    #[arg(long, default_value = "1,8,64,512")]
    clients: String,
    /// Session timeout of every session (ms).
    #[arg(long, default_value_t = 10_000)]
    session_timeout: u64,
    /// Seconds of keepalives over which the members' CPU is measured.
    #[arg(long, default_value_t = 10)]
    interval: u64,
    /// Dead sessions per size whose ephemerals' removal is timed.
    #[arg(long, default_value_t = 50)]
    expiry_sample: usize,
    /// Measured seconds per lock-queue size.
    #[arg(long, default_value_t = 5)]
    lock_window: u64,
    /// Measured seconds per clients run.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Runs per clients size (the spread).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Longest one fill or open step may take (s).
    #[arg(long, default_value_t = 300)]
    step_bound: u64,
    /// One cluster per target for all dimensions (quicker; the smoke), not
    /// a fresh one per dimension.
    #[arg(long)]
    shared_cluster: bool,
    /// Keep the members' data dirs (gigabytes at 1M nodes) to restart one
    /// by hand and profile its load.
    #[arg(long)]
    keep_data: bool,
    /// A rival's failure to reach a size (etcd's members overloaded by
    /// 25k sessions on 2 cores) is reported as its row, and the command
    /// still succeeds; Baton's failures fail it either way.
    #[arg(long)]
    rivals_may_fail: bool,
    /// Output folder (default bench/store/scale-<ts>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run nothing: draw DIR's PNGs and scale.md again from DIR/scale.json.
    #[arg(long, value_name = "DIR")]
    replot: Option<PathBuf>,
}

#[derive(Args)]
struct ScaleSessionsArgs {
    #[arg(long, value_enum)]
    target: Kind,
    #[arg(long)]
    endpoints: String,
    #[arg(long)]
    dir: String,
    #[arg(long)]
    count: usize,
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
}

#[derive(Args)]
struct HoldArgs {
    #[arg(long, value_enum)]
    target: Kind,
    #[arg(long)]
    endpoints: String,
    #[arg(long)]
    name: String,
    #[arg(long, default_value_t = 5000)]
    ttl_ms: u64,
}

fn main() {
    let cli = Cli::parse();
    cli::run(PROG, async {
        match cli.cmd {
            Cmd::Bench(a) => bench(a).await,
            Cmd::Cost(a) => cost(a).await,
            Cmd::Compare(a) => compare(a).await,
            Cmd::Scale(a) => scale(a).await,
            Cmd::LockSafety(a) => lock_safety(a).await,
            Cmd::ZkRegister(a) => zk_register(a).await,
            Cmd::Locks(a) => locks(a).await,
            Cmd::LocksWorker(a) => locks_worker(a).await,
            Cmd::Hold(a) => hold(a).await,
            Cmd::ScaleSessions(a) => scale_sessions(a).await,
        }
    })
}

/// `lock-safety --target etcd|baton-zk`: the target's own lock (etcd's
/// Lock RPC; ZooKeeper's recipe through Baton's ZooKeeper port) with and
/// without a fence. Exit code: `cli::verdict`.
async fn lock_safety(a: LockSafetyArgs) -> i32 {
    if !matches!(a.target, Kind::Etcd | Kind::BatonZk) {
        eprintln!("{PROG}: lock-safety runs against etcd or baton-zk");
        return 2;
    }
    let seed = a.run.seed.unwrap_or_else(rand::random);
    let out =
        a.run.out.unwrap_or_else(|| PathBuf::from(format!("bench/store/{}-{}-lock-{seed}", stamp(), a.target.name())));
    let o = RivalLockOpts {
        target: a.target,
        nemesis: a.run.nemesis,
        time_limit: Duration::from_secs(a.run.time_limit),
        concurrency: a.run.concurrency,
        seed,
        out: out.clone(),
    };
    let r = interruptible(rival_lock::run(o)).await;
    verdict(PROG, r.map(|(v, _)| v), &out)
}

/// `locks`: the seeds' comparison ([`locks`](baton_bench::locks)). Exit
/// code: `cli::verdict`.
async fn locks(a: LocksArgs) -> i32 {
    if let Some(json) = &a.replot {
        return match locks::replot(json) {
            Ok(png) => {
                println!("{}", png.display());
                0
            }
            Err(e) => {
                eprintln!("{PROG}: {e:#}");
                1
            }
        };
    }
    let seed = a.seed.unwrap_or_else(rand::random);
    let out = a.out.unwrap_or_else(|| locks::default_out(seed));
    let o = LocksOpts {
        kinds: if a.kinds.is_empty() { LockKind::ALL.to_vec() } else { a.kinds },
        workers: a.workers,
        faults: a.faults,
        time_limit: Duration::from_secs(a.time_limit),
        seed,
        out: out.clone(),
    };
    if let Err(e) = locks::check_opts(&o) {
        eprintln!("{PROG}: {e}");
        return 2;
    }
    let r = interruptible(locks::run(o)).await;
    verdict(PROG, r.map(|(v, _)| v), &out)
}

/// `locks-worker`: one of `locks`' workers; exit 1 on a set-up error.
async fn locks_worker(a: LocksWorkerArgs) -> i32 {
    let o = WorkerOpts {
        kind: a.kind,
        id: a.id,
        pg: a.pg,
        redis: a.redis,
        mariadb: a.mariadb,
        cut: a.cut,
        redlock: a.redlock.into_iter().filter(|u| !u.is_empty()).collect(),
        baton: a.baton,
        rival: a.rival.into_iter().filter(|u| !u.is_empty()).collect(),
        secs: a.secs,
    };
    match locks::worker(o).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{PROG} locks-worker: {e:#}");
            1
        }
    }
}

/// `zk-register`: linearizability of reads and writes through Baton's
/// ZooKeeper port ([`zk_port_register`]). Exit code: `cli::verdict`.
async fn zk_register(a: ZkRegisterArgs) -> i32 {
    let seed = a.run.seed.unwrap_or_else(rand::random);
    let out = a.run.out.unwrap_or_else(|| {
        PathBuf::from(format!("bench/store/{}-baton-zk-register-{}-{seed}", stamp(), a.zk_reads.name()))
    });
    let o = ZkPortRegisterOpts {
        target: Kind::BatonZk,
        nemesis: a.run.nemesis,
        time_limit: Duration::from_secs(a.run.time_limit),
        concurrency: a.run.concurrency,
        seed,
        out: out.clone(),
        reads: a.zk_reads,
        server_faults: a.server_fault,
    };
    let r = interruptible(zk_port_register::run(o)).await;
    verdict(PROG, r.map(|(v, _)| v), &out)
}

/// `bench`: one workload on one target; prints the medians (and writes
/// them to `--json`). Exit code 0, or 2 if it failed.
async fn bench(a: BenchArgs) -> i32 {
    let (target, workload) = (a.target, a.workload);
    let o = CompareOpts {
        targets: vec![target],
        workloads: vec![workload],
        duration: Duration::from_secs(a.duration),
        warmup: Duration::ZERO,
        run_warmup: Duration::from_secs(a.warmup),
        runs: a.runs,
        out: a.out.unwrap_or_else(|| PathBuf::from(format!("bench/store/bench-{}", stamp()))),
        baton_tls: false,
        open_loads: Vec::new(),
        open_runs: 0,
    };
    let clients = a.clients.unwrap_or(workload.default_clients());
    eprintln!(
        "bench: {} {} with {clients} clients, {} run(s) of {} s after {} s warm-up",
        target.name(),
        workload.name(),
        a.runs,
        a.duration,
        a.warmup
    );
    match interruptible(compare::bench(target, workload, clients, &o, a.rate)).await {
        Ok(s) => {
            println!("{}", bench_line(&s));
            if let Some(j) = a.json {
                match serde_json::to_string_pretty(&[&s]).map(|t| std::fs::write(&j, t)) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => eprintln!("{PROG}: writing {}: {e}", j.display()),
                    Err(e) => eprintln!("{PROG}: {e}"),
                }
            }
            0
        }
        Err(e) => {
            eprintln!("{PROG}: bench failed: {e:#}");
            2
        }
    }
}

/// `cost`: one measured run of one workload on a fresh Baton cluster;
/// prints its cost per operation (baton_bench::cost). Exit code 0, or 2.
async fn cost(a: CostArgs) -> i32 {
    let dir = a.out.unwrap_or_else(|| PathBuf::from(format!("bench/store/cost-{}", stamp())));
    let clients = a.clients.unwrap_or(a.workload.default_clients());
    let (warmup, duration) = (Duration::from_secs(a.warmup), Duration::from_secs(a.duration));
    match interruptible(baton_bench::cost::measure(&dir, a.workload, clients, warmup, duration, a.rate)).await {
        Ok(c) => {
            println!("{}", baton_bench::cost::table(a.workload, clients, &c));
            0
        }
        Err(e) => {
            eprintln!("{PROG}: cost failed: {e:#}");
            2
        }
    }
}

/// `bench`'s result line.
fn bench_line(s: &Summary) -> String {
    let gap = match (s.gap_ms, s.takeover_ms) {
        (Some(g), t) => {
            format!(", gap {g:.0} ms, takeover {}", t.map(|t| format!("{t:.0} ms")).unwrap_or_else(|| "n/a".into()))
        }
        _ => String::new(),
    };
    let open = match s.offered_ops_per_sec {
        Some(r) => format!(
            ", p99.9 {:.2} ms, offered {r:.0} ops/s, most late in a run {}",
            s.p999_ms.unwrap_or(0.0),
            s.late.unwrap_or(0)
        ),
        None => String::new(),
    };
    format!(
        "{} {}: {:.0} ops/s (median of {}, spread {:.0}-{:.0}), p50 {:.2} ms, p99 {:.2} ms{gap}{open}",
        s.target.name(),
        s.workload.name(),
        s.ops_per_sec,
        s.runs,
        s.ops_per_sec_min,
        s.ops_per_sec_max,
        s.p50_ms,
        s.p99_ms,
    )
}

/// `compare`: prints compare.md. Exit code 0, or 2 if it failed.
async fn compare(a: CompareArgs) -> i32 {
    if let Some(dir) = &a.replot {
        return match compare::replot(dir) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{PROG}: {e:#}");
                2
            }
        };
    }
    let parsed = list(&a.targets, Kind::parse).and_then(|t| {
        let w = match &a.workloads {
            Some(w) => list(w, BenchWorkload::parse)?,
            None => BenchWorkload::ALL.to_vec(),
        };
        let loads = match a.open_loop.trim() {
            "none" | "" => Vec::new(),
            l => list(l, |p| p.trim().parse::<u32>().with_context(|| format!("open-loop load {p:?}: a percentage")))?,
        };
        Ok((t, w, loads))
    });
    let (targets, workloads, open_loads) = match parsed {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{PROG}: {e:#}");
            return 2;
        }
    };
    let out = a.out.unwrap_or_else(|| PathBuf::from(format!("bench/store/compare-{}", stamp())));
    let o = CompareOpts {
        targets,
        workloads,
        duration: Duration::from_secs(a.duration),
        warmup: Duration::from_secs(a.warmup),
        run_warmup: Duration::from_secs(a.run_warmup),
        runs: a.runs,
        out: out.clone(),
        baton_tls: a.baton_tls,
        open_loads,
        open_runs: a.open_loop_runs,
    };
    match interruptible(compare::compare(&o)).await {
        Ok(_) => {
            println!("{}", std::fs::read_to_string(out.join("compare.md")).unwrap_or_default());
            println!("results in {}", out.display());
            0
        }
        Err(e) => {
            eprintln!("{PROG}: compare failed: {e:#}");
            2
        }
    }
}

/// `scale`: prints scale.md. Exit code 0, or 2 if it failed (a herd in a
/// lock queue, a dimension that failed, a harness error).
async fn scale(a: ScaleArgs) -> i32 {
    if let Some(dir) = &a.replot {
        return match scale::replot(dir) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{PROG}: {e:#}");
                2
            }
        };
    }
    let sizes = |s: &str| list(s, |p| p.trim().parse::<u64>().map_err(|e| anyhow::anyhow!("bad size {p:?}: {e}")));
    let parsed = (|| {
        let dims = match &a.dims {
            Some(d) => list(d, Dim::parse)?,
            None => Dim::ALL.to_vec(),
        };
        let out = a.out.clone().unwrap_or_else(|| PathBuf::from(format!("bench/store/scale-{}", stamp())));
        anyhow::Ok(ScaleOpts {
            targets: list(&a.targets, Kind::parse)?,
            dims,
            nodes: sizes(&a.nodes)?,
            sessions: sizes(&a.sessions)?,
            watches: sizes(&a.watches)?,
            watchers: sizes(&a.watchers)?,
            waiters: sizes(&a.waiters)?,
            clients: sizes(&a.clients)?,
            ttl: Duration::from_millis(a.session_timeout),
            interval: Duration::from_secs(a.interval),
            expiry_sample: a.expiry_sample,
            lock_window: Duration::from_secs(a.lock_window),
            duration: Duration::from_secs(a.duration),
            runs: a.runs,
            step_bound: Duration::from_secs(a.step_bound),
            shared_cluster: a.shared_cluster,
            keep_data: a.keep_data,
            rivals_may_fail: a.rivals_may_fail,
            out,
        })
    })();
    let o = match parsed {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{PROG}: {e:#}");
            return 2;
        }
    };
    let r = interruptible(scale::run(&o)).await;
    println!("{}", std::fs::read_to_string(o.out.join("scale.md")).unwrap_or_default());
    println!("results in {}", o.out.display());
    match r {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("{PROG}: scale failed: {e:#}");
            2
        }
    }
}

/// `scale-sessions` (a child of scale's sessions dimension).
async fn scale_sessions(a: ScaleSessionsArgs) -> i32 {
    let eps = baton_client::parse_endpoints(&a.endpoints);
    match scale::dying_sessions(a.target, eps, &a.dir, a.count, Duration::from_millis(a.ttl_ms)).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{PROG} scale-sessions: {e:#}");
            2
        }
    }
}

/// `hold` (a child of the failover workload): holds a lock until killed.
async fn hold(a: HoldArgs) -> i32 {
    let eps = baton_client::parse_endpoints(&a.endpoints);
    match targets::hold(a.target, eps, &a.name, Duration::from_millis(a.ttl_ms)).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{PROG} hold: {e:#}");
            2
        }
    }
}

fn list<T>(s: &str, parse: impl Fn(&str) -> anyhow::Result<T>) -> anyhow::Result<Vec<T>> {
    s.split(',').filter(|p| !p.trim().is_empty()).map(parse).collect()
}
