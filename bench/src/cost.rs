//! What one operation costs a Baton cluster (issue 26, "measure first"):
//! `baton-bench cost --workload W` runs W once on a fresh 3-member
//! cluster and divides, by the operations it measured, what the members
//! and this client process spent meanwhile:
//! - CPU µs (utime + stime, /proc/PID/stat) of the three members together,
//!   and of this process (the clients);
//! - voluntary context switches (every thread of the three members,
//!   /proc/PID/task/*/status), each a wake-up on some thread;
//! - fsyncs (`baton_fsync_seconds_count`), peer messages by type
//!   (`baton_peer_messages_sent_total`, one frame each), socket writes of
//!   peer frames (`baton_peer_flushes_total`) and Readies with new entries
//!   (`baton_ready_entries_count`), summed over the members' /metrics.
//! - lock-contended only: the hand-off as the clients see it
//!   ([`crate::bench::Handoff`]): grant to next grant, the holder's release
//!   round trip, and from that release returning to the next grant.
//!
//! The samples are taken right before and right after the measured
//! seconds (after the warm-up), so set-up and shutdown are not counted;
//! the clients' idle keepalives and the members' ticks are (over ~10 s and
//! thousands of operations they are a small share; a run with few
//! operations says so in its figures). CPU time is counted in the
//! kernel's clock ticks (10 ms): a run needs seconds of CPU to be exact
//! to a few percent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::bench::{run_once, BenchWorkload, Handoff, RunFigures, RunOpts};
use crate::scale::cluster::{metrics, Scalable};
use crate::targets::baton::{BatonOpts, BatonTarget};
use crate::targets::Target;

/// Counters at one moment.
#[derive(Debug, Default, Clone)]
pub struct Sample {
    member_cpu_us: f64,
    client_cpu_us: f64,
    member_switches: f64,
    /// Per kind of member thread (its name, digits and a trailing `-N`
    /// dropped), summed over the members: (CPU µs, voluntary switches).
    threads: BTreeMap<String, (f64, f64)>,
    /// Summed over the members: name (with labels) -> value.
    metrics: BTreeMap<String, f64>,
}

/// Per operation, between two samples.
#[derive(Debug, Clone)]
pub struct Cost {
    pub ops: u64,
    pub ops_per_sec: f64,
    pub member_cpu_us: f64,
    pub client_cpu_us: f64,
    pub member_switches: f64,
    pub fsyncs: f64,
    pub readies_with_entries: f64,
    pub peer_flushes: f64,
    /// Peer messages per type, and their sum.
    pub peer_messages: BTreeMap<String, f64>,
    pub peer_messages_total: f64,
    /// Per kind of member thread: (CPU µs, voluntary switches) per op.
    pub threads: BTreeMap<String, (f64, f64)>,
    /// Over the measured run, not per op: fsyncs (3 members) slower than
    /// 10, 25, 50 and 100 ms ([`SLOW_FSYNC_MS`]).
    pub slow_fsyncs: Vec<(u32, f64)>,
    /// The run's latencies (ms): p50, p99, p99.9.
    pub latency_ms: (f64, f64, f64),
    /// lock-contended: where a hand-off's time goes, from the clients.
    pub handoff: Option<Handoff>,
}

/// The thresholds of [`Cost::slow_fsyncs`]: bucket bounds of
/// `baton_fsync_seconds` (server/src/metrics.rs SECONDS_BUCKETS).
pub const SLOW_FSYNC_MS: [u32; 4] = [10, 25, 50, 100];

/// Which series are kept from /metrics.
const KEPT: [&str; 5] = [
    "baton_fsync_seconds_count",
    "baton_fsync_seconds_bucket",
    "baton_ready_entries_count",
    "baton_peer_flushes_total",
    "baton_peer_messages_sent_total",
];

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of `pid` ("self" for this process), in µs; 0 when it
/// cannot be read (the process is gone).
pub(crate) fn cpu_us(pid: &str) -> f64 {
    stat_cpu_us(&format!("/proc/{pid}/stat"))
}

/// utime + stime from a `/proc/.../stat` file, in µs.
fn stat_cpu_us(path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else { return 0.0 };
    // Fields after the command name, which is in parentheses and may hold
    // spaces: utime and stime are the 14th and 15th fields.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // `rest` starts at field 3 (state): field n is f[n - 3].
    (ticks(11) + ticks(12)) * 1e6 / clock_ticks()
}

/// Voluntary context switches of every thread of `pid`.
fn switches(pid: i32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| s.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:")?.trim().parse::<f64>().ok()))
        .sum()
}

/// A thread's kind: its name without digits and a trailing `-`/`:`
/// part that numbers it (`tokio-runtime-w`, `baton-syncer`, `rocksdb:low`).
fn thread_kind(comm: &str) -> String {
    let k: String = comm.trim().chars().filter(|c| !c.is_ascii_digit()).collect();
    k.trim_end_matches(['-', ':', '#']).to_string()
}

/// (CPU µs, voluntary switches) of each kind of `pid`'s threads, added into `into`.
fn add_threads(pid: i32, into: &mut BTreeMap<String, (f64, f64)>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for t in tasks.flatten() {
        let p = t.path();
        let Ok(comm) = std::fs::read_to_string(p.join("comm")) else { continue };
        let cpu = stat_cpu_us(&p.join("stat").to_string_lossy());
        let sw = std::fs::read_to_string(p.join("status"))
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:")?.trim().parse::<f64>().ok())
            })
            .unwrap_or(0.0);
        let e = into.entry(thread_kind(&comm)).or_default();
        e.0 += cpu;
        e.1 += sw;
    }
}

/// The kept series of one member's /metrics text, added into `into`.
fn add_metrics(text: &str, into: &mut BTreeMap<String, f64>) {
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        if !KEPT.iter().any(|k| series.starts_with(k)) {
            continue;
        }
        if let Ok(v) = value.trim().parse::<f64>() {
            *into.entry(series.to_string()).or_default() += v;
        }
    }
}

/// The counters now.
pub async fn sample(t: &BatonTarget) -> anyhow::Result<Sample> {
    let mut s = Sample { client_cpu_us: cpu_us("self"), ..Default::default() };
    for m in 0..3 {
        let pid = t.pid(m).with_context(|| format!("member {m} has no process"))?;
        s.member_cpu_us += cpu_us(&pid.to_string());
        s.member_switches += switches(pid);
        add_threads(pid, &mut s.threads);
        add_metrics(&metrics(t, m).await?, &mut s.metrics);
    }
    Ok(s)
}

/// `after - before`, per operation of `run`.
pub fn per_op(before: &Sample, after: &Sample, run: &RunFigures) -> Cost {
    let ops = run.ops.max(1) as f64;
    let d = |name: &str| {
        let sum = |s: &Sample| s.metrics.iter().filter(|(k, _)| k.starts_with(name)).map(|(_, v)| v).sum::<f64>();
        (sum(after) - sum(before)) / ops
    };
    let mut peer_messages = BTreeMap::new();
    for (k, v) in &after.metrics {
        if let Some(labels) = k.strip_prefix("baton_peer_messages_sent_total") {
            let kind = labels.split('"').nth(1).unwrap_or(labels).to_string();
            let was = before.metrics.get(k).copied().unwrap_or(0.0);
            peer_messages.insert(kind, (v - was) / ops);
        }
    }
    let threads = after
        .threads
        .iter()
        .map(|(k, (c, w))| {
            let (c0, w0) = before.threads.get(k).copied().unwrap_or_default();
            (k.clone(), ((c - c0) / ops, (w - w0) / ops))
        })
        .collect();
    Cost {
        threads,
        ops: run.ops,
        ops_per_sec: run.ops_per_sec,
        member_cpu_us: (after.member_cpu_us - before.member_cpu_us) / ops,
        client_cpu_us: (after.client_cpu_us - before.client_cpu_us) / ops,
        member_switches: (after.member_switches - before.member_switches) / ops,
        fsyncs: d("baton_fsync_seconds_count"),
        readies_with_entries: d("baton_ready_entries_count"),
        peer_flushes: d("baton_peer_flushes_total"),
        peer_messages_total: peer_messages.values().sum(),
        peer_messages,
        slow_fsyncs: SLOW_FSYNC_MS.iter().map(|ms| (*ms, slow_fsyncs(before, after, *ms))).collect(),
        latency_ms: (run.p50_ms, run.p99_ms, run.p999_ms.unwrap_or(0.0)),
        handoff: run.handoff,
    }
}

/// fsyncs slower than `ms` between two samples: the count less those in
/// the bucket up to `ms`.
fn slow_fsyncs(before: &Sample, after: &Sample, ms: u32) -> f64 {
    let le = format!("baton_fsync_seconds_bucket{{le=\"{}\"}}", f64::from(ms) / 1000.0);
    let at = |s: &Sample| {
        let get = |k: &str| s.metrics.get(k).copied().unwrap_or(0.0);
        get("baton_fsync_seconds_count") - get(&le)
    };
    (at(after) - at(before)).max(0.0)
}

/// Starts a cluster with /metrics, runs `workload` once with `clients`,
/// and returns its cost per operation.
pub async fn measure(
    dir: &std::path::Path,
    workload: BenchWorkload,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    rate: Option<f64>,
) -> anyhow::Result<Cost> {
    let t = Arc::new(BatonTarget::start_opts(dir, BatonOpts { http: true, ..BatonOpts::default() }).await?);
    let o =
        RunOpts { workload, clients, warmup: Duration::ZERO, duration, dir: dir.to_path_buf(), member_offset: 0, rate };
    // The warm-up as a run of its own, unmeasured; then the measured run.
    let warm = RunOpts { duration: warmup, ..o.clone() };
    run_once(t.clone(), &warm).await?;
    let before = sample(&t).await?;
    let run = run_once(t.clone(), &o).await?;
    let after = sample(&t).await?;
    t.stop();
    Ok(per_op(&before, &after, &run))
}

/// The table `cost` prints (Markdown).
pub fn table(workload: BenchWorkload, clients: usize, c: &Cost) -> String {
    let mut out = format!(
        "{} with {clients} clients: {} ops in the measured run, {:.0} ops/s\n\n| per operation | value |\n|---|---|\n",
        workload.name(),
        c.ops,
        c.ops_per_sec
    );
    let mut row = |k: &str, v: f64| out.push_str(&format!("| {k} | {v:.2} |\n"));
    row("member CPU µs (3 members)", c.member_cpu_us);
    row("client CPU µs (this process)", c.client_cpu_us);
    row("voluntary context switches (3 members)", c.member_switches);
    row("fsyncs (3 members)", c.fsyncs);
    row("Readies with new entries (3 members)", c.readies_with_entries);
    row("peer messages (3 members)", c.peer_messages_total);
    row("peer socket writes (3 members)", c.peer_flushes);
    let (p50, p99, p999) = c.latency_ms;
    out.push_str(&format!("| latency p50 / p99 / p99.9 ms | {p50:.2} / {p99:.2} / {p999:.2} |\n"));
    if let Some(h) = &c.handoff {
        let mut pair =
            |k: &str, (p50, p90): (f64, f64)| out.push_str(&format!("| {k}, p50 / p90 µs | {p50:.0} / {p90:.0} |\n"));
        pair("hand-off: grant to the next grant", h.period_us);
        pair("hand-off: the holder's release round trip", h.release_us);
        pair("hand-off: release returned to the next grant", h.to_next_us);
    }
    for (ms, n) in &c.slow_fsyncs {
        out.push_str(&format!("| fsyncs over {ms} ms in the run (3 members, not per op) | {n:.0} |\n"));
    }
    for (k, v) in &c.peer_messages {
        if *v >= 0.005 {
            out.push_str(&format!("| peer messages: {k} | {v:.2} |\n"));
        }
    }
    out.push_str("\n| member threads (3 members) | CPU µs per op | switches per op |\n|---|---|---|\n");
    for (k, (cpu, sw)) in &c.threads {
        if *cpu >= 0.05 || *sw >= 0.005 {
            out.push_str(&format!("| {k} | {cpu:.1} | {sw:.2} |\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slow fsyncs are the count less the bucket up to the threshold,
    /// between the two samples, as the exporter writes the buckets.
    #[test]
    fn slow_fsyncs_come_from_the_buckets() {
        let text = |count: u32, le10: u32, le50: u32| {
            format!(
                "baton_fsync_seconds_bucket{{le=\"0.01\"}} {le10}\nbaton_fsync_seconds_bucket{{le=\"0.025\"}} {le10}\n\
                 baton_fsync_seconds_bucket{{le=\"0.05\"}} {le50}\nbaton_fsync_seconds_bucket{{le=\"0.1\"}} {count}\n\
                 baton_fsync_seconds_bucket{{le=\"+Inf\"}} {count}\nbaton_fsync_seconds_count {count}\n"
            )
        };
        let (mut before, mut after) = (Sample::default(), Sample::default());
        // Before: 100 fsyncs, 2 over 10 ms. After: 1,100, of which 5 more
        // over 10 ms and 3 more over 50 ms (all under 100 ms).
        add_metrics(&text(100, 98, 100), &mut before.metrics);
        add_metrics(&text(1100, 1093, 1097), &mut after.metrics);
        assert_eq!(slow_fsyncs(&before, &after, 10), 5.0);
        assert_eq!(slow_fsyncs(&before, &after, 25), 5.0);
        assert_eq!(slow_fsyncs(&before, &after, 50), 3.0);
        assert_eq!(slow_fsyncs(&before, &after, 100), 0.0);
    }

    #[test]
    fn per_op_divides_the_difference_and_splits_messages_by_type() {
        let mut before =
            Sample { member_cpu_us: 1000.0, client_cpu_us: 10.0, member_switches: 5.0, ..Default::default() };
        add_metrics(
            "# HELP x\nbaton_fsync_seconds_count 10\nbaton_peer_messages_sent_total{type=\"append\"} 4\nbaton_other 7\n",
            &mut before.metrics,
        );
        let mut after =
            Sample { member_cpu_us: 3000.0, client_cpu_us: 110.0, member_switches: 45.0, ..Default::default() };
        let text = "baton_fsync_seconds_count 30\nbaton_peer_messages_sent_total{type=\"append\"} 24\n\
                    baton_peer_messages_sent_total{type=\"heartbeat\"} 2\nbaton_peer_flushes_total 10\n";
        add_metrics(text, &mut after.metrics);
        add_metrics(text, &mut after.metrics); // a second member
        let run = RunFigures { ops: 10, secs: 1.0, ops_per_sec: 10.0, ..Default::default() };
        let c = per_op(&before, &after, &run);
        assert_eq!((c.member_cpu_us, c.client_cpu_us, c.member_switches), (200.0, 10.0, 4.0));
        assert_eq!(c.fsyncs, 5.0, "(60 - 10) / 10");
        assert_eq!(c.peer_messages.get("append"), Some(&4.4));
        assert_eq!(c.peer_messages.get("heartbeat"), Some(&0.4));
        assert!((c.peer_messages_total - 4.8).abs() < 1e-9);
        assert_eq!(c.peer_flushes, 2.0);
        assert!(!after.metrics.keys().any(|k| k.starts_with("baton_other")));
    }

    #[test]
    fn threads_are_grouped_by_kind() {
        assert_eq!(thread_kind("tokio-runtime-w\n"), "tokio-runtime-w");
        assert_eq!(thread_kind("rocksdb:low12"), "rocksdb:low");
        assert_eq!(thread_kind("baton-syncer"), "baton-syncer");
        let mut t = BTreeMap::new();
        add_threads(std::process::id() as i32, &mut t);
        assert!(!t.is_empty(), "this process has threads");
    }

    #[test]
    fn this_process_has_cpu_time_and_threads() {
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(60) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_us("self") > 0.0);
        assert!(switches(std::process::id() as i32) >= 0.0);
    }
}
