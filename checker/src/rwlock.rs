//! The read-write lock workload's checker.
//!
//! The history it reads: `rw-acquire` (invoke `{"write"}`, ok `{"token",
//! "write"}`), `rw-release` (ok `{"token", "lost"}`), and the holders'
//! session-state notes.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::history::{FaultWindow, History, OpType, Pair};
use crate::holds::{judge, Grants};
use crate::verdict::{CheckResult, Validity};

/// Read-write lock `name`: tokens unique; a write hold overlaps no other
/// hold outside faults (`concurrent-holders`); no holder still
/// `Connected` after a conflicting hold went to another session
/// ([`crate::holds`]: read holds share, every other pair conflicts); `t`
/// is the session timeout. The stats count the read holds that overlapped
/// another read hold (`reads_shared`): a lock that never lets readers
/// share passes, but shows 0 there.
pub fn check(h: &History, name: &str, faults: &[FaultWindow], t: Duration) -> CheckResult {
    let pairs = h.pairs();
    let won: Vec<&Pair<'_>> =
        pairs.iter().filter(|p| p.invoke.f == "rw-acquire" && p.outcome() == OpType::Ok).collect();
    let mut anomalies = Vec::new();
    let mut by_token: HashMap<u64, u64> = HashMap::new();
    for p in &won {
        let Some(t) = p.complete.and_then(|c| c.u64("token")) else { continue };
        if let Some(o) = by_token.insert(t, p.invoke.process) {
            anomalies.push(json!({"anomaly": "duplicate-token", "token": t, "processes": [o, p.invoke.process]}));
        }
    }
    let writes = won.iter().filter(|p| is_write(p)).count();
    let holds =
        judge(h, &Grants { grant: "rw-acquire", release: "rw-release", what: "read-write lock", name }, faults, t);
    anomalies.extend(holds.anomalies);
    CheckResult {
        checker: "rwlock".into(),
        valid: Validity::of(&anomalies),
        anomalies,
        stats: json!({
            "write_holds": writes, "read_holds": won.len() - writes, "reads_shared": reads_shared(&pairs),
            "believed_held_at_once": holds.overlapping, "holder_states": holds.judged,
        }),
    }
}

fn is_write(p: &Pair<'_>) -> bool {
    p.complete.and_then(|c| c.value.get("write")).and_then(Value::as_bool) != Some(false)
}

/// Read holds that overlapped another read hold (granted before the
/// other's release was invoked).
fn reads_shared(pairs: &[Pair<'_>]) -> usize {
    // process -> grant time of its open read hold
    let mut open: HashMap<u64, u64> = HashMap::new();
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for p in pairs {
        let Some(c) = p.complete else { continue };
        if p.invoke.f == "rw-acquire" && c.ty == OpType::Ok && !is_write(p) {
            open.insert(p.invoke.process, c.time);
        } else if p.invoke.f == "rw-release" {
            if let Some(from) = open.remove(&p.invoke.process) {
                spans.push((from, p.invoke.time));
            }
        }
    }
    spans.sort_unstable();
    let mut shared = vec![false; spans.len()];
    for i in 0..spans.len() {
        for j in i + 1..spans.len() {
            if spans[j].0 >= spans[i].1 {
                break;
            }
            shared[i] = true;
            shared[j] = true;
        }
    }
    shared.iter().filter(|s| **s).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Op;

    const MS: u64 = 1_000_000;

    fn push(h: &mut History, process: u64, ty: OpType, f: &str, value: Value, at: u64) {
        h.ops.push(Op { index: 0, process, ty, f: f.into(), key: None, value, time: at * MS, error: None });
    }

    fn hold(h: &mut History, p: u64, token: u64, write: bool, from: u64, to: u64) {
        push(h, p, OpType::Invoke, "rw-acquire", json!({"write": write}), from - 1);
        push(h, p, OpType::Ok, "rw-acquire", json!({"token": token, "write": write}), from);
        push(h, p, OpType::Invoke, "rw-release", json!({"token": token}), to);
        push(h, p, OpType::Ok, "rw-release", json!({"token": token, "lost": false}), to + 1);
    }

    fn checked(mut h: History) -> CheckResult {
        h.ops.sort_by_key(|o| o.time);
        check(&h, "t", &[], Duration::from_secs(1))
    }

    #[test]
    fn readers_share_and_a_writer_beside_anyone_is_caught() {
        let mut h = History::default();
        hold(&mut h, 1, 10, false, 10, 50);
        hold(&mut h, 2, 11, false, 20, 60);
        hold(&mut h, 3, 12, true, 70, 90);
        let r = checked(h.clone());
        assert_eq!(r.valid, Validity::Valid, "{:?}", r.anomalies);
        assert_eq!(r.stats["reads_shared"], 2);
        assert_eq!(r.stats["write_holds"], 1);
        // A writer granted while a reader holds, with no fault: caught.
        hold(&mut h, 4, 13, true, 30, 40);
        let r = checked(h);
        assert_eq!(r.valid, Validity::Invalid);
        assert!(r.anomalies.iter().all(|a| a["anomaly"] == "concurrent-holders"), "{:?}", r.anomalies);
        assert_eq!(r.anomalies.len(), 2);
    }

    #[test]
    fn a_token_granted_twice_is_caught() {
        let mut h = History::default();
        hold(&mut h, 1, 10, false, 10, 20);
        hold(&mut h, 2, 10, false, 30, 40);
        let r = checked(h);
        assert_eq!(r.valid, Validity::Invalid);
        assert_eq!(r.anomalies[0]["anomaly"], "duplicate-token");
    }
}
