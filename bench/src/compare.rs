//! `baton-bench compare`: every workload on every target, and the outputs:
//! compare.json, compare.md (table + Baton's ratio to each rival + the
//! goals), compare.png (one linear panel per workload, with the spread of
//! the runs and p99).
//!
//! The targets' runs are interleaved: every target's cluster is started
//! (and warmed up) first, then each workload's runs go round the targets,
//! A B C A B C ..., so a slow minute of this shared machine lands on all of
//! them rather than on one target's whole row. Failover runs go round the
//! same way, each on a fresh cluster (the run kills its leader), after the
//! steady clusters are stopped. A goal is judged twice: on the medians, and
//! on the spreads (Baton's worst run against the rival's best: its lowest
//! ops/s against the rival's highest, its highest p99 or gap against the
//! rival's lowest); a goal is met only if it holds on the spreads.
//!
//! Open-loop latency: after the steady rows, while the same clusters are
//! up, write and lock-independent run open-loop (bench.rs's module doc) at
//! each of `open_loads` percent of the target's own median closed-loop
//! ops/s from this comparison, so each target is measured at the same
//! fraction of what it can do, and the rows give a throughput-latency
//! curve per target (p50, p99, p99.9 against the achieved rate). These
//! runs are interleaved round the targets too, `open_runs` of each. A
//! point whose achieved rate is below 95% of the offered one, or with
//! late operations, is marked saturated: its latencies are of the
//! operations that finished, a lower bound.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use plotters::prelude::*;

use super::bench::{describe, summarize, AnyTarget, BenchWorkload, RunFigures, RunOpts, Summary};
use super::targets::Kind;
use baton_jepsen::plot::{font, num, perr, render_png, stamp, Area};

pub struct CompareOpts {
    pub targets: Vec<Kind>,
    pub workloads: Vec<BenchWorkload>,
    /// Measured seconds per run.
    pub duration: Duration,
    /// Unmeasured load after a cluster starts (ZooKeeper's JIT needs ~30 s).
    pub warmup: Duration,
    /// Unmeasured seconds at the start of every run.
    pub run_warmup: Duration,
    pub runs: usize,
    pub out: PathBuf,
    /// Baton with TLS on both ports, every client too.
    pub baton_tls: bool,
    /// Open-loop loads, percent of each target's own closed-loop median
    /// (module doc); empty for none.
    pub open_loads: Vec<u32>,
    /// Runs of each open-loop load on each target.
    pub open_runs: usize,
}

/// The workloads measured open-loop too.
pub const OPEN_WORKLOADS: [BenchWorkload; 2] = [BenchWorkload::LockIndependent, BenchWorkload::Write];

/// Runs `runs` runs of one workload on one target. Failover starts a fresh
/// cluster for every run (the run kills its leader); the others share
/// `shared`, started by the caller.
pub async fn runs_of(
    kind: Kind,
    w: BenchWorkload,
    clients: usize,
    o: &CompareOpts,
    shared: Option<&AnyTarget>,
    rate: Option<f64>,
) -> anyhow::Result<Summary> {
    let mut tally = Tally::default();
    for i in 0..o.runs.max(1) {
        let r = one_run(kind, w, clients, o, shared, i, rate).await?;
        tally.record(kind, w, i, o.runs, r);
    }
    Ok(tally.finish(kind, w, clients))
}

/// Run `i` (0-based) of workload `w` on `kind`: on `shared` for a steady
/// workload, on a fresh cluster for failover or when `shared` is None.
/// The outer error is local (a folder not made); the inner one is the
/// run's, reported in its row.
async fn one_run(
    kind: Kind,
    w: BenchWorkload,
    clients: usize,
    o: &CompareOpts,
    shared: Option<&AnyTarget>,
    i: usize,
    rate: Option<f64>,
) -> anyhow::Result<anyhow::Result<RunFigures>> {
    let load = rate.map(|r| format!("-at{r:.0}")).unwrap_or_default();
    let dir = o.out.join(format!("{}-{}{load}-{}", kind.name(), w.name(), i + 1));
    std::fs::create_dir_all(&dir)?;
    let ro = RunOpts {
        workload: w,
        clients,
        warmup: o.run_warmup,
        duration: o.duration,
        dir: dir.clone(),
        member_offset: i,
        rate,
    };
    Ok(match shared {
        Some(t) if w != BenchWorkload::Failover => t.run(&ro).await,
        _ => match AnyTarget::start(kind, &dir.join("cluster"), o.baton_tls).await {
            Ok(t) => {
                let r = t.run(&ro).await;
                t.stop();
                r
            }
            Err(e) => Err(e.context("starting its cluster")),
        },
    })
}

/// The runs of one target and workload so far, and the ones that failed.
#[derive(Default)]
struct Tally {
    figures: Vec<RunFigures>,
    failed: Vec<String>,
}

impl Tally {
    /// One failed run is reported, not the end of the comparison: the
    /// other runs and workloads still say something.
    fn record(&mut self, kind: Kind, w: BenchWorkload, i: usize, runs: usize, r: anyhow::Result<RunFigures>) {
        match r {
            Ok(r) => {
                eprintln!("  [{}] {} run {}/{}: {}", kind.name(), w.name(), i + 1, runs, describe(&r));
                self.figures.push(r);
            }
            Err(e) => {
                eprintln!("  [{}] {} run {}/{} FAILED: {e:#}", kind.name(), w.name(), i + 1, runs);
                self.failed.push(format!("run {}: {e:#}", i + 1));
            }
        }
    }

    fn finish(self, kind: Kind, w: BenchWorkload, clients: usize) -> Summary {
        let mut s = summarize(kind, w, clients, self.figures);
        s.failed = self.failed;
        print_summary(&s);
        s
    }
}

fn print_summary(s: &Summary) {
    let (kind, w) = (s.target, s.workload);
    eprintln!(
        "  [{}] {} median of {}: {:.0} ops/s (spread {:.0}-{:.0}), p50 {:.2} ms, p99 {:.2} ms{}",
        kind.name(),
        w.name(),
        s.runs,
        s.ops_per_sec,
        s.ops_per_sec_min,
        s.ops_per_sec_max,
        s.p50_ms,
        s.p99_ms,
        match (s.gap_ms, s.takeover_ms) {
            (Some(g), Some(t)) => format!(", gap {g:.0} ms, takeover {t:.0} ms"),
            (Some(g), None) => format!(", gap {g:.0} ms"),
            _ => String::new(),
        }
    );
}

/// `baton-bench bench`: `o.runs` runs of workload `w` on `kind` (the only
/// target and workload in `o`) with `clients` clients, on a cluster of its
/// own in `o.out` (failover: a fresh one per run); open-loop at `rate`
/// ops/s if given.
pub async fn bench(
    kind: Kind,
    w: BenchWorkload,
    clients: usize,
    o: &CompareOpts,
    rate: Option<f64>,
) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(&o.out)?;
    let s = if w == BenchWorkload::Failover {
        runs_of(kind, w, clients, o, None, rate).await?
    } else {
        let t = AnyTarget::start(kind, &o.out.join("cluster"), o.baton_tls).await?;
        let s = runs_of(kind, w, clients, o, Some(&t), rate).await;
        t.stop();
        s?
    };
    if s.runs == 0 {
        anyhow::bail!("every run failed: {}", s.failed.join("; "));
    }
    Ok(s)
}

/// A row for a workload none of whose runs could start.
fn all_failed(kind: Kind, w: BenchWorkload, why: &anyhow::Error) -> Summary {
    let mut s = summarize(kind, w, w.default_clients(), Vec::new());
    s.failed.push(format!("{why:#}"));
    s
}

/// Every workload on every target, the runs interleaved across targets
/// (module doc). A run that fails is reported in its row
/// (`Summary::failed`) and the comparison goes on; the outputs are written
/// whatever happened.
pub async fn compare(o: &CompareOpts) -> anyhow::Result<Vec<Summary>> {
    std::fs::create_dir_all(&o.out)?;
    let mut all = Vec::new();
    let steady: Vec<BenchWorkload> = o.workloads.iter().copied().filter(|w| *w != BenchWorkload::Failover).collect();
    if !steady.is_empty() {
        let mut clusters: Vec<(Kind, anyhow::Result<AnyTarget>)> = Vec::new();
        for &kind in &o.targets {
            eprintln!("[{}] starting a 3-member cluster", kind.name());
            let t = AnyTarget::start(kind, &o.out.join(format!("{}-cluster", kind.name())), o.baton_tls).await;
            match &t {
                Ok(t) => {
                    if let Err(e) = warm_up(kind, t, o).await {
                        eprintln!("[{}] warm-up failed: {e:#}", kind.name());
                    }
                }
                Err(e) => eprintln!("[{}] the cluster did not start: {e:#}", kind.name()),
            }
            clusters.push((kind, t.map_err(|e| e.context("starting the cluster"))));
        }
        let mut result = steady_rounds(&steady, &clusters, o, &mut all).await;
        if result.is_ok() {
            result = open_rounds(&clusters, o, &mut all).await;
        }
        for (_, t) in &clusters {
            if let Ok(t) = t {
                t.stop();
            }
        }
        result?;
    }
    if o.workloads.contains(&BenchWorkload::Failover) {
        let w = BenchWorkload::Failover;
        eprintln!("[failover] a fresh cluster per run, round the targets");
        let mut tallies: Vec<Tally> = o.targets.iter().map(|_| Tally::default()).collect();
        for i in 0..o.runs.max(1) {
            for (&kind, tally) in o.targets.iter().zip(tallies.iter_mut()) {
                let r = one_run(kind, w, w.default_clients(), o, None, i, None).await?;
                tally.record(kind, w, i, o.runs, r);
            }
        }
        for (&kind, tally) in o.targets.iter().zip(tallies) {
            all.push(tally.finish(kind, w, w.default_clients()));
        }
    }
    write_outputs(&all, &o.out, o)?;
    Ok(all)
}

/// Each steady workload's runs, round the started clusters; a target whose
/// cluster did not start gets a failed row per workload.
async fn steady_rounds(
    steady: &[BenchWorkload],
    clusters: &[(Kind, anyhow::Result<AnyTarget>)],
    o: &CompareOpts,
    all: &mut Vec<Summary>,
) -> anyhow::Result<()> {
    for &w in steady {
        let mut tallies: Vec<Tally> = clusters.iter().map(|_| Tally::default()).collect();
        for i in 0..o.runs.max(1) {
            for ((kind, t), tally) in clusters.iter().zip(tallies.iter_mut()) {
                if let Ok(t) = t {
                    let r = one_run(*kind, w, w.default_clients(), o, Some(t), i, None).await?;
                    tally.record(*kind, w, i, o.runs, r);
                }
            }
        }
        for ((kind, t), tally) in clusters.iter().zip(tallies) {
            all.push(match t {
                Ok(_) => tally.finish(*kind, w, w.default_clients()),
                Err(e) => all_failed(*kind, w, e),
            });
        }
    }
    Ok(())
}

/// The open-loop rows (module doc): for each open-loop workload measured
/// closed-loop above and each load, `o.open_runs` runs round the targets,
/// each at the load's share of that target's own closed-loop median. A
/// target without a closed-loop figure gets no open-loop row.
async fn open_rounds(
    clusters: &[(Kind, anyhow::Result<AnyTarget>)],
    o: &CompareOpts,
    all: &mut Vec<Summary>,
) -> anyhow::Result<()> {
    for w in OPEN_WORKLOADS {
        for &pct in &o.open_loads {
            let rates: Vec<Option<f64>> = clusters
                .iter()
                .map(|(k, _)| find(all, *k, w).map(|s| s.ops_per_sec * f64::from(pct) / 100.0).filter(|r| *r >= 1.0))
                .collect();
            if rates.iter().all(Option::is_none) {
                continue;
            }
            eprintln!("[open loop] {} at {pct}% of each target's own median", w.name());
            let mut tallies: Vec<Tally> = clusters.iter().map(|_| Tally::default()).collect();
            for i in 0..o.open_runs.max(1) {
                for (((kind, t), tally), rate) in clusters.iter().zip(tallies.iter_mut()).zip(&rates) {
                    if let (Ok(t), Some(rate)) = (t, rate) {
                        let r = one_run(*kind, w, w.default_clients(), o, Some(t), i, Some(*rate)).await?;
                        tally.record(*kind, w, i, o.open_runs, r);
                    }
                }
            }
            for (((kind, _), tally), rate) in clusters.iter().zip(tallies).zip(&rates) {
                if let Some(rate) = rate {
                    let mut s = tally.finish(*kind, w, w.default_clients());
                    s.load_pct = Some(pct);
                    s.offered_ops_per_sec = Some(*rate);
                    all.push(s);
                }
            }
        }
    }
    Ok(())
}

/// Whether an open-loop row did not keep up with its offered rate
/// (module doc).
pub fn saturated(s: &Summary) -> bool {
    let short = s.offered_ops_per_sec.is_some_and(|r| s.ops_per_sec < 0.95 * r);
    short || s.late.is_some_and(|l| l > 0) || s.runs == 0
}

/// Unmeasured writes and reads once per cluster (ZooKeeper's JIT).
async fn warm_up(kind: Kind, t: &AnyTarget, o: &CompareOpts) -> anyhow::Result<()> {
    if o.warmup.is_zero() {
        return Ok(());
    }
    eprintln!("[{}] warm-up: {:?} of writes and reads, not measured", kind.name(), o.warmup);
    let half = o.warmup / 2;
    for w in [BenchWorkload::Write, BenchWorkload::Read] {
        let ro = RunOpts {
            workload: w,
            clients: 64,
            warmup: half,
            duration: Duration::ZERO,
            dir: o.out.clone(),
            member_offset: 0,
            rate: None,
        };
        t.run(&ro).await.with_context(|| format!("{} warm-up", kind.name()))?;
    }
    Ok(())
}

pub fn write_outputs(all: &[Summary], out: &Path, o: &CompareOpts) -> anyhow::Result<()> {
    std::fs::write(out.join("compare.json"), serde_json::to_string_pretty(all)?)?;
    std::fs::write(out.join("compare.md"), markdown(all, o))?;
    chart(all, &out.join("compare.png"))?;
    Ok(())
}

/// Draws `dir/compare.png` again from `dir/compare.json`, running nothing
/// (after a change to the chart, or for an older run).
pub fn replot(dir: &Path) -> anyhow::Result<()> {
    let json = dir.join("compare.json");
    let text = std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    let all: Vec<Summary> = serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    chart(&all, &dir.join("compare.png"))
}

/// The closed-loop row of `k` and `w`, with its failed runs if any.
fn row(all: &[Summary], k: Kind, w: BenchWorkload) -> Option<&Summary> {
    all.iter().find(|s| s.target == k && s.workload == w && s.load_pct.is_none())
}

/// The open-loop rows of `k` and `w`, lowest load first.
fn open_rows(all: &[Summary], k: Kind, w: BenchWorkload) -> Vec<&Summary> {
    let mut v: Vec<&Summary> =
        all.iter().filter(|s| s.target == k && s.workload == w && s.load_pct.is_some()).collect();
    v.sort_by_key(|s| s.load_pct);
    v
}

/// The row of `k` and `w` if at least one run gave figures.
fn find(all: &[Summary], k: Kind, w: BenchWorkload) -> Option<&Summary> {
    row(all, k, w).filter(|s| s.runs > 0)
}

/// The goal each workload is judged by: (what, Baton must be at least
/// this multiple of the better rival, or at most for latencies).
#[derive(Clone, Copy)]
enum Goal {
    Throughput(f64),
    P99(f64),
    Gap(f64),
}

fn goal(w: BenchWorkload) -> Goal {
    match w {
        BenchWorkload::LockUncontended => Goal::P99(0.5),
        BenchWorkload::Failover => Goal::Gap(0.5),
        BenchWorkload::Read => Goal::Throughput(1.0),
        _ => Goal::Throughput(2.0),
    }
}

fn yes_no(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "-",
    }
}

/// The lowest and highest of a figure over `s`'s runs (the median alone
/// for a row read from a JSON written before runs were kept).
fn run_range(s: &Summary, f: impl Fn(&RunFigures) -> Option<f64>, median: Option<f64>) -> Option<(f64, f64)> {
    let v: Vec<f64> = s.per_run.iter().filter_map(f).collect();
    if v.is_empty() {
        return median.map(|m| (m, m));
    }
    Some((v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max)))
}

/// A figure of one run, and the same figure of a row (its median).
type RunFigure = fn(&RunFigures) -> Option<f64>;
type RowFigure = fn(&Summary) -> Option<f64>;

/// Goal `g` for Baton's row `b` against the rivals' rows: its text, and
/// whether it holds on the medians and on the spreads (module doc); None
/// where a side has no figure.
fn judge(g: Goal, b: &Summary, others: &[&Summary]) -> (String, Option<bool>, Option<bool>) {
    let (text, x, higher_is_better, run, row): (String, f64, bool, RunFigure, RowFigure) = match g {
        Goal::Throughput(x) => (
            format!("ops/s >= {x}x the better rival"),
            x,
            true,
            |r| Some(r.ops_per_sec).filter(|v| *v > 0.0),
            |s| Some(s.ops_per_sec).filter(|v| *v > 0.0),
        ),
        Goal::P99(x) => (
            format!("p99 <= {x}x the better rival"),
            x,
            false,
            |r| Some(r.p99_ms).filter(|v| *v > 0.0),
            |s| Some(s.p99_ms).filter(|v| *v > 0.0),
        ),
        Goal::Gap(x) => (format!("gap <= {x}x the better rival"), x, false, |r| r.gap_ms, |s| s.gap_ms),
    };
    // Each side's median, and its (lowest, highest) run.
    let side = |s: &Summary| Some((row(s)?, run_range(s, run, row(s))?));
    let rivals: Vec<(f64, (f64, f64))> = others.iter().filter_map(|s| side(s)).collect();
    let Some((b_median, (b_low, b_high))) = side(b) else { return (text, None, None) };
    if rivals.is_empty() {
        return (text, None, None);
    }
    let best = |v: &mut dyn Iterator<Item = f64>| {
        if higher_is_better {
            v.fold(f64::NEG_INFINITY, f64::max)
        } else {
            v.fold(f64::INFINITY, f64::min)
        }
    };
    let rival_median = best(&mut rivals.iter().map(|(m, _)| *m));
    let rival_best_run = best(&mut rivals.iter().map(|(_, (lo, hi))| if higher_is_better { *hi } else { *lo }));
    let holds = |baton: f64, rival: f64| if higher_is_better { baton >= x * rival } else { baton <= x * rival };
    let baton_worst_run = if higher_is_better { b_low } else { b_high };
    (text, Some(holds(b_median, rival_median)), Some(holds(baton_worst_run, rival_best_run)))
}

fn opt_ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into())
}

pub fn markdown(all: &[Summary], o: &CompareOpts) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Baton, etcd and ZooKeeper side by side\n");
    if o.baton_tls {
        let _ = writeln!(md, "Baton ran with TLS on both ports (mutual TLS between members and for clients).\n");
    }
    let _ = writeln!(
        md,
        "3-member clusters on 127.0.0.1, fsync on, {} s session / lease TTL, linearizable reads. \
         Each figure is the median of {} run(s) of {:.0} s measured after {:.0} s unmeasured \
         (and {:.0} s of warm-up load once per cluster); the spread is the lowest-highest ops/s. \
         Client i of run k starts at member (i + k) mod 3, so the one uncontended client sits on a \
         different member in each run.\n",
        super::bench::TTL.as_secs(),
        o.runs,
        o.duration.as_secs_f64(),
        o.run_warmup.as_secs_f64(),
        o.warmup.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "Member CPU: µs of CPU (utime + stime) the target's three member processes spent per operation \
         during the measured seconds; client CPU: the same for the benchmark process, which runs every \
         client (not measured for failover, which kills a member).\n"
    );
    let _ = writeln!(
        md,
        "| workload | clients | target | ops/s | spread | p50 ms | p99 ms | gap ms | takeover ms | member CPU µs/op | client CPU µs/op |"
    );
    let _ = writeln!(md, "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|");
    for w in BenchWorkload::ALL {
        for k in &o.targets {
            let Some(s) = row(all, *k, w) else { continue };
            if s.runs == 0 {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | failed | - | - | - | - | - | - | - |",
                    w.name(),
                    s.clients,
                    k.name()
                );
            } else {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {:.0} | {:.0}-{:.0} | {:.2} | {:.2} | {} | {} | {} | {} |",
                    w.name(),
                    s.clients,
                    k.name(),
                    s.ops_per_sec,
                    s.ops_per_sec_min,
                    s.ops_per_sec_max,
                    s.p50_ms,
                    s.p99_ms,
                    opt_ms(s.gap_ms),
                    opt_ms(s.takeover_ms),
                    opt_ms(s.member_cpu_us),
                    opt_ms(s.client_cpu_us)
                );
            }
        }
    }
    let failures: Vec<String> = all
        .iter()
        .flat_map(|s| {
            let load = s.load_pct.map(|p| format!(" open-loop {p}%")).unwrap_or_default();
            s.failed.iter().map(move |f| format!("- {} {}{load}: {f}", s.target.name(), s.workload.name()))
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(md, "\nRuns that failed (left out of the figures above):\n");
        for f in failures {
            let _ = writeln!(md, "{}", f.replace('|', "/"));
        }
    }
    // baton-zk is Baton itself (through its ZooKeeper port): not a rival.
    let rivals: Vec<Kind> = o.targets.iter().copied().filter(|k| !matches!(k, Kind::Baton | Kind::BatonZk)).collect();
    if !rivals.is_empty() && o.targets.contains(&Kind::Baton) {
        let _ = writeln!(md, "\n## Baton's ratio to each rival\n");
        let _ = writeln!(
            md,
            "Throughput: Baton ÷ rival (above 1 = Baton faster). Latency and gap: Baton ÷ rival (below 1 = Baton lower). \
             The ratios are of the medians. `medians` says whether the goal holds on the medians; `spreads` whether it \
             holds with Baton's worst run against the better rival's best run (lowest ops/s against highest; highest \
             p99 or gap against lowest): a goal is met only on the spreads.\n"
        );
        let _ = write!(md, "| workload |");
        for p in &rivals {
            let _ = write!(md, " ops/s vs {0} | p99 vs {0} |", p.name());
        }
        let _ = writeln!(md, " goal | medians | spreads |");
        let _ = write!(md, "|---|");
        for _ in &rivals {
            let _ = write!(md, "---:|---:|");
        }
        let _ = writeln!(md, "---|---|---|");
        for w in BenchWorkload::ALL {
            let Some(b) = find(all, Kind::Baton, w) else { continue };
            let _ = write!(md, "| {} |", w.name());
            for p in &rivals {
                match find(all, *p, w) {
                    Some(s) if s.ops_per_sec > 0.0 && s.p99_ms > 0.0 => {
                        let _ = write!(md, " {:.2}x | {:.2}x |", b.ops_per_sec / s.ops_per_sec, b.p99_ms / s.p99_ms);
                    }
                    _ => {
                        let _ = write!(md, " - | - |");
                    }
                }
            }
            let others: Vec<&Summary> = rivals.iter().filter_map(|p| find(all, *p, w)).collect();
            let (text, on_medians, on_spreads) = judge(goal(w), b, &others);
            let _ = writeln!(md, " {text} | {} | {} |", yes_no(on_medians), yes_no(on_spreads));
        }
    }
    open_loop_table(&mut md, all, &o.targets);
    if o.targets.contains(&Kind::BatonZk) {
        zk_port_cost(&mut md, all);
    }
    md
}

/// The open-loop rows (module doc), if any.
fn open_loop_table(md: &mut String, all: &[Summary], targets: &[Kind]) {
    if !all.iter().any(|s| s.load_pct.is_some()) {
        return;
    }
    let _ = writeln!(md, "\n## Open-loop latency\n");
    let _ = writeln!(
        md,
        "Operations due at a fixed rate, a share of each target's own closed-loop median above; latency from when \
         each was due (time queued for a free client counts). Medians over the runs; `late`: the most operations \
         of any run still not done 10 s after its window. A saturated point (achieved < 95% of offered, or late \
         operations) gives the latencies of the operations that finished: a lower bound.\n"
    );
    let _ = writeln!(
        md,
        "| workload | target | load | offered ops/s | achieved ops/s | p50 ms | p99 ms | p99.9 ms | late | runs |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for w in OPEN_WORKLOADS {
        for k in targets {
            for s in open_rows(all, *k, w) {
                let achieved = if s.runs == 0 {
                    "failed".to_string()
                } else if saturated(s) {
                    format!("{:.0} (saturated)", s.ops_per_sec)
                } else {
                    format!("{:.0}", s.ops_per_sec)
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {}% | {:.0} | {achieved} | {:.2} | {:.2} | {} | {} | {} |",
                    w.name(),
                    k.name(),
                    s.load_pct.unwrap_or(0),
                    s.offered_ops_per_sec.unwrap_or(0.0),
                    s.p50_ms,
                    s.p99_ms,
                    s.p999_ms.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into()),
                    s.late.unwrap_or(0),
                    s.runs
                );
            }
        }
    }
}

/// What the ZooKeeper port costs: baton-zk next to Baton's own client and
/// next to real ZooKeeper (the same client code on both).
fn zk_port_cost(md: &mut String, all: &[Summary]) {
    let _ = writeln!(md, "\n## The ZooKeeper port\n");
    let _ = writeln!(
        md,
        "baton-zk: Baton's members through their ZooKeeper port, driven by the ZooKeeper target's client and \
         recipe. Above 1 = baton-zk faster.\n"
    );
    let _ = writeln!(md, "| workload | baton-zk ops/s | p99 ms | vs baton | vs zookeeper |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    let ratio = |z: &Summary, k: Kind, w: BenchWorkload| match find(all, k, w) {
        Some(s) if s.ops_per_sec > 0.0 => format!("{:.2}x", z.ops_per_sec / s.ops_per_sec),
        _ => "-".into(),
    };
    for w in BenchWorkload::ALL {
        let Some(z) = find(all, Kind::BatonZk, w) else { continue };
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.2} | {} | {} |",
            w.name(),
            z.ops_per_sec,
            z.p99_ms,
            ratio(z, Kind::Baton, w),
            ratio(z, Kind::Zookeeper, w)
        );
    }
}

fn color(k: Kind) -> RGBColor {
    match k {
        Kind::Baton => RGBColor(0x1f, 0x77, 0xb4),
        Kind::Etcd => RGBColor(0x2c, 0xa0, 0x2c),
        Kind::Zookeeper => RGBColor(0xff, 0x7f, 0x0e),
        Kind::BatonZk => RGBColor(0x9e, 0xc5, 0xe8),
    }
}

/// One panel per workload, each on its own linear axis from zero: a bar
/// per target at the median over the runs, a whisker from the lowest to
/// the highest run, and the median p99 written above it. The failover panel
/// shows the gap around the leader's kill instead (lower is better). One
/// log axis for all workloads, as before, made a 2x difference look like
/// nothing.
///
/// The open-loop rows, if any, add a panel per workload: latency (log
/// axis) against the achieved rate, a line per target through its loads,
/// p99 solid and p50 thin, a saturated point hollow.
pub fn chart(all: &[Summary], path: &Path) -> anyhow::Result<()> {
    let closed = |w: BenchWorkload| all.iter().any(|s| s.workload == w && s.load_pct.is_none());
    let open = |w: BenchWorkload| all.iter().any(|s| s.workload == w && s.load_pct.is_some() && s.runs > 0);
    let mut panels: Vec<(BenchWorkload, bool)> =
        BenchWorkload::ALL.into_iter().filter(|w| closed(*w)).map(|w| (w, false)).collect();
    panels.extend(OPEN_WORKLOADS.into_iter().filter(|w| open(*w)).map(|w| (w, true)));
    let mut targets: Vec<Kind> = all.iter().map(|s| s.target).collect();
    targets.sort();
    targets.dedup();
    const COLS: usize = 3;
    let rows = panels.len().div_ceil(COLS).max(1);
    // The run's span: from its first row's date to its last's.
    let mut dates: Vec<&str> = all.iter().filter_map(|s| s.date.as_deref()).collect();
    dates.sort_unstable();
    let span = match (dates.first(), dates.last()) {
        (Some(a), Some(b)) if a == b => Some(a.to_string()),
        (Some(a), Some(b)) => Some(format!("{a} to {}", b.trim_start_matches(&a[..11]))),
        _ => None,
    };
    render_png(path, (1200, 340 * rows as u32 + 16), |root| {
        let (plots, _) = root.split_vertically(340 * rows as u32);
        for ((w, open), area) in panels.iter().zip(plots.split_evenly((rows, COLS)).iter()) {
            if *open {
                open_panel(area, *w, &targets, all)?;
            } else {
                panel(area, *w, &targets, all)?;
            }
        }
        stamp(root, span.as_deref())
    })
}

/// Workload `w`'s open-loop curves (see [`chart`]).
fn open_panel(area: &Area<'_>, w: BenchWorkload, targets: &[Kind], all: &[Summary]) -> anyhow::Result<()> {
    let points: Vec<&Summary> = all.iter().filter(|s| s.workload == w && s.load_pct.is_some() && s.runs > 0).collect();
    let x_max =
        points.iter().map(|s| s.ops_per_sec.max(s.offered_ops_per_sec.unwrap_or(0.0))).fold(1.0, f64::max) * 1.1;
    let lat = |s: &Summary| [s.p50_ms, s.p99_ms].into_iter().filter(|v| *v > 0.0).collect::<Vec<f64>>();
    let all_lat: Vec<f64> = points.iter().flat_map(|s| lat(s)).collect();
    let y_min = all_lat.iter().copied().fold(1.0, f64::min).clamp(0.01, 1.0) * 0.7;
    let y_max = all_lat.iter().copied().fold(1.0, f64::max) * 1.5;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{} open loop: p99, p50 thin (ms)", w.name()), font(15))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, (y_min..y_max).log_scale())
        .map_err(perr)?;
    chart
        .configure_mesh()
        .x_labels(5)
        .x_desc("ops/s achieved")
        .x_label_formatter(&|v| num(*v))
        .y_label_formatter(&|v| num(*v))
        .label_style(font(12))
        .draw()
        .map_err(perr)?;
    for k in targets {
        let rows = open_rows(all, *k, w);
        let rows: Vec<&Summary> = rows.into_iter().filter(|s| s.runs > 0).collect();
        if rows.is_empty() {
            continue;
        }
        let c = color(*k);
        let p99: Vec<(f64, f64)> = rows.iter().map(|s| (s.ops_per_sec, s.p99_ms.max(y_min))).collect();
        let p50: Vec<(f64, f64)> = rows.iter().map(|s| (s.ops_per_sec, s.p50_ms.max(y_min))).collect();
        chart.draw_series(LineSeries::new(p99.clone(), c.stroke_width(2))).map_err(perr)?;
        chart.draw_series(LineSeries::new(p50, c.stroke_width(1))).map_err(perr)?;
        for (s, pt) in rows.iter().zip(p99) {
            let style = if saturated(s) { c.stroke_width(2) } else { c.filled() };
            chart.draw_series([Circle::new(pt, 4, style)]).map_err(perr)?;
        }
        let last = rows[rows.len() - 1];
        let label = k.name().to_string();
        chart
            .draw_series([Text::new(label, (last.ops_per_sec, last.p99_ms.max(y_min) * 1.15), font(12))])
            .map_err(perr)?;
    }
    Ok(())
}

/// One target's bar in a panel.
struct Bar {
    slot: usize,
    target: Kind,
    value: f64,
    low: f64,
    high: f64,
    label: String,
}

/// The bars of workload `w`: ops/s (or, for failover, the gap in ms).
fn bars(w: BenchWorkload, targets: &[Kind], all: &[Summary]) -> Vec<Bar> {
    let spread = |v: Vec<f64>, m: f64| {
        let lo = v.iter().copied().fold(m, f64::min);
        (lo, v.into_iter().fold(m, f64::max))
    };
    targets
        .iter()
        .enumerate()
        .filter_map(|(slot, t)| {
            let s = find(all, *t, w)?;
            let bar = if w == BenchWorkload::Failover {
                let value = s.gap_ms.unwrap_or(0.0);
                let (low, high) = spread(s.per_run.iter().filter_map(|r| r.gap_ms).collect(), value);
                Bar { slot, target: *t, value, low, high, label: format!("{value:.0} ms") }
            } else {
                let (low, high) = (s.ops_per_sec_min.min(s.ops_per_sec), s.ops_per_sec_max.max(s.ops_per_sec));
                Bar { slot, target: *t, value: s.ops_per_sec, low, high, label: format!("p99 {:.1} ms", s.p99_ms) }
            };
            Some(bar)
        })
        .collect()
}

fn panel(area: &Area<'_>, w: BenchWorkload, targets: &[Kind], all: &[Summary]) -> anyhow::Result<()> {
    let bars = bars(w, targets, all);
    let top = bars.iter().map(|b| b.high.max(b.value)).fold(1.0, f64::max) * 1.2;
    let caption = match w {
        BenchWorkload::Failover => "failover: gap, ms (lower is better)".to_string(),
        _ => format!("{}: ops/s (median, min-max)", w.name()),
    };
    let n = targets.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, font(16))
        .margin(10)
        .x_label_area_size(24)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|v| {
            let centre = (v.fract() - 0.5).abs() < 0.01;
            centre.then(|| targets.get(*v as usize).map(|t| t.name().to_string())).flatten().unwrap_or_default()
        })
        .y_label_formatter(&|v| num(*v))
        .label_style(font(12))
        .draw()
        .map_err(perr)?;
    for b in bars {
        let (x0, x1, xm) = (b.slot as f64 + 0.2, b.slot as f64 + 0.8, b.slot as f64 + 0.5);
        let c = color(b.target);
        chart.draw_series([Rectangle::new([(x0, 0.0), (x1, b.value)], c.filled())]).map_err(perr)?;
        let whisker = [(xm, b.low), (xm, b.high)];
        chart.draw_series([PathElement::new(whisker, BLACK.stroke_width(2))]).map_err(perr)?;
        chart.draw_series([Text::new(b.label, (x0, b.high + top * 0.04), font(12))]).map_err(perr)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::summarize;

    fn one(k: Kind, w: BenchWorkload, ops: f64, p99: f64, gap: Option<f64>) -> Summary {
        let r = RunFigures {
            ops: 1,
            secs: 1.0,
            ops_per_sec: ops,
            p50_ms: p99 / 2.0,
            p99_ms: p99,
            errors: 0,
            gap_ms: gap,
            takeover_ms: Some(5000.0),
            ..RunFigures::default()
        };
        summarize(k, w, w.default_clients(), vec![r])
    }

    fn opts(dir: &Path) -> CompareOpts {
        CompareOpts {
            targets: vec![Kind::Baton, Kind::Etcd, Kind::Zookeeper],
            workloads: BenchWorkload::ALL.to_vec(),
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(30),
            run_warmup: Duration::from_secs(2),
            runs: 1,
            out: dir.to_path_buf(),
            baton_tls: false,
            open_loads: vec![25, 50, 75],
            open_runs: 1,
        }
    }

    #[test]
    fn a_failed_run_is_reported_and_left_out_of_the_figures() {
        let good = |ops| RunFigures {
            ops: 1,
            secs: 1.0,
            ops_per_sec: ops,
            p50_ms: 1.0,
            p99_ms: 2.0,
            errors: 0,
            gap_ms: Some(300.0),
            ..RunFigures::default()
        };
        // ZooKeeper: two of three failover runs failed, etcd's all did.
        let mut zk = summarize(Kind::Zookeeper, BenchWorkload::Failover, 16, vec![good(500.0)]);
        zk.failed = vec!["run 2: no grant within 60s".into(), "run 3: no grant within 60s".into()];
        let etcd = all_failed(Kind::Etcd, BenchWorkload::Failover, &anyhow::anyhow!("no leader | at all"));
        let mut baton = summarize(Kind::Baton, BenchWorkload::Failover, 16, vec![good(900.0)]);
        baton.gap_ms = Some(100.0);
        let all = vec![baton, etcd, zk];
        let dir = tempfile::tempdir().expect("tempdir");
        let o = opts(dir.path());
        let md = markdown(&all, &o);
        assert!(md.contains("| failover | 16 | etcd | failed | - |"), "{md}");
        assert!(md.contains("| failover | 16 | zookeeper | 500 | 500-500 |"), "{md}");
        assert!(md.contains("- zookeeper failover: run 2: no grant within 60s"), "{md}");
        assert!(md.contains("- etcd failover: no leader / at all"), "{md}");
        // The ratio is to ZooKeeper's one good run; etcd's row gives none.
        // Baton's median gap (100 ms) is under half of ZooKeeper's 300, its
        // one run's (300 ms) is not: met on the medians, not on the spreads.
        assert!(
            md.contains("| failover | - | - | 1.80x | 1.00x | gap <= 0.5x the better rival | yes | **no** |"),
            "{md}"
        );
        write_outputs(&all, dir.path(), &o).expect("outputs");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("compare.json")).expect("json"))
                .expect("parse");
        let rows = json.as_array().expect("array");
        let e = rows.iter().find(|r| r["target"] == "etcd").expect("etcd row");
        assert_eq!(e["runs"], 0);
        assert_eq!(e["ops_per_sec_min"], 0.0);
        assert_eq!(e["failed"].as_array().map(Vec::len), Some(1));
        assert!(rows.iter().find(|r| r["target"] == "baton").expect("baton").get("failed").is_none());
    }

    #[test]
    fn outputs_table_ratios_goals_and_chart() {
        let all = vec![
            one(Kind::Baton, BenchWorkload::LockContended, 600.0, 40.0, None),
            one(Kind::Etcd, BenchWorkload::LockContended, 150.0, 120.0, None),
            one(Kind::Zookeeper, BenchWorkload::LockContended, 300.0, 130.0, None),
            one(Kind::Baton, BenchWorkload::Write, 10000.0, 12.0, None),
            one(Kind::Etcd, BenchWorkload::Write, 2000.0, 60.0, None),
            one(Kind::Zookeeper, BenchWorkload::Write, 7000.0, 50.0, None),
            one(Kind::Baton, BenchWorkload::Failover, 300.0, 40.0, Some(150.0)),
            one(Kind::Etcd, BenchWorkload::Failover, 40.0, 1000.0, Some(3000.0)),
            one(Kind::Zookeeper, BenchWorkload::Failover, 200.0, 100.0, Some(500.0)),
            one(Kind::BatonZk, BenchWorkload::Write, 5000.0, 20.0, None),
        ];
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = opts(dir.path());
        o.targets.push(Kind::BatonZk);
        let md = markdown(&all, &o);
        // Contended: 600 vs the better rival's 300 = 2x, goal met.
        assert!(
            md.contains(
                "| lock-contended | 4.00x | 0.33x | 2.00x | 0.31x | ops/s >= 2x the better rival | yes | yes |"
            ),
            "{md}"
        );
        // Write: 10000 vs 7000 = 1.43x, goal not met, and said so.
        assert!(
            md.contains("| write | 5.00x | 0.20x | 1.43x | 0.24x | ops/s >= 2x the better rival | **no** | **no** |"),
            "{md}"
        );
        // Failover: 150 ms vs ZooKeeper's 500 ms gap: at most half, met.
        assert!(md.contains("| failover |") && md.contains("gap <= 0.5x the better rival | yes | yes |"), "{md}");
        assert!(md.contains("| failover | 16 | baton | 300 | 300-300 | 20.00 | 40.00 | 150 | 5000 | - | - |"), "{md}");
        // baton-zk is not a rival (the ratios above are to etcd and ZooKeeper
        // only); its own table compares it with Baton and ZooKeeper.
        assert!(!md.contains("vs baton-zk"), "{md}");
        assert!(md.contains("| write | 5000 | 20.00 | 0.50x | 0.71x |"), "{md}");
        write_outputs(&all, dir.path(), &o).expect("outputs");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("compare.json")).expect("json"))
                .expect("parse");
        let rows = json.as_array().expect("array");
        assert_eq!(rows.len(), 10);
        assert!(rows.iter().any(|r| r["target"] == "baton-zk"));
        for key in ["target", "workload", "ops_per_sec", "p50_ms", "p99_ms", "runs"] {
            assert!(rows.iter().all(|r| r.get(key).is_some()), "missing {key}");
        }
        let fo = rows.iter().find(|r| r["workload"] == "failover" && r["target"] == "baton").expect("failover row");
        assert_eq!(fo["gap_ms"], 150.0);
        assert_eq!(fo["takeover_ms"], 5000.0);
        assert!(rows.iter().filter(|r| r["workload"] != "failover").all(|r| r.get("gap_ms").is_none()));
        let png = std::fs::read(dir.path().join("compare.png")).expect("png");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }

    /// Open-loop rows: their own table (offered, achieved, p50/p99/p99.9,
    /// late, saturated marked), kept out of the closed-loop table, the
    /// ratios and the goals, and drawn as curves.
    #[test]
    fn open_loop_rows_are_a_table_and_curves_of_their_own() {
        let open = |k: Kind, pct: u32, offered: f64, achieved: f64, p99: f64, late: u64| {
            let r = RunFigures {
                ops: 1,
                secs: 1.0,
                ops_per_sec: achieved,
                p50_ms: p99 / 4.0,
                p99_ms: p99,
                p999_ms: Some(p99 * 2.0),
                offered_ops_per_sec: Some(offered),
                late: Some(late),
                ..RunFigures::default()
            };
            let mut s = summarize(k, BenchWorkload::Write, 64, vec![r]);
            s.load_pct = Some(pct);
            s.offered_ops_per_sec = Some(offered);
            s
        };
        let all = vec![
            one(Kind::Baton, BenchWorkload::Write, 10000.0, 12.0, None),
            one(Kind::Zookeeper, BenchWorkload::Write, 7000.0, 50.0, None),
            open(Kind::Baton, 25, 2500.0, 2499.0, 2.0, 0),
            open(Kind::Baton, 75, 7500.0, 7480.0, 9.0, 0),
            open(Kind::Zookeeper, 25, 1750.0, 1750.0, 3.0, 0),
            // Fell behind: achieved well under offered, and late operations.
            open(Kind::Zookeeper, 75, 5250.0, 4000.0, 800.0, 1200),
        ];
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = opts(dir.path());
        o.targets = vec![Kind::Baton, Kind::Zookeeper];
        let md = markdown(&all, &o);
        assert!(md.contains("## Open-loop latency"), "{md}");
        assert!(md.contains("| write | baton | 25% | 2500 | 2499 | 0.50 | 2.00 | 4.00 | 0 | 1 |"), "{md}");
        assert!(
            md.contains("| write | zookeeper | 75% | 5250 | 4000 (saturated) | 200.00 | 800.00 | 1600.00 | 1200 | 1 |"),
            "{md}"
        );
        // The closed-loop rows and the goal are the closed-loop ones only.
        assert_eq!(md.matches("| write | 64 |").count(), 2, "{md}");
        assert!(md.contains("| write | 1.43x | 0.24x | ops/s >= 2x the better rival |"), "{md}");
        write_outputs(&all, dir.path(), &o).expect("outputs");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("compare.json")).expect("json"))
                .expect("parse");
        let rows = json.as_array().expect("array");
        assert_eq!(rows.iter().filter(|r| r.get("load_pct").is_some()).count(), 4);
        // Read back, the open-loop rows are still open-loop rows.
        replot(dir.path()).expect("replot");
        let back: Vec<Summary> =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("compare.json")).expect("json"))
                .expect("parse");
        assert_eq!(open_rows(&back, Kind::Zookeeper, BenchWorkload::Write).len(), 2);
        assert!(saturated(open_rows(&back, Kind::Zookeeper, BenchWorkload::Write)[1]));
        assert!(!saturated(open_rows(&back, Kind::Baton, BenchWorkload::Write)[1]));
    }

    /// A goal is met only if Baton's worst run beats the better rival's
    /// best; the medians alone can pass it. The CPU figures are in the table.
    #[test]
    fn goals_are_judged_on_the_spreads_and_cpu_is_shown() {
        let runs = |figs: &[(f64, f64)], cpu: f64| -> Vec<RunFigures> {
            figs.iter()
                .map(|&(ops, p99)| RunFigures {
                    ops: 1,
                    secs: 1.0,
                    ops_per_sec: ops,
                    p50_ms: 1.0,
                    p99_ms: p99,
                    member_cpu_us: Some(cpu),
                    client_cpu_us: Some(cpu / 10.0),
                    ..RunFigures::default()
                })
                .collect()
        };
        let (w, u) = (BenchWorkload::Write, BenchWorkload::LockUncontended);
        let all = vec![
            // Median 2,000 = 2x ZooKeeper's 1,000, but the slowest run (1,500)
            // is not 2x ZooKeeper's fastest (1,100).
            summarize(Kind::Baton, w, 64, runs(&[(1500.0, 2.0), (2000.0, 2.0), (2100.0, 2.0)], 100.0)),
            summarize(Kind::Zookeeper, w, 64, runs(&[(900.0, 2.0), (1000.0, 2.0), (1100.0, 2.0)], 300.0)),
            // p99: median 1.2 <= half of 4.0, but the worst run's 3.0 is not
            // <= half of ZooKeeper's best 3.0.
            summarize(Kind::Baton, u, 1, runs(&[(500.0, 1.0), (500.0, 1.2), (500.0, 3.0)], 50.0)),
            summarize(Kind::Zookeeper, u, 1, runs(&[(400.0, 3.0), (400.0, 4.0), (400.0, 5.0)], 80.0)),
        ];
        let dir = tempfile::tempdir().expect("tempdir");
        let md = markdown(&all, &opts(dir.path()));
        assert!(md.contains("| write | - | - | 2.00x | 1.00x | ops/s >= 2x the better rival | yes | **no** |"), "{md}");
        assert!(
            md.contains("| lock-uncontended | - | - | 1.25x | 0.30x | p99 <= 0.5x the better rival | yes | **no** |"),
            "{md}"
        );
        assert!(md.contains("| write | 64 | baton | 2000 | 1500-2100 | 1.00 | 2.00 | - | - | 100 | 10 |"), "{md}");
        assert!(md.contains("| write | 64 | zookeeper | 1000 | 900-1100 | 1.00 | 2.00 | - | - | 300 | 30 |"), "{md}");
        // The same runs with Baton's slowest at 2,200: met on both.
        let mut better = all.clone();
        better[0] = summarize(Kind::Baton, w, 64, runs(&[(2200.0, 2.0), (2300.0, 2.0), (2400.0, 2.0)], 100.0));
        let md = markdown(&better, &opts(dir.path()));
        assert!(md.contains("| write | - | - | 2.30x | 1.00x | ops/s >= 2x the better rival | yes | yes |"), "{md}");
    }
}
