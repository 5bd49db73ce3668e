//! What a checker concludes: a [`Validity`] and, for `results.json`, a
//! [`CheckResult`] with the anomalies found and figures worth reporting.

use serde::Serialize;
use serde_json::Value;

/// A verdict, for one checker, one object or a whole run. Serializes as
/// `"true"`, `"false"` or `"unknown"` (the `valid` fields of
/// `results.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Validity {
    #[serde(rename = "true")]
    Valid,
    #[serde(rename = "false")]
    Invalid,
    /// The checker could not decide: a search exceeded its budget, input
    /// could not be used, or a final reading is missing.
    #[serde(rename = "unknown")]
    Unknown,
}

impl Validity {
    /// Both verdicts together: Invalid dominates Unknown, which dominates
    /// Valid.
    pub fn and(self, other: Validity) -> Validity {
        use Validity::*;
        match (self, other) {
            (Invalid, _) | (_, Invalid) => Invalid,
            (Unknown, _) | (_, Unknown) => Unknown,
            _ => Valid,
        }
    }

    /// Valid with no anomalies, else Invalid.
    pub fn of(anomalies: &[Value]) -> Validity {
        if anomalies.is_empty() {
            Validity::Valid
        } else {
            Validity::Invalid
        }
    }

    /// As printed after `valid:` and written into `results.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Validity::Valid => "true",
            Validity::Invalid => "false",
            Validity::Unknown => "unknown",
        }
    }
}

/// One checker's result for `results.json`.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub checker: String,
    pub valid: Validity,
    /// Named anomalies (`{"anomaly": name, ...}`) with the operations
    /// involved.
    pub anomalies: Vec<Value>,
    /// Figures worth reporting (counts, rates).
    pub stats: Value,
}
