//! The lock workload's checker.
//!
//! The history it reads: `acquire` (ok: `{"token"}`), `read-counter`,
//! `incr` (invoke `{"token", "from"}`, ok `{"token", "from", "value",
//! "mzxid"}`: the counter written through the fence, its commit position),
//! `release`; and the holders' session-state notes.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::history::{FaultWindow, History, OpType, Pair};
use crate::holds::{judge, Grants};
use crate::verdict::{CheckResult, Validity};

/// Anomalies of one kind listed at most (the count goes on).
const MAX_LISTED: usize = 50;

/// Lock `name`: tokens unique; the fence never accepted a lower token after
/// a higher one; no acknowledged increment lost; mutual exclusion outside
/// faults; no holder still `Connected` after the lock went to another
/// session ([`crate::holds`]); the lock is granted again within
/// [`stall_limit`] of fault-free time while clients ask (`lock-stalled`). `final_counter` is the counter read after
/// the run (None: no reading, the verdict is at best unknown); `t` the
/// session timeout.
pub fn check(h: &History, name: &str, faults: &[FaultWindow], final_counter: Option<i64>, t: Duration) -> CheckResult {
    let pairs = h.pairs();
    let mut anomalies = Vec::new();
    let grants = unique_tokens(&pairs, &mut anomalies);
    let incr_ok = increments_in_commit_order(&pairs, &mut anomalies);
    let incr_info = pairs.iter().filter(|p| p.invoke.f == "incr" && p.outcome() == OpType::Info).count();
    let fence_rejected = pairs
        .iter()
        .filter(|p| {
            p.invoke.f == "incr"
                && p.complete.and_then(|c| c.error.as_deref()).is_some_and(|e| e.contains("FenceRejected"))
        })
        .count();
    let acked = incr_ok as i64;
    if let Some(f) = final_counter {
        if f < acked || f > acked + incr_info as i64 {
            anomalies.push(json!({
                "anomaly": "lost-update",
                "explain": "final counter does not match acknowledged increments",
                "final": f, "acknowledged": acked, "indeterminate": incr_info,
            }));
        }
    }
    let holds = judge(h, &Grants { grant: "acquire", release: "release", what: "lock", name }, faults, t);
    anomalies.extend(holds.anomalies);
    let longest_stall_ms = stalls(&pairs, faults, t, &mut anomalies);
    let valid = match final_counter {
        None if anomalies.is_empty() => Validity::Unknown,
        _ => Validity::of(&anomalies),
    };
    CheckResult {
        checker: "lock".into(),
        valid,
        anomalies,
        stats: json!({
            "grants": grants, "increments_acknowledged": acked, "increments_indeterminate": incr_info,
            "writes_rejected_by_fence": fence_rejected, "final_counter": final_counter,
            "believed_held_at_once": holds.overlapping, "holder_states": holds.judged,
            "longest_stall_healthy_ms": longest_stall_ms,
        }),
    }
}

/// Fault-free time a lock may go without a grant while clients ask for it:
/// 5 session timeouts, at least 10 s. A correct lock moves on within about
/// a session timeout and an election after every fault heals (a dead
/// holder's session expires, its node goes, the next waiter is told); a
/// node left at the head of the queue by a waiter that gave up, while its
/// session lives on, stops it for good (the harness found one stalled
/// 197 s; client/src/recipes/queue.rs, `delete_in_background`).
pub fn stall_limit(t: Duration) -> u64 {
    (t.as_millis() as u64 * 5).max(10_000) * 1_000_000
}

/// `lock-stalled`: between two grants (or from the first ask to the first
/// grant, or from the last grant to the last ask's end), acquires were
/// asked for and [`stall_limit`] of the time was outside every fault
/// window. Returns the longest such fault-free stretch, in ms.
fn stalls(pairs: &[Pair<'_>], faults: &[FaultWindow], t: Duration, anomalies: &mut Vec<Value>) -> u64 {
    let asks: Vec<&Pair<'_>> = pairs.iter().filter(|p| p.invoke.f == "acquire").collect();
    let (Some(first), Some(last)) = (asks.iter().map(|p| p.invoke.time).min(), asks.iter().map(|p| ask_end(p)).max())
    else {
        return 0;
    };
    let mut grants: Vec<u64> =
        asks.iter().filter(|p| p.outcome() == OpType::Ok).filter_map(|p| p.complete.map(|c| c.time)).collect();
    grants.sort_unstable();
    let mut marks = vec![first];
    marks.extend(grants.iter().copied());
    marks.push(last.max(first));
    let mut longest = 0;
    for w in marks.windows(2) {
        let (from, to) = (w[0], w[1]);
        let asked = asks.iter().any(|p| p.invoke.time < to && ask_end(p) > from);
        if !asked || to <= from {
            continue;
        }
        let healthy = (to - from).saturating_sub(covered(faults, from, to));
        longest = longest.max(healthy);
        if healthy >= stall_limit(t) && anomalies.len() < MAX_LISTED {
            anomalies.push(json!({
                "anomaly": "lock-stalled",
                "explain": "clients asked for the lock and none was granted through this much fault-free time",
                "from_ms": from / 1_000_000, "to_ms": to / 1_000_000,
                "fault_free_ms": healthy / 1_000_000, "limit_ms": stall_limit(t) / 1_000_000,
            }));
        }
    }
    longest / 1_000_000
}

/// When an acquire stopped asking: its completion, or (never answered) its
/// invocation.
fn ask_end(p: &Pair<'_>) -> u64 {
    p.complete.map(|c| c.time).unwrap_or(p.invoke.time)
}

/// How much of `[from, to)` the fault windows cover (their union).
fn covered(faults: &[FaultWindow], from: u64, to: u64) -> u64 {
    let mut spans: Vec<(u64, u64)> =
        faults.iter().map(|f| (f.start.max(from), f.end.min(to))).filter(|(a, b)| a < b).collect();
    spans.sort_unstable();
    let (mut total, mut reach) = (0, from);
    for (a, b) in spans {
        let a = a.max(reach);
        if b > a {
            total += b - a;
            reach = b;
        }
    }
    total
}

/// `duplicate-token`: two grants with one token. Returns the grants.
fn unique_tokens(pairs: &[Pair<'_>], anomalies: &mut Vec<Value>) -> usize {
    let mut tokens: HashMap<u64, u64> = HashMap::new();
    for p in pairs.iter().filter(|p| p.invoke.f == "acquire" && p.outcome() == OpType::Ok) {
        if let Some(t) = p.complete.and_then(|c| c.u64("token")) {
            if let Some(other) = tokens.insert(t, p.invoke.process) {
                anomalies
                    .push(json!({"anomaly": "duplicate-token", "token": t, "processes": [other, p.invoke.process]}));
            }
        }
    }
    tokens.len()
}

/// The acknowledged increments in commit (mzxid) order: `fence-regression`
/// (a lower token accepted after a higher one) and `lost-update` (one did
/// not build on the previous). Returns how many were acknowledged.
fn increments_in_commit_order(pairs: &[Pair<'_>], anomalies: &mut Vec<Value>) -> usize {
    let mut incr_ok: Vec<&Pair<'_>> =
        pairs.iter().filter(|p| p.invoke.f == "incr" && p.outcome() == OpType::Ok).collect();
    incr_ok.sort_by_key(|p| p.complete.map(|c| c.u64("mzxid").unwrap_or(0)).unwrap_or(0));
    let (mut max_token, mut last_value): (u64, i64) = (0, 0);
    let mut prev: Option<&Pair<'_>> = None;
    for p in &incr_ok {
        let Some(c) = p.complete else { continue };
        let t = c.u64("token").unwrap_or(0);
        let v = c.value.get("value").and_then(Value::as_i64).unwrap_or(0);
        if t < max_token && anomalies.len() < MAX_LISTED {
            anomalies.push(json!({
                "anomaly": "fence-regression",
                "explain": "the counter accepted a write with a lower token after a higher one",
                "ops": [prev.map(Pair::to_json), Some(p.to_json())],
            }));
        }
        if v <= last_value && anomalies.len() < MAX_LISTED {
            anomalies.push(json!({
                "anomaly": "lost-update",
                "explain": "an accepted increment did not build on the previous accepted one",
                "ops": [prev.map(Pair::to_json), Some(p.to_json())],
            }));
        }
        max_token = max_token.max(t);
        last_value = last_value.max(v);
        prev = Some(p);
    }
    incr_ok.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Op;

    const S: u64 = 1_000_000_000;

    fn op(h: &mut History, process: u64, ty: OpType, f: &str, value: Value, at: u64) {
        h.push(Op { index: 0, process, ty, f: f.into(), key: Some("jepsen".into()), value, time: at, error: None });
    }

    /// Process 1 holds from 1 s to 2 s; process 2 asks at 1.5 s and is
    /// granted at `granted` (None: it times out at 60 s, asking again
    /// every 4 s meanwhile).
    fn history(granted: Option<u64>) -> History {
        let mut h = History::default();
        op(&mut h, 1, OpType::Invoke, "acquire", Value::Null, S - 1);
        op(&mut h, 1, OpType::Ok, "acquire", json!({"token": 5}), S);
        op(&mut h, 2, OpType::Invoke, "acquire", Value::Null, S + S / 2);
        op(&mut h, 1, OpType::Invoke, "release", json!({"token": 5}), 2 * S);
        op(&mut h, 1, OpType::Ok, "release", json!({"token": 5}), 2 * S + 1);
        match granted {
            Some(at) => op(&mut h, 2, OpType::Ok, "acquire", json!({"token": 9}), at),
            None => {
                let mut at = S + S / 2;
                while at + 4 * S < 60 * S {
                    op(&mut h, 2, OpType::Fail, "acquire", Value::Null, at + 4 * S);
                    at += 4 * S + 1;
                    op(&mut h, 2, OpType::Invoke, "acquire", Value::Null, at);
                }
                op(&mut h, 2, OpType::Fail, "acquire", Value::Null, 60 * S);
            }
        }
        h
    }

    fn fault(start: u64, end: u64) -> FaultWindow {
        FaultWindow { kind: "partition".into(), detail: String::new(), start, end }
    }

    fn stalled(r: &CheckResult) -> bool {
        r.anomalies.iter().any(|a| a["anomaly"] == "lock-stalled")
    }

    #[test]
    fn a_lock_that_is_never_granted_again_is_stalled() {
        let t = Duration::from_secs(2);
        let r = check(&history(None), "jepsen", &[], None, t);
        assert!(stalled(&r), "{:?}", r.anomalies);
        assert_eq!(r.stats["longest_stall_healthy_ms"], 59_000);
    }

    #[test]
    fn a_grant_within_the_limit_or_a_stall_inside_faults_is_not() {
        let t = Duration::from_secs(2);
        let r = check(&history(Some(9 * S)), "jepsen", &[], None, t);
        assert!(!stalled(&r), "{:?}", r.anomalies);
        // 58 s without a grant, all but 9 s of it in two overlapping faults.
        let faults = [fault(3 * S, 40 * S), fault(30 * S, 53 * S)];
        let r = check(&history(None), "jepsen", &faults, None, t);
        assert!(!stalled(&r), "{:?}", r.anomalies);
        assert_eq!(r.stats["longest_stall_healthy_ms"], 9_000);
    }
}
