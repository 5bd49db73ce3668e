//! The semaphore workload's checker.
//!
//! The history it reads: `sem-acquire` (ok `{"token"}`), `sem-release` (ok
//! `{"token", "lost"}`), and the holders' session-state notes.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use crate::history::{FaultWindow, History, OpType};
use crate::holds::{fault_grace, judge_permits, Grants};
use crate::verdict::{CheckResult, Validity};

/// Semaphore `name` of `permits`: tokens unique; at most `permits` holds
/// at once outside faults (`too-many-holders`); no more than `permits - 1`
/// earlier holders still `Connected` when another is granted over the
/// limit ([`judge_permits`]); `t` is the session timeout. The stats give
/// the most holds seen at once (`most_held_at_once`): a semaphore that
/// never lets two hold passes, but shows 1 there. Liveness, outside faults
/// (and their grace): no acquire waits more than [`IDLE_LIMIT`] while
/// fewer than `permits` holds are open (`permit-idle`: a free permit the
/// waiter was never given).
pub fn check(h: &History, name: &str, permits: usize, faults: &[FaultWindow], t: Duration) -> CheckResult {
    let pairs = h.pairs();
    let mut anomalies = Vec::new();
    let mut by_token: HashMap<u64, u64> = HashMap::new();
    let mut won = 0;
    for p in pairs.iter().filter(|p| p.invoke.f == "sem-acquire" && p.outcome() == OpType::Ok) {
        won += 1;
        let Some(t) = p.complete.and_then(|c| c.u64("token")) else { continue };
        if let Some(o) = by_token.insert(t, p.invoke.process) {
            anomalies.push(json!({"anomaly": "duplicate-token", "token": t, "processes": [o, p.invoke.process]}));
        }
    }
    let idle = idle_waits(h, permits, faults, fault_grace(t));
    let longest_idle_ms = idle.iter().map(|w| w.2).max().unwrap_or(0) as f64 / 1e6;
    for (process, from, len) in idle.iter().filter(|w| w.2 > IDLE_LIMIT).take(20) {
        anomalies.push(json!({
            "anomaly": "permit-idle",
            "explain": format!(
                "an acquire of semaphore {name:?} waited {} ms while fewer than {permits} holds were open, with no \
                 fault active: a free permit was not given to a waiter",
                len / 1_000_000
            ),
            "process": process, "from_s": *from as f64 / 1e9, "idle_ms": *len as f64 / 1e6,
        }));
    }
    let g = Grants { grant: "sem-acquire", release: "sem-release", what: "semaphore", name };
    let holds = judge_permits(h, &g, permits, faults, t);
    anomalies.extend(holds.anomalies);
    CheckResult {
        checker: "semaphore".into(),
        valid: Validity::of(&anomalies),
        anomalies,
        stats: json!({
            "permits": permits, "holds": won, "most_held_at_once": most_at_once(h),
            "granted_over_the_limit": holds.overlapping, "holder_states": holds.judged,
            "longest_idle_wait_ms": longest_idle_ms,
        }),
    }
}

/// How long a waiter may wait beside a free permit outside faults: the
/// hand-on (a release's commit, the mutex's turn, a lease) takes tens of
/// milliseconds (96 ms the longest in a quiet 30 s run; a `baton` process's
/// release and exit are in it through the CLI door); two seconds leave a
/// loaded machine room, and the idle permit it was made for kept waiters
/// up to their 4 s limit.
pub const IDLE_LIMIT: u64 = 2_000_000_000;

/// Each acquire's longest stretch of waiting while fewer than `permits`
/// holds were open and no fault (or its grace) was active: (process, start,
/// length in ns). A hold is open from its grant to its release's
/// invocation.
fn idle_waits(h: &History, permits: usize, faults: &[FaultWindow], grace: u64) -> Vec<(u64, u64, u64)> {
    let end = h.ops.last().map(|o| o.time).unwrap_or(0);
    let mut steps: Vec<(u64, i64)> = Vec::new();
    let mut waits: Vec<(u64, u64, u64)> = Vec::new();
    let mut open: HashMap<u64, u64> = HashMap::new();
    for p in h.pairs() {
        let done = p.complete.map(|c| c.time).unwrap_or(end);
        if p.invoke.f == "sem-acquire" {
            waits.push((p.invoke.process, p.invoke.time, done));
            if p.complete.is_some_and(|c| c.ty == OpType::Ok) {
                open.insert(p.invoke.process, done);
            }
        } else if p.invoke.f == "sem-release" {
            if let Some(from) = open.remove(&p.invoke.process) {
                steps.push((from, 1));
                steps.push((p.invoke.time, -1));
            }
        }
    }
    for from in open.into_values() {
        steps.push((from, 1));
        steps.push((end, -1));
    }
    steps.sort_unstable();
    // Stretches with fewer than `permits` open: [start, end).
    let mut short: Vec<(u64, u64)> = Vec::new();
    let (mut now, mut since) = (0i64, Some(0u64));
    for (at, d) in steps {
        now += d;
        let under = now < permits as i64;
        match (under, since) {
            (false, Some(s)) => {
                short.push((s, at));
                since = None;
            }
            (true, None) => since = Some(at),
            _ => {}
        }
    }
    if let Some(s) = since {
        short.push((s, end));
    }
    // Cut out the faults and their grace.
    let mut quiet: Vec<(u64, u64)> = Vec::new();
    for (mut s, e) in short {
        let mut ws: Vec<(u64, u64)> =
            faults.iter().map(|f| (f.start.saturating_sub(1), f.end.saturating_add(grace))).collect();
        ws.sort_unstable();
        for (fs, fe) in ws {
            if fe <= s || fs >= e {
                continue;
            }
            if fs > s {
                quiet.push((s, fs));
            }
            s = s.max(fe);
        }
        if s < e {
            quiet.push((s, e));
        }
    }
    let mut out = Vec::new();
    for (process, from, to) in waits {
        let longest = quiet
            .iter()
            .filter(|(s, e)| *s < to && *e > from)
            .map(|(s, e)| ((*s).max(from), (*e).min(to) - (*s).max(from)))
            .max_by_key(|x| x.1);
        if let Some((at, len)) = longest {
            out.push((process, at, len));
        }
    }
    out
}

/// The most holds that were open at one instant (a grant to its release's
/// invocation).
fn most_at_once(h: &History) -> usize {
    let mut edges: Vec<(u64, i64)> = Vec::new();
    let mut open: HashMap<u64, u64> = HashMap::new();
    for p in h.pairs() {
        let Some(c) = p.complete else { continue };
        if p.invoke.f == "sem-acquire" && c.ty == OpType::Ok {
            open.insert(p.invoke.process, c.time);
        } else if p.invoke.f == "sem-release" {
            if let Some(from) = open.remove(&p.invoke.process) {
                edges.push((from, 1));
                edges.push((p.invoke.time, -1));
            }
        }
    }
    // A release at the same instant as a grant ends first.
    edges.sort_unstable();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{role, Op, SESSION_STATE};
    use serde_json::Value;

    const MS: u64 = 1_000_000;

    fn push(h: &mut History, process: u64, ty: OpType, f: &str, value: Value, at: u64) {
        h.ops.push(Op { index: 0, process, ty, f: f.into(), key: None, value, time: at * MS, error: None });
    }

    fn hold(h: &mut History, p: u64, token: u64, from: u64, to: u64) {
        push(h, p, OpType::Invoke, "sem-acquire", Value::Null, from - 1);
        push(h, p, OpType::Ok, "sem-acquire", json!({"token": token}), from);
        push(h, p, OpType::Invoke, "sem-release", json!({"token": token}), to);
        push(h, p, OpType::Ok, "sem-release", json!({"token": token, "lost": false}), to + 1);
    }

    fn state(h: &mut History, of: u64, s: &str, at: u64) {
        let v = json!({"of": of, "role": role::MAIN, "slot": 0, "session": of * 10, "state": s});
        push(h, 100 + of, OpType::Info, SESSION_STATE, v, at);
    }

    fn checked(mut h: History, faults: &[FaultWindow]) -> CheckResult {
        h.ops.sort_by_key(|o| o.time);
        check(&h, "t", 2, faults, Duration::from_secs(1))
    }

    fn names(r: &CheckResult) -> Vec<&str> {
        r.anomalies.iter().filter_map(|a| a["anomaly"].as_str()).collect()
    }

    #[test]
    fn two_holders_share_and_a_third_beside_them_is_caught() {
        let mut h = History::default();
        hold(&mut h, 1, 10, 10, 50);
        hold(&mut h, 2, 11, 20, 60);
        hold(&mut h, 3, 12, 55, 90);
        let r = checked(h.clone(), &[]);
        assert_eq!(r.valid, Validity::Valid, "{:?}", r.anomalies);
        assert_eq!(r.stats["most_held_at_once"], 2);
        // A third granted while two hold, with no fault: caught.
        hold(&mut h, 4, 13, 30, 40);
        let r = checked(h, &[]);
        assert_eq!(r.valid, Validity::Invalid);
        assert_eq!(names(&r), ["too-many-holders"]);
        assert_eq!(r.stats["most_held_at_once"], 3);
    }

    /// A waiter that waits 2.5 s beside a free permit (one of two held)
    /// with no fault is caught; the same during a fault is not.
    #[test]
    fn a_waiter_beside_a_free_permit_is_caught_outside_faults() {
        let mut h = History::default();
        hold(&mut h, 1, 10, 100, 5000);
        push(&mut h, 2, OpType::Invoke, "sem-acquire", Value::Null, 200);
        push(&mut h, 2, OpType::Ok, "sem-acquire", json!({"token": 11}), 2700);
        push(&mut h, 2, OpType::Invoke, "sem-release", json!({"token": 11}), 2800);
        push(&mut h, 2, OpType::Ok, "sem-release", json!({"token": 11}), 2801);
        let r = checked(h.clone(), &[]);
        assert_eq!(names(&r), ["permit-idle"]);
        assert_eq!(r.stats["longest_idle_wait_ms"], 2500.0);
        let fault = [FaultWindow { kind: "test".into(), detail: String::new(), start: 0, end: 300 * MS }];
        let r = checked(h.clone(), &fault);
        assert_eq!(r.valid, Validity::Valid, "{:?}", r.anomalies);
        // Waiting while both permits are held is not idle.
        let mut h = History::default();
        hold(&mut h, 1, 10, 100, 5000);
        hold(&mut h, 3, 12, 150, 2150);
        push(&mut h, 2, OpType::Invoke, "sem-acquire", Value::Null, 200);
        push(&mut h, 2, OpType::Ok, "sem-acquire", json!({"token": 11}), 2200);
        let r = checked(h, &[]);
        assert_eq!(r.valid, Validity::Valid, "{:?}", r.anomalies);
    }

    /// Processes 1 and 2 hold from 100 and 200 ms to 2,000 ms; 3 is granted
    /// at 1,000 ms, over the two permits; 1 leaves `Connected` at
    /// `suspended` ms, 2 never does.
    fn three_holds(suspended: u64) -> History {
        let mut h = History::default();
        for p in 1..=3 {
            state(&mut h, p, "connected", 0);
        }
        hold(&mut h, 1, 10, 100, 2000);
        hold(&mut h, 2, 11, 200, 2000);
        hold(&mut h, 3, 12, 1000, 1500);
        state(&mut h, 1, "suspended", suspended);
        h
    }

    /// Over the limit during a fault is judged by the holders' states: two
    /// still `Connected` at a grant over two permits is caught; one is what
    /// the cluster allows (the other's session expired).
    #[test]
    fn over_the_limit_needs_all_but_one_holder_to_have_left_connected() {
        let fault = [FaultWindow { kind: "test".into(), detail: String::new(), start: 0, end: 5000 * MS }];
        // Holder 1 left Connected 400 ms before the grant: allowed.
        let r = checked(three_holds(600), &fault);
        assert_eq!(r.valid, Validity::Valid, "{:?}", r.anomalies);
        assert_eq!(r.stats["granted_over_the_limit"], 1);
        // Holder 2 still Connected at the grant: the larger margin decides.
        assert_eq!(r.stats["holder_states"]["closest_ms"], 400.0);
        // Both Connected until 100 ms before the grant (inside the 0.19 T
        // allowance): caught.
        let r = checked(three_holds(900), &fault);
        assert_eq!(names(&r), ["holder-connected-after-expiry"]);
    }
}
