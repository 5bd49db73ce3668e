//! What the lock, election and read-write lock checkers share: the hold
//! intervals of a lock-like grant (a lock, leadership, a read or write
//! hold), mutual exclusion outside faults, and
//! `holder-connected-after-expiry`.
//!
//! Two holds conflict unless both are shared: a grant whose `ok` value has
//! `"write": false` (a read hold) is shared, every other grant exclusive.
//! Shared holds may overlap each other; neither check counts them.
//!
//! Every client's session state changes are recorded as history notes
//! ([`crate::history`], module doc). Grants are judged against them:
//! `holder-connected-after-expiry` when an earlier holder, before invoking
//! its release / resign, was still recorded `Connected` more than
//! [`clock_allowance`] before another session was granted the same lock /
//! leadership, less [`state_slack`] (min(50 ms, T/20)) for recording lag.
//! The session guarantee: the new grant needs the old session expired, and
//! a correct client leaves `Connected` at least T/3 before that can commit,
//! on one clock; with clock rates up to 10% apart (docs/guarantees.md) a
//! client is safe only with a margin of at least the allowance (0.19 T) on
//! one clock. A harness run has one clock, so it judges that margin
//! (except a run through the ZooKeeper door: `History::one_clock_only`).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::history::{role, FaultWindow, History, OpType};

/// How one kind of grant shows in the history.
pub(crate) struct Grants<'a> {
    /// `f` of the operation whose `ok` (with a `token`) grants it.
    pub grant: &'a str,
    /// `f` of the operation that gives it up (its invocation ends the hold).
    pub release: &'a str,
    /// What is granted, for explanations: "lock", "election".
    pub what: &'a str,
    /// The lock's or election's name, for anomalies.
    pub name: &'a str,
}

/// What [`judge`] found.
pub(crate) struct Judgement {
    /// Pairs of holds that overlapped (during faults, or not).
    pub overlapping: usize,
    /// What `holder-connected-after-expiry` judged.
    pub judged: Judged,
    /// `concurrent-holders` and `holder-connected-after-expiry` anomalies.
    pub anomalies: Vec<Value>,
}

/// Mutual exclusion outside faults (`concurrent-holders`) and
/// `holder-connected-after-expiry`, for the grants `g` in `h`, with
/// session timeout `t`.
pub(crate) fn judge(h: &History, g: &Grants<'_>, faults: &[FaultWindow], t: Duration) -> Judgement {
    let hs = holds(h, g.grant, g.release);
    let (overlapping, mut anomalies) = overlaps(&hs, faults, fault_grace(t));
    let (judged, late) = holder_connected(h, &hs, g.name, g.what, t);
    anomalies.extend(late);
    Judgement { overlapping, judged, anomalies }
}

/// True if time `t` (ns) is within a fault window or `grace` after it.
fn near_fault(faults: &[FaultWindow], t: u64, grace: u64) -> bool {
    faults.iter().any(|f| t + 1 >= f.start && t <= f.end.saturating_add(grace))
}

/// Grace after a fault during which overlapping holders are explained by
/// it: two session timeouts `t`, an election and a keepalive period.
pub fn fault_grace(t: Duration) -> u64 {
    (t.as_millis() as u64 * 2 + 3000) * 1_000_000
}

/// Slack for recording lag in `holder-connected-after-expiry` (ns):
/// min(50 ms, T/20). A state note is written when the watcher task *saw*
/// the change: after the client actor noticed its proof ran out (it looks
/// every 20 ms) and the task was scheduled. The slack is a cushion on top
/// of the real margin: a correct client leaves `Connected` at least T/3
/// before any leader can commit its session's expiry, and a grant is
/// recorded when the new holder's call returned (after that commit), so a
/// false positive needs more than T/3 + slack of recording lag (383 ms at
/// T = 1 s). Measured on correct runs (client freezes, T = 1 s and 2 s),
/// the closest any holder's recorded `Connected` came to another's grant
/// was T/3 + 22-36 ms, i.e. no lag showed at all; the stats report that
/// figure (`closest_ms`) on every run. A larger slack hides real
/// violations: the planted `keepalive-without-quorum` typically keeps a
/// holder `Connected` only 0-150 ms past the grant, because the cut-off
/// leader steps down (check-quorum) within 0.5-1 s.
pub fn state_slack(t: Duration) -> u64 {
    (t.as_nanos() as u64 / 20).min(50_000_000)
}

/// How far two clocks' rates may differ (docs/guarantees.md: 10%).
pub const CLOCK_RATE: f64 = 0.10;

/// The margin (ns) on one clock by which a holder must have left
/// `Connected` before the next grant, so that it would still have left in
/// time with clock rates [`CLOCK_RATE`] apart: a client's deadline up to
/// `T` after its last proof may run late by `rate * T` of real time, and
/// the leader's `T` from that proof may run early by `T * rate / (1 +
/// rate)`: 0.19 T at 10%. A correct client leaves `Connected` `2T/3` after
/// its proof, `T/3` before the expiry can commit: 0.14 T to spare for its
/// own reaction. Found by this check (2026-12-07): `baton lock --on-suspend
/// wait` ran its command until a whole `T` after the proof, 18 ms before
/// the next grant in one run; it now stops at `2T/3` as `Connected` does.
pub fn clock_allowance(t: Duration) -> u64 {
    (t.as_nanos() as f64 * (CLOCK_RATE + CLOCK_RATE / (1.0 + CLOCK_RATE))) as u64
}

/// One process's hold, times in ns.
struct Hold {
    process: u64,
    token: u64,
    granted: u64,
    /// When its release was invoked (the end of the run if never).
    released: u64,
    /// A read hold (module doc).
    shared: bool,
}

impl Hold {
    /// Whether `self` and `other` may not be held at once.
    fn conflicts(&self, other: &Hold) -> bool {
        !(self.shared && other.shared)
    }

    fn to_json(&self) -> Value {
        let (from_s, to_s) = (self.granted as f64 / 1e9, self.released as f64 / 1e9);
        json!({"process": self.process, "token": self.token, "from_s": from_s, "to_s": to_s})
    }
}

/// Hold intervals [granted, release invoked] per process, by grant time.
fn holds(h: &History, grant: &str, release: &str) -> Vec<Hold> {
    let pairs = h.pairs();
    // process -> (token, granted, shared)
    let mut open: HashMap<u64, (u64, u64, bool)> = HashMap::new();
    let mut out = Vec::new();
    let end_of_run = h.ops.last().map(|o| o.time).unwrap_or(0);
    for p in &pairs {
        let Some(c) = p.complete else { continue };
        if p.invoke.f == grant && c.ty == OpType::Ok {
            if let Some(t) = c.u64("token") {
                let shared = c.value.get("write").and_then(Value::as_bool) == Some(false);
                open.insert(p.invoke.process, (t, c.time, shared));
            }
        } else if p.invoke.f == release {
            if let Some((token, granted, shared)) = open.remove(&p.invoke.process) {
                out.push(Hold { process: p.invoke.process, token, granted, released: p.invoke.time, shared });
            }
        }
    }
    for (process, (token, granted, shared)) in open {
        out.push(Hold { process, token, granted, released: end_of_run, shared });
    }
    out.sort_by_key(|x| x.granted);
    out
}

/// Pairs of overlapping holds; those outside fault windows violate mutual
/// exclusion.
fn overlaps(hs: &[Hold], faults: &[FaultWindow], grace: u64) -> (usize, Vec<Value>) {
    let mut total = 0;
    let mut bad = Vec::new();
    for (i, a) in hs.iter().enumerate() {
        for b in &hs[i + 1..] {
            if b.granted >= a.released {
                continue;
            }
            if a.process == b.process || !a.conflicts(b) {
                continue;
            }
            total += 1;
            if !near_fault(faults, b.granted, grace) && bad.len() < 20 {
                bad.push(json!({
                    "anomaly": "concurrent-holders",
                    "explain": "two processes held it at once with no fault active",
                    "first": a.to_json(),
                    "second": b.to_json(),
                }));
            }
        }
    }
    (total, bad)
}

/// `holder-connected-after-expiry`: when a process is granted `name` (a
/// lock, or leadership) while an earlier holder has not yet invoked its
/// release / resign, that holder's client must already have left
/// `Connected` by [`clock_allowance`]: the cluster can only have handed it
/// on after expiring the holder's session, and a correct client is
/// `Suspended` at least T/3 before that expiry can commit. Judged from the
/// session-state notes (`crate::history`): a violation is a `Connected`
/// state recorded at any time in [grant - allowance + slack, the holder's
/// release invocation), from no earlier than the holder's own grant, i.e.
/// the last note at that start, or a later one before the release, says
/// `Connected`. `slack` is [`state_slack`]. Returns (grants judged,
/// violations); a holder with no notes is not judged. Also reports, in
/// `closest`, the smallest margin seen (grant time minus the end of the
/// holder's last `Connected` stretch; negative: still `Connected` after
/// the grant): how near the run came to a violation.
fn holder_connected(h: &History, hs: &[Hold], name: &str, what: &str, t: Duration) -> (Judged, Vec<Value>) {
    let states = h.session_states(role::MAIN);
    let slack = state_slack(t);
    let allowance = if h.one_clock_only { 0 } else { clock_allowance(t) };
    let mut judged = Judged { slack_ms: slack as f64 / 1e6, allowance_ms: allowance as f64 / 1e6, ..Judged::default() };
    let mut bad = Vec::new();
    for (i, a) in hs.iter().enumerate() {
        let Some(log) = states.get(&a.process) else { continue };
        // Holds are sorted by grant time: every later grant inside a's hold.
        // One anomaly per hold: its first offending grant, and a count.
        let mut first: Option<(&Hold, u64)> = None;
        let mut offending = 0;
        for b in hs[i + 1..].iter().take_while(|b| b.granted < a.released) {
            if b.process == a.process || !a.conflicts(b) {
                continue;
            }
            judged.grants += 1;
            if let Some(end) = log.connected_end(b.granted, a.released) {
                let margin = (b.granted as f64 - end as f64) / 1e6;
                if judged.closest_ms.is_none_or(|c| margin < c) {
                    judged.closest_ms = Some(margin);
                }
            }
            let from = (b.granted + slack).saturating_sub(allowance).max(a.granted);
            if let Some(at) = log.connected_within(from, a.released) {
                offending += 1;
                first = first.or(Some((b, at)));
            }
        }
        if let Some((b, at)) = first.filter(|_| bad.len() < 20) {
            let new_session = states.get(&b.process).map(|l| l.session);
            // The holder's notes from its grant, or two timeouts before the
            // other grant if later, to its release.
            let since = b.granted.saturating_sub(2 * t.as_nanos() as u64).max(a.granted);
            bad.push(json!({
                "anomaly": "holder-connected-after-expiry",
                "explain": format!(
                    "{what} {name:?} was granted to another session while its earlier holder had not invoked its \
                     release and its client was still recorded Connected less than {} ms before the grant (the \
                     allowance for clock rates {}% apart, less {} ms of slack): the holder's session can only \
                     have been expired before the grant, so its client stayed Connected too close to, or past, \
                     its session's expiry",
                    allowance / 1_000_000,
                    (CLOCK_RATE * 100.0).round(),
                    slack / 1_000_000
                ),
                "name": name,
                "holder": {
                    "process": a.process, "session": log.session, "token": a.token,
                    "granted_s": a.granted as f64 / 1e9, "release_invoked_s": a.released as f64 / 1e9,
                },
                "granted": {
                    "process": b.process, "session": new_session, "token": b.token,
                    "granted_s": b.granted as f64 / 1e9,
                },
                "holder_connected_at_s": at as f64 / 1e9,
                "grants_while_holder_connected": offending,
                "slack_ms": slack as f64 / 1e6,
                "allowance_ms": allowance as f64 / 1e6,
                "holder_states_from_s": since as f64 / 1e9,
                "holder_state_then": log.state_at(since),
                "holder_states": log
                    .between(since, a.released)
                    .into_iter()
                    .map(|(at, s)| json!({"at_s": at as f64 / 1e9, "state": s}))
                    .collect::<Vec<_>>(),
            }));
        }
    }
    (judged, bad)
}

/// A semaphore of `permits`: at most `permits` holds at once outside
/// faults (`too-many-holders`), and `holder-connected-after-expiry`
/// generalized: when a hold is granted while `permits` or more earlier
/// holds of other processes have not invoked their release, the cluster
/// can only have granted it after expiring all but `permits - 1` of their
/// sessions, so at most `permits - 1` of those holders may still be
/// recorded `Connected` within the clock allowance before the grant (the
/// same window as [`holder_connected`]'s). With `permits` 1 this is the
/// lock's rule. `closest` is, per judged grant, the `permits`-th smallest
/// margin among those holders (the one that decides), the smallest of them
/// over the run. `overlapping` counts grants made over the limit.
pub(crate) fn judge_permits(
    h: &History,
    g: &Grants<'_>,
    permits: usize,
    faults: &[FaultWindow],
    t: Duration,
) -> Judgement {
    let hs = holds(h, g.grant, g.release);
    let states = h.session_states(role::MAIN);
    let (slack, grace) = (state_slack(t), fault_grace(t));
    let allowance = if h.one_clock_only { 0 } else { clock_allowance(t) };
    let mut judged = Judged { slack_ms: slack as f64 / 1e6, allowance_ms: allowance as f64 / 1e6, ..Judged::default() };
    let (mut overlapping, mut anomalies, mut late) = (0, Vec::new(), Vec::new());
    let permits = permits.max(1);
    for (i, b) in hs.iter().enumerate() {
        let held: Vec<&Hold> = hs[..i].iter().filter(|a| a.released > b.granted && a.process != b.process).collect();
        if held.len() < permits {
            continue;
        }
        overlapping += 1;
        let all = || held.iter().map(|a| a.to_json()).chain(std::iter::once(b.to_json())).collect::<Vec<_>>();
        if !near_fault(faults, b.granted, grace) && anomalies.len() < 20 {
            anomalies.push(json!({
                "anomaly": "too-many-holders",
                "explain": format!("more than {permits} processes held {} {:?} at once with no fault active", g.what, g.name),
                "permits": permits,
                "holds": all(),
            }));
        }
        judged.grants += 1;
        let mut margins: Vec<f64> = held
            .iter()
            .filter_map(|a| states.get(&a.process)?.connected_end(b.granted, a.released))
            .map(|end| (b.granted as f64 - end as f64) / 1e6)
            .collect();
        margins.sort_by(f64::total_cmp);
        if let Some(&m) = margins.get(permits - 1) {
            if judged.closest_ms.is_none_or(|c| m < c) {
                judged.closest_ms = Some(m);
            }
        }
        let from = (b.granted + slack).saturating_sub(allowance);
        let connected: Vec<Value> = held
            .iter()
            .filter_map(|a| {
                let log = states.get(&a.process)?;
                let at = log.connected_within(from.max(a.granted), a.released)?;
                Some(json!({"process": a.process, "session": log.session, "token": a.token, "connected_at_s": at as f64 / 1e9}))
            })
            .collect();
        if connected.len() >= permits && late.len() < 20 {
            late.push(json!({
                "anomaly": "holder-connected-after-expiry",
                "explain": format!(
                    "{} {:?} ({permits} permits) was granted to another session while {} earlier holders had not \
                     invoked their release and were recorded Connected less than {} ms before the grant: all but \
                     {} of their sessions can only have been expired before it",
                    g.what, g.name, connected.len(), allowance.saturating_sub(slack) / 1_000_000, permits - 1
                ),
                "name": g.name,
                "granted": b.to_json(),
                "connected_holders": connected,
                "slack_ms": slack as f64 / 1e6,
                "allowance_ms": allowance as f64 / 1e6,
            }));
        }
    }
    anomalies.extend(late);
    Judgement { overlapping, judged, anomalies }
}

/// What `holder_connected` judged (for the stats).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct Judged {
    /// Grants made while an earlier holder had not invoked its release.
    grants: usize,
    /// Smallest margin (ms) between such a grant and the end of the
    /// holder's last `Connected` stretch (negative: Connected after it).
    closest_ms: Option<f64>,
    slack_ms: f64,
    /// [`clock_allowance`], the margin required.
    allowance_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_clock_allowance_is_0_19_of_the_session_timeout() {
        assert_eq!(clock_allowance(Duration::from_secs(1)), 190_909_090);
        assert_eq!(clock_allowance(Duration::from_secs(2)), 381_818_181);
        // A correct client's margin, T/3, covers it with 0.14 T to spare.
        assert!(clock_allowance(Duration::from_secs(3)) < 1000 * MS - 400 * MS);
    }

    #[test]
    fn the_slack_is_min_50_ms_and_t_over_20() {
        assert_eq!(state_slack(Duration::from_millis(1000)), 50 * MS);
        assert_eq!(state_slack(Duration::from_millis(600)), 30 * MS);
        assert_eq!(state_slack(Duration::from_millis(5000)), 50 * MS);
    }

    fn push(h: &mut History, process: u64, ty: OpType, f: &str, value: Value, at: u64) {
        let op =
            crate::history::Op { index: 0, process, ty, f: f.into(), key: None, value, time: at * MS, error: None };
        h.ops.push(op);
    }

    /// Process `p` holds from `from` to `to` (ms), `write` or not.
    fn hold(h: &mut History, p: u64, token: u64, write: Option<bool>, from: u64, to: u64) {
        push(h, p, OpType::Invoke, "get", Value::Null, from - 1);
        let ok = match write {
            Some(w) => json!({"token": token, "write": w}),
            None => json!({"token": token}),
        };
        push(h, p, OpType::Ok, "get", ok, from);
        push(h, p, OpType::Invoke, "put", Value::Null, to);
        push(h, p, OpType::Ok, "put", Value::Null, to + 1);
    }

    fn overlapping(h: &mut History) -> usize {
        h.ops.sort_by_key(|o| o.time);
        let g = Grants { grant: "get", release: "put", what: "test", name: "t" };
        judge(h, &g, &[], Duration::from_secs(1)).overlapping
    }

    #[test]
    fn read_holds_share_and_every_other_pair_conflicts() {
        // Two readers at once: no conflict.
        let mut h = History::default();
        hold(&mut h, 1, 10, Some(false), 10, 50);
        hold(&mut h, 2, 11, Some(false), 20, 60);
        assert_eq!(overlapping(&mut h), 0);
        // A writer beside a reader, and a writer beside a writer: conflicts.
        hold(&mut h, 3, 12, Some(true), 30, 40);
        assert_eq!(overlapping(&mut h), 2);
        let mut h = History::default();
        hold(&mut h, 1, 10, Some(true), 10, 50);
        hold(&mut h, 2, 11, Some(true), 20, 60);
        assert_eq!(overlapping(&mut h), 1);
        // A grant that says nothing (a lock, leadership) is exclusive.
        let mut h = History::default();
        hold(&mut h, 1, 10, None, 10, 50);
        hold(&mut h, 2, 11, Some(false), 20, 60);
        assert_eq!(overlapping(&mut h), 1);
    }
}
