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
//!
//! # Session-state notes
//! Besides operations, the history holds *notes* of every client's session
//! state (`Connected` / `Suspended` / `Expired`), one per change a watcher
//! task saw on `Client::state()`: a lone `info` entry with `f` =
//! [`SESSION_STATE`], under the watcher's own process id (which never
//! invokes anything, so [`History::pairs`] never pairs a note with an
//! operation), and value `{"of": <the worker process using the client>,
//! "role": "main" | "storage" | "observer", "slot": N, "session": <id>,
//! "state": "connected" | "suspended" | "expired"}`. The first note is the
//! state when the client was handed to its worker, recorded before the
//! worker's first operation. A note's time is when the watcher *saw* the
//! change (a little after it happened); [`StateLog`] answers "was this
//! client `Connected` at time t" from the notes.

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

impl Op {
    /// Field `name` of this entry's value as an unsigned integer.
    pub fn u64(&self, name: &str) -> Option<u64> {
        self.value.get(name).and_then(serde_json::Value::as_u64)
    }
}

/// A complete history, in time order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<Op>,
    /// Judge `holder-connected-after-expiry` on one clock only, without
    /// the clock allowance (`crate::holds::clock_allowance`): set for runs
    /// through the ZooKeeper door, whose clients do not keep that margin
    /// in every case (docs/testing.md, "That margin, judged").
    #[serde(default)]
    pub one_clock_only: bool,
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
    /// The operation as an anomaly names it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "process": self.invoke.process, "f": self.invoke.f, "key": self.invoke.key,
            "invoke": self.invoke.value, "outcome": self.outcome(),
            "result": self.complete.map(|c| c.value.clone()), "error": self.complete.and_then(|c| c.error.clone()),
            "time_s": self.invoke.time as f64 / 1e9, "index": self.invoke.index,
        })
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

    /// The session-state notes of clients in `role`, keyed by the worker
    /// process that used the client (see the module doc).
    pub fn session_states(&self, role: &str) -> std::collections::HashMap<u64, StateLog> {
        let mut out: std::collections::HashMap<u64, StateLog> = std::collections::HashMap::new();
        for op in self.ops.iter().filter(|o| o.f == SESSION_STATE && o.ty != OpType::Invoke) {
            let v = &op.value;
            if v.get("role").and_then(|r| r.as_str()) != Some(role) {
                continue;
            }
            let (Some(of), Some(state)) =
                (v.get("of").and_then(|x| x.as_u64()), v.get("state").and_then(|x| x.as_str()))
            else {
                continue;
            };
            let log = out.entry(of).or_default();
            if let Some(sid) = v.get("session").and_then(|x| x.as_u64()) {
                log.session = sid;
            }
            log.changes.push((op.time, state.to_string()));
        }
        for log in out.values_mut() {
            log.changes.sort_by_key(|(t, _)| *t);
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

/// `f` of a session-state note (see the module doc).
pub const SESSION_STATE: &str = "session-state";

/// The `role` of a session-state note: which of a worker's clients it is
/// about.
pub mod role {
    /// The client a worker takes its locks, leadership or nodes with.
    pub const MAIN: &str = "main";
    /// The lock worker's second session, which writes the fenced counter as
    /// an external resource would.
    pub const STORAGE: &str = "storage";
    /// The election observer's client.
    pub const OBSERVER: &str = "observer";
}

/// One client's recorded session states, in time order.
#[derive(Debug, Clone, Default)]
pub struct StateLog {
    /// The session id (0 if no note carried one).
    pub session: u64,
    /// (time ns, state) as recorded: "connected", "suspended", "expired".
    pub changes: Vec<(u64, String)>,
}

impl StateLog {
    /// The recorded state at `t`: the last note at or before `t` (None
    /// before the first note).
    pub fn state_at(&self, t: u64) -> Option<&str> {
        let i = self.changes.partition_point(|(at, _)| *at <= t);
        i.checked_sub(1).map(|i| self.changes[i].1.as_str())
    }

    /// The first time in `[from, to)` at which the client was recorded
    /// `Connected`: `from` itself if the last note before it says so, else
    /// the first note to `Connected` inside the interval.
    pub fn connected_within(&self, from: u64, to: u64) -> Option<u64> {
        if from >= to {
            return None;
        }
        if self.state_at(from) == Some("connected") {
            return Some(from);
        }
        self.changes.iter().find(|(at, s)| *at > from && *at < to && s == "connected").map(|(at, _)| *at)
    }

    /// When the client last stopped being `Connected` at or before `t`, or
    /// (if it was still `Connected` at `t`) the next note after `t`, capped
    /// at `to`. None if it was never recorded `Connected` by `t`.
    pub fn connected_end(&self, t: u64, to: u64) -> Option<u64> {
        let i = self.changes.partition_point(|(at, _)| *at <= t);
        if i == 0 {
            return None;
        }
        if self.changes[i - 1].1 == "connected" {
            return Some(self.changes.get(i).map(|(at, _)| *at).unwrap_or(to).min(to));
        }
        // Walk back to the note that ended the last Connected stretch.
        (1..i).rev().find(|j| self.changes[j - 1].1 == "connected").map(|j| self.changes[j].0)
    }

    /// The notes in `[from, to]` (for reports).
    pub fn between(&self, from: u64, to: u64) -> Vec<(u64, String)> {
        self.changes.iter().filter(|(at, _)| *at >= from && *at <= to).cloned().collect()
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
