//! Adapters from the generic checkers to [`CheckResult`]s.

use serde_json::json;

use crate::history::History;
use crate::linearizability::{check_register_history, RegisterState, Validity as LinValidity};
use crate::workloads::{CheckResult, Validity};

/// Register workload: linearizability per key (keys start as "0" at
/// version 0, as `workloads::setup` creates them).
pub fn register(h: &History) -> CheckResult {
    let report = check_register_history(h, RegisterState { value: Some(0), version: 0 });
    let valid = match report.valid {
        LinValidity::Valid => Validity::True,
        LinValidity::Invalid => Validity::False,
        LinValidity::Unknown => Validity::Unknown,
    };
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
        valid,
        anomalies,
        stats: json!({
            "ops": report.op_count, "keys": report.key_count, "check_ms": report.elapsed_ms,
            "unknown_keys": report.unknown_keys,
        }),
    }
}
