//! `baton bench`: throughput and latency of one workload, from many
//! clients (each its own session, spread over the endpoints as a fleet
//! would be).
//!
//! Everything a run creates is named after its run id: the data under
//! `/bench-<id>`, the locks `bench-<id>` and `bench-<id>-<client>`. When the
//! run ends, however it ends (its time is up, an error, SIGINT or SIGTERM),
//! those are deleted, within [`CLEANUP_TIMEOUT`]; if that fails, the error
//! says what is left and how to delete it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_client::recipes::RECIPE_ROOT;
use baton_client::{Client, CreateOptions, ErrorKind};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::task::JoinSet;

use crate::conn::{self, Conn};
use crate::node::{child_path, code_of, delete_tree};
use crate::output::Out;
use crate::signal::Interrupts;
use crate::{parse_duration, Fail};

/// Clients when --clients is not given (lock-uncontended: 1).
const DEFAULT_CLIENTS: usize = 64;
/// How long the clients have to finish their last operation once the time
/// is up; the ones still busy are dropped (their sessions close).
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long deleting what the run created may take.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Histogram bounds: 1 µs to 60 s, 3 significant digits.
const HIST_MAX_US: u64 = 60_000_000;

/// Measure throughput and latency (and delete what the run created).
#[derive(Args, Debug)]
pub struct Bench {
    /// The workload.
    #[arg(value_enum)]
    workload: Workload,
    /// Concurrent clients, each with its own session [default: 64;
    /// lock-uncontended: 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    clients: Option<u32>,
    /// How long to measure, e.g. 10s, 500ms, 1m.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    duration: Duration,
    /// Bytes of data per write.
    #[arg(long, default_value_t = 64)]
    size: usize,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// Create persistent sequential nodes.
    Create,
    /// Set one node per client.
    Set,
    /// Linearizable reads of one node per client.
    Get,
    /// Acquire + release one lock, one client (the latency of a grant).
    LockUncontended,
    /// Every client on one lock: grants/s, and the wait for a grant.
    LockContended,
    /// Every client on its own lock.
    LockIndependent,
}

/// What a run measured.
struct Report {
    hist: Histogram<u64>,
    errors: u64,
    secs: f64,
    clients: usize,
    /// The signal that cut the run short, if one did.
    interrupted: Option<i32>,
}

impl Bench {
    fn clients(&self) -> anyhow::Result<usize> {
        match (self.workload, self.clients) {
            (Workload::LockUncontended, Some(n)) if n > 1 => Err(crate::usage(
                "lock-uncontended runs one client (several clients on their own locks: lock-independent)",
            )),
            (Workload::LockUncontended, _) => Ok(1),
            (_, n) => Ok(n.map_or(DEFAULT_CLIENTS, |n| n as usize)),
        }
    }

    pub async fn run(self, conn: &Conn, out: Out) -> anyhow::Result<()> {
        let clients = self.clients()?;
        let tag = format!("bench-{:08x}", rand::random::<u32>());
        let setup = conn.connect().await?;
        let measured = self.measure(conn, &setup, &tag, clients).await;
        let cleaned = cleanup(&setup, &tag).await;
        conn::close(&setup).await;
        let report = measured?;
        self.print(&report, out);
        cleaned?;
        match report.interrupted {
            Some(signal) => Err(Fail::Interrupted { what: "during the benchmark".into(), signal }.into()),
            None => Ok(()),
        }
    }

    /// Starts the clients, lets them run for the duration (or until a
    /// signal), stops them and adds up their figures.
    async fn measure(&self, conn: &Conn, setup: &Client, tag: &str, clients: usize) -> anyhow::Result<Report> {
        let mut interrupts = Interrupts::new()?;
        setup.create(&format!("/{tag}"), Vec::new(), CreateOptions::persistent()).await?;
        let stop = Arc::new(AtomicBool::new(false));
        // Dropping the set (an error, a signal) aborts every client.
        let mut tasks = JoinSet::new();
        tokio::select! {
            r = self.start(conn, tag, clients, &stop, &mut tasks) => r?,
            e = interrupts.fail("while starting the benchmark clients".into()) => return Err(e),
        }
        eprintln!("running {:?} with {clients} clients for {:?}...", self.workload, self.duration);
        let start = Instant::now();
        let interrupted = tokio::select! {
            _ = tokio::time::sleep(self.duration) => None,
            sig = interrupts.recv() => Some(sig),
        };
        stop.store(true, Ordering::Relaxed);
        let (hist, errors) = collect(tasks).await?;
        Ok(Report { hist, errors, secs: start.elapsed().as_secs_f64(), clients, interrupted })
    }

    /// Connects each client, creates its node and starts its loop.
    async fn start(
        &self,
        conn: &Conn,
        tag: &str,
        clients: usize,
        stop: &Arc<AtomicBool>,
        tasks: &mut JoinSet<(Histogram<u64>, u64)>,
    ) -> anyhow::Result<()> {
        let data = Bytes::from(vec![b'x'; self.size]);
        for i in 0..clients {
            let mut eps = conn.endpoints.clone();
            let n = eps.len();
            eps.rotate_left(i % n);
            let c = Client::connect_with(conn.config_for(eps)).await?;
            let key = format!("/{tag}/k{i}");
            c.create(&key, data.clone(), CreateOptions::persistent()).await?;
            let lock = match self.workload {
                Workload::LockContended => tag.to_string(),
                _ => format!("{tag}-{i}"),
            };
            let job = Job { c, workload: self.workload, root: format!("/{tag}"), key, lock, data: data.clone() };
            tasks.spawn(job.run(stop.clone()));
        }
        Ok(())
    }

    fn print(&self, r: &Report, out: Out) {
        let (ops, ms) = (r.hist.len(), |us: u64| us as f64 / 1000.0);
        let (p50, p99, max) = (ms(r.hist.value_at_quantile(0.5)), ms(r.hist.value_at_quantile(0.99)), ms(r.hist.max()));
        let rate = ops as f64 / r.secs;
        let name = self.workload.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default();
        let json = json!({"workload": name, "clients": r.clients, "ops": ops, "seconds": r.secs, "ops_per_sec": rate,
                          "p50_ms": p50, "p99_ms": p99, "max_ms": max, "errors": r.errors,
                          "interrupted": r.interrupted.is_some()});
        let text = format!(
            "{:?}: {ops} ops in {:.1}s = {rate:.0} ops/s, p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms, errors {}",
            self.workload, r.secs, r.errors
        );
        out.emit(json, text);
    }
}

/// One client's loop.
struct Job {
    c: Client,
    workload: Workload,
    root: String,
    key: String,
    lock: String,
    data: Bytes,
}

impl Job {
    /// Runs operations until `stop`; their latencies and the error count.
    async fn run(self, stop: Arc<AtomicBool>) -> (Histogram<u64>, u64) {
        let mut hist = new_hist();
        let mut errors = 0u64;
        while !stop.load(Ordering::Relaxed) {
            match self.once().await {
                Ok(took) => {
                    let _ = hist.record(took.as_micros().max(1) as u64);
                }
                Err(_) => errors += 1,
            }
        }
        conn::close(&self.c).await;
        (hist, errors)
    }

    /// One operation; the latency it counts (contended: the wait for a
    /// grant).
    async fn once(&self) -> baton_client::Result<Duration> {
        let (c, t) = (&self.c, Instant::now());
        match self.workload {
            Workload::Create => {
                let opts = CreateOptions::persistent().sequential();
                c.create(&format!("{}/n-", self.root), self.data.clone(), opts).await?;
            }
            Workload::Set => drop(c.set(&self.key, self.data.clone(), None).await?),
            Workload::Get => drop(c.get(&self.key).await?),
            Workload::LockContended => {
                let g = c.lock(&self.lock).await?;
                let waited = t.elapsed();
                g.release().await?;
                return Ok(waited);
            }
            Workload::LockUncontended | Workload::LockIndependent => c.lock(&self.lock).await?.release().await?,
        }
        Ok(t.elapsed())
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("static bounds are valid")
}

/// Adds up the clients' figures, waiting at most [`STOP_TIMEOUT`] for them
/// (the ones left are aborted when the set drops).
async fn collect(mut tasks: JoinSet<(Histogram<u64>, u64)>) -> anyhow::Result<(Histogram<u64>, u64)> {
    let (mut hist, mut errors) = (new_hist(), 0);
    let deadline = tokio::time::Instant::now() + STOP_TIMEOUT;
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {
        let (h, e) = done?;
        hist.add(&h)?;
        errors += e;
    }
    if !tasks.is_empty() {
        eprintln!("baton: {} clients still busy after {STOP_TIMEOUT:?}; dropped", tasks.len());
    }
    Ok((hist, errors))
}

/// Deletes `/TAG` and the locks named `TAG*`, within [`CLEANUP_TIMEOUT`].
async fn cleanup(c: &Client, tag: &str) -> anyhow::Result<()> {
    let locks = format!("{RECIPE_ROOT}/locks");
    let work = async {
        let mut trees = vec![format!("/{tag}")];
        let kids = c.children(&locks).await.or_else(|e| if e.is_no_node() { Ok(Vec::new()) } else { Err(e) })?;
        trees.extend(kids.iter().filter(|k| k.starts_with(tag)).map(|k| child_path(&locks, k)));
        for t in &trees {
            match delete_tree(c, t).await {
                Err(e) if code_of(&e) != Some(ErrorKind::NoNode) => return Err(e),
                _ => {}
            }
        }
        anyhow::Ok(())
    };
    let left = format!("delete what is left with `baton rm -r /{tag}` and `baton rm -r {locks}/{tag}...`");
    match tokio::time::timeout(CLEANUP_TIMEOUT, work).await {
        Ok(r) => r.map_err(|e| e.context(format!("cleaning up after the benchmark: {left}"))),
        Err(_) => anyhow::bail!("cleaning up after the benchmark took over {CLEANUP_TIMEOUT:?}: {left}"),
    }
}
