//! The session workload's checker.
//!
//! The history it reads: `create` (an ephemeral node per session), `check`
//! (ok: `{"exists", "disturbed"}`: whether the node was there, and whether
//! the session had left `Connected` by the time the answer came),
//! `watch-event` (ok: `{"zxid", "type"}`), `close`.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use crate::history::{History, OpType, Pair};
use crate::verdict::{CheckResult, Validity};

/// Anomalies listed at most by the node check (the count goes on).
const MAX_LISTED: usize = 50;

/// An ephemeral node never vanishes while its session was never in doubt;
/// every ephemeral is gone once its session ended (`leftover`: nodes found
/// after the run; None: no reading, the verdict is at best unknown);
/// watches fire once, in zxid order.
pub fn check(h: &History, leftover: Option<Vec<String>>) -> CheckResult {
    let pairs = h.pairs();
    let mut anomalies = Vec::new();
    let checks = nodes_live_with_their_session(&pairs, &mut anomalies);
    let events = watches_fire_once_in_order(&pairs, &mut anomalies);
    let mut valid = Validity::Valid;
    match &leftover {
        Some(l) if !l.is_empty() => anomalies.push(json!({
            "anomaly": "ephemeral-outlived-session",
            "explain": "nodes still present after every session ended and its timeout passed",
            "nodes": l,
        })),
        Some(_) => {}
        None => valid = Validity::Unknown,
    }
    if !anomalies.is_empty() {
        valid = Validity::Invalid;
    }
    CheckResult {
        checker: "session".into(),
        valid,
        anomalies,
        stats: json!({"checks": checks, "watch_events": events}),
    }
}

/// `ephemeral-vanished-while-session-alive`. Returns the checks made.
fn nodes_live_with_their_session(pairs: &[Pair<'_>], anomalies: &mut Vec<Value>) -> usize {
    let mut checks = 0;
    for p in pairs.iter().filter(|p| p.invoke.f == "check" && p.outcome() == OpType::Ok) {
        checks += 1;
        let Some(c) = p.complete else { continue };
        let exists = c.value.get("exists").and_then(Value::as_bool).unwrap_or(true);
        let disturbed = c.value.get("disturbed").and_then(Value::as_bool).unwrap_or(true);
        if !exists && !disturbed && anomalies.len() < MAX_LISTED {
            anomalies.push(json!({
                "anomaly": "ephemeral-vanished-while-session-alive",
                "explain": "the node was gone although its session never left Connected",
                "op": p.to_json(),
            }));
        }
    }
    checks
}

/// `watch-events-out-of-order` and `watch-fired-twice`, per process.
/// Returns the events seen.
fn watches_fire_once_in_order(pairs: &[Pair<'_>], anomalies: &mut Vec<Value>) -> usize {
    let mut last_zxid: HashMap<u64, u64> = HashMap::new();
    let mut events = 0;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    for p in pairs.iter().filter(|p| p.invoke.f == "watch-event") {
        events += 1;
        let z = p.complete.and_then(|c| c.u64("zxid")).unwrap_or(0);
        let last = last_zxid.entry(p.invoke.process).or_insert(0);
        if z < *last {
            anomalies.push(json!({"anomaly": "watch-events-out-of-order", "op": p.to_json(), "after_zxid": *last}));
        }
        if !seen.insert((p.invoke.process, z)) {
            anomalies.push(json!({"anomaly": "watch-fired-twice", "op": p.to_json()}));
        }
        *last = z;
    }
    events
}
