//! The register workload's model and checker: a Baton node's value and
//! version as a sequential specification ([`RegisterState`]), and the
//! adapter that splits a history by key (P-compositionality: every key is
//! an independent object), checks each key's operations with the WGL
//! search ([`crate::linearizability`]), keys in parallel, and explains a
//! failure for humans ([`Anomaly`]).
//!
//! The register adapter gives every written value that no read observes
//! one common value, so states that no read can tell apart coincide; and
//! if nothing on a key observes versions, an indeterminate write of such a
//! value is dropped (it can only have overwritten the value with one never
//! read). Definite failures (`fail`) had no effect and are excluded, as
//! are indeterminate reads.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use serde::Serialize;
use serde_json::json;

use crate::history::{History, OpType, Pair};
use crate::linearizability::{check_operations, CheckOptions, Failure, Model, Operation};
use crate::verdict::{CheckResult, Validity};

/// The register checker's result for `results.json`: linearizability per
/// key from `initial` (the harness creates its keys as "0" at version 0).
pub fn check(h: &History, initial: RegisterState) -> CheckResult {
    let report = check_register_history(h, initial);
    let anomalies = report
        .keys
        .iter()
        .filter_map(|k| {
            k.anomaly
                .as_ref()
                .map(|a| json!({"anomaly": "not-linearizable", "key": k.key, "explain": a.explanation, "detail": a}))
        })
        .collect();
    CheckResult {
        checker: "register".into(),
        valid: report.valid,
        anomalies,
        stats: json!({
            "ops": report.op_count, "keys": report.key_count, "check_ms": report.elapsed_ms,
            "unknown_keys": report.unknown_keys,
        }),
    }
}

// ---------------------------------------------------------------------------
// The model (Baton nodes: value + version)
// ---------------------------------------------------------------------------

/// A Baton node's data as the register workload sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub struct RegisterState {
    /// `None`: no value (node absent / never written).
    pub value: Option<i64>,
    /// Incremented by every successful write or cas.
    pub version: i32,
}

/// Register operations (inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum RegisterOp {
    Read,
    /// Unconditional write: always succeeds, version += 1.
    Write(i64),
    /// Succeeds iff the version equals `expected_version`; then sets the
    /// value and version += 1. A cas that failed (BadVersion) is recorded as
    /// `fail` and excluded, so an `ok` cas output means it succeeded.
    Cas {
        expected_version: i32,
        new: i64,
    },
}

/// Outputs of `ok` register operations. `version: None` = not reported,
/// not checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum RegisterRet {
    Read {
        value: Option<i64>,
        version: Option<i32>,
    },
    /// The new version after the write.
    Write {
        version: Option<i32>,
    },
    /// The new version after the cas.
    Cas {
        version: Option<i32>,
    },
}

impl RegisterState {
    fn written(&self, v: i64) -> Option<RegisterState> {
        Some(RegisterState { value: Some(v), version: self.version.checked_add(1)? })
    }
}

impl Model for RegisterState {
    type In = RegisterOp;
    type Out = RegisterRet;

    fn step(&self, input: &RegisterOp, output: &RegisterRet) -> Option<Self> {
        let version_ok = |s: &RegisterState, v: &Option<i32>| v.is_none_or(|v| v == s.version);
        match (input, output) {
            (RegisterOp::Read, RegisterRet::Read { value, version }) => {
                (*value == self.value && version_ok(self, version)).then_some(*self)
            }
            (RegisterOp::Write(v), RegisterRet::Write { version }) => {
                self.written(*v).filter(|n| version_ok(n, version))
            }
            (RegisterOp::Cas { expected_version, new }, RegisterRet::Cas { version }) => {
                if self.version != *expected_version {
                    return None;
                }
                self.written(*new).filter(|n| version_ok(n, version))
            }
            _ => None,
        }
    }

    fn step_unknown(&self, input: &RegisterOp) -> Option<Self> {
        match input {
            RegisterOp::Read => Some(*self),
            RegisterOp::Write(v) => self.written(*v),
            // A cas with the wrong version fails without effect.
            RegisterOp::Cas { expected_version, new } => {
                if self.version == *expected_version {
                    self.written(*new)
                } else {
                    Some(*self)
                }
            }
        }
    }

    fn still_possible(&self, input: &RegisterOp, output: Option<&RegisterRet>) -> bool {
        // Versions never decrease.
        let by_input = match input {
            RegisterOp::Cas { expected_version, .. } => self.version <= *expected_version,
            _ => true,
        };
        let by_output = match output {
            Some(RegisterRet::Read { version: Some(v), .. }) => self.version <= *v,
            Some(RegisterRet::Write { version: Some(v) }) | Some(RegisterRet::Cas { version: Some(v) }) => {
                self.version < *v
            }
            _ => true,
        };
        by_input && by_output
    }
}

// ---------------------------------------------------------------------------
// History adapter and report
// ---------------------------------------------------------------------------

/// The whole-history result ([`check`] puts its figures and anomalies
/// into `results.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Unknown: some key exceeded the state budget or had unparseable
    /// operations, and none is invalid.
    pub valid: Validity,
    pub checker: String,
    pub model: String,
    /// Operations (invoke/completion pairs) checked, over all keys.
    pub op_count: usize,
    pub key_count: usize,
    pub invalid_keys: Vec<Option<String>>,
    pub unknown_keys: Vec<Option<String>>,
    pub max_states_per_key: u64,
    pub elapsed_ms: f64,
    /// One entry per key, in key order.
    pub keys: Vec<KeyReport>,
}

impl Report {
    /// True only if every key is linearizable.
    pub fn is_valid(&self) -> bool {
        self.valid == Validity::Valid
    }
    pub fn key(&self, key: Option<&str>) -> Option<&KeyReport> {
        self.keys.iter().find(|k| k.key.as_deref() == key)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct KeyReport {
    pub key: Option<String>,
    pub valid: Validity,
    /// Operations checked (ok + indeterminate).
    pub ops: usize,
    /// Of which indeterminate (info or never completed).
    pub indeterminate: usize,
    /// Definite failures, excluded (no effect).
    pub failed_excluded: usize,
    /// Indeterminate reads, excluded (no effect, nothing observed).
    pub info_reads_excluded: usize,
    /// Distinct configurations the search explored.
    pub states: u64,
    pub elapsed_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anomaly: Option<Anomaly>,
}

/// Why a key is not linearizable, for humans.
#[derive(Debug, Clone, Serialize)]
pub struct Anomaly {
    pub explanation: String,
    /// The operation that completed with no possible linearization point
    /// after the longest linearizable prefix found.
    pub failed_op: OpInfo,
    /// The register after that prefix.
    pub state_after_prefix: serde_json::Value,
    /// Other operations that could have taken effect at that point.
    pub concurrent_ops: Vec<OpInfo>,
    /// Length of the longest linearizable prefix found.
    pub prefix_len: usize,
    /// The last (up to 20) operations of that prefix, in linearization order.
    pub prefix_tail: Vec<OpInfo>,
    /// History indexes (of the invocations) of the whole prefix, in
    /// linearization order.
    pub prefix_indexes: Vec<usize>,
}

/// One operation as recorded, for reports.
#[derive(Debug, Clone, Serialize)]
pub struct OpInfo {
    /// History index of the invocation.
    pub index: usize,
    /// History index of the completion, if any.
    pub completion_index: Option<usize>,
    pub process: u64,
    pub f: String,
    pub outcome: OpType,
    pub invoke_value: serde_json::Value,
    pub completion_value: serde_json::Value,
    pub invoke_time: u64,
    pub completion_time: Option<u64>,
}

impl OpInfo {
    fn from_pair(p: &Pair<'_>) -> OpInfo {
        OpInfo {
            index: p.invoke.index,
            completion_index: p.complete.map(|c| c.index),
            process: p.invoke.process,
            f: p.invoke.f.clone(),
            outcome: p.outcome(),
            invoke_value: p.invoke.value.clone(),
            completion_value: p.complete.map(|c| c.value.clone()).unwrap_or(serde_json::Value::Null),
            invoke_time: p.invoke.time,
            completion_time: p.complete.map(|c| c.time),
        }
    }

    fn describe(&self) -> String {
        let args = if self.invoke_value.is_null() { String::new() } else { format!(" {}", self.invoke_value) };
        let result = match self.outcome {
            OpType::Ok => format!("ok {}", self.completion_value),
            _ => "indeterminate".to_string(),
        };
        format!("op {} (process {}, t={}) {}{} -> {}", self.index, self.process, self.invoke_time, self.f, args, result)
    }
}

/// Checks a register history (ops with `f` in read/write/cas) per key, from
/// `initial`, with default options.
pub fn check_register_history(h: &History, initial: RegisterState) -> Report {
    check_register_history_with(h, initial, &CheckOptions::default())
}

/// Like [`check_register_history`], with explicit limits.
///
/// Expected values: write invoke `{"value": n}`; cas invoke
/// `{"expected_version": v, "value": n}`; read invoke `null`. Ok
/// completions: read `{"value": n|null, "version": v}`, write and cas
/// `{"version": v}` (the new version; optional). `fail` ops are excluded;
/// `info` / never-completed ops are indeterminate.
pub fn check_register_history_with(h: &History, initial: RegisterState, opts: &CheckOptions) -> Report {
    let start = Instant::now();
    let keys = check_keys(by_key(h), initial, opts);
    let valid = keys.iter().fold(Validity::Valid, |v, k| v.and(k.valid));
    Report {
        valid,
        checker: "linearizability (Wing-Gong-Lowe search, per key)".to_string(),
        model: "register (value, version)".to_string(),
        op_count: keys.iter().map(|k| k.ops).sum(),
        key_count: keys.len(),
        invalid_keys: keys.iter().filter(|k| k.valid == Validity::Invalid).map(|k| k.key.clone()).collect(),
        unknown_keys: keys.iter().filter(|k| k.valid == Validity::Unknown).map(|k| k.key.clone()).collect(),
        max_states_per_key: opts.max_states,
        elapsed_ms: start.elapsed().as_secs_f64() * 1e3,
        keys,
    }
}

/// One key's register operations, as recorded.
#[derive(Default)]
struct KeyInput<'a> {
    /// Operations to check: ok and indeterminate writes, cas and reads.
    pairs: Vec<Pair<'a>>,
    /// Definite failures: no effect, excluded.
    failed: usize,
    /// Indeterminate reads: no effect, nothing observed, excluded.
    info_reads: usize,
}

/// The history's read / write / cas operations, by key, in key order.
fn by_key(h: &History) -> Vec<(Option<String>, KeyInput<'_>)> {
    let mut groups: BTreeMap<Option<String>, KeyInput<'_>> = BTreeMap::new();
    for p in h.pairs() {
        if !matches!(p.invoke.f.as_str(), "read" | "write" | "cas") {
            continue;
        }
        let g = groups.entry(p.invoke.key.clone()).or_default();
        match p.outcome() {
            OpType::Fail => g.failed += 1,
            OpType::Info | OpType::Invoke if p.invoke.f == "read" => g.info_reads += 1,
            _ => g.pairs.push(p),
        }
    }
    groups.into_iter().collect()
}

/// Checks every key on `opts.threads` threads (0: one per core), largest
/// keys first, pulled from a shared counter. Reports in key order.
fn check_keys(
    inputs: Vec<(Option<String>, KeyInput<'_>)>,
    initial: RegisterState,
    opts: &CheckOptions,
) -> Vec<KeyReport> {
    let n_keys = inputs.len();
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    } else {
        opts.threads
    }
    .clamp(1, n_keys.max(1));
    let mut order: Vec<usize> = (0..n_keys).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(inputs[i].1.pairs.len()));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<(usize, KeyReport)> = std::thread::scope(|s| {
        let (inputs, order, next) = (&inputs, &order, &next);
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&i) = order.get(k) else { break };
                        let (key, input) = &inputs[i];
                        out.push((i, check_key(key.clone(), input, initial, opts)));
                    }
                    out
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("linearizability worker panicked")).collect()
    });
    let mut keys: Vec<Option<KeyReport>> = (0..n_keys).map(|_| None).collect();
    for (i, r) in results {
        keys[i] = Some(r);
    }
    keys.into_iter().map(|k| k.expect("every key checked")).collect()
}

/// Checks one key: parse its operations, merge the unobserved values,
/// search, and explain a failure.
fn check_key(key: Option<String>, input: &KeyInput<'_>, initial: RegisterState, opts: &CheckOptions) -> KeyReport {
    let start = Instant::now();
    let mut report = KeyReport {
        key,
        valid: Validity::Unknown,
        ops: input.pairs.len(),
        indeterminate: input.pairs.iter().filter(|p| p.outcome() != OpType::Ok).count(),
        failed_excluded: input.failed,
        info_reads_excluded: input.info_reads,
        states: 0,
        elapsed_ms: 0.0,
        error: None,
        anomaly: None,
    };
    match KeyOps::new(&input.pairs) {
        Err(e) => report.error = Some(e),
        Ok(k) => {
            let outcome = check_operations(&initial, &k.ops, opts);
            report.valid = outcome.validity;
            report.states = outcome.states;
            match outcome.validity {
                Validity::Valid => {}
                Validity::Unknown => {
                    let deepest = outcome.failure.as_ref().map_or(String::new(), |f| {
                        format!(
                            "; longest linearizable prefix found: {} ops, after which {} could not be linearized",
                            f.prefix.len(),
                            OpInfo::from_pair(&input.pairs[f.op]).describe()
                        )
                    });
                    report.error = Some(format!(
                        "search gave up after exploring {} states (max_states = {}){deepest}",
                        outcome.states, opts.max_states
                    ))
                }
                Validity::Invalid => {
                    let f = outcome.failure.expect("an invalid outcome carries its failure");
                    report.anomaly = Some(k.explain(&f, &input.pairs, initial));
                }
            }
        }
    }
    report.elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    report
}

/// One key's operations as the search sees them (local id = index into
/// the key's pairs).
struct KeyOps {
    ops: Vec<Operation<RegisterOp, RegisterRet>>,
    /// The one value that every written value no read observes became.
    hidden: i64,
    /// Inputs and outputs by local id, as written (before the merge), for
    /// replaying a reported prefix.
    original: Vec<(RegisterOp, Option<RegisterRet>)>,
}

impl KeyOps {
    /// Parses `pairs` (an error names the first unusable operation), then
    /// merges what no read can tell apart.
    fn new(pairs: &[Pair<'_>]) -> Result<KeyOps, String> {
        let mut ops = Vec::with_capacity(pairs.len());
        for (local, p) in pairs.iter().enumerate() {
            let (input, output) = parse_register_op(p).map_err(|e| format!("op {}: {e}", p.invoke.index))?;
            ops.push(Operation { id: local, call: p.invoke.time, ret: p.end(), input, output });
        }
        let original = ops.iter().map(|o| (o.input, o.output)).collect();
        let hidden = merge_unobserved(&mut ops);
        Ok(KeyOps { ops, hidden, original })
    }

    /// Why the key is not linearizable, for humans, from the search's
    /// failure `f`.
    fn explain(&self, f: &Failure<RegisterState>, pairs: &[Pair<'_>], initial: RegisterState) -> Anomaly {
        let info = |id: usize| OpInfo::from_pair(&pairs[id]);
        let state = self.state_after(f, initial);
        let failed_op = info(f.op);
        let concurrent_ops: Vec<OpInfo> = f.pending.iter().filter(|&&id| id != f.op).map(|&id| info(id)).collect();
        let prefix_tail: Vec<OpInfo> =
            f.prefix[f.prefix.len().saturating_sub(20)..].iter().map(|&id| info(id)).collect();
        let last = prefix_tail.last().map_or("the initial state".to_string(), |o| o.describe());
        let mut explanation = format!(
            "Not linearizable. The longest linearizable prefix found has {} operations (ending with {}) and leaves \
             the register at {}. {} completed at t={} but cannot take effect from that state",
            f.prefix.len(),
            last,
            state,
            failed_op.describe(),
            failed_op.completion_time.unwrap_or(u64::MAX),
        );
        if concurrent_ops.is_empty() {
            explanation.push_str(", and no other operation was pending.");
        } else {
            explanation.push_str(", nor after any of the concurrently pending operations: ");
            let list: Vec<String> = concurrent_ops.iter().take(8).map(|o| o.describe()).collect();
            explanation.push_str(&list.join("; "));
            if concurrent_ops.len() > 8 {
                explanation.push_str(&format!("; and {} more", concurrent_ops.len() - 8));
            }
            explanation.push('.');
        }
        Anomaly {
            explanation,
            failed_op,
            state_after_prefix: state,
            concurrent_ops,
            prefix_len: f.prefix.len(),
            prefix_tail,
            prefix_indexes: f.prefix.iter().map(|&id| pairs[id].invoke.index).collect(),
        }
    }

    /// The register after the failure's prefix, replayed with the values as
    /// written (the search saw unobserved values merged into one).
    fn state_after(&self, f: &Failure<RegisterState>, initial: RegisterState) -> serde_json::Value {
        let replayed = f.prefix.iter().try_fold(initial, |s, &id| match &self.original[id] {
            (input, Some(out)) => s.step(input, out),
            (input, None) => s.step_unknown(input),
        });
        match replayed {
            Some(s) => json!({ "value": s.value, "version": s.version }),
            None => json!({
                "value": match f.state.value {
                    Some(v) if v == self.hidden => json!("<a value no read observed>"),
                    v => json!(v),
                },
                "version": f.state.version,
            }),
        }
    }
}

/// Values no read ever observes are indistinguishable from one another:
/// gives them all one value no read observes (returned), so equivalent
/// states (and interchangeable indeterminate writes) coincide. If nothing
/// on the key observes versions, an indeterminate write of that value can
/// only have overwritten the value with one never read: dropping it ("it
/// never took effect") changes no verdict.
fn merge_unobserved(ops: &mut Vec<Operation<RegisterOp, RegisterRet>>) -> i64 {
    let observed: HashSet<i64> = ops
        .iter()
        .filter_map(|o| match o.output {
            Some(RegisterRet::Read { value, .. }) => value,
            _ => None,
        })
        .collect();
    let hidden = (i64::MIN..).find(|v| !observed.contains(v)).expect("some value is unobserved");
    for o in ops.iter_mut() {
        if let RegisterOp::Write(v) | RegisterOp::Cas { new: v, .. } = &mut o.input {
            if !observed.contains(&*v) {
                *v = hidden;
            }
        }
    }
    let versions_observed = ops.iter().any(|o| {
        matches!(o.input, RegisterOp::Cas { .. })
            || matches!(
                o.output,
                Some(RegisterRet::Read { version: Some(_), .. })
                    | Some(RegisterRet::Write { version: Some(_) })
                    | Some(RegisterRet::Cas { version: Some(_) })
            )
    });
    if !versions_observed {
        ops.retain(|o| !(o.output.is_none() && o.ret == u64::MAX && o.input == RegisterOp::Write(hidden)));
    }
    hidden
}

fn field_i64(v: &serde_json::Value, name: &str) -> Result<Option<i64>, String> {
    match v.get(name) {
        None => Err(format!("missing \"{name}\" in {v}")),
        Some(serde_json::Value::Null) => Ok(None),
        Some(x) => x.as_i64().map(Some).ok_or_else(|| format!("\"{name}\" is not an integer in {v}")),
    }
}

fn field_i32(v: &serde_json::Value, name: &str) -> Result<Option<i32>, String> {
    match v.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(x) => x
            .as_i64()
            .and_then(|x| i32::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| format!("\"{name}\" is not a 32-bit integer in {v}")),
    }
}

fn parse_register_op(p: &Pair<'_>) -> Result<(RegisterOp, Option<RegisterRet>), String> {
    let iv = &p.invoke.value;
    let input = match p.invoke.f.as_str() {
        "read" => RegisterOp::Read,
        "write" => {
            let v = if let Some(n) = iv.as_i64() { Some(n) } else { field_i64(iv, "value")? };
            RegisterOp::Write(v.ok_or_else(|| format!("write of null in {iv}"))?)
        }
        "cas" => {
            let expected_version =
                field_i32(iv, "expected_version")?.ok_or_else(|| format!("cas without expected_version in {iv}"))?;
            let new = if iv.get("value").is_some() { field_i64(iv, "value")? } else { field_i64(iv, "new")? };
            RegisterOp::Cas { expected_version, new: new.ok_or_else(|| format!("cas to null in {iv}"))? }
        }
        f => return Err(format!("unexpected f {f:?}")),
    };
    let output = match (p.outcome(), p.complete) {
        (OpType::Ok, Some(c)) => {
            let cv = &c.value;
            Some(match input {
                RegisterOp::Read => {
                    RegisterRet::Read { value: field_i64(cv, "value")?, version: field_i32(cv, "version")? }
                }
                RegisterOp::Write(_) => RegisterRet::Write { version: field_i32(cv, "version")? },
                RegisterOp::Cas { .. } => RegisterRet::Cas { version: field_i32(cv, "version")? },
            })
        }
        _ => None,
    };
    Ok((input, output))
}
