//! `baton-bench scale`: how far one 3-member cluster goes, one dimension
//! at a time, for Baton, ZooKeeper and (where it applies) etcd in one run
//! (docs/scaling.md).
//!
//! Dimensions ([`Dim`]), each on a fresh cluster per target, each size
//! from a flag so the same command does the smoke and the full run:
//! - `nodes`: the tree filled to each size with 100-byte nodes (one
//!   follower down meanwhile): RSS per member, data dir on disk, snapshot
//!   size and time, the lagging follower's catch-up, a member's restart to
//!   serving. etcd: flat keys of 100 bytes, puts in txns of 100.
//! - `sessions`: live sessions with an ephemeral node each: the members'
//!   CPU and RSS while they keep alive; how late a dead session's ephemeral
//!   goes after its timeout. etcd: a lease per session (TTL = the session
//!   timeout), a key under it, keepalives every TTL/3.
//! - `watches`: one-shot watches registered: time and members' RSS.
//! - `fanout`: one write, its event delivered to every watcher.
//! - `locks`: one lock's queue: handoff latency, and wake-ups per release,
//!   which must be at most one (no herd; the run fails otherwise). etcd:
//!   the handoff only (its Lock RPC waits on the server, where the client
//!   cannot count wake-ups).
//! - `clients`: bench.rs's write and lock-independent loops.
//!
//! Outputs in `--out`: scale.json (every [`Row`]), scale.md (one table per
//! dimension), scale-<dim>.png (one panel per figure, the targets on the
//! same linear axes).
//!
//! Not here: etcd in watches and fanout ([`not_measured`] says why; the
//! run skips those pairs), and anything beyond one cluster.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use super::targets::Kind;

pub mod client;
pub mod cluster;
pub mod dims;
pub mod plot;

pub use dims::dying_sessions;

/// One thing grown at a time.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Dim {
    Nodes,
    Sessions,
    Watches,
    Fanout,
    Locks,
    Clients,
}

impl Dim {
    pub const ALL: [Dim; 6] = [Dim::Nodes, Dim::Sessions, Dim::Watches, Dim::Fanout, Dim::Locks, Dim::Clients];

    pub fn name(self) -> &'static str {
        match self {
            Dim::Nodes => "nodes",
            Dim::Sessions => "sessions",
            Dim::Watches => "watches",
            Dim::Fanout => "fanout",
            Dim::Locks => "locks",
            Dim::Clients => "clients",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Dim> {
        Dim::ALL.into_iter().find(|d| d.name() == s.trim()).with_context(|| format!("unknown dimension {s:?}"))
    }

    /// What the size counts.
    pub fn unit(self) -> &'static str {
        match self {
            Dim::Nodes => "nodes",
            Dim::Sessions => "sessions",
            Dim::Watches => "watches",
            Dim::Fanout => "watchers",
            Dim::Locks => "waiters",
            Dim::Clients => "clients",
        }
    }
}

/// One target at one size of one dimension.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub target: Kind,
    pub dim: Dim,
    pub size: u64,
    /// Named figures (units in the name: `_s`, `_ms`, `_mb`, `_pct`).
    pub figures: BTreeMap<String, f64>,
    /// What went wrong or was not measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// When it ran (`YYYY-MM-DD HH:MM UTC`; absent in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
}

impl Row {
    pub fn get(&self, key: &str) -> Option<f64> {
        self.figures.get(key).copied()
    }

    /// A lock row shows a herd: more wake-ups than releases (one of slack
    /// for a release at the window's edge), or, with waiters queued, no
    /// wake-up counted at all (the counter is not seeing them). Never for a
    /// target whose wake-ups this side cannot count (etcd).
    pub fn herd(&self) -> Option<String> {
        if self.dim != Dim::Locks || !counts_wakeups(self.target) {
            return None;
        }
        let (woke, rel) = (self.get("wakeups").unwrap_or(0.0), self.get("releases").unwrap_or(0.0));
        if woke > rel + 1.0 {
            return Some(format!(
                "{} {} waiters: {woke} wake-ups for {rel} releases (a herd)",
                self.target.name(),
                self.size
            ));
        }
        if self.size >= 2 && rel >= 2.0 && woke < 1.0 {
            return Some(format!(
                "{} {} waiters: no wake-up counted for {rel} releases",
                self.target.name(),
                self.size
            ));
        }
        None
    }
}

/// Can this side count a lock waiter's wake-ups on `kind`? Baton's recipe
/// and the ZooKeeper adapter run in this process and count each one;
/// etcd's Lock RPC waits inside the server (`concurrency.Mutex`, each
/// waiter watching the key just before its own), which tells the client
/// nothing until the lock is granted.
pub fn counts_wakeups(kind: Kind) -> bool {
    kind != Kind::Etcd
}

/// Why `dim` is not measured on `kind` (None: it is).
pub fn not_measured(kind: Kind, dim: Dim) -> Option<&'static str> {
    if kind != Kind::Etcd {
        return None;
    }
    match dim {
        Dim::Nodes | Dim::Sessions | Dim::Locks | Dim::Clients => None,
        Dim::Watches => Some(
            "etcd has no one-shot watch: its watches are streams that stay until cancelled, opened on a \
             connection's watch stream; not built",
        ),
        Dim::Fanout => Some("etcd has no one-shot watch (see watches); not built"),
    }
}

pub struct ScaleOpts {
    pub targets: Vec<Kind>,
    pub dims: Vec<Dim>,
    pub nodes: Vec<u64>,
    pub sessions: Vec<u64>,
    pub watches: Vec<u64>,
    pub watchers: Vec<u64>,
    pub waiters: Vec<u64>,
    pub clients: Vec<u64>,
    /// Session timeout everywhere.
    pub ttl: Duration,
    /// The sessions dimension's CPU window.
    pub interval: Duration,
    /// Dead sessions per size whose expiry is timed.
    pub expiry_sample: usize,
    /// The locks dimension's measured window per size.
    pub lock_window: Duration,
    /// Measured seconds per clients run.
    pub duration: Duration,
    /// Runs per clients size.
    pub runs: usize,
    /// Longest one step of filling or opening may take.
    pub step_bound: Duration,
    /// One cluster per target for every dimension (the smoke), instead of
    /// a fresh one per dimension (what one dimension leaves behind, in
    /// memory above all, would count against the next).
    pub shared_cluster: bool,
    /// Keep the members' data dirs (to restart one on a copy and profile
    /// its load) instead of deleting them.
    pub keep_data: bool,
    /// A rival that cannot reach a size on this machine is a result (its
    /// row says why), not a failed run: only Baton's failures fail the
    /// command (the full run; the smoke fails on any, an adapter broken).
    pub rivals_may_fail: bool,
    pub out: PathBuf,
}

/// Sockets this process and its members may hold (50k sessions are 50k
/// client sockets here and 50k in the members).
const NOFILE: u64 = 400_000;

/// Runs every dimension on every target, writes the outputs, and fails if
/// a lock queue showed a herd (after writing them).
pub async fn run(o: &ScaleOpts) -> anyhow::Result<Vec<Row>> {
    std::fs::create_dir_all(&o.out)?;
    let nofile = cluster::raise_nofile(NOFILE);
    eprintln!("scale: open-file limit {nofile}");
    let mut all: Vec<Row> = Vec::new();
    for &kind in &o.targets {
        for &dim in &o.dims {
            if let Some(why) = not_measured(kind, dim) {
                eprintln!("[{}] {}: not measured ({why})", kind.name(), dim.name());
            }
        }
    }
    let measured = |kind: Kind, dim: Dim| not_measured(kind, dim).is_none();
    if o.shared_cluster {
        for &kind in &o.targets {
            if !o.dims.iter().any(|&d| measured(kind, d)) {
                continue;
            }
            let dir = o.out.join(kind.name());
            let t = start(kind, &dir, o).await?;
            for &dim in o.dims.iter().filter(|&&d| measured(kind, d)) {
                all.extend(one_dim(&t, dim, o).await);
                write_outputs(&all, &o.out)?;
            }
            finish(t, &dir, o.keep_data);
        }
    } else {
        for &dim in &o.dims {
            for &kind in o.targets.iter().filter(|&&k| measured(k, dim)) {
                let dir = o.out.join(format!("{}-{}", kind.name(), dim.name()));
                let t = start(kind, &dir, o).await?;
                all.extend(one_dim(&t, dim, o).await);
                finish(t, &dir, o.keep_data);
                // Written after every dimension: a run cut short keeps what it had.
                write_outputs(&all, &o.out)?;
            }
        }
    }
    write_outputs(&all, &o.out)?;
    let herds: Vec<String> = all.iter().filter_map(Row::herd).collect();
    if !herds.is_empty() {
        anyhow::bail!("herd effect: {}", herds.join("; "));
    }
    let failed: Vec<String> = all
        .iter()
        .filter(|r| r.figures.is_empty())
        .map(|r| format!("{} {}: {}", r.target.name(), r.dim.name(), r.notes.join("; ")))
        .collect();
    let ours = all.iter().filter(|r| r.figures.is_empty() && matches!(r.target, Kind::Baton | Kind::BatonZk)).count();
    if o.rivals_may_fail && ours == 0 && !failed.is_empty() {
        eprintln!("a rival did not reach every size (its row in scale.md says why): {}", failed.join(" | "));
    } else if !failed.is_empty() {
        anyhow::bail!("dimensions failed: {}", failed.join(" | "));
    }
    Ok(all)
}

async fn start(kind: Kind, dir: &Path, o: &ScaleOpts) -> anyhow::Result<cluster::Scaled> {
    eprintln!("[{}] starting a 3-member cluster in {}", kind.name(), dir.display());
    let t = cluster::Scaled::start(kind, dir).await?;
    let s = client::Sc::connect(kind, &t.endpoints(), o.ttl).await?;
    s.ensure("/scale").await?;
    // The benchmark adapters' folder (the clients dimension writes there).
    s.ensure("/cmp").await?;
    s.close().await;
    Ok(t)
}

/// Stops the cluster and deletes its data (gigabytes at 1M nodes), keeping
/// the logs (and the data with `keep_data`).
fn finish(t: cluster::Scaled, dir: &Path, keep_data: bool) {
    t.stop();
    drop(t);
    if keep_data {
        return;
    }
    for m in 1..=3 {
        let _ = std::fs::remove_dir_all(dir.join(format!("member-{m}")));
        let _ = std::fs::remove_dir_all(dir.join(format!("zk-{m}/data")));
        let _ = std::fs::remove_dir_all(dir.join(format!("etcd-{m}")));
    }
}

/// One dimension's rows, up to the size that failed if one did; the
/// failure is then a row with no figures and a note.
async fn one_dim(t: &cluster::Scaled, dim: Dim, o: &ScaleOpts) -> Vec<Row> {
    let kind = t.kind();
    eprintln!("[{}] {}", kind.name(), dim.name());
    let mut rows = Vec::new();
    let r = match dim {
        Dim::Nodes => dims::nodes(t, o, &mut rows).await,
        Dim::Sessions => dims::sessions(t, o, &mut rows).await,
        Dim::Watches => dims::watches(t, o, &mut rows).await,
        Dim::Fanout => dims::fanout(t, o, &mut rows).await,
        Dim::Locks => dims::locks(t, o, &mut rows).await,
        Dim::Clients => dims::clients(t, o, &mut rows).await,
    };
    if let Err(e) = r {
        eprintln!("[{}] {} failed: {e:#}", kind.name(), dim.name());
        let note = format!("failed after {} size(s): {e:#}", rows.len());
        rows.push(Row { target: kind, dim, size: 0, figures: BTreeMap::new(), notes: vec![note], date: None });
    }
    rows
}

pub fn write_outputs(all: &[Row], out: &Path) -> anyhow::Result<()> {
    let now = baton_jepsen::plot::utc_stamp(std::time::SystemTime::now());
    let all: Vec<Row> =
        all.iter().map(|r| Row { date: r.date.clone().or_else(|| Some(now.clone())), ..r.clone() }).collect();
    let all = &all[..];
    std::fs::write(out.join("scale.json"), serde_json::to_string_pretty(all)?)?;
    std::fs::write(out.join("scale.md"), markdown(all))?;
    plot::charts(all, out)
}

/// Draws the PNGs again from `dir/scale.json`, running nothing.
pub fn replot(dir: &Path) -> anyhow::Result<()> {
    let json = dir.join("scale.json");
    let text = std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    let all: Vec<Row> = serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    std::fs::write(dir.join("scale.md"), markdown(&all))?;
    plot::charts(&all, dir)
}

/// A target's name in prose.
fn title(k: Kind) -> &'static str {
    match k {
        Kind::Baton => "Baton",
        Kind::Etcd => "etcd",
        Kind::Zookeeper => "ZooKeeper",
        Kind::BatonZk => "Baton's ZooKeeper port",
    }
}

/// "a", "a and b", "a, b and c".
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// A figure for a table: 3 significant digits, thousands unrounded.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A table's columns: (header, figure key).
fn columns(d: Dim) -> &'static [(&'static str, &'static str)] {
    match d {
        Dim::Nodes => &[
            ("fill s", "write_s"),
            ("writes/s", "writes_per_sec"),
            ("RSS max MB", "rss_mb_max"),
            ("RSS sum MB", "rss_mb_sum"),
            ("disk max MB", "disk_mb_max"),
            ("snapshot MB", "snapshot_mb"),
            ("snapshot s", "snapshot_s"),
            ("Baton auto snapshot mean s", "raft_snapshot_mean_s"),
            ("catch-up s", "catchup_s"),
            ("restart s", "restart_s"),
        ],
        Dim::Sessions => &[
            ("open s", "open_s"),
            ("CPU % (3 members)", "cpu_pct_sum"),
            ("CPU % max member", "cpu_pct_max"),
            ("RSS max MB", "rss_mb_max"),
            ("expired", "expired"),
            ("late p50 ms", "expiry_late_p50_ms"),
            ("late p99 ms", "expiry_late_p99_ms"),
            ("late max ms", "expiry_late_max_ms"),
            ("early max ms", "expiry_early_max_ms"),
        ],
        Dim::Watches => &[
            ("registered", "registered"),
            ("register s", "register_s"),
            ("watches/s", "watches_per_sec"),
            ("RSS max MB", "rss_mb_max"),
            ("RSS growth MB", "rss_growth_mb_max"),
        ],
        Dim::Fanout => &[
            ("delivered", "delivered"),
            ("p50 ms", "p50_ms"),
            ("p99 ms", "p99_ms"),
            ("all ms", "all_ms"),
            ("RSS max MB", "rss_mb_max"),
        ],
        Dim::Locks => &[
            ("handoffs/s", "handoffs_per_sec"),
            ("p50 ms", "handoff_p50_ms"),
            ("p99 ms", "handoff_p99_ms"),
            ("releases", "releases"),
            ("wake-ups", "wakeups"),
            ("wake-ups/release", "wakeups_per_release"),
        ],
        Dim::Clients => &[
            ("write ops/s", "write_ops_per_sec"),
            ("write min", "write_ops_per_sec_min"),
            ("write max", "write_ops_per_sec_max"),
            ("write p99 ms", "write_p99_ms"),
            ("lock ops/s", "lock_ops_per_sec"),
            ("lock min", "lock_ops_per_sec_min"),
            ("lock max", "lock_ops_per_sec_max"),
            ("lock p99 ms", "lock_p99_ms"),
        ],
    }
}

pub fn markdown(all: &[Row]) -> String {
    let mut md = String::new();
    let mut targets: Vec<Kind> = all.iter().map(|r| r.target).collect();
    targets.sort();
    targets.dedup();
    let names: Vec<&str> = targets.iter().map(|&k| title(k)).collect();
    let _ = writeln!(md, "# One cluster, one dimension at a time\n");
    let _ =
        writeln!(md, "3-member clusters on 127.0.0.1 ({}), a fresh one per dimension and target.\n", and_list(&names));
    for d in Dim::ALL {
        let rows: Vec<&Row> = all.iter().filter(|r| r.dim == d).collect();
        if rows.is_empty() {
            continue;
        }
        let cols = columns(d);
        let _ = writeln!(md, "## {}\n", d.name());
        let _ = write!(md, "| {} | target |", d.unit());
        for (h, _) in cols {
            let _ = write!(md, " {h} |");
        }
        let herd_col = d == Dim::Locks;
        if herd_col {
            let _ = write!(md, " herd |");
        }
        let _ = write!(md, "\n|---:|---|");
        for _ in cols {
            let _ = write!(md, "---:|");
        }
        if herd_col {
            let _ = write!(md, "---|");
        }
        let _ = writeln!(md);
        let mut sorted = rows.clone();
        sorted.sort_by_key(|r| (r.size, r.target));
        for r in &sorted {
            let _ = write!(md, "| {} | {} |", r.size, r.target.name());
            for (_, k) in cols {
                let _ = write!(md, " {} |", r.get(k).map(fmt_num).unwrap_or_else(|| "-".into()));
            }
            if herd_col {
                let herd = if !counts_wakeups(r.target) {
                    "n/a"
                } else if r.herd().is_some() {
                    "**yes**"
                } else {
                    "no"
                };
                let _ = write!(md, " {herd} |");
            }
            let _ = writeln!(md);
        }
        let mut notes: Vec<String> = Vec::new();
        // A note once per target, at its first size (etcd's lock note is on
        // every size).
        let mut seen = std::collections::BTreeSet::new();
        for r in &sorted {
            for n in &r.notes {
                if seen.insert((r.target, n.as_str())) {
                    notes.push(format!("- {} {}: {n}", r.target.name(), r.size));
                }
            }
        }
        for &k in &targets {
            if let Some(why) = not_measured(k, d) {
                notes.push(format!("- {}: not measured: {why}", k.name()));
            }
        }
        if !notes.is_empty() {
            let _ = writeln!(md, "\n{}", notes.join("\n"));
        }
        let _ = writeln!(md, "\n![{}](scale-{}.png)\n", d.name(), d.name());
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock_row(size: u64, woke: f64, rel: f64) -> Row {
        let mut figures = BTreeMap::new();
        figures.insert("wakeups".to_string(), woke);
        figures.insert("releases".to_string(), rel);
        figures.insert("handoff_p99_ms".to_string(), 4.0);
        Row { target: Kind::Baton, dim: Dim::Locks, size, figures, notes: vec![], date: None }
    }

    #[test]
    fn herd_is_more_wakeups_than_releases() {
        assert!(lock_row(10, 99.0, 100.0).herd().is_none());
        assert!(lock_row(10, 101.0, 100.0).herd().is_none(), "one of slack at the window's edge");
        assert!(lock_row(10, 900.0, 100.0).herd().is_some());
        // One waiter is never woken: it is alone.
        assert!(lock_row(1, 0.0, 100.0).herd().is_none());
        // Waiters queued but nothing counted: the counter is broken.
        assert!(lock_row(10, 0.0, 100.0).herd().is_some());
    }

    #[test]
    fn outputs_tables_and_charts() {
        let mut rows = vec![lock_row(1, 0.0, 50.0), lock_row(10, 49.0, 50.0), lock_row(100, 500.0, 50.0)];
        for (size, ops) in [(1, 400.0), (8, 2500.0), (64, 9000.0)] {
            let mut f = BTreeMap::new();
            for k in ["write", "lock"] {
                f.insert(format!("{k}_ops_per_sec"), ops);
                f.insert(format!("{k}_ops_per_sec_min"), ops * 0.9);
                f.insert(format!("{k}_ops_per_sec_max"), ops * 1.1);
                f.insert(format!("{k}_p99_ms"), 3.0);
            }
            rows.push(Row { target: Kind::Zookeeper, dim: Dim::Clients, size, figures: f, notes: vec![], date: None });
        }
        let md = markdown(&rows);
        assert!(md.contains("## locks") && md.contains("## clients"), "{md}");
        assert!(md.contains("| 100 | baton |") && md.contains("| **yes** |"), "{md}");
        assert!(md.contains("| 8 | zookeeper | 2500 | 2250 | 2750 | 3.00 |"), "{md}");
        let dir = tempfile::tempdir().expect("tempdir");
        write_outputs(&rows, dir.path()).expect("outputs");
        for png in ["scale-locks.png", "scale-clients.png"] {
            let bytes = std::fs::read(dir.path().join(png)).expect("png");
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        }
        assert!(!dir.path().join("scale-nodes.png").exists());
        replot(dir.path()).expect("replot");
        let back: Vec<Row> =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("scale.json")).expect("json"))
                .expect("parse");
        assert_eq!(back.len(), rows.len());
        assert_eq!(back[1].get("wakeups"), Some(49.0));
        assert_eq!(Dim::parse("fanout").ok(), Some(Dim::Fanout));
        assert!(Dim::parse("nope").is_err());
        assert_eq!(fmt_num(1234.4), "1234");
        assert_eq!(fmt_num(0.123), "0.12");
    }

    /// An etcd lock row as `locks_on` writes it: handoffs, no wake-ups.
    fn etcd_lock_row(size: u64) -> Row {
        let mut figures = BTreeMap::new();
        figures.insert("releases".to_string(), 300.0);
        figures.insert("handoffs_per_sec".to_string(), 100.0);
        figures.insert("handoff_p50_ms".to_string(), 6.0);
        figures.insert("handoff_p99_ms".to_string(), 20.0);
        let notes = vec![dims::ETCD_WAKEUPS_NOTE.to_string()];
        Row { target: Kind::Etcd, dim: Dim::Locks, size, figures, notes, date: None }
    }

    #[test]
    fn etcd_lock_rows_are_no_herd_and_say_why() {
        // Without the wake-up figures a Baton row would fail the check.
        let mut baton = etcd_lock_row(100);
        baton.target = Kind::Baton;
        assert!(baton.herd().is_some());
        for size in [1, 10, 1000] {
            assert!(etcd_lock_row(size).herd().is_none(), "{size}");
        }
        assert!(!counts_wakeups(Kind::Etcd) && counts_wakeups(Kind::Baton) && counts_wakeups(Kind::Zookeeper));
        let rows = vec![lock_row(10, 10.0, 10.0), etcd_lock_row(10), etcd_lock_row(100)];
        let md = markdown(&rows);
        assert!(md.contains("| 10 | etcd | 100 | 6.00 | 20.0 | 300 | - | - | n/a |"), "{md}");
        assert!(md.contains("| 10 | baton |") && md.contains(" | no |"), "{md}");
        // The note once, not once per size.
        assert_eq!(md.matches("wake-ups not counted").count(), 1, "{md}");
        assert!(md.contains("(Baton and etcd)"), "{md}");
    }

    #[test]
    fn etcd_runs_where_it_applies_and_tables_say_where_not() {
        for d in [Dim::Nodes, Dim::Sessions, Dim::Locks, Dim::Clients] {
            assert!(not_measured(Kind::Etcd, d).is_none(), "{d:?}");
        }
        for d in [Dim::Watches, Dim::Fanout] {
            assert!(not_measured(Kind::Etcd, d).is_some(), "{d:?}");
        }
        for d in Dim::ALL {
            assert!(not_measured(Kind::Baton, d).is_none() && not_measured(Kind::Zookeeper, d).is_none());
        }
        let node = |target: Kind, size: u64, rss: f64| {
            let mut f = BTreeMap::new();
            f.insert("write_s".to_string(), size as f64 / 20_000.0);
            f.insert("rss_mb_max".to_string(), rss);
            f.insert("snapshot_mb".to_string(), size as f64 / 4000.0);
            f.insert("catchup_s".to_string(), 1.5);
            Row { target, dim: Dim::Nodes, size, figures: f, notes: vec![], date: None }
        };
        let mut rows = vec![node(Kind::Etcd, 10_000, 60.0), node(Kind::Etcd, 100_000, 250.0)];
        rows.push(node(Kind::Zookeeper, 10_000, 190.0));
        let mut s = BTreeMap::new();
        s.insert("registered".to_string(), 1000.0);
        rows.push(Row {
            target: Kind::Zookeeper,
            dim: Dim::Watches,
            size: 1000,
            figures: s,
            notes: vec![],
            date: None,
        });
        let md = markdown(&rows);
        assert!(md.contains("(etcd and ZooKeeper)"), "{md}");
        // etcd has no auto-snapshot figure: a dash, not a zero.
        assert!(md.contains("| 100000 | etcd | 5.00 | - | 250 | - | - | 25.0 | - | - | 1.50 | - |"), "{md}");
        let watches = md.split("## watches").nth(1).expect("watches section");
        assert!(watches.contains("- etcd: not measured: etcd has no one-shot watch"), "{md}");
        let nodes = md.split("## watches").next().expect("nodes section");
        assert!(!nodes.contains("not measured"), "{md}");
        let dir = tempfile::tempdir().expect("tempdir");
        write_outputs(&rows, dir.path()).expect("outputs");
        let bytes = std::fs::read(dir.path().join("scale-nodes.png")).expect("png");
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(and_list(&[]), "");
        assert_eq!(and_list(&["a", "b", "c"]), "a, b and c");
    }
}
