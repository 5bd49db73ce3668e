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
/// session ([`crate::holds`]). `final_counter` is the counter read after
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
        }),
    }
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
