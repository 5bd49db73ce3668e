//! The recorded history: every operation's invocation and completion, as
//! Jepsen records them.
//!
//! An operation is two entries with the same `process`: an `invoke`, then
//! one completion: `ok` (it happened, with this result), `fail` (it
//! definitely did not happen) or `info` (unknown: it may or may not have
//! happened, e.g. a write whose reply never came). Checkers must treat
//! `info` as "may have taken effect at any time after its invocation, or
//! never". A process that got an `info` is retired and replaced by a fresh
//! one (new process id), as Jepsen does, since its next operation would
//! otherwise be concurrent with the unfinished one.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// One history entry (one line of `history.jsonl`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Op {
    /// Position in the history.
    pub index: usize,
    /// Logical client; unique per client incarnation.
    pub process: u64,
    #[serde(rename = "type")]
    pub ty: OpType,
    /// The function: read, write, cas, acquire, release, incr, ...
    pub f: String,
    /// The key or resource it applies to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Arguments on invoke, results on completion (workload-specific).
    #[serde(default)]
    pub value: serde_json::Value,
    /// Nanoseconds since the test started.
    pub time: u64,
    /// Error text on fail/info.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A complete history, in time order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<Op>,
}

/// An invocation paired with its completion (None: the test ended first,
/// which counts as `info`).
#[derive(Debug, Clone)]
pub struct Pair<'a> {
    pub invoke: &'a Op,
    pub complete: Option<&'a Op>,
}

impl<'a> Pair<'a> {
    /// The completion type; an operation never completed is `Info`.
    pub fn outcome(&self) -> OpType {
        self.complete.map(|c| c.ty).unwrap_or(OpType::Info)
    }
    /// Completion time, or `u64::MAX` for indeterminate operations.
    pub fn end(&self) -> u64 {
        match self.complete {
            Some(c) if c.ty != OpType::Info => c.time,
            _ => u64::MAX,
        }
    }
}

impl History {
    pub fn push(&mut self, mut op: Op) -> usize {
        op.index = self.ops.len();
        self.ops.push(op);
        self.ops.len() - 1
    }

    /// Pairs every invocation with the next entry of the same process.
    pub fn pairs(&self) -> Vec<Pair<'_>> {
        let mut open: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
        let mut out: Vec<Pair<'_>> = Vec::new();
        for op in &self.ops {
            match op.ty {
                OpType::Invoke => {
                    open.insert(op.process, out.len());
                    out.push(Pair { invoke: op, complete: None });
                }
                _ => {
                    if let Some(i) = open.remove(&op.process) {
                        out[i].complete = Some(op);
                    }
                }
            }
        }
        out
    }

    /// Writes one JSON object per line.
    pub fn write_jsonl(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        for op in &self.ops {
            serde_json::to_writer(&mut f, op)?;
            f.write_all(b"\n")?;
        }
        f.flush()
    }

    pub fn read_jsonl(path: &std::path::Path) -> std::io::Result<History> {
        let text = std::fs::read_to_string(path)?;
        let mut h = History::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let op: Op = serde_json::from_str(line).map_err(std::io::Error::other)?;
            h.ops.push(op);
        }
        Ok(h)
    }
}

/// A time interval during which a fault was active (for reports).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultWindow {
    pub kind: String,
    pub detail: String,
    pub start: u64,
    pub end: u64,
}
