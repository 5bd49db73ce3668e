//! `baton txn`: several operations applied atomically (`Client::multi`):
//! all of them, or none.
//!
//! Operations come from the arguments (one each) or from stdin (one per
//! line, blank lines and `#` comments skipped), each parsed like a small
//! command line (shell quoting) by clap: `create`, `set`, `rm`, `check`,
//! `fence`. A refused transaction names the operation that failed (the
//! server reports its index) and changed nothing; an ambiguous one may have
//! been applied whole.

use std::io::BufRead;

use baton_client::{Client, Error, Op, OpResult};
use clap::{Args, Parser};
use serde_json::json;

use crate::node::{parse_fence, CreateFlags};
use crate::output::{stat_json, Encoding, Out};

const OPS_HELP: &str = "\
Operations (quote a value with spaces as in a shell):
  create PATH [DATA] [--ephemeral] [--sequential] [--parents]
  set PATH DATA [--version N]
  rm PATH [--version N]
  check PATH [--version N]    the txn fails unless PATH exists (at version N)
  fence RESOURCE=TOKEN        the txn fails if a higher token was used on RESOURCE
Example:
  baton txn 'check /config --version 3' 'set /config v4' 'create /log/change- v4 --sequential'";

/// Apply several operations atomically: all succeed or none is applied.
#[derive(Args, Debug)]
#[command(after_help = OPS_HELP)]
pub struct Txn {
    /// The operations, one per argument (e.g. 'create /a x' 'rm /b'); none:
    /// read them from stdin, one per line.
    #[arg(value_name = "OP")]
    ops: Vec<String>,
    #[command(flatten)]
    enc: Encoding,
}

/// One operation, as written.
#[derive(Parser, Debug)]
#[command(no_binary_name = true, name = "op")]
enum Line {
    /// Create a node.
    Create {
        /// The node's path (with --sequential, the prefix of its name).
        #[arg(value_parser = crate::parse_path_prefix)]
        path: String,
        /// Its value (default: empty).
        data: Option<String>,
        #[command(flatten)]
        flags: CreateFlags,
    },
    /// Set a node's value.
    Set {
        /// The node's path.
        #[arg(value_parser = crate::parse_path)]
        path: String,
        /// The new value.
        data: String,
        /// Only if the node is at this version.
        #[arg(long)]
        version: Option<i32>,
    },
    /// Delete a node.
    #[command(alias = "delete")]
    Rm {
        /// The node's path.
        #[arg(value_parser = crate::parse_path)]
        path: String,
        /// Only if the node is at this version.
        #[arg(long)]
        version: Option<i32>,
    },
    /// Fail unless a node exists (at a version).
    Check {
        /// The node's path.
        #[arg(value_parser = crate::parse_path)]
        path: String,
        /// Only if the node is at this version.
        #[arg(long)]
        version: Option<i32>,
    },
    /// Fail if a higher fencing token was used on RESOURCE; record TOKEN.
    Fence {
        /// RESOURCE=TOKEN.
        #[arg(value_parser = parse_fence, value_name = "RESOURCE=TOKEN")]
        fence: (String, u64),
    },
}

/// A transaction read and parsed, before any member is dialled: a
/// malformed op is a usage error (exit 2) that sent nothing.
pub struct Prepared {
    lines: Vec<String>,
    ops: Vec<Op>,
}

impl Txn {
    pub fn prepare(&self) -> anyhow::Result<Prepared> {
        let lines = if self.ops.is_empty() { stdin_lines()? } else { self.ops.clone() };
        if lines.is_empty() {
            return Err(crate::usage("txn: no operations (give them as arguments or on stdin)"));
        }
        let ops = lines
            .iter()
            .enumerate()
            .map(|(i, l)| parse(l, &self.enc).map_err(|e| crate::usage(format!("txn op {} `{l}`: {e}", i + 1))))
            .collect::<anyhow::Result<Vec<Op>>>()?;
        Ok(Prepared { lines, ops })
    }
}

impl Prepared {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        let Prepared { lines, ops } = self;
        let results = c.multi(&ops).await.map_err(|e| name_failing(e, &lines))?;
        for (op, r) in ops.iter().zip(results) {
            print_result(op, &r, out);
        }
        Ok(())
    }
}

fn stdin_lines() -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    for l in std::io::stdin().lock().lines() {
        let l = l.map_err(|e| anyhow::anyhow!("reading stdin: {e}"))?;
        let t = l.trim();
        if !t.is_empty() && !t.starts_with('#') {
            lines.push(t.to_string());
        }
    }
    Ok(lines)
}

/// One line as an [`Op`]; DATA decoded as `enc` says.
fn parse(line: &str, enc: &Encoding) -> Result<Op, String> {
    let words = shlex::split(line).ok_or("unbalanced quotes")?;
    let parsed = Line::try_parse_from(words).map_err(|e| {
        let text = e.to_string();
        let lines = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("For more"));
        lines.map(|l| l.strip_prefix("error: ").unwrap_or(l)).collect::<Vec<_>>().join("; ")
    })?;
    let value = |d: String| enc.decode(d.into_bytes()).map(Into::into).map_err(|e| e.to_string());
    Ok(match parsed {
        Line::Create { path, data, flags } => {
            Op::Create { path, data: value(data.unwrap_or_default())?, options: flags.options() }
        }
        Line::Set { path, data, version } => Op::Set { path, data: value(data)?, version },
        Line::Rm { path, version } => Op::Delete { path, version },
        Line::Check { path, version } => Op::Check { path, version },
        Line::Fence { fence: (resource, token) } => Op::CheckFence { resource, token },
    })
}

/// The index of the failing op, from the server's `multi op #I failed`.
fn failing_index(e: &Error) -> Option<usize> {
    let Error::Server { message, .. } = e else { return None };
    message.split("multi op #").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// `e` with the failing operation named, and what was applied. The
/// server counts ops from 0 (`multi op #1`), people from 1: only the
/// second numbering is printed (`txn op 2 of 2 ...: bad version`).
fn name_failing(e: Error, lines: &[String]) -> anyhow::Error {
    let what = match failing_index(&e) {
        Some(i) if i < lines.len() => {
            let what = format!("txn op {} of {} `{}` failed; nothing was applied", i + 1, lines.len(), lines[i]);
            let e = match e {
                Error::Server { kind, message } => {
                    let message = match message.split_once(" failed: ") {
                        Some((head, rest)) if head.starts_with("multi op #") => rest.to_string(),
                        _ => message,
                    };
                    Error::Server { kind, message }
                }
                other => other,
            };
            return anyhow::Error::new(e).context(what);
        }
        _ if e.is_ambiguous() => "txn outcome unknown (all or none of it may have been applied)".to_string(),
        _ => "txn failed; nothing was applied".to_string(),
    };
    anyhow::Error::new(e).context(what)
}

fn print_result(op: &Op, r: &OpResult, out: Out) {
    let stat = r.stat.as_ref().map(stat_json);
    let (json, text) = match op {
        Op::Create { .. } => (json!({"op": "create", "path": r.path, "stat": stat}), format!("created {}", r.path)),
        Op::Set { path, .. } => {
            let version = r.stat.as_ref().map(|s| s.version).unwrap_or_default();
            (json!({"op": "set", "path": path, "stat": stat}), format!("set {path} version {version}"))
        }
        Op::Delete { path, .. } => (json!({"op": "rm", "path": path}), format!("deleted {path}")),
        Op::Check { path, .. } => (json!({"op": "check", "path": path}), format!("checked {path}")),
        Op::CheckFence { resource, token } => {
            (json!({"op": "fence", "resource": resource, "token": token}), format!("fenced {resource} at {token}"))
        }
        other => (json!({"op": format!("{other:?}")}), format!("done {other:?}")),
    };
    out.emit(json, text);
}
