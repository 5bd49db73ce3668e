//! The election workload's checker.
//!
//! The history it reads: `campaign` (ok: `{"token"}`), `resign`, the
//! observers' `observe` (ok: `{"token"}` of the leader seen, or null), and
//! the leaders' session-state notes.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::{json, Value};

use crate::history::{FaultWindow, History, OpType, Pair};
use crate::holds::{judge, Grants};
use crate::verdict::{CheckResult, Validity};

/// Anomalies listed at most by the order checks (the count goes on).
const MAX_LISTED: usize = 50;

/// Election `name`: one leader per token, tokens grow in real time,
/// observers never go backwards, one leader at a time outside faults, no
/// leader still `Connected` (`is_leader()`) after another was elected
/// ([`crate::holds`]); `t` is the session timeout.
pub fn check(h: &History, name: &str, faults: &[FaultWindow], t: Duration) -> CheckResult {
    let pairs = h.pairs();
    let mut anomalies = Vec::new();
    let won: Vec<&Pair<'_>> = pairs.iter().filter(|p| p.invoke.f == "campaign" && p.outcome() == OpType::Ok).collect();
    one_leader_per_token(&won, &mut anomalies);
    tokens_grow_in_real_time(&won, &mut anomalies);
    let observed = observers_go_forward(&pairs, &mut anomalies);
    let holds = judge(h, &Grants { grant: "campaign", release: "resign", what: "election", name }, faults, t);
    anomalies.extend(holds.anomalies);
    CheckResult {
        checker: "election".into(),
        valid: Validity::of(&anomalies),
        anomalies,
        stats: json!({
            "elections": won.len(), "observed_changes": observed, "believed_leader_at_once": holds.overlapping,
            "holder_states": holds.judged,
        }),
    }
}

fn token(p: &Pair<'_>) -> u64 {
    p.complete.and_then(|c| c.u64("token")).unwrap_or(0)
}

/// `two-leaders-one-token`.
fn one_leader_per_token(won: &[&Pair<'_>], anomalies: &mut Vec<Value>) {
    let mut by_token: HashMap<u64, u64> = HashMap::new();
    for p in won {
        let t = token(p);
        if let Some(o) = by_token.insert(t, p.invoke.process) {
            anomalies.push(json!({"anomaly": "two-leaders-one-token", "token": t, "processes": [o, p.invoke.process]}));
        }
    }
}

/// `token-went-backwards`: if A was elected before B campaigned, A's token
/// < B's.
fn tokens_grow_in_real_time(won: &[&Pair<'_>], anomalies: &mut Vec<Value>) {
    for a in won {
        for b in won {
            let (Some(ac), Some(_)) = (a.complete, b.complete) else { continue };
            if ac.time < b.invoke.time && token(a) >= token(b) && anomalies.len() < MAX_LISTED {
                anomalies
                    .push(json!({"anomaly": "token-went-backwards", "earlier": a.to_json(), "later": b.to_json()}));
            }
        }
    }
}

/// `observer-went-backwards`. Returns the changes observed.
fn observers_go_forward(pairs: &[Pair<'_>], anomalies: &mut Vec<Value>) -> usize {
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    let mut observed = 0;
    for p in pairs.iter().filter(|p| p.invoke.f == "observe" && p.outcome() == OpType::Ok) {
        observed += 1;
        if let Some(t) = p.complete.and_then(|c| c.u64("token")) {
            let last = seen.entry(p.invoke.process).or_insert(0);
            if t < *last && anomalies.len() < MAX_LISTED {
                anomalies.push(
                    json!({"anomaly": "observer-went-backwards", "process": p.invoke.process, "from": *last, "to": t}),
                );
            }
            *last = t;
        }
    }
    observed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{role, Op, SESSION_STATE};

    const MS: u64 = 1_000_000;
    const NAME: &str = "jepsen";

    fn op(h: &mut History, process: u64, ty: OpType, f: &str, value: Value, ms: u64) {
        let key = if f == SESSION_STATE { None } else { Some(NAME.to_string()) };
        h.push(Op { index: 0, process, ty, f: f.into(), key, value, time: ms * MS, error: None });
    }

    fn state(h: &mut History, of: u64, session: u64, s: &str, ms: u64) {
        let v = json!({"of": of, "role": role::MAIN, "slot": 0, "session": session, "state": s});
        op(h, 100 + of, OpType::Info, SESSION_STATE, v, ms);
    }

    /// Process 1 leads from 100 ms and resigns at `resign` ms; its client
    /// goes Suspended at `suspended` ms; process 2 is elected at 1,000 ms.
    fn history(suspended: u64, resign: u64) -> History {
        let mut h = History::default();
        state(&mut h, 1, 11, "connected", 0);
        state(&mut h, 2, 22, "connected", 0);
        op(&mut h, 1, OpType::Invoke, "campaign", Value::Null, 50);
        op(&mut h, 1, OpType::Ok, "campaign", json!({"token": 5}), 100);
        op(&mut h, 2, OpType::Invoke, "campaign", Value::Null, 200);
        let mut rest = vec![
            (1, OpType::Invoke, "resign", json!({"token": 5}), resign),
            (2, OpType::Ok, "campaign", json!({"token": 9}), 1000),
            (1, OpType::Ok, "resign", json!({"token": 5}), resign + 5),
        ];
        rest.sort_by_key(|x| x.4);
        let mut noted = false;
        for (p, ty, f, v, ms) in rest {
            if !noted && suspended <= ms {
                state(&mut h, 1, 11, "suspended", suspended);
                noted = true;
            }
            op(&mut h, p, ty, f, v, ms);
        }
        if !noted {
            state(&mut h, 1, 11, "suspended", suspended);
        }
        h
    }

    /// A fault over the whole test history, so overlapping holds are not
    /// `concurrent-holders`.
    fn fault() -> Vec<FaultWindow> {
        vec![FaultWindow { kind: "test".into(), detail: String::new(), start: 0, end: 2000 * MS }]
    }

    fn named(r: &CheckResult) -> Vec<&str> {
        r.anomalies.iter().filter_map(|a| a.get("anomaly").and_then(Value::as_str)).collect()
    }

    #[test]
    fn a_holder_connected_after_the_next_grant_is_caught() {
        let t = Duration::from_secs(1);
        // Suspended 200 ms after the other's grant, resign later still.
        let r = check(&history(1200, 1500), NAME, &fault(), t);
        assert_eq!(r.valid, Validity::Invalid);
        assert_eq!(named(&r), ["holder-connected-after-expiry"]);
        let a = &r.anomalies[0];
        assert_eq!(a["holder"]["session"], 11);
        assert_eq!(a["granted"]["session"], 22);
        assert_eq!(a["name"], NAME);
        assert_eq!(r.stats["holder_states"]["closest_ms"], -200.0);
    }

    /// T = 1 s: the allowance for clock rates is 190.9 ms, the slack 50 ms,
    /// so a holder must have left `Connected` by 859 ms for a grant at 1,000.
    #[test]
    fn a_holder_suspended_by_the_clock_allowance_before_the_grant_is_not() {
        let t = Duration::from_secs(1);
        for suspended in [600, 700, 859] {
            let r = check(&history(suspended, 1500), NAME, &fault(), t);
            assert_eq!(r.valid, Validity::Valid, "suspended at {suspended} ms: {:?}", r.anomalies);
        }
    }

    /// Connected until 18 ms before the next grant (what `baton lock
    /// --on-suspend wait` did when it waited a whole T after its proof):
    /// safe on one clock, not with clock rates 10% apart.
    #[test]
    fn a_holder_connected_within_the_clock_allowance_before_the_grant_is_caught() {
        let t = Duration::from_secs(1);
        for suspended in [870, 982, 1000, 1049] {
            let r = check(&history(suspended, 1500), NAME, &fault(), t);
            assert_eq!(r.valid, Validity::Invalid, "suspended at {suspended} ms");
            assert_eq!(named(&r), ["holder-connected-after-expiry"]);
        }
        let r = check(&history(982, 1500), NAME, &fault(), t);
        assert_eq!(r.stats["holder_states"]["closest_ms"], 18.0);
        let allowance = r.stats["holder_states"]["allowance_ms"].as_f64().unwrap_or(0.0);
        assert!((allowance - 190.909).abs() < 0.01, "allowance {allowance} ms");
    }

    #[test]
    fn a_holder_that_already_invoked_its_resign_is_not_judged() {
        let t = Duration::from_secs(1);
        let r = check(&history(1300, 990), NAME, &fault(), t);
        assert_eq!(r.valid, Validity::Valid, "{:?}", r.anomalies);
    }
}
