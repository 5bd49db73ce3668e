//! `baton-bench locks`: the seeds' comparison, measured (seed 003's job,
//! seed 002's debate). One job for every lock kind: N worker processes
//! each loop "take the lock, read a stock count from PostgreSQL, [pause
//! point], write it back minus one, release", against real servers this
//! run starts itself (a private PostgreSQL and Redis from the kit's
//! stores, a 3-member Baton cluster).
//!
//! # The lock kinds (each by the book)
//! - `pg-for-update`: `SELECT n ... FOR UPDATE` in a transaction, the
//!   update, commit (the row lock is the lock).
//! - `pg-optimistic`: read `n` and a version column, `UPDATE ... WHERE
//!   version = v`; zero rows: read again (up to 1,000 tries).
//! - `pg-advisory`: `pg_advisory_lock(k)` on the worker's session,
//!   autocommit read and write, `pg_advisory_unlock(k)`.
//! - `mariadb-get-lock`: MySQL's named lock, `GET_LOCK('stock', 30)` on
//!   the worker's own MariaDB connection (a private MariaDB 10.11 from the
//!   kit's stores), autocommit read and write in PostgreSQL,
//!   `RELEASE_LOCK('stock')`. The lock lives as long as the connection.
//! - `redis-spin`: `SET lock <random> NX PX <lease>` retried every 5-25 ms,
//!   released by a script that deletes the key only if it still holds the
//!   worker's value (the classic single-Redis lock).
//! - `redis-watchdog`: Redisson's lock: `SET NX PX`, a waiter sleeps on a
//!   pub/sub channel (or the key's remaining TTL) instead of spinning, and a
//!   watchdog renews the lease every third of it while the holder runs;
//!   the release deletes its own value and publishes. (Redisson's default
//!   lease is 30 s; here 2 s like the others, so a 4 s pause outlives it.)
//! - `redlock`: Redlock over 5 independent Redis servers: `SET NX PX` on
//!   each in turn (50 ms timeout each), held if a majority said yes within
//!   the lease less the time taken and a drift allowance (1% + 2 ms);
//!   otherwise (and on release) delete its value everywhere.
//! - `etcd`: etcd 3.4's Lock RPC under a lease (TTL = the lease, kept
//!   alive by the client), unlocked after the write.
//! - `zookeeper`: ZooKeeper 3.8's lock recipe (an ephemeral sequential node,
//!   a watch on the predecessor), session timeout = the lease (its tickTime
//!   is 1,000 ms here so that a 2 s session is allowed).
//! - `baton-zk-fenced`: the same recipe through Baton's ZooKeeper port,
//!   fenced like `baton-fenced` with the lock node's czxid (Baton's token).
//! - `baton`: Baton's lock recipe (`Client::lock`, session timeout =
//!   the lease), no fence.
//! - `baton-fenced`: the same, and the read and the write are one
//!   transaction fenced with the grant's token (`baton_fence::postgres`):
//!   the fence first, then the read, then the write (a read before the
//!   fence could be overtaken; docs/recipes.md). Its pause point is
//!   therefore before the transaction (holding the lock, before the read).
//!
//! # Faults
//! - `none`.
//! - `pause`: every 3 s the run asks one worker (SIGUSR1) to pause; at its
//!   next pause point (holding the lock, after its read, before its write)
//!   the worker stops itself (SIGSTOP: every thread, its keepalives and
//!   lease renewals too, as a GC pause or a stopped VM would), and the run
//!   sends SIGCONT after twice the lease. A worker that does not reach a
//!   pause point within 10 s is left alone.
//! - `kill`: the lock service's primary is killed -9 every few seconds:
//!   Redis (no replication, no persistence: the lock key is lost) and
//!   restarted on its port 200 ms later, as a supervisor would; one of
//!   Redlock's 5 servers, likewise;
//!   the leader of Baton's cluster (restarted 2 s later), of etcd's and of
//!   ZooKeeper's (once per run: their scripts start whole clusters only, so
//!   the cluster is started afresh after the run). The PostgreSQL kinds are
//!   not run under it: their lock service is the database the job writes to.
//!   MariaDB is killed and restarted on its port 200 ms later, likewise.
//! - `cut`: every 7 s the run asks one worker (SIGUSR2) to be cut off; at
//!   its next pause point the worker stalls every link to its lock service
//!   (the worker's lock-service connections all go through a proxy inside
//!   it, [`baton_kit::proxy`]: bytes are held both ways, connections stay
//!   open, as a firewall dropping packets would), works on for twice the
//!   lease (the process runs: its keepalives and renewals are sent, and
//!   go nowhere), heals the links, and writes. Its link to PostgreSQL stays.
//!   The PostgreSQL kinds are not run under it (their lock service is the
//!   database).
//!
//! # The checker
//! Every acknowledged write set the stock to the value it read minus one.
//! Decrements lost: the acknowledged writes less the decrements the final
//! stock shows (`start - final`), or the acknowledged writes that wrote a
//! value another acknowledged write also wrote, whichever is larger.
//! Writes with no answer (a commit whose reply was lost) may or may not
//! have applied and are counted apart. The verdict: valid if no fenced kind
//! lost a decrement, and (with no fault) no kind did, and every kind
//! acknowledged at least one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use baton_checker::Validity;
use baton_client::{Client, ClientConfig, SessionState};
use baton_fence::postgres::tokio_postgres::{self, NoTls};
use baton_fence::postgres::PgFence;
use baton_fence::redis::redis;
use baton_kit::proxy::{LinkId, Proxies};
use baton_kit::stores::{Mariadb, Postgres, Redis};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::targets::baton::BatonTarget;
use crate::targets::etcd::{EtcdClient, EtcdTarget};
use crate::targets::zookeeper::{ZkClient, ZkTarget};
use crate::targets::{OpError, Target, TargetClient};

/// The stock each run starts from.
const START: i64 = 1_000_000;
/// Lease of the leased locks (Redis PX, Baton's session timeout).
pub const LEASE: Duration = Duration::from_secs(2);
/// Between two pause requests.
const PAUSE_EVERY: Duration = Duration::from_secs(3);
/// How long a worker may take to reach its pause point.
const PAUSE_REACH: Duration = Duration::from_secs(10);
/// How long one lock acquisition may wait before the op fails.
const ACQUIRE_LIMIT: Duration = Duration::from_secs(30);
/// Redlock's independent servers.
const REDLOCK_SERVERS: usize = 5;
/// Redlock's timeout for one server's `SET`.
const REDLOCK_STEP: Duration = Duration::from_millis(50);
/// The lock key of the Redis kinds, and the channel a release publishes on.
const REDIS_KEY: &str = "lock:stock";
const REDIS_CHANNEL: &str = "lock:stock:released";
/// Deletes the key only if it holds the caller's value; publishes if it did.
const REDIS_RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]); \
    redis.call('PUBLISH', KEYS[2], 'free'); return 1 else return 0 end";
/// Extends the key's lease only if it holds the caller's value.
const REDIS_RENEW: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockKind {
    PgForUpdate,
    PgOptimistic,
    PgAdvisory,
    MariadbGetLock,
    RedisSpin,
    RedisWatchdog,
    Redlock,
    Etcd,
    Zookeeper,
    BatonZkFenced,
    Baton,
    BatonFenced,
}

impl LockKind {
    pub const ALL: [LockKind; 12] = [
        LockKind::PgForUpdate,
        LockKind::PgOptimistic,
        LockKind::PgAdvisory,
        LockKind::MariadbGetLock,
        LockKind::RedisSpin,
        LockKind::RedisWatchdog,
        LockKind::Redlock,
        LockKind::Etcd,
        LockKind::Zookeeper,
        LockKind::BatonZkFenced,
        LockKind::Baton,
        LockKind::BatonFenced,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LockKind::PgForUpdate => "pg-for-update",
            LockKind::PgOptimistic => "pg-optimistic",
            LockKind::PgAdvisory => "pg-advisory",
            LockKind::MariadbGetLock => "mariadb-get-lock",
            LockKind::RedisSpin => "redis-spin",
            LockKind::RedisWatchdog => "redis-watchdog",
            LockKind::Redlock => "redlock",
            LockKind::Etcd => "etcd",
            LockKind::Zookeeper => "zookeeper",
            LockKind::BatonZkFenced => "baton-zk-fenced",
            LockKind::Baton => "baton",
            LockKind::BatonFenced => "baton-fenced",
        }
    }

    /// What the seeds (003, 002) say of it, for the report.
    pub fn predicted(self, fault: Fault) -> &'static str {
        match (self, fault) {
            (_, Fault::None) => "no loss",
            (LockKind::BatonFenced | LockKind::BatonZkFenced, _) => "no loss: the database refuses the stale token",
            (LockKind::MariadbGetLock, Fault::Kill) => {
                "may lose updates: a restarted server has forgotten the named lock of a holder still working"
            }
            (LockKind::MariadbGetLock, Fault::Pause) => {
                "no loss: the server keeps the paused connection's lock (others wait)"
            }
            (LockKind::MariadbGetLock, Fault::Cut) => {
                "no loss while the server keeps the silent connection's lock (others wait); it goes once TCP gives up"
            }
            (LockKind::RedisSpin | LockKind::RedisWatchdog, Fault::Cut) => {
                "loses updates: the lease expires while the cut-off holder works on (renewals cannot arrive)"
            }
            (LockKind::Redlock, Fault::Cut) => {
                "loses updates: the leases expire on every server the cut-off holder cannot reach"
            }
            (LockKind::Etcd, Fault::Cut) => "loses updates: keepalives cannot arrive, the lease expires",
            (_, Fault::Cut) => "loses updates: the session expires under the cut-off holder",
            (LockKind::RedisSpin | LockKind::RedisWatchdog, Fault::Kill) => {
                "may lose updates: a restarted Redis without persistence forgets the lock of a holder still working"
            }
            (LockKind::Redlock, Fault::Kill) => {
                "may lose updates: a restarted server without persistence forgets its vote (antirez: delay restarts)"
            }
            (_, Fault::Kill) => "no loss: the quorum keeps the lock through its leader's death",
            (LockKind::PgForUpdate | LockKind::PgAdvisory, Fault::Pause) => {
                "no loss: the database holds the lock for the paused session (others wait)"
            }
            (LockKind::PgOptimistic, Fault::Pause) => "no loss: the version check refuses the late write",
            (LockKind::RedisSpin, Fault::Pause) => "loses updates: the lease expires under the paused holder",
            (LockKind::RedisWatchdog, Fault::Pause) => {
                "loses updates: the watchdog is paused with its holder, the lease expires"
            }
            (LockKind::Redlock, Fault::Pause) => {
                "loses updates (Kleppmann): a majority of leases expires under the paused holder"
            }
            (LockKind::Etcd, Fault::Pause) => "loses updates: the lease expires under the paused holder",
            (_, Fault::Pause) => "loses updates: the session expires under the paused holder",
        }
    }

    /// Whether `fault` applies to this kind (a kill of, or a cut link to,
    /// its lock service would be one of the PostgreSQL kinds' database).
    pub fn runs_under(self, fault: Fault) -> bool {
        matches!(fault, Fault::None | Fault::Pause)
            || !matches!(self, LockKind::PgForUpdate | LockKind::PgOptimistic | LockKind::PgAdvisory)
    }

    /// A fenced kind must never lose a decrement.
    pub fn fenced(self) -> bool {
        matches!(self, LockKind::BatonFenced | LockKind::BatonZkFenced)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    None,
    Pause,
    Kill,
    Cut,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Pause => "pause",
            Fault::Kill => "kill",
            Fault::Cut => "cut",
        }
    }
}

pub struct LocksOpts {
    pub kinds: Vec<LockKind>,
    pub workers: Vec<usize>,
    pub faults: Vec<Fault>,
    pub time_limit: Duration,
    pub seed: u64,
    pub out: PathBuf,
}

/// One kind's run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct KindResult {
    pub kind: LockKind,
    pub workers: usize,
    pub fault: Fault,
    pub secs: f64,
    pub acked: u64,
    /// Refused by a fence or a version check: definitely not applied.
    pub refused: u64,
    /// No answer to the write: may have applied.
    pub unknown: u64,
    /// The lock was not acquired, or a read failed: nothing written.
    pub failed: u64,
    /// The decrements the final stock shows.
    pub consumed: u64,
    pub lost: u64,
    /// Pauses or kills done.
    pub injected: u64,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Runs every kind × workers × fault; writes locks.json and locks.md.
pub async fn run(o: LocksOpts) -> anyhow::Result<(Validity, Vec<KindResult>)> {
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    let pg = tokio::task::spawn_blocking(Postgres::start).await??;
    let redis_srv = tokio::task::spawn_blocking(|| Redis::start(false)).await??;
    let mut redlock_srvs = Vec::new();
    if o.kinds.contains(&LockKind::Redlock) {
        for _ in 0..REDLOCK_SERVERS {
            redlock_srvs.push(tokio::task::spawn_blocking(|| Redis::start(false)).await??);
        }
    }
    let mariadb = match o.kinds.contains(&LockKind::MariadbGetLock) {
        true => Some(tokio::task::spawn_blocking(Mariadb::start).await??),
        false => None,
    };
    let baton = BatonTarget::start_with(&o.out.join("baton"), false, true).await?;
    let endpoints = baton.endpoints();
    // ZooKeeper allows sessions of 2 to 20 ticks: 1,000 ms ticks let its
    // clients have the 2 s the others have (zookeeper.sh reads it).
    std::env::set_var("ZK_TICK_MS", "1000");
    let mut starts = 0;
    let mut etcd = match o.kinds.contains(&LockKind::Etcd) {
        true => Some(EtcdTarget::start(&o.out.join("etcd-0")).await?),
        false => None,
    };
    let mut zk = match o.kinds.contains(&LockKind::Zookeeper) {
        true => Some(ZkTarget::start(&o.out.join("zookeeper-0")).await?),
        false => None,
    };
    let (mut db, conn) = tokio_postgres::connect(&pg.conn_str(), NoTls).await?;
    tokio::spawn(conn);
    PgFence::new().install(&mut db).await?;
    let mut env = WorkerEnv {
        pg: pg.conn_str(),
        redis: redis_srv.url(),
        mariadb: mariadb.as_ref().map(Mariadb::url).unwrap_or_default(),
        redlock: redlock_srvs.iter().map(Redis::url).collect::<Vec<_>>().join(","),
        baton: endpoints.join(","),
        baton_zk: baton.zk_endpoints().join(","),
        etcd: etcd.as_ref().map(|t| t.endpoints().join(",")).unwrap_or_default(),
        zookeeper: zk.as_ref().map(|t| t.endpoints().join(",")).unwrap_or_default(),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(o.seed);
    let mut results = Vec::new();
    for &fault in &o.faults {
        for &workers in &o.workers {
            for &kind in o.kinds.iter().filter(|k| k.runs_under(fault)) {
                reset(&db, std::iter::once(&redis_srv).chain(&redlock_srvs)).await?;
                let service = match kind {
                    _ if fault != Fault::Kill => Service::None,
                    LockKind::RedisSpin | LockKind::RedisWatchdog => Service::Redis(std::slice::from_ref(&redis_srv)),
                    LockKind::Redlock => Service::Redis(&redlock_srvs),
                    LockKind::MariadbGetLock => mariadb.as_ref().map_or(Service::None, Service::Mariadb),
                    LockKind::Etcd => etcd.as_ref().map_or(Service::None, Service::Etcd),
                    LockKind::Zookeeper => zk.as_ref().map_or(Service::None, Service::Zk),
                    _ => Service::Baton(&baton),
                };
                let cell = Cell { kind, workers, fault, time_limit: o.time_limit };
                let r = run_kind(cell, &env, &db, service, &mut rng).await?;
                // etcd's and ZooKeeper's scripts cannot restart a member: a
                // cluster that lost one is started afresh.
                if fault == Fault::Kill && matches!(kind, LockKind::Etcd | LockKind::Zookeeper) {
                    starts += 1;
                    if kind == LockKind::Etcd {
                        if let Some(t) = etcd.take() {
                            t.stop();
                        }
                        let t = EtcdTarget::start(&o.out.join(format!("etcd-{starts}"))).await?;
                        env.etcd = t.endpoints().join(",");
                        etcd = Some(t);
                    } else {
                        if let Some(t) = zk.take() {
                            t.stop();
                        }
                        let t = ZkTarget::start(&o.out.join(format!("zookeeper-{starts}"))).await?;
                        env.zookeeper = t.endpoints().join(",");
                        zk = Some(t);
                    }
                }
                eprintln!(
                    "locks: {:<14} {:>3} workers, fault {:<5}: {} acked, {} lost, {} refused, {} unknown, {} failed, {:.0} ops/s, p50 {:.1} ms, p99 {:.1} ms, {} faults",
                    kind.name(), workers, fault.name(), r.acked, r.lost, r.refused, r.unknown, r.failed, r.ops_per_sec, r.p50_ms, r.p99_ms, r.injected
                );
                results.push(r);
            }
        }
    }
    baton.stop();
    if let Some(t) = etcd {
        t.stop();
    }
    if let Some(t) = zk {
        t.stop();
    }
    let validity = judge(&results);
    write_report(&o, &results, validity)?;
    Ok((validity, results))
}

/// Valid: no fenced kind lost a decrement; with no fault, no kind did; every
/// kind acknowledged at least one.
pub fn judge(results: &[KindResult]) -> Validity {
    let bad = results.iter().any(|r| r.acked == 0 || (r.lost > 0 && (r.kind.fenced() || r.fault == Fault::None)));
    if bad {
        Validity::Invalid
    } else {
        Validity::Valid
    }
}

struct WorkerEnv {
    pg: String,
    redis: String,
    /// MariaDB's URL (empty unless `mariadb-get-lock` runs).
    mariadb: String,
    /// Redlock's servers, comma-separated (empty unless it runs).
    redlock: String,
    baton: String,
    baton_zk: String,
    etcd: String,
    zookeeper: String,
}

async fn reset(db: &tokio_postgres::Client, redis_srvs: impl Iterator<Item = &Redis>) -> anyhow::Result<()> {
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS stock; CREATE TABLE stock (item text PRIMARY KEY, n bigint NOT NULL, version bigint NOT NULL);\
         INSERT INTO stock VALUES ('widget', {START}, 0); DELETE FROM baton_fence;"
    ))
    .await?;
    for srv in redis_srvs {
        let mut c = redis::Client::open(srv.url())?.get_multiplexed_async_connection().await?;
        let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await?;
    }
    Ok(())
}

/// The endpoints of the service a rival kind's workers use ("" for the
/// others).
fn rival_eps(kind: LockKind, env: &WorkerEnv) -> &str {
    match kind {
        LockKind::Etcd => &env.etcd,
        LockKind::Zookeeper => &env.zookeeper,
        LockKind::BatonZkFenced => &env.baton_zk,
        _ => "",
    }
}

/// One run's settings. A worker's output lines: `a <µs> <value>` acked,
/// `r <µs>` refused, `u <µs>` unknown, `f <µs>` failed, `c` (before the
/// decrement's line) its lock-service links were cut during it.
struct Cell {
    kind: LockKind,
    workers: usize,
    fault: Fault,
    time_limit: Duration,
}

async fn run_kind(
    cell: Cell,
    env: &WorkerEnv,
    db: &tokio_postgres::Client,
    service: Service<'_>,
    rng: &mut rand::rngs::StdRng,
) -> anyhow::Result<KindResult> {
    let Cell { kind, workers, fault, time_limit } = cell;
    let exe = std::env::current_exe().context("this binary's path")?;
    let mut children = Vec::new();
    // A worker that has printed a line has its SIGUSR1 handler (the
    // default action would end it): only those are asked to pause.
    let ready: Arc<Vec<AtomicBool>> = Arc::new((0..workers).map(|_| AtomicBool::new(false)).collect());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, String)>();
    for id in 0..workers {
        let mut child = tokio::process::Command::new(&exe)
            .args(["locks-worker", "--kind", kind.name(), "--id", &id.to_string()])
            .args(["--pg", &env.pg, "--redis", &env.redis, "--redlock", &env.redlock, "--baton", &env.baton])
            .args(["--rival", rival_eps(kind, env), "--mariadb", &env.mariadb])
            .args(if fault == Fault::Cut { &["--cut"][..] } else { &[] })
            .args(["--secs", &time_limit.as_secs_f64().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting a locks worker")?;
        let out = child.stdout.take().context("worker stdout")?;
        let (tx, ready) = (tx.clone(), ready.clone());
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                ready[id].store(true, Ordering::SeqCst);
                if tx.send((id, l)).is_err() {
                    break;
                }
            }
        });
        children.push(child);
    }
    drop(tx);
    let pids: Vec<i32> = children.iter().filter_map(|c| c.id()).filter_map(|p| i32::try_from(p).ok()).collect();
    let started = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let pauser = matches!(fault, Fault::Pause | Fault::Cut).then(|| {
        let (pids, ready, done, seed) = (pids.clone(), ready.clone(), done.clone(), rng.gen::<u64>());
        tokio::spawn(async move { pause_loop(fault, pids, ready, done, seed).await })
    });

    let killer = kill_loop(service, &done, rng.gen::<u64>());
    let mut hist = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).context("histogram")?;
    let (mut acked, mut refused, mut unknown, mut failed, mut cuts) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut values: HashMap<i64, u64> = HashMap::new();
    let limit = time_limit + Duration::from_secs(60);
    let reader = async {
        while let Ok(Some((_, line))) = tokio::time::timeout_at((started + limit).into(), rx.recv()).await {
            let mut f = line.split(' ');
            let tag = f.next().unwrap_or("");
            let us = f.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            match tag {
                "a" => {
                    acked += 1;
                    let _ = hist.record(us.max(1));
                    if let Some(v) = f.next().and_then(|v| v.parse::<i64>().ok()) {
                        *values.entry(v).or_default() += 1;
                    }
                }
                "r" => refused += 1,
                "u" => unknown += 1,
                "f" => failed += 1,
                "c" => cuts += 1,
                _ => {}
            }
        }
        done.store(true, Ordering::SeqCst);
    };
    let ((), kills) = tokio::join!(reader, killer);
    for &pid in &pids {
        // SAFETY: kill(2) on a worker this run started and has not reaped:
        // none may stay stopped.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    let pauses = match pauser {
        Some(p) => p.await.unwrap_or(0),
        None => 0,
    };
    for mut c in children {
        // A paused worker is continued by the pauser before it returns; a
        // worker past the limit is killed.
        let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
        let _ = c.kill().await;
    }
    let secs = time_limit.as_secs_f64();
    let n: i64 = db.query_one("SELECT n FROM stock WHERE item = 'widget'", &[]).await?.get(0);
    let consumed = u64::try_from(START - n).unwrap_or(0);
    let duplicated: u64 = values.values().map(|c| c - 1).sum();
    let lost = acked.saturating_sub(consumed).max(duplicated);
    Ok(KindResult {
        kind,
        workers,
        fault,
        secs,
        acked,
        refused,
        unknown,
        failed,
        consumed,
        lost,
        injected: pauses + kills + cuts,
        ops_per_sec: acked as f64 / secs,
        p50_ms: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: hist.value_at_quantile(0.99) as f64 / 1000.0,
    })
}

/// Every [`PAUSE_EVERY`], asks a random worker to pause at its pause
/// point, waits (bounded) until it has stopped, continues it after twice
/// the lease. The pauses done. For the cut fault: asks (SIGUSR2) to be
/// cut off instead, and waits twice the lease before the next
/// [`PAUSE_EVERY`] (the worker reports its cuts itself).
async fn pause_loop(
    fault: Fault,
    pids: Vec<i32>,
    ready: Arc<Vec<AtomicBool>>,
    done: Arc<AtomicBool>,
    seed: u64,
) -> u64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut pauses = 0;
    tokio::time::sleep(Duration::from_secs(1)).await;
    while !done.load(Ordering::SeqCst) {
        let live: Vec<i32> =
            pids.iter().zip(ready.iter()).filter(|(_, r)| r.load(Ordering::SeqCst)).map(|(p, _)| *p).collect();
        if live.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let pid = live[rng.gen_range(0..live.len())];
        if fault == Fault::Cut {
            // SAFETY: kill(2) on a worker this run started (kill_on_drop reaps it).
            unsafe { libc::kill(pid, libc::SIGUSR2) };
            tokio::time::sleep(LEASE * 2 + PAUSE_EVERY).await;
            continue;
        }
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGUSR1) };
        let deadline = Instant::now() + PAUSE_REACH;
        let mut stopped = false;
        while Instant::now() < deadline && !done.load(Ordering::SeqCst) {
            if proc_state(pid) == Some('T') {
                stopped = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if stopped {
            pauses += 1;
            tokio::time::sleep(LEASE * 2).await;
        }
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        tokio::time::sleep(PAUSE_EVERY).await;
    }
    pauses
}

/// A kind's lock service, for the kill fault.
enum Service<'a> {
    /// Not killed (no kill fault, or a PostgreSQL kind).
    None,
    /// Redis servers: one of them is killed and restarted each time.
    Redis(&'a [Redis]),
    Mariadb(&'a Mariadb),
    Baton(&'a BatonTarget),
    Etcd(&'a EtcdTarget),
    Zk(&'a ZkTarget),
}

/// How long a killed Baton member stays down.
const KILL_DOWN: Duration = Duration::from_secs(2);
/// How long a killed Redis stays down: a supervisor restarts it at once.
const REDIS_DOWN: Duration = Duration::from_millis(200);
/// Between a restart and the next kill.
const KILL_EVERY: Duration = Duration::from_secs(4);

/// Kills the service's primary every [`KILL_EVERY`] (after 2 s), restarts
/// it after [`KILL_DOWN`] where it can (module doc); the kills done.
async fn kill_loop(service: Service<'_>, done: &AtomicBool, seed: u64) -> u64 {
    if matches!(service, Service::None) {
        return 0;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut kills = 0;
    tokio::time::sleep(Duration::from_secs(2)).await;
    while !done.load(Ordering::SeqCst) {
        match &service {
            Service::None => return 0,
            Service::Redis(srvs) => {
                let srv = &srvs[rng.gen_range(0..srvs.len())];
                srv.kill();
                kills += 1;
                tokio::time::sleep(REDIS_DOWN).await;
                if let Err(e) = tokio::task::block_in_place(|| srv.restart()) {
                    eprintln!("locks: restarting redis on {}: {e:#}", srv.port());
                }
            }
            Service::Mariadb(m) => {
                m.kill();
                kills += 1;
                tokio::time::sleep(REDIS_DOWN).await;
                if let Err(e) = tokio::task::block_in_place(|| m.restart()) {
                    eprintln!("locks: restarting mariadb on {}: {e:#}", m.port());
                }
            }
            Service::Baton(t) => kills += kill_leader(*t, true).await,
            Service::Etcd(t) => return kills + kill_leader(*t, false).await,
            Service::Zk(t) => return kills + kill_leader(*t, false).await,
        }
        tokio::time::sleep(KILL_EVERY).await;
    }
    kills
}

/// kill -9 `t`'s leader; started again after [`KILL_DOWN`] if `restart`.
/// 1 if a leader was found and killed.
async fn kill_leader<T: Target>(t: &T, restart: bool) -> u64 {
    let Ok(leader) = t.leader().await else { return 0 };
    if t.kill(leader).is_err() {
        return 0;
    }
    if restart {
        tokio::time::sleep(KILL_DOWN).await;
        if let Err(e) = t.restart(leader) {
            eprintln!("locks: restarting member {leader}: {e:#}");
        }
    }
    1
}

/// A process's state letter from /proc/PID/stat (`T`: stopped).
fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(") ")?.1.chars().next()
}

fn write_report(o: &LocksOpts, results: &[KindResult], validity: Validity) -> anyhow::Result<()> {
    let j = json!({
        "valid": validity.as_str(),
        "seed": o.seed,
        "secs": o.time_limit.as_secs_f64(),
        "lease_ms": LEASE.as_millis() as u64,
        "start_stock": START,
        "date": baton_jepsen::plot::utc_stamp(std::time::SystemTime::now()),
        "results": results,
    });
    std::fs::write(o.out.join("locks.json"), serde_json::to_vec_pretty(&j)?)?;
    let mut md = String::from(
        "| lock | workers | fault | acked | lost | refused | unknown | failed | ops/s | p50 ms | p99 ms | faults | the seeds predicted |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in results {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {} | {} |\n",
            r.kind.name(),
            r.workers,
            r.fault.name(),
            r.acked,
            r.lost,
            r.refused,
            r.unknown,
            r.failed,
            r.ops_per_sec,
            r.p50_ms,
            r.p99_ms,
            r.injected,
            r.kind.predicted(r.fault)
        ));
    }
    md.push_str(&format!(
        "\nvalid: {} (no fenced kind lost a decrement; with no fault, none did; every kind acknowledged some)\n",
        validity.as_str()
    ));
    std::fs::write(o.out.join("locks.md"), md)?;
    draw(&o.out.join("locks.png"), results, j["date"].as_str())
}

/// Draws the PNG of a `locks.json` again (beside it, same name, `.png`),
/// running nothing: after a change to the picture, or for an older run.
pub fn replot(json: &Path) -> anyhow::Result<PathBuf> {
    #[derive(serde::Deserialize)]
    struct Report {
        results: Vec<KindResult>,
        #[serde(default)]
        date: Option<String>,
    }
    let text = std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    let r: Report = serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    let png = json.with_extension("png");
    draw(&png, &r.results, r.date.as_deref())?;
    Ok(png)
}

/// locks.png: one panel per fault and worker count, a bar per lock kind:
/// the decrements it lost as a share of those it acknowledged, labelled
/// with the count.
fn draw(path: &Path, results: &[KindResult], date: Option<&str>) -> anyhow::Result<()> {
    use baton_jepsen::plot::{font, num, perr, render_png, stamp};
    use plotters::prelude::*;
    let mut panels: Vec<(Fault, usize)> = Vec::new();
    for r in results {
        if !panels.contains(&(r.fault, r.workers)) {
            panels.push((r.fault, r.workers));
        }
    }
    let height = 80 + 260 * panels.len() as u32;
    let kinds = results.iter().map(|r| r.kind).collect::<std::collections::HashSet<_>>().len() as u32;
    let width = (150 + 125 * kinds).max(1100);
    render_png(path, (width, height), |root| {
        let (title, rest) = root.split_vertically(50);
        title
            .draw(&Text::new("Stock decrements lost, by lock kind (share of those acknowledged)", (20, 15), font(20)))
            .map_err(perr)?;
        for (area, (fault, workers)) in rest.split_evenly((panels.len(), 1)).iter().zip(&panels) {
            let rows: Vec<&KindResult> =
                results.iter().filter(|r| r.fault == *fault && r.workers == *workers).collect();
            let mut chart = ChartBuilder::on(area)
                .caption(format!("fault: {}, {} workers", fault.name(), workers), font(16))
                .margin(10)
                .x_label_area_size(30)
                .y_label_area_size(60)
                .build_cartesian_2d(0f64..rows.len() as f64, 0f64..100f64)
                .map_err(perr)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(0)
                .y_desc("lost %")
                .y_label_formatter(&|v| num(*v))
                .label_style(font(12))
                .draw()
                .map_err(perr)?;
            for (i, r) in rows.iter().enumerate() {
                let share = if r.acked == 0 { 0.0 } else { (100.0 * r.lost as f64 / r.acked as f64).min(100.0) };
                let x = i as f64;
                let colour = if r.lost > 0 { RED.mix(0.7) } else { GREEN.mix(0.7) };
                chart
                    .draw_series([Rectangle::new([(x + 0.15, 0.0), (x + 0.85, share)], colour.filled())])
                    .map_err(perr)?;
                chart
                    .draw_series([
                        Text::new(r.kind.name().to_string(), (x + 0.15, 97.0), font(13)),
                        Text::new(format!("{} of {}", r.lost, r.acked), (x + 0.15, share.max(4.0) + 6.0), font(12)),
                    ])
                    .map_err(perr)?;
            }
        }
        stamp(root, date)
    })
}

// ---- the worker process ----

pub struct WorkerOpts {
    pub kind: LockKind,
    pub id: usize,
    pub pg: String,
    pub redis: String,
    /// MariaDB's URL (`mariadb-get-lock`).
    pub mariadb: String,
    /// Route every lock-service connection through a proxy in this process,
    /// for the cut fault.
    pub cut: bool,
    /// Redlock's servers.
    pub redlock: Vec<String>,
    pub baton: Vec<String>,
    /// etcd's, ZooKeeper's or Baton's ZooKeeper port's endpoints, for the
    /// rival kinds.
    pub rival: Vec<String>,
    pub secs: f64,
}

/// How long one Redis command may take: a connection to a killed server
/// can otherwise wait for its reconnection indefinitely.
const REDIS_OP_LIMIT: Duration = Duration::from_secs(1);

/// `f`, bounded by [`REDIS_OP_LIMIT`]; its error as text.
async fn within<T>(what: &str, f: impl std::future::Future<Output = redis::RedisResult<T>>) -> Result<T, String> {
    match tokio::time::timeout(REDIS_OP_LIMIT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {REDIS_OP_LIMIT:?}")),
    }
}

/// The release channel's messages, on a connection of their own.
type Released = std::pin::Pin<Box<dyn futures::Stream<Item = redis::Msg> + Send>>;

async fn subscribe(url: &str) -> Result<Released, redis::RedisError> {
    let mut ps = redis::Client::open(url)?.get_async_pubsub().await?;
    ps.subscribe(REDIS_CHANNEL).await?;
    Ok(Box::pin(ps.into_on_message()))
}

/// A rival's client.
enum Rival {
    Etcd(EtcdClient),
    Zk(ZkClient),
}

impl Rival {
    async fn close(self) {
        match self {
            Rival::Etcd(c) => c.close().await,
            Rival::Zk(c) => c.close().await,
        }
    }
}

/// What one decrement came to.
enum Outcome {
    Acked(i64),
    Refused,
    Unknown,
    Failed(String),
}

struct Worker {
    kind: LockKind,
    db: tokio_postgres::Client,
    redis: Option<redis::aio::ConnectionManager>,
    /// `redis-watchdog`: the release channel's messages.
    released: Option<Released>,
    redis_url: String,
    /// `redlock`: one connection per server.
    redlock: Vec<redis::aio::ConnectionManager>,
    /// Baton's endpoints; the client is made again after its session
    /// expired (a pause past the lease does that).
    baton_eps: Vec<String>,
    baton: Option<Client>,
    rival_eps: Vec<String>,
    /// Made again after its session or lease was lost.
    rival: Option<Rival>,
    /// `mariadb-get-lock`: made again after an error.
    mariadb: Option<mysql_async::Conn>,
    mariadb_url: String,
    id: usize,
    faults: PausePoint,
    me: String,
}

/// What a worker does at its pause point, when the run asks.
struct PausePoint {
    /// When the run last asked (SIGUSR1) this worker to pause.
    pause: PauseAsk,
    /// When the run last asked (SIGUSR2) to cut it off.
    cut: PauseAsk,
    /// The links to the lock service (the cut fault only).
    proxies: Option<Proxies>,
    /// Cuts done since the last output line.
    cuts: std::sync::atomic::AtomicU64,
}

impl PausePoint {
    /// Holding the lock, after the read: stops this process if a pause was
    /// asked for (the run continues it); if a cut was, stalls the links to
    /// the lock service while it works on for twice the lease, then heals
    /// them.
    async fn reached(&self) {
        if take_ask(&self.pause) {
            // SAFETY: raise(3) stops this process until SIGCONT.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        if take_ask(&self.cut) {
            if let Some(p) = &self.proxies {
                p.stall_slot(0, true);
                self.cuts.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(LEASE * 2).await;
                p.stall_slot(0, false);
            }
        }
    }
}

/// The worker: loops until `secs` pass, one line per decrement on stdout.
pub async fn worker(mut o: WorkerOpts) -> anyhow::Result<()> {
    use tokio::signal::unix::SignalKind;
    let pause = ask_on(SignalKind::user_defined1())?;
    let cut = ask_on(SignalKind::user_defined2())?;
    let proxies = match o.cut {
        true => Some(proxy_lock_service(&mut o).await?),
        false => None,
    };
    let (db, conn) = tokio_postgres::connect(&o.pg, NoTls).await.context("worker: postgres")?;
    tokio::spawn(conn);
    let redis = match o.kind {
        LockKind::RedisSpin | LockKind::RedisWatchdog => {
            Some(redis::Client::open(o.redis.as_str())?.get_connection_manager().await.context("worker: redis")?)
        }
        _ => None,
    };
    let released = match o.kind {
        LockKind::RedisWatchdog => Some(subscribe(&o.redis).await.context("worker: subscribe")?),
        _ => None,
    };
    let mut redlock = Vec::new();
    if o.kind == LockKind::Redlock {
        for url in &o.redlock {
            let c = redis::Client::open(url.as_str())?.get_connection_manager().await;
            redlock.push(c.with_context(|| format!("worker: redlock server {url}"))?);
        }
    }
    let mut w = Worker {
        kind: o.kind,
        db,
        redis,
        released,
        redis_url: o.redis.clone(),
        redlock,
        baton_eps: o.baton.clone(),
        baton: None,
        rival_eps: o.rival.clone(),
        rival: None,
        mariadb: None,
        mariadb_url: o.mariadb.clone(),
        id: o.id,
        faults: PausePoint { pause, cut, proxies, cuts: Default::default() },
        me: format!("w{}-{}", o.id, rand::random::<u32>()),
    };
    let deadline = Instant::now() + Duration::from_secs_f64(o.secs);
    let mut out = std::io::stdout().lock();
    use std::io::Write as _;
    while Instant::now() < deadline {
        let t0 = Instant::now();
        let outcome = w.decrement().await;
        let us = t0.elapsed().as_micros();
        for _ in 0..w.faults.cuts.swap(0, Ordering::SeqCst) {
            writeln!(out, "c")?;
        }
        let line = match outcome {
            Outcome::Acked(v) => format!("a {us} {v}"),
            Outcome::Refused => format!("r {us}"),
            Outcome::Unknown => format!("u {us}"),
            Outcome::Failed(why) => {
                eprintln!("locks worker {} ({}): {why}", o.id, o.kind.name());
                tokio::time::sleep(Duration::from_millis(50)).await;
                format!("f {us}")
            }
        };
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    if let Some(c) = w.baton.take() {
        let _ = c.close().await;
    }
    Ok(())
}

/// Writes `read - 1` in `tx` and commits it: Acked, or Unknown if the
/// commit had no answer.
async fn commit_decrement(tx: tokio_postgres::Transaction<'_>, read: i64) -> Result<Outcome, String> {
    tx.execute("UPDATE stock SET n = $1 WHERE item = 'widget'", &[&(read - 1)])
        .await
        .map_err(|e| format!("update: {e}"))?;
    Ok(match tx.commit().await {
        Ok(()) => Outcome::Acked(read - 1),
        Err(_) => Outcome::Unknown,
    })
}

/// When the run last asked this worker to pause (SIGUSR1) or to be cut off
/// (SIGUSR2).
type PauseAsk = Arc<std::sync::Mutex<Option<Instant>>>;

/// The ask that `kind` signals record.
fn ask_on(kind: tokio::signal::unix::SignalKind) -> anyhow::Result<PauseAsk> {
    let ask: PauseAsk = Arc::new(std::sync::Mutex::new(None));
    let mut sig = tokio::signal::unix::signal(kind)?;
    let a = ask.clone();
    tokio::spawn(async move {
        while sig.recv().await.is_some() {
            *a.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        }
    });
    Ok(ask)
}

/// Takes a pending ask; one the run has given up on (it waits
/// PAUSE_REACH) is dropped: nobody would continue this process.
fn take_ask(ask: &PauseAsk) -> bool {
    let asked = ask.lock().unwrap_or_else(|e| e.into_inner()).take();
    asked.is_some_and(|at| at.elapsed() < PAUSE_REACH - Duration::from_secs(1))
}

/// Starts a proxy for every lock-service endpoint of `o.kind` (each
/// `127.0.0.1:PORT` in them) and points `o` at the proxies.
async fn proxy_lock_service(o: &mut WorkerOpts) -> anyhow::Result<Proxies> {
    let mut proxies = Proxies::default();
    let eps: Vec<&mut String> = match o.kind {
        LockKind::RedisSpin | LockKind::RedisWatchdog => vec![&mut o.redis],
        LockKind::Redlock => o.redlock.iter_mut().collect(),
        LockKind::MariadbGetLock => vec![&mut o.mariadb],
        LockKind::Baton | LockKind::BatonFenced => o.baton.iter_mut().collect(),
        LockKind::Etcd | LockKind::Zookeeper | LockKind::BatonZkFenced => o.rival.iter_mut().collect(),
        LockKind::PgForUpdate | LockKind::PgOptimistic | LockKind::PgAdvisory => vec![],
    };
    for (to, ep) in (0u64..).zip(eps) {
        const HOST: &str = "127.0.0.1:";
        let at = ep.find(HOST).with_context(|| format!("no {HOST} in endpoint {ep:?}"))? + HOST.len();
        let digits = ep[at..].chars().take_while(char::is_ascii_digit).count();
        let port: u16 = ep[at..at + digits].parse().with_context(|| format!("no port in endpoint {ep:?}"))?;
        let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let via = proxies.add(LinkId::Client { slot: 0, home: 0, to }, target).await?;
        ep.replace_range(at..at + digits, &via.port().to_string());
    }
    Ok(proxies)
}

impl Worker {
    async fn read(&self) -> Result<i64, String> {
        self.db
            .query_one("SELECT n FROM stock WHERE item = 'widget'", &[])
            .await
            .map(|r| r.get(0))
            .map_err(|e| format!("read: {e}"))
    }

    /// An autocommit write: no answer means it may have applied.
    async fn write(&self, v: i64) -> Outcome {
        match self.db.execute("UPDATE stock SET n = $1 WHERE item = 'widget'", &[&v]).await {
            Ok(_) => Outcome::Acked(v),
            Err(_) => Outcome::Unknown,
        }
    }

    async fn decrement(&mut self) -> Outcome {
        match self.kind {
            LockKind::PgForUpdate => self.pg_for_update().await.unwrap_or_else(Outcome::Failed),
            LockKind::PgOptimistic => self.pg_optimistic().await.unwrap_or_else(Outcome::Failed),
            LockKind::PgAdvisory => self.pg_advisory().await.unwrap_or_else(Outcome::Failed),
            LockKind::MariadbGetLock => self.mariadb_get_lock().await.unwrap_or_else(Outcome::Failed),
            LockKind::RedisSpin => self.redis_spin().await.unwrap_or_else(Outcome::Failed),
            LockKind::RedisWatchdog => self.redis_watchdog().await.unwrap_or_else(Outcome::Failed),
            LockKind::Redlock => self.redlock().await.unwrap_or_else(Outcome::Failed),
            LockKind::Baton | LockKind::BatonFenced => self.baton().await.unwrap_or_else(Outcome::Failed),
            LockKind::Etcd | LockKind::Zookeeper | LockKind::BatonZkFenced => {
                self.rival().await.unwrap_or_else(Outcome::Failed)
            }
        }
    }

    /// Holding a lock outside the database: read, pause point, write.
    async fn read_pause_write(&self) -> Result<Outcome, String> {
        let n = self.read().await?;
        self.faults.reached().await;
        Ok(self.write(n - 1).await)
    }

    /// `SET key me NX PX lease` on `conn`: true if taken.
    async fn set_nx(conn: &mut redis::aio::ConnectionManager, me: &str) -> Result<bool, String> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(REDIS_KEY).arg(me).arg("NX").arg("PX").arg(LEASE.as_millis() as u64);
        let got: Option<String> = within("SET NX", cmd.query_async(conn)).await?;
        Ok(got.is_some())
    }

    async fn redis_release(conn: &mut redis::aio::ConnectionManager, me: &str) {
        let script = redis::Script::new(REDIS_RELEASE);
        let mut inv = script.key(REDIS_KEY);
        inv.key(REDIS_CHANNEL).arg(me);
        let _: Result<i64, _> = within("release", inv.invoke_async(conn)).await;
    }

    async fn redis_watchdog(&mut self) -> Result<Outcome, String> {
        let mut conn = self.redis.clone().ok_or("no redis connection")?;
        let until = Instant::now() + ACQUIRE_LIMIT;
        while !Self::set_nx(&mut conn, &self.me).await? {
            if Instant::now() > until {
                return Err(format!("no redis lock within {ACQUIRE_LIMIT:?}"));
            }
            // Sleep until a release is published or the holder's lease
            // would have run out.
            let ttl: i64 = within("PTTL", redis::cmd("PTTL").arg(REDIS_KEY).query_async(&mut conn)).await?;
            let wait = Duration::from_millis(ttl.clamp(1, LEASE.as_millis() as i64) as u64);
            if self.released.is_none() {
                self.released = within("SUBSCRIBE", subscribe(&self.redis_url)).await.ok();
            }
            match self.released.as_mut() {
                Some(msgs) => {
                    use futures::StreamExt as _;
                    // The stream ends when Redis went away: subscribe again.
                    if let Ok(None) = tokio::time::timeout(wait, msgs.next()).await {
                        self.released = None;
                    }
                }
                None => tokio::time::sleep(wait).await,
            }
        }
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (mut dog_conn, me) = (conn.clone(), self.me.clone());
        let dog = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(LEASE / 3) => {
                        let script = redis::Script::new(REDIS_RENEW);
                        let mut inv = script.key(REDIS_KEY);
                        inv.arg(&me).arg(LEASE.as_millis() as u64);
                        let _: Result<i64, _> = within("renew", inv.invoke_async(&mut dog_conn)).await;
                    }
                    _ = &mut stopped => break,
                }
            }
        });
        let r = self.read_pause_write().await;
        let _ = stop.send(());
        let _ = dog.await;
        Self::redis_release(&mut conn, &self.me).await;
        r
    }

    async fn redlock(&mut self) -> Result<Outcome, String> {
        let until = Instant::now() + ACQUIRE_LIMIT;
        let majority = self.redlock.len() / 2 + 1;
        let drift = LEASE / 100 + Duration::from_millis(2);
        loop {
            let t0 = Instant::now();
            let mut got = 0;
            for c in &mut self.redlock {
                if let Ok(Ok(true)) = tokio::time::timeout(REDLOCK_STEP, Self::set_nx(c, &self.me)).await {
                    got += 1;
                }
            }
            if got >= majority && t0.elapsed() + drift < LEASE {
                break;
            }
            for c in &mut self.redlock {
                let _ = tokio::time::timeout(REDLOCK_STEP, Self::redis_release(c, &self.me)).await;
            }
            if Instant::now() > until {
                return Err(format!("no redlock within {ACQUIRE_LIMIT:?}"));
            }
            let wait = rand::thread_rng().gen_range(5..25);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        let r = self.read_pause_write().await;
        for c in &mut self.redlock {
            let _ = tokio::time::timeout(REDLOCK_STEP, Self::redis_release(c, &self.me)).await;
        }
        r
    }

    async fn pg_for_update(&mut self) -> Result<Outcome, String> {
        let tx = self.db.transaction().await.map_err(|e| format!("begin: {e}"))?;
        let n: i64 = tx
            .query_one("SELECT n FROM stock WHERE item = 'widget' FOR UPDATE", &[])
            .await
            .map_err(|e| format!("select for update: {e}"))?
            .get(0);
        self.faults.reached().await;
        commit_decrement(tx, n).await
    }

    async fn pg_optimistic(&mut self) -> Result<Outcome, String> {
        for _ in 0..1000 {
            let row = self
                .db
                .query_one("SELECT n, version FROM stock WHERE item = 'widget'", &[])
                .await
                .map_err(|e| format!("read: {e}"))?;
            let (n, version): (i64, i64) = (row.get(0), row.get(1));
            self.faults.reached().await;
            match self
                .db
                .execute(
                    "UPDATE stock SET n = $1, version = version + 1 WHERE item = 'widget' AND version = $2",
                    &[&(n - 1), &version],
                )
                .await
            {
                Ok(1) => return Ok(Outcome::Acked(n - 1)),
                Ok(_) => continue, // someone else wrote first: read again
                Err(_) => return Ok(Outcome::Unknown),
            }
        }
        Ok(Outcome::Refused)
    }

    async fn pg_advisory(&mut self) -> Result<Outcome, String> {
        self.db.execute("SELECT pg_advisory_lock(4242)", &[]).await.map_err(|e| format!("advisory lock: {e}"))?;
        let r = self.read_pause_write().await;
        let _ = self.db.execute("SELECT pg_advisory_unlock(4242)", &[]).await;
        r
    }

    async fn mariadb_get_lock(&mut self) -> Result<Outcome, String> {
        use mysql_async::prelude::Queryable as _;
        let mut conn = match self.mariadb.take() {
            Some(c) => c,
            None => tokio::time::timeout(ACQUIRE_LIMIT, mysql_async::Conn::from_url(self.mariadb_url.as_str()))
                .await
                .map_err(|_| format!("mariadb: no connection within {ACQUIRE_LIMIT:?}"))?
                .map_err(|e| format!("mariadb: {e}"))?,
        };
        // GET_LOCK waits up to its own timeout (1 if granted, 0 if not); a
        // connection that errs is dropped and made again next time.
        let ask = format!("SELECT GET_LOCK('stock', {})", ACQUIRE_LIMIT.as_secs());
        let got: Option<Option<i64>> =
            match tokio::time::timeout(ACQUIRE_LIMIT + Duration::from_secs(5), conn.query_first(ask)).await {
                Err(_) => return Err("GET_LOCK: no answer".into()),
                Ok(Err(e)) => return Err(format!("GET_LOCK: {e}")),
                Ok(Ok(v)) => v,
            };
        if got != Some(Some(1)) {
            self.mariadb = Some(conn);
            return Err(format!("GET_LOCK: {got:?} within {ACQUIRE_LIMIT:?}"));
        }
        let r = self.read_pause_write().await;
        let release = conn.query_drop("DO RELEASE_LOCK('stock')");
        if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(5), release).await {
            self.mariadb = Some(conn);
        }
        r
    }

    async fn redis_spin(&mut self) -> Result<Outcome, String> {
        let mut conn = self.redis.clone().ok_or("no redis connection")?;
        let until = Instant::now() + ACQUIRE_LIMIT;
        while !Self::set_nx(&mut conn, &self.me).await? {
            if Instant::now() > until {
                return Err(format!("no redis lock within {ACQUIRE_LIMIT:?}"));
            }
            let wait = rand::thread_rng().gen_range(5..25);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        let r = self.read_pause_write().await;
        Self::redis_release(&mut conn, &self.me).await;
        r
    }

    /// Pause point, then one transaction fenced with `token`
    /// (baton_fence::postgres): the fence, the read, the write. Refused if
    /// a newer token wrote.
    async fn pause_fenced_read_write(&mut self, token: u64) -> Result<Outcome, String> {
        self.faults.reached().await;
        let tx = self.db.transaction().await.map_err(|e| format!("begin: {e}"))?;
        match PgFence::new().fenced(&tx, "stock/widget", token).await {
            Ok(()) => {}
            Err(e) if e.is_stale() => return Ok(Outcome::Refused),
            Err(e) => return Err(format!("fence: {e}")),
        }
        let n: i64 = tx
            .query_one("SELECT n FROM stock WHERE item = 'widget'", &[])
            .await
            .map_err(|e| format!("read: {e}"))?
            .get(0);
        commit_decrement(tx, n).await
    }

    /// etcd's lock, ZooKeeper's recipe (on ZooKeeper or Baton's port).
    async fn rival(&mut self) -> Result<Outcome, String> {
        let rival = match self.rival.take() {
            Some(r) => r,
            None => {
                let (eps, member) = (self.rival_eps.clone(), self.id);
                let made = match self.kind {
                    LockKind::Etcd => EtcdClient::connect_to(eps, member, LEASE).await.map(Rival::Etcd),
                    _ => ZkClient::connect_to(eps, member, LEASE).await.map(Rival::Zk),
                };
                made.map_err(|e| format!("connect: {e:#}"))?
            }
        };
        let r = match &rival {
            Rival::Etcd(c) => self.with_rival(c).await,
            Rival::Zk(c) => self.with_rival(c).await,
        };
        match r {
            Err((why, true)) => {
                rival.close().await;
                Err(why)
            }
            Err((why, false)) => {
                self.rival = Some(rival);
                Err(why)
            }
            Ok(o) => {
                self.rival = Some(rival);
                Ok(o)
            }
        }
    }

    /// One decrement under `c`'s lock; the error says whether the client's
    /// session (lease) is gone.
    async fn with_rival<C: TargetClient>(&mut self, c: &C) -> Result<Outcome, (String, bool)> {
        let lost = |e: &OpError| e.is_session_lost();
        let held = match tokio::time::timeout(ACQUIRE_LIMIT, c.lock("stock")).await {
            Err(_) => return Err((format!("no lock within {ACQUIRE_LIMIT:?}"), false)),
            Ok(Err(e)) => return Err((format!("lock: {e}"), lost(&e))),
            Ok(Ok(h)) => h,
        };
        let r = if self.kind == LockKind::BatonZkFenced {
            match c.token(&held).await {
                Ok(token) => self.pause_fenced_read_write(token).await,
                Err(e) => Err(format!("token: {e}")),
            }
        } else {
            self.read_pause_write().await
        };
        let gone = match c.unlock(held).await {
            Err(e) => lost(&e),
            Ok(()) => false,
        };
        r.map_err(|why| (why, gone))
    }

    async fn baton(&mut self) -> Result<Outcome, String> {
        if self.baton.as_ref().is_some_and(|c| *c.state().borrow() == SessionState::Expired) {
            if let Some(old) = self.baton.take() {
                let _ = old.close().await;
            }
        }
        if self.baton.is_none() {
            let cfg = ClientConfig::new(self.baton_eps.clone()).session_timeout(LEASE);
            self.baton = Some(Client::connect_with(cfg).await.map_err(|e| format!("connect: {e}"))?);
        }
        let client = self.baton.as_ref().ok_or("no baton client")?;
        let guard = tokio::time::timeout(ACQUIRE_LIMIT, client.lock("stock"))
            .await
            .map_err(|_| format!("no baton lock within {ACQUIRE_LIMIT:?}"))?
            .map_err(|e| format!("lock: {e}"))?;
        let token = guard.fencing_token();
        let r = async {
            if self.kind != LockKind::BatonFenced {
                return self.read_pause_write().await;
            }
            self.pause_fenced_read_write(token).await
        }
        .await;
        let _ = guard.release().await;
        r
    }
}

/// The run folder's default name.
pub fn default_out(seed: u64) -> PathBuf {
    Path::new("bench/store").join(format!("{}-locks-{seed}", baton_jepsen::cli::stamp()))
}

/// Refuses an empty selection.
pub fn check_opts(o: &LocksOpts) -> anyhow::Result<()> {
    if o.kinds.is_empty() || o.workers.is_empty() || o.faults.is_empty() || o.workers.contains(&0) {
        bail!("locks: give at least one kind, one fault and a worker count above 0");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(kind: LockKind, fault: Fault, acked: u64, lost: u64) -> KindResult {
        KindResult {
            kind,
            workers: 4,
            fault,
            secs: 1.0,
            acked,
            refused: 0,
            unknown: 0,
            failed: 0,
            consumed: acked - lost,
            lost,
            injected: 0,
            ops_per_sec: acked as f64,
            p50_ms: 1.0,
            p99_ms: 2.0,
        }
    }

    #[test]
    fn the_verdict_holds_fenced_kinds_to_no_loss_and_every_kind_to_none_without_faults() {
        let paused_redis_loses = [result(LockKind::RedisSpin, Fault::Pause, 100, 40)];
        assert_eq!(judge(&paused_redis_loses), Validity::Valid, "what the seeds predict is not a failure");
        for bad in [
            result(LockKind::BatonFenced, Fault::Pause, 100, 1),
            result(LockKind::RedisSpin, Fault::None, 100, 1),
            result(LockKind::PgForUpdate, Fault::None, 0, 0),
        ] {
            assert_eq!(judge(std::slice::from_ref(&bad)), Validity::Invalid, "{bad:?}");
        }
    }

    #[test]
    fn the_picture_is_drawn() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("locks.png");
        let rows: Vec<KindResult> = LockKind::ALL
            .iter()
            .flat_map(|&k| {
                [result(k, Fault::None, 50, 0), result(k, Fault::Pause, 50, if k.fenced() { 0 } else { 10 })]
            })
            .collect();
        draw(&path, &rows, Some("2026-12-07 05:00 UTC")).expect("draw");
        assert!(std::fs::metadata(&path).expect("png").len() > 1000);
    }

    #[tokio::test]
    async fn a_cut_worker_reaches_its_lock_service_through_proxies_it_can_stall() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = server.local_addr().expect("addr").port();
        let mut o = WorkerOpts {
            kind: LockKind::Redlock,
            id: 0,
            pg: "host=127.0.0.1 port=1".into(),
            redis: "redis://127.0.0.1:2/".into(),
            mariadb: String::new(),
            cut: true,
            redlock: vec![format!("redis://127.0.0.1:{port}/"), format!("redis://127.0.0.1:{port}/")],
            baton: vec!["127.0.0.1:3".into()],
            rival: vec![],
            secs: 1.0,
        };
        let proxies = proxy_lock_service(&mut o).await.expect("proxies");
        assert_eq!(proxies.links.len(), 2, "one per Redlock server, none for the others");
        assert_eq!(
            (o.pg.as_str(), o.redis.as_str(), o.baton[0].as_str()),
            ("host=127.0.0.1 port=1", "redis://127.0.0.1:2/", "127.0.0.1:3")
        );
        let via: u16 =
            o.redlock[0].trim_start_matches("redis://127.0.0.1:").trim_end_matches('/').parse().expect("port");
        assert_ne!(via, port);
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", via)).await.expect("connect");
        let (mut s, _) =
            tokio::time::timeout(Duration::from_secs(5), server.accept()).await.expect("bounded").expect("accept");
        c.write_all(b"a").await.expect("write");
        let mut b = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b)).await.expect("forwarded").expect("read");
        proxies.stall_slot(0, true);
        c.write_all(b"b").await.expect("write");
        assert!(tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut b)).await.is_err(), "cut: held");
        proxies.stall_slot(0, false);
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b)).await.expect("healed").expect("read");
        assert_eq!(&b, b"b");
    }

    #[test]
    fn the_database_kinds_run_under_no_fault_of_a_separate_lock_service() {
        for k in LockKind::ALL {
            let db = matches!(k, LockKind::PgForUpdate | LockKind::PgOptimistic | LockKind::PgAdvisory);
            assert!(k.runs_under(Fault::None) && k.runs_under(Fault::Pause));
            assert_eq!(k.runs_under(Fault::Kill), !db, "{k:?}");
            assert_eq!(k.runs_under(Fault::Cut), !db, "{k:?}");
        }
    }

    #[test]
    fn a_process_state_is_read_from_proc() {
        let me = i32::try_from(std::process::id()).expect("pid");
        assert!(matches!(proc_state(me), Some('R' | 'S')), "{:?}", proc_state(me));
        assert_eq!(proc_state(i32::MAX), None);
    }
}
