//! Tests for the WGL linearizability checker: hand-written histories, a
//! brute-force cross-check of the generic search, random valid histories from
//! a simulated linearizable register (and corrupted variants), and a
//! 100,000-operation timing run.

use baton_checker::history::{History, Op, OpType};
use baton_checker::linearizability::{check_operations, CheckOptions, Model, Operation};
use baton_checker::register::{
    check_register_history, check_register_history_with, RegisterOp, RegisterRet, RegisterState, Report,
};
use baton_checker::Validity;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Instant;

// ---------------------------------------------------------------------------
// History builder
// ---------------------------------------------------------------------------

/// Collects entries with explicit times, then sorts them into a history.
struct Hb {
    entries: Vec<Op>,
    key: String,
}

impl Hb {
    fn new() -> Hb {
        Hb { entries: Vec::new(), key: "r".to_string() }
    }
    fn key(&mut self, k: &str) -> &mut Hb {
        self.key = k.to_string();
        self
    }
    fn entry(&mut self, process: u64, ty: OpType, f: &str, value: Value, time: u64) {
        let error = match ty {
            OpType::Fail => Some("BadVersion".to_string()),
            OpType::Info => Some("timeout".to_string()),
            _ => None,
        };
        self.entries.push(Op {
            index: 0,
            process,
            ty,
            f: f.to_string(),
            key: Some(self.key.clone()),
            value,
            time,
            error,
        });
    }
    /// One operation: invoke at `t0`; completion `ty` at `t1` (none if `t1` is None).
    #[allow(clippy::too_many_arguments)]
    fn op(&mut self, p: u64, f: &str, inv: Value, t0: u64, t1: Option<u64>, ty: OpType, out: Value) -> &mut Hb {
        self.entry(p, OpType::Invoke, f, inv, t0);
        if let Some(t1) = t1 {
            self.entry(p, ty, f, out, t1);
        }
        self
    }
    fn write(&mut self, p: u64, v: i64, t0: u64, t1: u64, version: Option<i32>) -> &mut Hb {
        let out = version.map_or(Value::Null, |v| json!({ "version": v }));
        self.op(p, "write", json!({ "value": v }), t0, Some(t1), OpType::Ok, out)
    }
    fn write_info(&mut self, p: u64, v: i64, t0: u64, t1: u64) -> &mut Hb {
        self.op(p, "write", json!({ "value": v }), t0, Some(t1), OpType::Info, Value::Null)
    }
    fn read(&mut self, p: u64, t0: u64, t1: u64, value: Option<i64>, version: i32) -> &mut Hb {
        self.op(p, "read", Value::Null, t0, Some(t1), OpType::Ok, json!({ "value": value, "version": version }))
    }
    #[allow(clippy::too_many_arguments)]
    fn cas(&mut self, p: u64, ev: i32, v: i64, t0: u64, t1: u64, ty: OpType, version: Option<i32>) -> &mut Hb {
        let out = match (ty, version) {
            (OpType::Ok, Some(v)) => json!({ "version": v }),
            _ => Value::Null,
        };
        self.op(p, "cas", json!({ "expected_version": ev, "value": v }), t0, Some(t1), ty, out)
    }
    fn history(&self) -> History {
        let mut e = self.entries.clone();
        e.sort_by_key(|o| o.time);
        let mut h = History::default();
        for o in e {
            h.push(o);
        }
        h
    }
    fn check(&self) -> Report {
        check_register_history(&self.history(), RegisterState::default())
    }
}

fn assert_valid(r: &Report) {
    assert_eq!(r.valid, Validity::Valid, "expected valid: {}", serde_json::to_string_pretty(r).unwrap());
}

fn assert_invalid(r: &Report) {
    assert_eq!(r.valid, Validity::Invalid, "expected invalid: {}", serde_json::to_string_pretty(r).unwrap());
}

// ---------------------------------------------------------------------------
// Hand-written histories
// ---------------------------------------------------------------------------

#[test]
fn stale_read_after_completed_write_is_invalid() {
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).read(2, 20, 30, None, 0);
    assert_invalid(&h.check());
    // Control: the fresh read is fine.
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).read(2, 20, 30, Some(1), 1);
    assert_valid(&h.check());
    // Stale value even with the new version is invalid too.
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).write(1, 2, 11, 15, Some(2)).read(2, 20, 30, Some(1), 2);
    assert_invalid(&h.check());
}

#[test]
fn concurrent_write_and_read_may_see_either_value() {
    for (value, version) in [(None, 0), (Some(1), 1)] {
        let mut h = Hb::new();
        h.write(1, 1, 0, 100, Some(1)).read(2, 10, 20, value, version);
        assert_valid(&h.check());
    }
    // Two reads inside the write: the later one may not go back in time.
    let mut h = Hb::new();
    h.write(1, 1, 0, 100, Some(1)).read(2, 10, 20, Some(1), 1).read(2, 30, 40, None, 0);
    assert_invalid(&h.check());
    // ...but two concurrent reads may disagree.
    let mut h = Hb::new();
    h.write(1, 1, 0, 100, Some(1)).read(2, 10, 40, Some(1), 1).read(3, 30, 50, None, 0);
    assert_valid(&h.check());
}

#[test]
fn read_of_never_written_value_is_invalid() {
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).read(2, 5, 30, Some(2), 1);
    assert_invalid(&h.check());
    let mut h = Hb::new();
    h.read(2, 5, 30, Some(7), 0);
    assert_invalid(&h.check());
}

#[test]
fn indeterminate_write_observed_later_is_valid() {
    let mut h = Hb::new();
    h.write_info(1, 5, 0, 10).read(2, 50, 60, Some(5), 1);
    assert_valid(&h.check());
    // It may even take effect after its info was recorded, between two reads.
    let mut h = Hb::new();
    h.write_info(1, 5, 0, 10).read(2, 20, 30, None, 0).read(2, 50, 60, Some(5), 1);
    assert_valid(&h.check());
    // But not before it was invoked.
    let mut h = Hb::new();
    h.read(2, 0, 5, Some(5), 1).write_info(1, 5, 10, 20);
    assert_invalid(&h.check());
}

#[test]
fn indeterminate_write_never_observed_is_valid() {
    let mut h = Hb::new();
    h.write_info(1, 5, 0, 10).read(2, 50, 60, None, 0).read(3, 70, 80, None, 0);
    assert_valid(&h.check());
    // Its effect may be visible only through versions.
    let mut h = Hb::new();
    h.write_info(1, 5, 0, 10).write(2, 6, 20, 30, Some(2)).read(3, 40, 50, Some(6), 2);
    assert_valid(&h.check());
    // One indeterminate write explains one missing version, not two.
    let mut h = Hb::new();
    h.write_info(1, 5, 0, 10).write(2, 6, 20, 30, Some(3));
    assert_invalid(&h.check());
    // A never-completed invocation is indeterminate too.
    let mut h = Hb::new();
    h.op(1, "write", json!({"value": 5}), 0, None, OpType::Info, Value::Null).read(2, 50, 60, Some(5), 1);
    assert_valid(&h.check());
}

#[test]
fn cas_success_with_wrong_expected_version_is_invalid() {
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).cas(2, 0, 2, 20, 30, OpType::Ok, Some(2));
    assert_invalid(&h.check());
    // Control: the right expected version.
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).cas(2, 1, 2, 20, 30, OpType::Ok, Some(2)).read(3, 40, 50, Some(2), 2);
    assert_valid(&h.check());
    // Concurrent with the write, expecting version 0, it may go first.
    let mut h = Hb::new();
    h.write(1, 1, 0, 30, None).cas(2, 0, 2, 10, 20, OpType::Ok, None).read(3, 40, 50, Some(1), 2);
    assert_valid(&h.check());
}

#[test]
fn failed_cas_has_no_effect() {
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).cas(2, 0, 2, 20, 30, OpType::Fail, None).read(3, 40, 50, Some(1), 1);
    assert_valid(&h.check());
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).cas(2, 1, 2, 20, 30, OpType::Fail, None).read(3, 40, 50, Some(2), 2);
    assert_invalid(&h.check());
    let r = h.check();
    assert_eq!(r.keys[0].failed_excluded, 1);
}

#[test]
fn versions_increase_by_one_per_write() {
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).write(1, 2, 20, 30, Some(3));
    assert_invalid(&h.check());
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).write(1, 2, 20, 30, Some(2));
    assert_valid(&h.check());
    // Without version outputs, reads still pin the count.
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, None).write(1, 2, 20, 30, None).read(2, 40, 50, Some(2), 3);
    assert_invalid(&h.check());
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, None).write(1, 2, 20, 30, None).read(2, 40, 50, Some(2), 2);
    assert_valid(&h.check());
    // Versions never go backwards.
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).read(2, 20, 30, Some(1), 0);
    assert_invalid(&h.check());
}

#[test]
fn real_time_order_between_writes_is_respected() {
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, None).write(2, 2, 20, 30, None).read(3, 40, 50, Some(1), 2);
    assert_invalid(&h.check());
    // Overlapping writes may land in either order.
    let mut h = Hb::new();
    h.write(1, 1, 0, 25, None).write(2, 2, 20, 30, None).read(3, 40, 50, Some(1), 2);
    assert_valid(&h.check());
    // A return and a call at the same instant count as concurrent.
    let mut h = Hb::new();
    h.write(1, 1, 0, 20, None).write(2, 2, 20, 30, None).read(3, 40, 50, Some(1), 2);
    assert_valid(&h.check());
}

#[test]
fn initial_state_is_a_parameter() {
    let mut h = Hb::new();
    h.read(1, 0, 10, Some(7), 3);
    let hist = h.history();
    assert_eq!(check_register_history(&hist, RegisterState::default()).valid, Validity::Invalid);
    let init = RegisterState { value: Some(7), version: 3 };
    assert_eq!(check_register_history(&hist, init).valid, Validity::Valid);
}

#[test]
fn keys_are_checked_independently() {
    let mut h = Hb::new();
    h.key("a").write(1, 1, 0, 10, Some(1)).read(2, 20, 30, Some(1), 1);
    h.key("b").write(3, 1, 0, 10, Some(1)).read(4, 20, 30, None, 0);
    // Same value on another key does not leak into "b".
    h.key("c").read(5, 20, 30, None, 0);
    let r = h.check();
    assert_invalid(&r);
    assert_eq!(r.key_count, 3);
    assert_eq!(r.invalid_keys, vec![Some("b".to_string())]);
    assert_eq!(r.key(Some("a")).unwrap().valid, Validity::Valid);
    assert_eq!(r.key(Some("c")).unwrap().valid, Validity::Valid);
}

#[test]
fn invalid_report_names_the_anomaly() {
    let mut h = Hb::new();
    h.write(1, 1, 0, 10, Some(1)).write(1, 2, 20, 30, Some(2)).read(2, 40, 50, Some(1), 1);
    let hist = h.history();
    let r = check_register_history(&hist, RegisterState::default());
    assert_invalid(&r);
    let j = serde_json::to_value(&r).unwrap();
    assert_eq!(j["valid"], json!("false"));
    let a = &j["keys"][0]["anomaly"];
    // The stale read is the op that cannot be linearized; its invoke is entry 4.
    assert_eq!(hist.ops[4].f, "read");
    assert_eq!(a["failed_op"]["index"], json!(4));
    assert_eq!(a["failed_op"]["completion_value"], json!({"value": 1, "version": 1}));
    assert_eq!(a["prefix_indexes"], json!([0, 2]));
    assert_eq!(a["prefix_len"], json!(2));
    assert_eq!(a["state_after_prefix"], json!({"value": 2, "version": 2}));
    let text = a["explanation"].as_str().unwrap();
    assert!(text.contains("op 4") && text.contains("read"), "{text}");
    println!("{}", serde_json::to_string_pretty(&j).unwrap());
}

#[test]
fn state_budget_gives_unknown() {
    // Many concurrent writes of values read only at the very end, then an
    // impossible read: the search must explore orderings.
    let mut h = Hb::new();
    for p in 0..12 {
        h.write(p, p as i64 + 1, 0, 100, None);
    }
    h.read(100, 200, 210, Some(99), 12);
    let hist = h.history();
    let tight = CheckOptions { max_states: 5, threads: 1 };
    let r = check_register_history_with(&hist, RegisterState::default(), &tight);
    assert_eq!(r.valid, Validity::Unknown);
    assert_eq!(serde_json::to_value(&r).unwrap()["valid"], json!("unknown"));
    assert!(r.keys[0].error.as_deref().unwrap().contains("max_states"));
    let r = check_register_history(&hist, RegisterState::default());
    assert_invalid(&r);
}

#[test]
fn unparseable_operation_makes_key_unknown() {
    let mut h = Hb::new();
    h.op(1, "write", json!({"val": 1}), 0, Some(10), OpType::Ok, Value::Null);
    let r = h.check();
    assert_eq!(r.valid, Validity::Unknown);
    assert!(r.keys[0].error.is_some());
}

#[test]
fn many_indeterminate_writes_do_not_explode() {
    // 300 unobserved indeterminate writes stay pending for the whole history;
    // then an ordinary history with a stale read at the end. The checker must
    // still answer "invalid" well within its budget.
    let mut h = Hb::new();
    for p in 0..300u64 {
        h.write_info(1000 + p, 10_000 + p as i64, p, p + 1);
    }
    let mut t = 1_000;
    let mut version = 0;
    for i in 0..200i64 {
        version += 1;
        h.write(1, i, t, t + 10, None).read(2, t + 5, t + 15, Some(i), version);
        t += 20;
    }
    let valid = h.history();
    let r = check_register_history(&valid, RegisterState::default());
    assert_valid(&r);
    h.read(3, t + 100, t + 110, Some(198), version - 1);
    let r = check_register_history(&h.history(), RegisterState::default());
    assert_invalid(&r);
    println!("states explored: {}", r.keys[0].states);
}

// ---------------------------------------------------------------------------
// The generic search against brute force
// ---------------------------------------------------------------------------

type RegOp = Operation<RegisterOp, RegisterRet>;

fn apply(s: &RegisterState, o: &RegOp) -> Option<RegisterState> {
    match &o.output {
        Some(out) => s.step(&o.input, out),
        None => s.step_unknown(&o.input),
    }
}

/// Exhaustive search straight from the definition.
fn brute_force(state: RegisterState, ops: &[RegOp], used: &mut Vec<bool>) -> bool {
    if ops.iter().zip(used.iter()).all(|(o, &u)| u || o.ret == u64::MAX) {
        return true;
    }
    for i in 0..ops.len() {
        if used[i] {
            continue;
        }
        // Every unused op that returned before i was called must come first.
        if (0..ops.len()).any(|j| !used[j] && j != i && ops[j].ret < ops[i].call) {
            continue;
        }
        if let Some(ns) = apply(&state, &ops[i]) {
            used[i] = true;
            let ok = brute_force(ns, ops, used);
            used[i] = false;
            if ok {
                return true;
            }
        }
    }
    false
}

/// Checks that a witness linearization is legal.
fn verify_witness(init: RegisterState, ops: &[RegOp], order: &[usize]) {
    let by_id: HashMap<usize, &RegOp> = ops.iter().map(|o| (o.id, o)).collect();
    let mut seen = std::collections::HashSet::new();
    let mut s = init;
    for (k, id) in order.iter().enumerate() {
        assert!(seen.insert(*id), "op {id} twice");
        let o = by_id[id];
        for later in &order[k + 1..] {
            assert!(by_id[later].ret >= o.call, "op {later} returned before {id} was called but follows it");
        }
        s = apply(&s, o).unwrap_or_else(|| panic!("op {id} illegal in witness from {s:?}"));
    }
    for o in ops {
        assert!(o.ret == u64::MAX || seen.contains(&o.id), "determinate op {} missing from witness", o.id);
    }
}

fn random_small_ops(rng: &mut StdRng) -> Vec<RegOp> {
    let n = rng.gen_range(1..=7);
    let mut ops: Vec<RegOp> = (0..n)
        .map(|id| {
            let call = rng.gen_range(0..20u64);
            let ret = call + rng.gen_range(0..10u64);
            let input = match rng.gen_range(0..10) {
                0..=4 => RegisterOp::Read,
                5..=7 => RegisterOp::Write(rng.gen_range(1..=3)),
                _ => RegisterOp::Cas { expected_version: rng.gen_range(0..=2), new: rng.gen_range(1..=3) },
            };
            Operation { id: id * 10 + 3, call, ret, input, output: None }
        })
        .collect();
    // Outputs from a real execution half of the time, random otherwise.
    let simulate = rng.gen_bool(0.5);
    let mut order: Vec<usize> = (0..n).collect();
    let lin: Vec<f64> = ops.iter().map(|o| o.call as f64 + rng.gen::<f64>() * (o.ret - o.call) as f64).collect();
    order.sort_by(|&a, &b| lin[a].partial_cmp(&lin[b]).unwrap());
    let mut s = RegisterState::default();
    for &i in &order {
        let out = match ops[i].input {
            RegisterOp::Read => RegisterRet::Read { value: s.value, version: Some(s.version) },
            RegisterOp::Write(v) => {
                s = RegisterState { value: Some(v), version: s.version + 1 };
                RegisterRet::Write { version: Some(s.version) }
            }
            RegisterOp::Cas { expected_version, new } => {
                if s.version == expected_version {
                    s = RegisterState { value: Some(new), version: s.version + 1 };
                }
                RegisterRet::Cas { version: Some(s.version) }
            }
        };
        let out = if simulate && rng.gen_bool(0.85) {
            out
        } else {
            match ops[i].input {
                RegisterOp::Read => RegisterRet::Read {
                    value: [None, Some(1), Some(2), Some(3)][rng.gen_range(0..4)],
                    version: if rng.gen_bool(0.8) { Some(rng.gen_range(0..=3)) } else { None },
                },
                RegisterOp::Write(_) => {
                    RegisterRet::Write { version: if rng.gen_bool(0.5) { Some(rng.gen_range(1..=4)) } else { None } }
                }
                RegisterOp::Cas { .. } => {
                    RegisterRet::Cas { version: if rng.gen_bool(0.5) { Some(rng.gen_range(1..=4)) } else { None } }
                }
            }
        };
        ops[i].output = Some(out);
    }
    for o in &mut ops {
        if rng.gen_bool(0.2) {
            o.ret = u64::MAX;
            o.output = None;
        }
    }
    ops.shuffle(rng);
    ops
}

#[test]
fn generic_search_agrees_with_brute_force() {
    let mut rng = StdRng::seed_from_u64(7);
    let (mut valid, mut invalid) = (0, 0);
    for case in 0..20_000 {
        let ops = random_small_ops(&mut rng);
        let init =
            if rng.gen_bool(0.8) { RegisterState::default() } else { RegisterState { value: Some(1), version: 1 } };
        let expect = brute_force(init, &ops, &mut vec![false; ops.len()]);
        let got = check_operations(&init, &ops, &CheckOptions::default());
        assert_eq!(got.validity == Validity::Valid, expect, "case {case}: init {init:?}, ops {ops:#?}, got {got:?}");
        if expect {
            valid += 1;
            verify_witness(init, &ops, &got.linearization);
        } else {
            invalid += 1;
            let f = got.failure.expect("failure for invalid");
            assert!(ops.iter().any(|o| o.id == f.op) && !f.prefix.contains(&f.op));
            verify_witness_prefix(init, &ops, &f.prefix, &f.state);
        }
    }
    println!("brute force agreement: {valid} valid, {invalid} invalid");
    assert!(valid > 3_000 && invalid > 3_000, "{valid} valid / {invalid} invalid: poor mix");
}

/// The reported prefix is a legal partial linearization reaching `state`.
fn verify_witness_prefix(init: RegisterState, ops: &[RegOp], prefix: &[usize], state: &RegisterState) {
    let by_id: HashMap<usize, &RegOp> = ops.iter().map(|o| (o.id, o)).collect();
    let mut s = init;
    for (k, id) in prefix.iter().enumerate() {
        for later in &prefix[k + 1..] {
            assert!(by_id[later].ret >= by_id[id].call, "prefix violates real-time order");
        }
        s = apply(&s, by_id[id]).unwrap_or_else(|| panic!("prefix op {id} illegal from {s:?}"));
    }
    assert_eq!(&s, state);
    // Every op that returned before some prefix op was called is in the prefix.
    for o in ops {
        if !prefix.contains(&o.id) {
            assert!(prefix.iter().all(|id| o.ret >= by_id[id].call), "prefix skips op {} that precedes it", o.id);
        }
    }
}

/// The same random small histories, through the JSON history adapter (which
/// merges unobserved values and may drop unobserved indeterminate writes),
/// must get the brute-force verdict computed on the original values.
#[test]
fn history_adapter_agrees_with_brute_force() {
    let mut rng = StdRng::seed_from_u64(11);
    let (mut valid, mut invalid) = (0, 0);
    for case in 0..20_000 {
        let mut ops = random_small_ops(&mut rng);
        // Half the cases observe no versions at all.
        if rng.gen_bool(0.5) {
            ops.retain(|o| !matches!(o.input, RegisterOp::Cas { .. }));
            for o in &mut ops {
                o.output = match o.output {
                    Some(RegisterRet::Read { value, .. }) => Some(RegisterRet::Read { value, version: None }),
                    Some(RegisterRet::Write { .. }) => Some(RegisterRet::Write { version: None }),
                    other => other,
                };
            }
        }
        let mut h = Hb::new();
        for (p, o) in ops.iter().enumerate() {
            let (f, inv) = match o.input {
                RegisterOp::Read => ("read", Value::Null),
                RegisterOp::Write(v) => ("write", json!({ "value": v })),
                RegisterOp::Cas { expected_version, new } => {
                    ("cas", json!({ "expected_version": expected_version, "value": new }))
                }
            };
            let out = match o.output {
                None => Value::Null,
                Some(RegisterRet::Read { value, version }) => match version {
                    Some(v) => json!({ "value": value, "version": v }),
                    None => json!({ "value": value }),
                },
                Some(RegisterRet::Write { version }) | Some(RegisterRet::Cas { version }) => {
                    version.map_or(Value::Null, |v| json!({ "version": v }))
                }
            };
            let (t1, ty) = if o.ret == u64::MAX {
                (if p % 2 == 0 { Some(o.call + 1) } else { None }, OpType::Info)
            } else {
                (Some(o.ret), OpType::Ok)
            };
            h.op(p as u64, f, inv, o.call, t1, ty, out);
        }
        let init = RegisterState::default();
        let expect = brute_force(init, &ops, &mut vec![false; ops.len()]);
        let r = check_register_history(&h.history(), init);
        assert_eq!(r.is_valid(), expect, "case {case}: ops {ops:#?}, report {}", serde_json::to_string(&r).unwrap());
        if expect {
            valid += 1;
        } else {
            invalid += 1;
            assert!(r.keys[0].anomaly.is_some());
        }
    }
    println!("adapter brute force agreement: {valid} valid, {invalid} invalid");
    assert!(valid > 3_000 && invalid > 3_000, "{valid} valid / {invalid} invalid: poor mix");
}

// ---------------------------------------------------------------------------
// Random histories from a simulated linearizable register
// ---------------------------------------------------------------------------

struct GenConfig {
    keys: usize,
    procs_per_key: usize,
    ops_per_key: usize,
    p_info: f64,
    /// Record the new version in write/cas completions.
    write_versions: bool,
    /// Record the version in read completions.
    read_versions: bool,
    /// Scale of operation durations (1.0 = mostly 0.1-2 ms, some up to 20 ms).
    dur_scale: f64,
    /// Generate cas operations (else only reads and writes).
    cas: bool,
}

struct Generated {
    history: History,
    /// Per key: the value at each version, in the real execution.
    truth: HashMap<String, Vec<Option<i64>>>,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Call(usize),
    Lin(usize),
    Ret(usize),
}

struct SimOp {
    process: u64,
    slot: usize,
    f: &'static str,
    input: RegisterOp,
    info: bool,
    recorded_ret: bool,
    ty: OpType,
    out: Value,
    observed_version: Option<i32>,
}

/// A linearizable register per key, driven by concurrent processes: each
/// operation takes effect at a random instant inside its interval (an
/// indeterminate one at any instant after its call, or never).
fn generate(seed: u64, cfg: &GenConfig) -> Generated {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut entries: Vec<(u64, u64, Op)> = Vec::new();
    let mut seq = 0u64;
    let mut truth = HashMap::new();
    let mut next_pid = 0u64;
    for k in 0..cfg.keys {
        let key = format!("k{k}");
        let mut state = RegisterState::default();
        let mut values = vec![None];
        let mut ops: Vec<SimOp> = Vec::new();
        let mut slot_pid: Vec<u64> = Vec::new();
        let mut slot_version = vec![0i32; cfg.procs_per_key];
        let mut q: BinaryHeap<Reverse<(u64, u64, Ev)>> = BinaryHeap::new();
        for s in 0..cfg.procs_per_key {
            slot_pid.push(next_pid);
            next_pid += 1;
            q.push(Reverse((rng.gen_range(0..1_000_000), 0, Ev::Call(s))));
        }
        let mut started = 0;
        let mut counter = 0i64;
        let mut qseq = 0u64;
        while let Some(Reverse((t, _, ev))) = q.pop() {
            let mut record = |time: u64, op: Op, entries: &mut Vec<(u64, u64, Op)>| {
                seq += 1;
                entries.push((time, seq, op));
            };
            qseq += 1;
            match ev {
                Ev::Call(s) => {
                    if started >= cfg.ops_per_key {
                        continue;
                    }
                    started += 1;
                    let (f, input, inv) = match rng.gen_range(0..if cfg.cas { 10 } else { 8 }) {
                        0..=4 => ("read", RegisterOp::Read, Value::Null),
                        5..=7 => {
                            counter += 1;
                            let v = k as i64 * 1_000_000_000 + counter;
                            ("write", RegisterOp::Write(v), json!({ "value": v }))
                        }
                        _ => {
                            counter += 1;
                            let v = k as i64 * 1_000_000_000 + counter;
                            let ev = if rng.gen_bool(0.7) {
                                slot_version[s]
                            } else {
                                (slot_version[s] + rng.gen_range(-1..=2)).max(0)
                            };
                            (
                                "cas",
                                RegisterOp::Cas { expected_version: ev, new: v },
                                json!({"expected_version": ev, "value": v}),
                            )
                        }
                    };
                    // Mostly short operations, some slow ones.
                    let dur = if rng.gen_bool(0.9) {
                        rng.gen_range(100_000..2_000_000)
                    } else {
                        rng.gen_range(2_000_000..20_000_000)
                    };
                    let dur = ((dur as f64 * cfg.dur_scale) as u64).max(2);
                    let info = rng.gen_bool(cfg.p_info);
                    let id = ops.len();
                    let process = slot_pid[s];
                    record(
                        t,
                        Op {
                            index: 0,
                            process,
                            ty: OpType::Invoke,
                            f: f.to_string(),
                            key: Some(key.clone()),
                            value: inv,
                            time: t,
                            error: None,
                        },
                        &mut entries,
                    );
                    ops.push(SimOp {
                        process,
                        slot: s,
                        f,
                        input,
                        info,
                        recorded_ret: !info || rng.gen_bool(0.7),
                        ty: OpType::Ok,
                        out: Value::Null,
                        observed_version: None,
                    });
                    if !info {
                        q.push(Reverse((t + rng.gen_range(1..dur), qseq, Ev::Lin(id))));
                    } else if rng.gen_bool(0.5) {
                        q.push(Reverse((t + rng.gen_range(1..3 * dur), qseq, Ev::Lin(id))));
                    }
                    q.push(Reverse((t + dur, qseq, Ev::Ret(id))));
                }
                Ev::Lin(id) => {
                    let o = &mut ops[id];
                    match o.input {
                        RegisterOp::Read => {
                            o.out = json!({ "value": state.value, "version": state.version });
                            o.observed_version = Some(state.version);
                        }
                        RegisterOp::Write(v) => {
                            state = RegisterState { value: Some(v), version: state.version + 1 };
                            values.push(state.value);
                            o.out = json!({ "version": state.version });
                            o.observed_version = Some(state.version);
                        }
                        RegisterOp::Cas { expected_version, new } => {
                            if state.version == expected_version {
                                state = RegisterState { value: Some(new), version: state.version + 1 };
                                values.push(state.value);
                                o.out = json!({ "version": state.version });
                                o.observed_version = Some(state.version);
                            } else {
                                o.ty = OpType::Fail;
                                o.observed_version = Some(state.version);
                            }
                        }
                    }
                }
                Ev::Ret(id) => {
                    let o = &ops[id];
                    if o.recorded_ret {
                        let (ty, value, error) = if o.info {
                            (OpType::Info, Value::Null, Some("timeout".to_string()))
                        } else if o.ty == OpType::Fail {
                            (OpType::Fail, Value::Null, Some("BadVersion".to_string()))
                        } else {
                            let mut out = o.out.clone();
                            let versions = if o.f == "read" { cfg.read_versions } else { cfg.write_versions };
                            if !versions {
                                if o.f == "read" {
                                    out.as_object_mut().unwrap().remove("version");
                                } else {
                                    out = Value::Null;
                                }
                            }
                            (OpType::Ok, out, None)
                        };
                        record(
                            t,
                            Op {
                                index: 0,
                                process: o.process,
                                ty,
                                f: o.f.to_string(),
                                key: Some(key.clone()),
                                value,
                                time: t,
                                error,
                            },
                            &mut entries,
                        );
                    }
                    let s = o.slot;
                    if o.info {
                        // The process is retired; a fresh one takes its place.
                        slot_pid[s] = next_pid;
                        next_pid += 1;
                    } else if let Some(v) = o.observed_version {
                        slot_version[s] = v;
                    }
                    q.push(Reverse((t + rng.gen_range(0..500_000), qseq, Ev::Call(s))));
                }
            }
        }
        truth.insert(key, values);
    }
    entries.sort_by_key(|(t, s, _)| (*t, *s));
    let mut history = History::default();
    for (_, _, op) in entries {
        history.push(op);
    }
    Generated { history, truth }
}

/// Makes one ok read impossible; returns the corrupted history and key.
fn corrupt(g: &Generated, rng: &mut StdRng, stale: bool) -> Option<(History, String)> {
    let pairs = g.history.pairs();
    let mut reads: Vec<usize> =
        (0..pairs.len()).filter(|&i| pairs[i].invoke.f == "read" && pairs[i].outcome() == OpType::Ok).collect();
    reads.shuffle(rng);
    for i in reads {
        let r = &pairs[i];
        let key = r.invoke.key.clone().unwrap();
        let new_value = if stale {
            // The highest version a write returned before this read began:
            // the read must see at least that; show it the one before.
            let floor = pairs
                .iter()
                .filter(|p| {
                    p.invoke.key == r.invoke.key
                        && p.invoke.f != "read"
                        && p.outcome() == OpType::Ok
                        && p.end() < r.invoke.time
                })
                .filter_map(|p| p.complete.unwrap().value["version"].as_i64())
                .max();
            match floor {
                Some(v) if v >= 1 => {
                    let old = (v - 1) as usize;
                    json!({ "value": g.truth[&key][old], "version": old })
                }
                _ => continue,
            }
        } else {
            let mut v = r.complete.unwrap().value.clone();
            v["value"] = json!(999_999_999_999i64);
            v
        };
        let mut h = g.history.clone();
        h.ops[r.complete.unwrap().index].value = new_value;
        return Some((h, key));
    }
    None
}

fn small_config(versions: bool) -> GenConfig {
    GenConfig {
        keys: 3,
        procs_per_key: 6,
        ops_per_key: 400,
        p_info: 0.03,
        write_versions: versions,
        read_versions: versions,
        dur_scale: 1.0,
        cas: versions,
    }
}

fn check_random_valid(versions: bool) {
    let cfg = small_config(versions);
    let mut infos = 0;
    for seed in 0..60 {
        let g = generate(seed, &cfg);
        infos += g.history.ops.iter().filter(|o| o.ty == OpType::Info).count();
        let r = check_register_history(&g.history, RegisterState::default());
        assert_valid(&r);
        assert_eq!(r.key_count, cfg.keys);
        assert!(r.keys.iter().all(|k| k.ops > 0));
    }
    assert!(infos > 0, "the generator should produce indeterminate operations");
}

#[test]
fn random_valid_histories_are_valid() {
    check_random_valid(true);
}

#[test]
fn random_valid_histories_without_versions_are_valid() {
    check_random_valid(false);
}

fn check_corrupted(versions: bool) {
    let cfg = small_config(versions);
    let mut rng = StdRng::seed_from_u64(99);
    let mut checked = 0;
    for seed in 0..60 {
        let g = generate(seed, &cfg);
        // A stale read can only be proven with write versions.
        for stale in [false, versions] {
            let Some((h, key)) = corrupt(&g, &mut rng, stale) else { continue };
            let r = check_register_history(&h, RegisterState::default());
            assert_invalid(&r);
            assert_eq!(r.invalid_keys, vec![Some(key)], "seed {seed} stale {stale}");
            checked += 1;
        }
    }
    assert!(checked >= 60, "only {checked} corrupted histories");
}

#[test]
fn corrupted_histories_are_invalid() {
    check_corrupted(true);
}

#[test]
fn corrupted_histories_without_versions_are_invalid() {
    check_corrupted(false);
}

// ---------------------------------------------------------------------------
// Performance
// ---------------------------------------------------------------------------

#[test]
fn hundred_thousand_ops_check_under_60s() {
    let cfg = GenConfig {
        keys: 10,
        procs_per_key: 10,
        ops_per_key: 10_000,
        p_info: 0.01,
        write_versions: true,
        read_versions: true,
        dur_scale: 1.0,
        cas: true,
    };
    time_100k(&cfg);
}

/// The same size with no versions recorded anywhere and no cas: a plain
/// read/write register, where the search has much less to go on.
#[test]
fn hundred_thousand_ops_without_versions_check_under_60s() {
    let cfg = GenConfig {
        keys: 10,
        procs_per_key: 10,
        ops_per_key: 10_000,
        p_info: 0.01,
        write_versions: false,
        read_versions: false,
        dur_scale: 1.0,
        cas: false,
    };
    time_100k(&cfg);
}

fn time_100k(cfg: &GenConfig) {
    let g = generate(2024, cfg);
    let pairs = g.history.pairs();
    let n_ops = pairs.len();
    let infos = pairs.iter().filter(|p| p.outcome() == OpType::Info).count();
    assert!(n_ops >= cfg.keys * cfg.ops_per_key, "{n_ops} ops");
    let start = Instant::now();
    let r = check_register_history(&g.history, RegisterState::default());
    let elapsed = start.elapsed();
    let states: u64 = r.keys.iter().map(|k| k.states).sum();
    println!(
        "checked {n_ops} ops ({infos} indeterminate, {} keys, {} checked after excluding fails/info reads) in {:.3} s: {:.0} ops/s, {states} states",
        r.key_count,
        r.op_count,
        elapsed.as_secs_f64(),
        n_ops as f64 / elapsed.as_secs_f64()
    );
    for k in &r.keys {
        println!("  key {:?}: {} ops, {} states, {:.1} ms", k.key, k.ops, k.states, k.elapsed_ms);
    }
    assert_valid(&r);
    assert!(elapsed.as_secs() < 60, "took {elapsed:?}");

    // The same history with one stale read must be rejected, also in time.
    let mut rng = StdRng::seed_from_u64(5);
    let (bad, key) = corrupt(&g, &mut rng, cfg.write_versions).unwrap();
    let start = Instant::now();
    let r = check_register_history(&bad, RegisterState::default());
    let elapsed = start.elapsed();
    println!("corrupted 100k-op history rejected in {:.3} s", elapsed.as_secs_f64());
    assert_invalid(&r);
    assert_eq!(r.invalid_keys, vec![Some(key)]);
    assert!(elapsed.as_secs() < 60, "took {elapsed:?}");
}
