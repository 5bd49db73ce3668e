//! The dimensions, one function each. Every one runs on a cluster the
//! caller started, grows one thing through its sizes, and returns one
//! [`Row`] per size. Every loop is bounded in count and in time.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use tokio::io::AsyncBufReadExt;
use tokio::sync::Notify;

use super::client::{Fired, Sc};
use super::cluster::{dir_bytes, metric, metrics, Scaled};
use super::{Dim, Row, ScaleOpts};
use crate::bench::{run_once, summarize, BenchWorkload, RunOpts};
use crate::targets::zookeeper::{line_value, zk_word};
use crate::targets::{Kind, Target, TargetClient};

/// Data of each node in the nodes dimension.
pub const NODE_BYTES: usize = 100;
/// Creates per multi when filling the tree.
const BATCH: usize = 100;
/// Sessions filling the tree at once.
const WRITERS: usize = 16;
/// Sessions opened at once (per process).
const OPEN_CONCURRENCY: usize = 128;
/// Tries to open one session.
const CONNECT_TRIES: u32 = 8;
/// Longest wait for a member to serve after a (re)start.
const SERVE_BOUND: Duration = Duration::from_secs(600);
/// Sessions the watches dimension spreads its registrations over.
const WATCH_SESSIONS: usize = 100;

const MB: f64 = 1024.0 * 1024.0;

fn row(target: Kind, dim: Dim, size: u64) -> Row {
    Row { target, dim, size, figures: BTreeMap::new(), notes: Vec::new(), date: None }
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static histogram bounds")
}

fn q_ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Puts the members' RSS (max and sum, MB) into `r` under `prefix`.
fn put_rss(r: &mut Row, t: &Scaled, prefix: &str) {
    let rss = t.rss();
    r.figures.insert(format!("{prefix}rss_mb_max"), rss.iter().copied().max().unwrap_or(0) as f64 / MB);
    r.figures.insert(format!("{prefix}rss_mb_sum"), rss.iter().sum::<u64>() as f64 / MB);
}

/// Opens `n` sessions, session i listing member i mod 3 first, and runs
/// `setup(i, &session)` on each; bounded by `bound`.
async fn open_sessions<F, Fut>(
    kind: Kind,
    endpoints: &[String],
    n: usize,
    ttl: Duration,
    bound: Duration,
    setup: F,
) -> anyhow::Result<Vec<Sc>>
where
    F: Fn(usize, Arc<Sc>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let go = futures::stream::iter(0..n)
        .map(|i| {
            let mut eps = endpoints.to_vec();
            let len = eps.len().max(1);
            eps.rotate_left(i % len);
            let setup = &setup;
            async move {
                let mut last = None;
                // Under the load of thousands of sessions opening, a
                // connect may time out: a few more tries, backing off.
                for attempt in 0..CONNECT_TRIES {
                    match Sc::connect(kind, &eps, ttl).await {
                        Ok(s) => {
                            let s = Arc::new(s);
                            setup(i, s.clone()).await?;
                            return Arc::into_inner(s).context("session still shared after setup");
                        }
                        Err(e) => {
                            last = Some(e);
                            tokio::time::sleep(Duration::from_millis(200 * (attempt as u64 + 1))).await;
                        }
                    }
                }
                Err(last.unwrap_or_else(|| anyhow::anyhow!("no attempt")).context(format!("opening session {i}")))
            }
        })
        .buffer_unordered(OPEN_CONCURRENCY)
        .collect::<Vec<anyhow::Result<Sc>>>();
    let all =
        tokio::time::timeout(bound, go).await.with_context(|| format!("opening {n} sessions took over {bound:?}"))?;
    all.into_iter().collect()
}

async fn close_all(sessions: Vec<Sc>) {
    let go = futures::stream::iter(sessions).map(|s| s.close()).buffer_unordered(OPEN_CONCURRENCY).collect::<Vec<()>>();
    let _ = tokio::time::timeout(Duration::from_secs(120), go).await;
}

/// Time from now until member `member` alone answers a linearizable read
/// of `path` with the node there (connecting again while it refuses).
async fn time_to_serve(t: &Scaled, member: usize, path: &str) -> anyhow::Result<f64> {
    let ep = vec![t.endpoints()[member].clone()];
    let start = Instant::now();
    while start.elapsed() < SERVE_BOUND {
        let attempt = async {
            let s = Sc::connect(t.kind(), &ep, Duration::from_secs(10)).await?;
            let seen = s.read(path).await;
            s.close().await;
            seen
        };
        if let Ok(Ok(true)) = tokio::time::timeout(Duration::from_secs(20), attempt).await {
            return Ok(start.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("member {} did not serve {path} within {SERVE_BOUND:?}", member + 1)
}

fn node_path(i: u64) -> String {
    format!("/scale/n/{i:08}")
}

/// Nodes: fills the tree to each size (cumulative) with one follower down,
/// then measures memory, disk, the snapshot, the lagging follower's catch-up
/// and a restart of it.
pub async fn nodes(t: &Scaled, o: &ScaleOpts, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let kind = t.kind();
    let eps = t.endpoints();
    let writers = open_sessions(kind, &eps, WRITERS, o.ttl, Duration::from_secs(60), |_, _| async { Ok(()) }).await?;
    writers[0].ensure("/scale/n").await?;
    let writers: Vec<Arc<Sc>> = writers.into_iter().map(Arc::new).collect();
    let mut sizes = o.nodes.clone();
    sizes.sort_unstable();
    let mut written = 0u64;
    for size in sizes.into_iter().filter(|s| *s > 0) {
        let leader = t.leader().await?;
        let lagger = (leader + 1) % 3;
        let mut r = row(kind, Dim::Nodes, size);
        eprintln!(
            "  [{}] nodes {size}: member {} down while writing {} nodes",
            kind.name(),
            lagger + 1,
            size - written
        );
        t.kill(lagger)?;
        let start = Instant::now();
        let next = Arc::new(AtomicU64::new(written));
        let deadline = start + o.step_bound;
        let mut tasks = Vec::new();
        for w in &writers {
            let (w, next) = (w.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let data = [b'n'; NODE_BYTES];
                loop {
                    if Instant::now() > deadline {
                        anyhow::bail!("filling the tree went past its time bound");
                    }
                    let from = next.fetch_add(BATCH as u64, Ordering::SeqCst);
                    if from >= size {
                        return Ok(());
                    }
                    let paths: Vec<String> = (from..(from + BATCH as u64).min(size)).map(node_path).collect();
                    let mut tries = 0;
                    while let Err(e) = w.create_batch(&paths, &data).await {
                        // A batch whose answer was lost may have been applied.
                        if w.read(&paths[0]).await.unwrap_or(false) {
                            break;
                        }
                        tries += 1;
                        if tries >= 5 {
                            return Err(e.context("a batch of creates kept failing"));
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }));
        }
        for task in tasks {
            task.await.context("writer panicked")??;
        }
        let write_s = start.elapsed().as_secs_f64();
        written = size;
        r.figures.insert("write_s".into(), write_s);
        r.figures.insert("writes_per_sec".into(), (size as f64 - written_before(rows)) / write_s.max(1e-9));
        let last = node_path(size - 1);
        // The lagging follower comes back.
        t.start_member(lagger)?;
        let catchup = time_to_serve(t, lagger, &last).await?;
        r.figures.insert("catchup_s".into(), catchup);
        // A restart of a caught-up member.
        tokio::time::sleep(Duration::from_secs(1)).await;
        t.kill(lagger)?;
        t.start_member(lagger)?;
        let restart = time_to_serve(t, lagger, &last).await?;
        r.figures.insert("restart_s".into(), restart);
        // After the catch-up: ZooKeeper writes a snapshot when a follower
        // syncs from one (and counts a multi as one transaction towards
        // snapCount, so filling with multis alone may never make one).
        if let Err(e) = snapshot(t, &mut r).await {
            r.notes.push(format!("snapshot not measured: {e:#}"));
        }
        put_rss(&mut r, t, "");
        let disk: Vec<u64> = (0..3).map(|m| dir_bytes(&t.data_dir(m))).collect();
        r.figures.insert("disk_mb_max".into(), disk.iter().copied().max().unwrap_or(0) as f64 / MB);
        eprintln!("  [{}] nodes {size}: {}", kind.name(), brief(&r));
        rows.push(r);
    }
    for w in writers {
        if let Some(w) = Arc::into_inner(w) {
            w.close().await;
        }
    }
    Ok(())
}

fn written_before(rows: &[Row]) -> f64 {
    rows.last().map(|r| r.size as f64).unwrap_or(0.0)
}

/// The snapshot figures: Baton's `snapshot save` (the whole state after a
/// ReadIndex, from one member: bytes and seconds; each member is asked in
/// turn until one answers) and the mean time of the Raft snapshots the
/// leader made (/metrics); ZooKeeper's largest snapshot file in any
/// member's data dir and the longest snapshot any member took (`mntr`);
/// etcd's Maintenance Snapshot RPC (what `etcdctl snapshot save` calls:
/// the member's whole backend streamed to the client: bytes and seconds,
/// each member asked in turn until one answers).
async fn snapshot(t: &Scaled, r: &mut Row) -> anyhow::Result<()> {
    match t {
        Scaled::Baton(b) => {
            let mut errors = Vec::new();
            for ep in t.endpoints() {
                let cfg = baton_client::ClientConfig::new(vec![ep.clone()]).op_timeout(Duration::from_secs(300));
                let start = Instant::now();
                match baton_client::admin::snapshot_save(&cfg).await {
                    Ok((bytes, _)) => {
                        r.figures.insert("snapshot_s".into(), start.elapsed().as_secs_f64());
                        r.figures.insert("snapshot_mb".into(), bytes.len() as f64 / MB);
                        errors.clear();
                        break;
                    }
                    Err(e) => errors.push(format!("{ep}: {e}")),
                }
            }
            let leader = t.leader().await?;
            if let Ok(text) = metrics(b, leader).await {
                let sum = metric(&text, "baton_snapshot_seconds_sum{kind=\"made\"}");
                let count = metric(&text, "baton_snapshot_seconds_count{kind=\"made\"}");
                if let (Some(s), Some(c)) = (sum, count) {
                    if c > 0.0 {
                        r.figures.insert("raft_snapshot_mean_s".into(), s / c);
                    }
                }
            }
            if !errors.is_empty() {
                anyhow::bail!("snapshot save failed on every member: {}", errors.join("; "));
            }
        }
        Scaled::Zk(_) => {
            let mut largest = 0u64;
            let mut longest_ms = None::<f64>;
            for m in 0..3 {
                let dir = t.data_dir(m).join("version-2");
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    if e.file_name().to_string_lossy().starts_with("snapshot.") {
                        largest = largest.max(e.metadata().map(|m| m.len()).unwrap_or(0));
                    }
                }
                if let Ok(text) = zk_word(&t.endpoints()[m], "mntr", Duration::from_secs(3)).await {
                    if let Some(ms) = line_value(&text, "zk_max_snapshottime").and_then(|v| v.parse::<f64>().ok()) {
                        longest_ms = Some(longest_ms.unwrap_or(0.0).max(ms));
                    }
                }
            }
            r.figures.insert("snapshot_mb".into(), largest as f64 / MB);
            if let Some(ms) = longest_ms {
                r.figures.insert("snapshot_s".into(), ms / 1000.0);
            }
        }
        Scaled::Etcd(_) => {
            let mut errors = Vec::new();
            for ep in t.endpoints() {
                let start = Instant::now();
                match tokio::time::timeout(Duration::from_secs(300), etcd_snapshot_bytes(&ep)).await {
                    Ok(Ok(bytes)) => {
                        r.figures.insert("snapshot_s".into(), start.elapsed().as_secs_f64());
                        r.figures.insert("snapshot_mb".into(), bytes as f64 / MB);
                        return Ok(());
                    }
                    Ok(Err(e)) => errors.push(format!("{ep}: {e:#}")),
                    Err(_) => errors.push(format!("{ep}: over 300 s")),
                }
            }
            anyhow::bail!("snapshot failed on every member: {}", errors.join("; "));
        }
    }
    Ok(())
}

/// Streams member `endpoint`'s backend to this side (the bytes are
/// counted, not kept) and returns how many there were.
async fn etcd_snapshot_bytes(endpoint: &str) -> anyhow::Result<u64> {
    use crate::targets::etcd::{connect_with, POLITE_KEEPALIVE};
    let mut c = connect_with(endpoint, POLITE_KEEPALIVE).await?;
    let mut stream = c.snapshot().await?;
    let mut bytes = 0u64;
    while let Some(part) = stream.message().await? {
        bytes += part.blob().len() as u64;
    }
    if bytes == 0 {
        anyhow::bail!("empty snapshot");
    }
    Ok(bytes)
}

/// Sessions: `n` live sessions, each with an ephemeral node, keeping
/// alive for `o.interval`: CPU and RSS per member; then a sample of
/// sessions in a child process is killed -9 and each ephemeral's removal
/// is timed against the session timeout. The live sessions are held by
/// child processes of at most [`SESSIONS_PER_PROCESS`] each (a process's
/// open-file limit here is 20,000).
pub async fn sessions(t: &Scaled, o: &ScaleOpts, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let kind = t.kind();
    let eps = t.endpoints();
    let watcher = Sc::connect(kind, &eps, o.ttl).await?;
    for &n in &o.sessions {
        let mut r = row(kind, Dim::Sessions, n);
        let procs = (n as usize).div_ceil(SESSIONS_PER_PROCESS).max(1);
        eprintln!("  [{}] sessions {n}: opening them in {procs} process(es)", kind.name());
        let start = Instant::now();
        let spawned = futures::future::join_all((0..procs).map(|j| {
            let count = n as usize / procs + usize::from(j < n as usize % procs);
            spawn_sessions(t, o, format!("/scale/s{n}/p{j}"), count)
        }))
        .await;
        let mut holders = Vec::new();
        let mut failed = None;
        for h in spawned {
            match h {
                Ok(h) => holders.push(h),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            release(holders).await;
            return Err(e.context(format!("opening {n} sessions")));
        }
        r.figures.insert("open_s".into(), start.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (c0, t0) = (t.cpu(), Instant::now());
        tokio::time::sleep(o.interval).await;
        let (c1, secs) = (t.cpu(), t0.elapsed().as_secs_f64());
        let pct: Vec<f64> = c0.iter().zip(&c1).map(|(a, b)| (b - a) / secs * 100.0).collect();
        r.figures.insert("cpu_pct_sum".into(), pct.iter().sum());
        r.figures.insert("cpu_pct_max".into(), pct.iter().copied().fold(0.0, f64::max));
        put_rss(&mut r, t, "");
        let sample = o.expiry_sample.min(n as usize).max(1);
        match expiry(t, o, &watcher, &format!("/scale/x{n}"), sample).await {
            Ok(late) => {
                r.figures.insert("expired".into(), late.len() as f64);
                let mut h = hist();
                // Lateness past the timeout; an early removal counts as 0 late
                // (the session was last heard up to TTL/3 before the kill).
                let mut early = 0.0f64;
                for ms in &late {
                    early = early.max(-ms);
                    let _ = h.record((ms.max(0.0) * 1000.0) as u64 + 1);
                }
                r.figures.insert("expiry_late_p50_ms".into(), q_ms(&h, 0.5));
                r.figures.insert("expiry_late_p99_ms".into(), q_ms(&h, 0.99));
                r.figures.insert("expiry_late_max_ms".into(), q_ms(&h, 1.0));
                r.figures.insert("expiry_early_max_ms".into(), early);
                if late.len() < sample {
                    r.notes.push(format!("{} of {sample} dead sessions' ephemerals never went", sample - late.len()));
                }
            }
            Err(e) => r.notes.push(format!("expiry not measured: {e:#}")),
        }
        eprintln!("  [{}] sessions {n}: {}", kind.name(), brief(&r));
        release(holders).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        rows.push(r);
    }
    watcher.close().await;
    Ok(())
}

/// Live sessions one `scale-sessions` child holds at most.
const SESSIONS_PER_PROCESS: usize = 15_000;

/// Starts `baton-bench scale-sessions` with `count` sessions whose
/// ephemerals live under `dir`; returns once it says they all exist. It
/// closes them and exits when its stdin closes ([`release`]), or dies with
/// them on kill -9.
async fn spawn_sessions(t: &Scaled, o: &ScaleOpts, dir: String, count: usize) -> anyhow::Result<tokio::process::Child> {
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .arg("scale-sessions")
        .arg(format!("--target={}", t.kind().name()))
        .arg(format!("--endpoints={}", t.endpoints().join(",")))
        .arg(format!("--dir={dir}"))
        .arg(format!("--count={count}"))
        .arg(format!("--ttl-ms={}", o.ttl.as_millis()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting scale-sessions")?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(o.step_bound, async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.trim() == "ready" {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if !ready {
        let _ = child.kill().await;
        anyhow::bail!("a scale-sessions child ({count} sessions under {dir}) never said ready");
    }
    Ok(child)
}

/// Closes the children's stdin (they close their sessions and exit);
/// kills any still there after 120 s.
async fn release(children: Vec<tokio::process::Child>) {
    let waits = children.into_iter().map(|mut c| async move {
        drop(c.stdin.take());
        if tokio::time::timeout(Duration::from_secs(120), c.wait()).await.is_err() {
            let _ = c.kill().await;
        }
    });
    futures::future::join_all(waits).await;
}

/// A `scale-sessions` child of `count` sessions under `dir`, killed -9
/// once they exist; returns each ephemeral's removal time after the kill
/// minus the session timeout (ms; negative: removed before a whole timeout
/// had passed since the kill).
async fn expiry(t: &Scaled, o: &ScaleOpts, watcher: &Sc, dir: &str, count: usize) -> anyhow::Result<Vec<f64>> {
    let mut child = spawn_sessions(t, o, dir.to_string(), count).await?;
    let mut left: std::collections::BTreeSet<String> = watcher.children(dir).await?.into_iter().collect();
    let expected = left.len();
    let killed = Instant::now();
    child.start_kill()?;
    let _ = child.wait().await;
    let mut late = Vec::new();
    let deadline = killed + o.ttl + Duration::from_secs(60);
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let Ok(now) = watcher.children(dir).await else { continue };
        let at = killed.elapsed();
        let now: std::collections::BTreeSet<String> = now.into_iter().collect();
        let gone: Vec<String> = left.difference(&now).cloned().collect();
        for g in gone {
            left.remove(&g);
            late.push(at.as_secs_f64() * 1000.0 - o.ttl.as_secs_f64() * 1000.0);
        }
    }
    if expected == 0 {
        anyhow::bail!("the session child's ephemerals were not there");
    }
    Ok(late)
}

/// `scale-sessions` (a child of the sessions dimension): `count` sessions,
/// each with an ephemeral `dir/<i>`; says `ready`, then holds them until
/// its stdin closes (then closes them) or it is killed.
pub async fn dying_sessions(
    kind: Kind,
    endpoints: Vec<String>,
    dir: &str,
    count: usize,
    ttl: Duration,
) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt as _;
    {
        let s = Sc::connect(kind, &endpoints, ttl).await?;
        s.ensure(dir).await?;
        s.close().await;
    }
    let dir = dir.to_string();
    let live = open_sessions(kind, &endpoints, count, ttl, Duration::from_secs(900), |i, s| {
        let path = format!("{dir}/{i}");
        async move { s.create_ephemeral(&path).await }
    })
    .await?;
    println!("ready");
    use std::io::Write as _;
    std::io::stdout().flush()?;
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3600), tokio::io::stdin().read_to_end(&mut sink)).await;
    close_all(live).await;
    Ok(())
}

/// Watches: `n` one-shot exists-watches on missing nodes, spread over
/// [`WATCH_SESSIONS`] sessions: the time to register them and the members'
/// RSS with them in place.
pub async fn watches(t: &Scaled, o: &ScaleOpts, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let kind = t.kind();
    let eps = t.endpoints();
    for &n in &o.watches {
        let mut r = row(kind, Dim::Watches, n);
        let per = Arc::new(Mutex::new(Vec::<Fired>::new()));
        let sessions_n = WATCH_SESSIONS.min(n as usize).max(1);
        let before = t.rss();
        let start = Instant::now();
        let per2 = per.clone();
        let live = open_sessions(kind, &eps, sessions_n, o.ttl, o.step_bound, |i, s| {
            let per = per2.clone();
            async move {
                let mine = (n as usize / sessions_n) + usize::from(i < n as usize % sessions_n);
                let fired: Vec<anyhow::Result<Fired>> = futures::stream::iter(0..mine)
                    .map(|j| {
                        let s = s.clone();
                        async move { s.watch(&format!("/scale/w{n}/{i}-{j}")).await }
                    })
                    .buffer_unordered(32)
                    .collect()
                    .await;
                let fired: Vec<Fired> = fired.into_iter().collect::<anyhow::Result<_>>()?;
                per.lock().unwrap_or_else(|p| p.into_inner()).extend(fired);
                Ok(())
            }
        })
        .await?;
        let secs = start.elapsed().as_secs_f64();
        let registered = per.lock().unwrap_or_else(|p| p.into_inner()).len();
        r.figures.insert("register_s".into(), secs);
        r.figures.insert("registered".into(), registered as f64);
        r.figures.insert("watches_per_sec".into(), registered as f64 / secs.max(1e-9));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = t.rss();
        put_rss(&mut r, t, "");
        let growth = before.iter().zip(&after).map(|(a, b)| b.saturating_sub(*a)).max().unwrap_or(0);
        r.figures.insert("rss_growth_mb_max".into(), growth as f64 / MB);
        eprintln!("  [{}] watches {n}: {}", kind.name(), brief(&r));
        per.lock().unwrap_or_else(|p| p.into_inner()).clear();
        close_all(live).await;
        rows.push(r);
    }
    Ok(())
}

/// Fan-out: `n` sessions each with an exists-watch on one node, one write
/// to it, and the time until every watcher has its event.
pub async fn fanout(t: &Scaled, o: &ScaleOpts, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let kind = t.kind();
    let eps = t.endpoints();
    for &n in &o.watchers {
        let mut r = row(kind, Dim::Fanout, n);
        let path = format!("/scale/fan{n}");
        let writer = Sc::connect(kind, &eps, o.ttl).await?;
        writer.ensure(&path).await?;
        let fired = Arc::new(Mutex::new(Vec::<Fired>::new()));
        let f2 = fired.clone();
        let p2 = path.clone();
        let live = open_sessions(kind, &eps, n as usize, o.ttl, o.step_bound, |_, s| {
            let (fired, path) = (f2.clone(), p2.clone());
            async move {
                let w = s.watch(&path).await?;
                fired.lock().unwrap_or_else(|p| p.into_inner()).push(w);
                Ok(())
            }
        })
        .await?;
        let mut pending: FuturesUnordered<Fired> =
            std::mem::take(&mut *fired.lock().unwrap_or_else(|p| p.into_inner())).into_iter().collect();
        let expected = pending.len();
        let start = Instant::now();
        writer.set(&path, b"fan").await?;
        let mut h = hist();
        let mut delivered = 0usize;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while delivered < expected {
            match tokio::time::timeout_at(deadline, pending.next()).await {
                Ok(Some(())) => {
                    delivered += 1;
                    let _ = h.record(start.elapsed().as_micros() as u64 + 1);
                }
                Ok(None) | Err(_) => break,
            }
        }
        r.figures.insert("delivered".into(), delivered as f64);
        r.figures.insert("all_ms".into(), q_ms(&h, 1.0));
        r.figures.insert("p50_ms".into(), q_ms(&h, 0.5));
        r.figures.insert("p99_ms".into(), q_ms(&h, 0.99));
        put_rss(&mut r, t, "");
        if delivered < expected {
            r.notes.push(format!("{} of {expected} watchers had no event within 60 s", expected - delivered));
        }
        eprintln!("  [{}] fanout {n}: {}", kind.name(), brief(&r));
        drop(pending);
        writer.close().await;
        close_all(live).await;
        rows.push(r);
    }
    Ok(())
}

/// Waiter wake-ups in this process so far (every lock client of the run
/// lives here): Baton's lock recipe counts them, and so does the
/// ZooKeeper adapter's. None for etcd: its waiters wait inside the server.
fn wakeups(kind: Kind) -> Option<u64> {
    match kind {
        Kind::Baton => Some(baton_client::recipes::lock::total_wakeups()),
        Kind::Zookeeper | Kind::BatonZk => Some(crate::targets::zookeeper::wakeups()),
        Kind::Etcd => None,
    }
}

/// The note on an etcd lock row, in place of the wake-up figures.
pub const ETCD_WAKEUPS_NOTE: &str = "wake-ups not counted: etcd's Lock RPC waits inside the server \
     (concurrency.Mutex: each waiter watches the key just before its own), so the client sees only the grant; \
     the one-wake-up-per-release check is Baton's and ZooKeeper's only";

struct LockShared {
    stop: AtomicBool,
    stopped: Notify,
    measuring: AtomicBool,
    /// When the holder began its release (None: no release pending).
    released: Mutex<Option<Instant>>,
    releases: AtomicU64,
    hist: Mutex<Histogram<u64>>,
}

/// Lock queues: `n` clients on one lock, each taking it, releasing at
/// once and queueing again. Handoff = the holder's release began → the
/// next holder's `lock` returned. Herd: wake-ups per release (not on etcd).
pub async fn locks(t: &Scaled, o: &ScaleOpts, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    match t {
        Scaled::Baton(b) => locks_on(b.clone(), o, rows).await,
        Scaled::Zk(z) => locks_on(z.clone(), o, rows).await,
        Scaled::Etcd(e) => locks_on(e.clone(), o, rows).await,
    }
}

async fn locks_on<T: Target>(target: Arc<T>, o: &ScaleOpts, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let kind = target.kind();
    for &n in &o.waiters {
        let mut r = row(kind, Dim::Locks, n);
        let name = format!("scale-{n}-{:08x}", rand::random::<u32>());
        let sh = Arc::new(LockShared {
            stop: AtomicBool::new(false),
            stopped: Notify::new(),
            measuring: AtomicBool::new(false),
            released: Mutex::new(None),
            releases: AtomicU64::new(0),
            hist: Mutex::new(hist()),
        });
        let clients: Vec<anyhow::Result<T::Client>> = futures::stream::iter(0..n as usize)
            .map(|i| target.connect(i % 3, o.ttl))
            .buffer_unordered(OPEN_CONCURRENCY)
            .collect()
            .await;
        let clients: Vec<T::Client> = clients.into_iter().collect::<anyhow::Result<_>>()?;
        let mut tasks = Vec::new();
        for c in clients {
            let (sh, name) = (sh.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let mut errors = 0u64;
                while !sh.stop.load(Ordering::SeqCst) && errors < 100 {
                    let stopped = async {
                        loop {
                            let n = sh.stopped.notified();
                            if sh.stop.load(Ordering::SeqCst) {
                                return;
                            }
                            n.await;
                        }
                    };
                    let held = tokio::select! {
                        h = c.lock(&name) => h,
                        _ = stopped => break,
                    };
                    let Ok(held) = held else {
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let now = Instant::now();
                    if let Some(rel) = sh.released.lock().unwrap_or_else(|p| p.into_inner()).take() {
                        if sh.measuring.load(Ordering::SeqCst) {
                            let us = now.duration_since(rel).as_micros() as u64 + 1;
                            let _ = sh.hist.lock().unwrap_or_else(|p| p.into_inner()).record(us);
                        }
                    }
                    *sh.released.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                    if sh.measuring.load(Ordering::SeqCst) {
                        sh.releases.fetch_add(1, Ordering::SeqCst);
                    }
                    if c.unlock(held).await.is_err() {
                        errors += 1;
                    }
                }
                let _ = tokio::time::timeout(Duration::from_secs(5), c.close()).await;
            }));
        }
        // Every waiter queued (or a bound), then the measured window.
        tokio::time::sleep(Duration::from_secs(1) + Duration::from_millis(2 * n)).await;
        let w0 = wakeups(kind);
        sh.measuring.store(true, Ordering::SeqCst);
        tokio::time::sleep(o.lock_window).await;
        sh.measuring.store(false, Ordering::SeqCst);
        let woke = wakeups(kind).zip(w0).map(|(w1, w0)| w1.saturating_sub(w0));
        let releases = sh.releases.load(Ordering::SeqCst);
        sh.stop.store(true, Ordering::SeqCst);
        sh.stopped.notify_waiters();
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        let h = sh.hist.lock().unwrap_or_else(|p| p.into_inner()).clone();
        r.figures.insert("handoffs".into(), h.len() as f64);
        r.figures.insert("handoffs_per_sec".into(), h.len() as f64 / o.lock_window.as_secs_f64().max(1e-9));
        r.figures.insert("handoff_p50_ms".into(), q_ms(&h, 0.5));
        r.figures.insert("handoff_p99_ms".into(), q_ms(&h, 0.99));
        r.figures.insert("releases".into(), releases as f64);
        match woke {
            Some(woke) => {
                r.figures.insert("wakeups".into(), woke as f64);
                r.figures.insert("wakeups_per_release".into(), woke as f64 / (releases.max(1)) as f64);
            }
            None => r.notes.push(ETCD_WAKEUPS_NOTE.into()),
        }
        eprintln!("  [{}] locks {n} waiters: {}", kind.name(), brief(&r));
        rows.push(r);
    }
    Ok(())
}

/// Clients: bench.rs's loop for `write` and `lock-independent` with each
/// client count, `o.runs` runs each.
pub async fn clients(t: &Scaled, o: &ScaleOpts, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    match t {
        Scaled::Baton(b) => clients_on(b.clone(), o, rows).await,
        Scaled::Zk(z) => clients_on(z.clone(), o, rows).await,
        Scaled::Etcd(e) => clients_on(e.clone(), o, rows).await,
    }
}

async fn clients_on<T: Target>(target: Arc<T>, o: &ScaleOpts, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let kind = target.kind();
    for &n in &o.clients {
        let mut r = row(kind, Dim::Clients, n);
        for (w, key) in [(BenchWorkload::Write, "write"), (BenchWorkload::LockIndependent, "lock")] {
            let mut runs = Vec::new();
            for i in 0..o.runs.max(1) {
                let dir: PathBuf = o.out.join(format!("{}-clients-{n}-{key}-{i}", kind.name()));
                std::fs::create_dir_all(&dir)?;
                let ro = RunOpts {
                    workload: w,
                    clients: n as usize,
                    warmup: Duration::from_secs(1),
                    duration: o.duration,
                    dir,
                    member_offset: i,
                    rate: None,
                };
                runs.push(run_once(target.clone(), &ro).await?);
            }
            let s = summarize(kind, w, n as usize, runs);
            r.figures.insert(format!("{key}_ops_per_sec"), s.ops_per_sec);
            r.figures.insert(format!("{key}_ops_per_sec_min"), s.ops_per_sec_min);
            r.figures.insert(format!("{key}_ops_per_sec_max"), s.ops_per_sec_max);
            r.figures.insert(format!("{key}_p50_ms"), s.p50_ms);
            r.figures.insert(format!("{key}_p99_ms"), s.p99_ms);
            let p99s: Vec<f64> = s.per_run.iter().map(|x| x.p99_ms).collect();
            r.figures.insert(format!("{key}_p99_ms_min"), p99s.iter().copied().fold(f64::INFINITY, f64::min));
            r.figures.insert(format!("{key}_p99_ms_max"), p99s.iter().copied().fold(0.0, f64::max));
        }
        eprintln!("  [{}] clients {n}: {}", kind.name(), brief(&r));
        rows.push(r);
    }
    Ok(())
}

/// One line of a row's figures for the progress output.
fn brief(r: &Row) -> String {
    r.figures.iter().map(|(k, v)| format!("{k} {}", super::fmt_num(*v))).collect::<Vec<_>>().join(", ")
}
