//! Golden-script tests for the deterministic state machine (`src/state/mod.rs`).
//!
//! Every `tests/golden/<name>.script` is run against a fresh
//! [`StateMachine`] and the transcript it produces is compared with
//! `tests/golden/<name>.out`. With `BATON_BLESS=1` the `.out` files are
//! (re)written instead; review them by eye before committing.
//!
//! # Script language
//!
//! One command per line. Blank lines and `#` comments are copied to the
//! transcript as they are; every command is echoed as `> <command>` and
//! followed by its result lines.
//!
//! Each write-type command is one log entry at the next index (starting at
//! 1), with `time_ms = 1000 * index`:
//!
//! - `session <timeout_ms> [as <name>]`: a `NewSession` (secret `s`); the
//!   session id is the entry index. Wherever a `<sid>` is expected, a name
//!   bound with `as` may stand for it.
//! - `create <sid> [-e] [-s] [-p] <path> [data]`
//! - `set <sid> <path> <data> [v=<n>]`
//! - `delete <sid> <path> [v=<n>]`
//! - `multi <sid> <op> ; <op> ; ...` where an op is `create [-e] [-s] [-p]
//!   <path> [data]`, `set <path> <data> [v=<n>]`, `delete <path> [v=<n>]`,
//!   `check <path> [v=<n>]` or `fence <resource> <token>`.
//! - `close <sid>`: a `CloseSession` write.
//! - `expire <sid> [<sid>...]`: an `ExpireSessions` entry.
//! - `noop`: an entry that carries no command (a new leader's empty entry,
//!   a configuration change): `StateMachine::skip`.
//! - `repeat <n> <command>`: runs a command `n` times; only the last run's
//!   output is kept.
//!
//! Client writes (`create`, `set`, `delete`, `multi`, `close`) take optional
//! `seq=<n>` and `acked=<n>` tokens. By default each session's `seq` counts
//! up from 1 and `acked_below = seq` (every earlier write was answered). An
//! explicit `seq=<n>` (a retry) leaves the counter alone unless `n` is past
//! it, and defaults `acked_below` to the last value sent for that session;
//! `seq=last` retries the session's latest automatically numbered write.
//! After `seqs on` every client write first prints the `seq=<n>
//! acked_below=<n>` it carried (`seqs off` stops that).
//!
//! Reads and checks (no log entry): `get <path>`, `ls <path>`,
//! `exists <path>`, `dump`, and
//! - `restart`: flush into the member's `MemKv` and continue with
//!   `StateMachine::load` of it;
//! - `snapshot`: `snapshot()` then `restore()` into a fresh machine and
//!   continue with that one.
//!
//! Both report whether the dump, the snapshot bytes (which include sequence
//! counters and cached replies) and the applied index are unchanged. The
//! machine is flushed into its `MemKv` after every entry (the Raft driver
//! flushes once per batch of entries), so `restart` also checks the
//! incremental dirty tracking across many flushes.
//!
//! The token `""` stands for an empty string (path or data).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use baton_proto::{
    client_write, command, op, response, CheckFenceOp, CheckOp, ClientWrite, CloseSessionReq, Command, CreateOp,
    DeleteOp, ErrorCode, ExpireSessions, MultiOp, NewSession, Op, Response, SetOp, Stat,
};
use baton_server::kv::{Batch, Kv, MemKv};
use baton_server::state::{Applied, Change, StateMachine};
use bytes::Bytes;

const SECRET: &[u8] = b"s";

/// Per-session client-side counters for the exactly-once fields.
#[derive(Default, Clone, Copy)]
struct Seqs {
    /// Last seq used by an automatic write (0 = none yet).
    last: u64,
    /// Last `acked_below` sent.
    acked: u64,
}

struct Runner {
    sm: StateMachine,
    kv: MemKv,
    next_index: u64,
    seqs: HashMap<u64, Seqs>,
    names: HashMap<String, u64>,
    show_seqs: bool,
    out: Vec<String>,
}

impl Runner {
    fn new() -> Self {
        Runner {
            sm: StateMachine::new(),
            kv: MemKv::default(),
            next_index: 1,
            seqs: HashMap::new(),
            names: HashMap::new(),
            show_seqs: false,
            out: Vec::new(),
        }
    }

    fn line(&mut self, s: impl Into<String>) {
        self.out.push(s.into());
    }

    fn run_script(&mut self, text: &str) -> Result<(), String> {
        for (no, raw) in text.lines().enumerate() {
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                self.line(raw.trim_end());
                continue;
            }
            self.line(format!("> {trimmed}"));
            self.run_command(trimmed).map_err(|e| format!("line {}: {e}: {trimmed}", no + 1))?;
        }
        Ok(())
    }

    fn run_command(&mut self, line: &str) -> Result<(), String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (cmd, args) = words.split_first().ok_or("empty command")?;
        match *cmd {
            "session" => {
                let (timeout, name) = match args {
                    [t] => (t, None),
                    [t, "as", name] if name.parse::<u64>().is_err() => (t, Some(name)),
                    _ => return Err("usage: session <timeout_ms> [as <name>]".into()),
                };
                let timeout_ms = parse_num(timeout)?;
                if let Some(name) = name {
                    if self.names.insert(name.to_string(), self.next_index).is_some() {
                        return Err(format!("session name {name} is already bound"));
                    }
                }
                self.apply(command::Body::NewSession(NewSession { timeout_ms, secret: Bytes::from_static(SECRET) }));
            }
            "expire" => {
                if args.is_empty() {
                    return Err("usage: expire <sid> [<sid>...]".into());
                }
                let session_ids = args.iter().map(|a| self.sid(a)).collect::<Result<_, _>>()?;
                self.apply(command::Body::Expire(ExpireSessions { session_ids }));
            }
            "noop" => {
                if !args.is_empty() {
                    return Err("usage: noop".into());
                }
                let index = self.next_index;
                self.next_index += 1;
                self.sm.skip(index);
                self.flush()?;
                self.line(format!("skipped {index}, applied={}", self.sm.applied()));
            }
            "create" | "set" | "delete" | "multi" | "close" => self.client_write(cmd, args)?,
            "repeat" => {
                let (n, rest) = args.split_first().ok_or("usage: repeat <n> <command>")?;
                let n: u64 = parse_num(n)?;
                if n == 0 || rest.is_empty() {
                    return Err("usage: repeat <n> <command>".into());
                }
                let inner = rest.join(" ");
                for i in 0..n {
                    let mark = self.out.len();
                    self.run_command(&inner)?;
                    if i + 1 < n {
                        self.out.truncate(mark);
                    }
                }
            }
            "get" => {
                let path = one_path(args)?;
                match self.sm.get(path) {
                    Ok((data, stat)) => {
                        self.line(format!("data={:?}", String::from_utf8_lossy(&data)));
                        self.line(format!("  {}", fmt_stat(&stat)));
                    }
                    Err(e) => self.line(fmt_op_error(&e)),
                }
            }
            "exists" => {
                let path = one_path(args)?;
                match self.sm.exists(path) {
                    Ok(Some(stat)) => {
                        self.line("exists");
                        self.line(format!("  {}", fmt_stat(&stat)));
                    }
                    Ok(None) => self.line("does not exist"),
                    Err(e) => self.line(fmt_op_error(&e)),
                }
            }
            "ls" => {
                let path = one_path(args)?;
                match self.sm.children(path) {
                    Ok((children, stat)) => {
                        self.line(format!("children [{}]", children.join(", ")));
                        self.line(format!("  {}", fmt_stat(&stat)));
                    }
                    Err(e) => self.line(fmt_op_error(&e)),
                }
            }
            "seqs" => {
                self.show_seqs = match args {
                    ["on"] => true,
                    ["off"] => false,
                    _ => return Err("usage: seqs on|off".into()),
                };
            }
            "dump" => {
                if !args.is_empty() {
                    return Err("usage: dump".into());
                }
                let dump = self.sm.dump();
                for l in dump.lines() {
                    self.line(format!("  {l}"));
                }
            }
            "restart" => {
                if !args.is_empty() {
                    return Err("usage: restart".into());
                }
                let before = Image::of(&self.sm);
                self.flush()?;
                self.sm = StateMachine::load(&self.kv).map_err(|e| format!("load failed: {e}"))?;
                self.report_image("restarted", &before);
            }
            "snapshot" => {
                if !args.is_empty() {
                    return Err("usage: snapshot".into());
                }
                let before = Image::of(&self.sm);
                let mut fresh = StateMachine::new();
                fresh.restore(&before.snapshot).map_err(|e| format!("restore failed: {e}"))?;
                self.sm = fresh;
                // An installed snapshot replaces the stored state too.
                self.flush()?;
                self.report_image("snapshot restored", &before);
            }
            other => return Err(format!("unknown command {other:?}")),
        }
        Ok(())
    }

    /// A session id, by number or by the name bound with `session ... as`.
    fn sid(&self, token: &str) -> Result<u64, String> {
        match token.parse() {
            Ok(id) => Ok(id),
            Err(_) => self.names.get(token).copied().ok_or_else(|| format!("unknown session {token:?}")),
        }
    }

    /// `create`, `set`, `delete`, `multi`, `close`: one `ClientWrite`.
    fn client_write(&mut self, cmd: &str, args: &[&str]) -> Result<(), String> {
        let mut seq = None;
        let mut retry_last = false;
        let mut acked = None;
        let mut rest = Vec::new();
        for a in args {
            if *a == "seq=last" {
                retry_last = true;
            } else if let Some(v) = a.strip_prefix("seq=") {
                seq = Some(parse_num(v)?);
            } else if let Some(v) = a.strip_prefix("acked=") {
                acked = Some(parse_num(v)?);
            } else {
                rest.push(*a);
            }
        }
        let (sid, rest) = rest.split_first().ok_or("missing session id")?;
        let session_id = self.sid(sid)?;
        let write_op = match cmd {
            "close" => {
                if !rest.is_empty() {
                    return Err("usage: close <sid>".into());
                }
                client_write::Op::CloseSession(CloseSessionReq {})
            }
            "multi" => {
                let joined = rest.join(" ");
                let mut ops = Vec::new();
                for part in joined.split(';').filter(|_| !joined.trim().is_empty()) {
                    let words: Vec<&str> = part.split_whitespace().collect();
                    ops.push(Op { op: Some(parse_op(&words)?) });
                }
                client_write::Op::Multi(MultiOp { ops })
            }
            _ => {
                let mut words = vec![cmd];
                words.extend_from_slice(rest);
                match parse_op(&words)? {
                    op::Op::Create(c) => client_write::Op::Create(c),
                    op::Op::Set(s) => client_write::Op::Set(s),
                    op::Op::Delete(d) => client_write::Op::Delete(d),
                    _ => return Err("check and fence are only valid inside multi".into()),
                }
            }
        };
        let counters = self.seqs.entry(session_id).or_default();
        if retry_last {
            if counters.last == 0 || seq.is_some() {
                return Err("seq=last needs an earlier write and no other seq=".into());
            }
            seq = Some(counters.last);
        }
        let (seq, acked_below) = match seq {
            None => {
                counters.last += 1;
                (counters.last, acked.unwrap_or(counters.last))
            }
            Some(s) => {
                counters.last = counters.last.max(s);
                (s, acked.unwrap_or(counters.acked))
            }
        };
        counters.acked = acked_below;
        if self.show_seqs {
            self.line(format!("seq={seq} acked_below={acked_below}"));
        }
        self.apply(command::Body::Write(ClientWrite {
            session_id,
            seq,
            acked_below,
            secret: Bytes::from_static(SECRET),
            // Golden scripts run without ACLs (acl.rs has its own tests).
            identities: Vec::new(),
            superuser: false,
            epoch: 0,
            op: Some(write_op),
        }));
        Ok(())
    }

    /// Applies one entry at the next index, flushes, prints the outcome.
    fn apply(&mut self, body: command::Body) {
        let index = self.next_index;
        self.next_index += 1;
        let cmd = Command { origin: 1, request_id: index, time_ms: 1000 * index as i64, body: Some(body) };
        let applied = self.sm.apply(index, &cmd);
        if let Err(e) = self.flush() {
            self.line(format!("FLUSH FAILED: {e}"));
        }
        self.print_applied(index, &applied);
    }

    fn flush(&mut self) -> Result<(), String> {
        let mut batch = Batch::default();
        self.sm.flush(&mut batch);
        self.kv.write(batch, true).map_err(|e| e.to_string())
    }

    fn print_applied(&mut self, index: u64, a: &Applied) {
        match &a.reply {
            Some(r) => {
                let lines = fmt_response(r);
                self.out.extend(lines);
            }
            None => self.line(format!("applied at {index} (no reply)")),
        }
        for c in &a.changes {
            let (kind, path) = match c {
                Change::Created(p) => ("Created", p),
                Change::Deleted(p) => ("Deleted", p),
                Change::DataChanged(p) => ("DataChanged", p),
                Change::ChildrenChanged(p) => ("ChildrenChanged", p),
            };
            self.line(format!("  change {kind} {path}"));
        }
        if !a.ended_sessions.is_empty() {
            self.line(format!("  ended sessions {:?}", a.ended_sessions));
        }
    }

    fn report_image(&mut self, what: &str, before: &Image) {
        let after = Image::of(&self.sm);
        let mut diffs = Vec::new();
        if after.applied != before.applied {
            diffs.push(format!("applied {} -> {}", before.applied, after.applied));
        }
        if after.dump != before.dump {
            diffs.push("dump differs".to_string());
        }
        if after.snapshot != before.snapshot {
            diffs.push("snapshot bytes differ".to_string());
        }
        if diffs.is_empty() {
            self.line(format!("{what}: applied={}, state identical", after.applied));
        } else {
            self.line(format!("{what}: applied={}, STATE DIFFERS: {}", after.applied, diffs.join("; ")));
            if after.dump != before.dump {
                self.line("  dump before:");
                for l in before.dump.lines() {
                    self.line(format!("    {l}"));
                }
                self.line("  dump after:");
                for l in after.dump.lines() {
                    self.line(format!("    {l}"));
                }
            }
        }
    }
}

/// Everything `restart` and `snapshot` must preserve.
struct Image {
    applied: u64,
    dump: String,
    snapshot: Vec<u8>,
}

impl Image {
    fn of(sm: &StateMachine) -> Self {
        Image { applied: sm.applied(), dump: sm.dump(), snapshot: sm.snapshot() }
    }
}

fn parse_num<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("bad number {s:?}"))
}

fn unquote(s: &str) -> &str {
    if s == "\"\"" {
        ""
    } else {
        s
    }
}

fn one_path<'a>(args: &[&'a str]) -> Result<&'a str, String> {
    match args {
        [p] => Ok(unquote(p)),
        _ => Err("expected exactly one path".into()),
    }
}

/// Parses `create|set|delete|check|fence ...` into an op.
fn parse_op(words: &[&str]) -> Result<op::Op, String> {
    let (name, args) = words.split_first().ok_or("empty op")?;
    let mut version = None;
    let mut flags = (false, false, false);
    let mut pos = Vec::new();
    for a in args {
        if let Some(v) = a.strip_prefix("v=") {
            version = Some(parse_num::<i32>(v)?);
        } else if pos.is_empty() && a.starts_with('-') && a.len() == 2 {
            match *a {
                "-e" => flags.0 = true,
                "-s" => flags.1 = true,
                "-p" => flags.2 = true,
                _ => return Err(format!("unknown flag {a}")),
            }
        } else {
            pos.push(unquote(a));
        }
    }
    let flagged = flags != (false, false, false);
    if flagged && *name != "create" {
        return Err(format!("{name} takes no flags"));
    }
    if version.is_some() && (*name == "create" || *name == "fence") {
        return Err(format!("{name} takes no version"));
    }
    let data = |d: Option<&&str>| Bytes::from(d.map(|s| s.as_bytes().to_vec()).unwrap_or_default());
    Ok(match (*name, pos.as_slice()) {
        ("create", [path, rest @ ..]) if rest.len() <= 1 => op::Op::Create(CreateOp {
            path: path.to_string(),
            data: data(rest.first()),
            ephemeral: flags.0,
            sequential: flags.1,
            parents: flags.2,
            ..Default::default()
        }),
        ("set", [path, d]) => op::Op::Set(SetOp { path: path.to_string(), data: data(Some(d)), version }),
        ("delete", [path]) => op::Op::Delete(DeleteOp { path: path.to_string(), version }),
        ("check", [path]) => op::Op::Check(CheckOp { path: path.to_string(), version }),
        ("fence", [resource, token]) => {
            op::Op::CheckFence(CheckFenceOp { resource: resource.to_string(), token: parse_num(token)? })
        }
        _ => return Err(format!("bad op {:?}", words.join(" "))),
    })
}

fn code_name(code: i32) -> String {
    match ErrorCode::try_from(code) {
        Ok(c) => c.as_str_name().to_string(),
        Err(_) => format!("UNKNOWN({code})"),
    }
}

fn fmt_op_error((code, msg): &(ErrorCode, String)) -> String {
    format!("error {}: {msg}", code.as_str_name())
}

fn fmt_stat(s: &Stat) -> String {
    format!(
        "stat czxid={} mzxid={} pzxid={} ctime={} mtime={} version={} cversion={} ephemeral_owner={} data_length={} num_children={}",
        s.czxid,
        s.mzxid,
        s.pzxid,
        s.ctime,
        s.mtime,
        s.version,
        s.cversion,
        s.ephemeral_owner,
        s.data_length,
        s.num_children
    )
}

fn fmt_response(r: &Response) -> Vec<String> {
    let mut lines = Vec::new();
    let mut head = if r.error == 0 {
        format!("ok zxid={}", r.zxid)
    } else {
        format!("error {}: {} (zxid={})", code_name(r.error), r.message, r.zxid)
    };
    if r.error == 0 && !r.message.is_empty() {
        let _ = write!(head, " message={:?}", r.message);
    }
    let mut stat = None;
    match &r.body {
        None => {}
        Some(response::Body::Empty(_)) => {}
        Some(response::Body::CreateSession(cs)) => {
            let _ = write!(
                head,
                " session={} timeout_ms={} secret={:?}",
                cs.session_id,
                cs.timeout_ms,
                String::from_utf8_lossy(&cs.secret)
            );
        }
        Some(response::Body::Create(c)) => {
            let _ = write!(head, " path={}", c.path);
            stat = c.stat;
        }
        Some(response::Body::Set(s)) => stat = s.stat,
        Some(response::Body::Multi(m)) => {
            lines.push(head);
            for (i, res) in m.results.iter().enumerate() {
                let mut l = if res.error == 0 {
                    format!("  result[{i}] ok")
                } else {
                    format!("  result[{i}] error {}", code_name(res.error))
                };
                if !res.path.is_empty() {
                    let _ = write!(l, " path={}", res.path);
                }
                lines.push(l);
                if let Some(s) = &res.stat {
                    lines.push(format!("    {}", fmt_stat(s)));
                }
            }
            return lines;
        }
        Some(other) => {
            let _ = write!(head, " unexpected body {other:?}");
        }
    }
    lines.push(head);
    if let Some(s) = stat {
        lines.push(format!("  {}", fmt_stat(&s)));
    }
    lines
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden")
}

/// Where `expected` and `actual` first differ, for a readable failure.
fn describe_diff(name: &str, expected: &str, actual: &str) -> String {
    let exp: Vec<&str> = expected.lines().collect();
    let act: Vec<&str> = actual.lines().collect();
    let first = exp.iter().zip(&act).position(|(e, a)| e != a).unwrap_or(exp.len().min(act.len()));
    let mut msg = format!(
        "{name}: output differs from {name}.out at line {} (expected {} lines, got {})\n",
        first + 1,
        exp.len(),
        act.len()
    );
    for (i, l) in act.iter().enumerate().take(first).skip(first.saturating_sub(3)) {
        let _ = writeln!(msg, "   {:>4} | {l}", i + 1);
    }
    let _ = writeln!(msg, "  expected: {}", exp.get(first).copied().unwrap_or("<end of file>"));
    let _ = writeln!(msg, "  actual:   {}", act.get(first).copied().unwrap_or("<end of output>"));
    if expected.lines().eq(actual.lines()) {
        let _ = writeln!(msg, "  (lines are equal; trailing newline differs)");
    }
    msg
}

#[test]
fn golden_scripts() {
    let dir = golden_dir();
    let bless = std::env::var("BATON_BLESS").is_ok_and(|v| v == "1");
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "script"))
        .collect();
    scripts.sort();
    assert!(!scripts.is_empty(), "no *.script files in {}", dir.display());

    let mut failures = Vec::new();
    for script in &scripts {
        let name = script.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let text = match std::fs::read_to_string(script) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: cannot read script: {e}"));
                continue;
            }
        };
        let mut runner = Runner::new();
        if let Err(e) = runner.run_script(&text) {
            failures.push(format!("{name}.script: {e}"));
            continue;
        }
        let mut actual = runner.out.join("\n");
        actual.push('\n');
        let out_path = script.with_extension("out");
        if bless {
            if let Err(e) = std::fs::write(&out_path, &actual) {
                failures.push(format!("{name}: cannot write {}: {e}", out_path.display()));
            } else {
                eprintln!("blessed {}", out_path.display());
            }
            continue;
        }
        match std::fs::read_to_string(&out_path) {
            Ok(expected) if expected == actual => eprintln!("ok {name}"),
            Ok(expected) => failures.push(describe_diff(&name, &expected, &actual)),
            Err(e) => failures
                .push(format!("{name}: cannot read {} ({e}); run with BATON_BLESS=1 to create it", out_path.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} golden scripts failed (rerun with BATON_BLESS=1 to accept new output, then review the diff):\n{}",
        failures.len(),
        scripts.len(),
        failures.join("\n")
    );
}
