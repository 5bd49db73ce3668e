//! `baton`: the command-line client for a Baton cluster.
//!
//! # Layout
//! One module per command group, each holding its commands' arguments,
//! parsing and execution together (mini-redis's `cmd/`):
//! - this file: the global flags, the [`Cmd`] enum, dispatch and exit codes.
//! - `conn`: endpoints, TLS, authentication, timeouts, connecting, and the
//!   "no member answered" diagnosis.
//! - `node`: create, get, set, rm, ls, stat, and how values are read.
//! - `txn`: several operations applied atomically (`Client::multi`).
//! - `lock`: `lock` (mutex, read-write lock, semaphore); `elect` and
//!   `leader` in `elect`; the supervised child process in `supervise`.
//! - `admin`: status, health, member, snapshot.
//! - `acl`: node ACLs and password users.
//! - `watch`: printing changes (kept as it is until server-side changes).
//! - `output`: JSON and text formatting, value encodings.
//! - `signal`: SIGINT and SIGTERM, handled alike wherever a command blocks.
//!
//! # Exit codes
//! Every failure maps to one code ([`exit_code`]); the table is printed by
//! `baton --help` ([`EXIT_CODES`]) and in docs/cli.md. An error is printed
//! once, by [`main`], with its causes.

mod acl;
mod admin;
mod conn;
mod elect;
mod holder;
mod lock;
mod node;
mod output;
mod signal;
mod supervise;
mod txn;
mod watch;

use std::time::Duration;

use baton_client::{Client, Error};
use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::conn::{Conn, ConnFlags};
use crate::output::Out;

/// Success.
pub const EXIT_OK: i32 = 0;
/// Any other error: refused by the cluster (node exists, bad version, not
/// authorized, fence rejected, ...), a local I/O error.
pub const EXIT_OTHER: i32 = 1;
/// Usage error (clap's code): bad flags or arguments, a malformed endpoint
/// or path (ours, the client's `Invalid` or the server's `INVALID_PATH`), an
/// undecodable --hex/--base64 value.
pub const EXIT_USAGE: i32 = 2;
/// A write was sent and no answer came in time: it may have been applied.
pub const EXIT_AMBIGUOUS: i32 = 3;
/// The node does not exist (`NO_NODE`).
pub const EXIT_NOT_FOUND: i32 = 4;
/// No member answered, or the cluster could not serve in time (nothing
/// was applied).
pub const EXIT_UNAVAILABLE: i32 = 5;
/// `baton leader NAME`: the election has no leader.
pub const EXIT_NO_LEADER: i32 = 6;
/// `lock --nonblock` / `--timeout`: the lock was not acquired (like
/// `flock -n`); the command did not run.
pub const EXIT_NOT_ACQUIRED: i32 = 7;
/// The lock or leadership was lost while the command ran (EX_TEMPFAIL).
pub const EXIT_LOST: i32 = 75;

/// The exit code table, as `baton --help` shows it.
const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    other error: refused by the cluster (node exists, bad version, not authorized, ...)
  2    usage error: bad flags or arguments, malformed endpoint or path, bad --hex/--base64 value
  3    ambiguous: a write was sent and no answer came; it may have been applied
  4    not found: the node does not exist
  5    unavailable: no member answered, or the cluster could not serve in time (not applied)
  6    no leader: the election `baton leader NAME` asked about has none
  7    lock not acquired (lock --nonblock or --timeout); the command did not run
  75   lock or leadership lost while the command ran (lock, elect)
  130  interrupted by SIGINT (143: SIGTERM) while waiting
`lock` and `elect` otherwise exit with the command's own code (128+N if a signal N ended it).";

#[derive(Parser, Debug)]
#[command(name = "baton", version, about = "Command-line client for a Baton cluster", after_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    conn: ConnFlags,
    /// Print results as JSON, one object per line (refused by `lock` and
    /// `elect`, whose standard output is the command's).
    #[arg(long, global = true, help_heading = "Global options")]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    #[command(flatten)]
    Session(SessionCmd),
    Status(admin::Status),
    Health(admin::Health),
    /// The cluster's members: list, add, remove, promote, move-leader, replace.
    #[command(subcommand)]
    Member(admin::MemberCmd),
    /// Backups: `snapshot save FILE` (restore with `batond restore`).
    #[command(subcommand)]
    Snapshot(admin::SnapshotCmd),
    Lock(lock::Lock),
    Elect(elect::Elect),
    Leader(elect::Leader),
}

/// The node commands: `get`, `ls` and `stat` read without a session (no
/// Raft write; `--stale` works without a quorum), the others run on one
/// session with the default timeout.
#[derive(Subcommand, Debug)]
enum SessionCmd {
    Create(node::Create),
    Get(node::Get),
    Set(node::Set),
    Rm(node::Rm),
    Ls(node::Ls),
    Stat(node::Stat),
    Txn(txn::Txn),
    Watch(watch::Watch),
    /// Read or change a node's ACL.
    #[command(subcommand)]
    Acl(acl::AclCmd),
    /// Password users (superusers only) and this client's identities.
    #[command(subcommand)]
    Auth(acl::AuthCmd),
    /// Fences: `fence reset NAME` (superusers only).
    #[command(subcommand)]
    Fence(acl::FenceCmd),
    /// The cluster-wide settings: `settings get`, `settings set`
    /// (superusers only).
    #[command(subcommand)]
    Settings(acl::SettingsCmd),
}

impl SessionCmd {
    async fn run(self, conn: &Conn, out: Out) -> anyhow::Result<()> {
        match self {
            SessionCmd::Get(x) => conn.read(x.stale(), x.run(&conn.reader()?, out)).await,
            SessionCmd::Ls(x) => conn.read(x.stale(), x.run(&conn.reader()?, out)).await,
            SessionCmd::Stat(x) => conn.read(x.stale(), x.run(&conn.reader()?, out)).await,
            cmd => conn.session(None, async |c| cmd.run_on(c, out).await).await,
        }
    }

    async fn run_on(self, c: &Client, out: Out) -> anyhow::Result<()> {
        match self {
            SessionCmd::Get(_) | SessionCmd::Ls(_) | SessionCmd::Stat(_) | SessionCmd::Txn(_) => {
                unreachable!("get, ls and stat are run by SessionCmd::run, txn by run")
            }
            SessionCmd::Create(x) => x.run(c, out).await,
            SessionCmd::Set(x) => x.run(c, out).await,
            SessionCmd::Rm(x) => x.run(c, out).await,
            SessionCmd::Watch(x) => x.run(c, out).await,
            SessionCmd::Acl(x) => x.run(c, out).await,
            SessionCmd::Auth(x) => x.run(c, out).await,
            SessionCmd::Fence(x) => x.run(c, out).await,
            SessionCmd::Settings(x) => x.run(c, out).await,
        }
    }
}

/// Errors of the CLI itself (the client library's are [`baton_client::Error`]).
#[derive(Debug)]
pub enum Fail {
    /// A usage error found after parsing (exit 2).
    Usage(String),
    /// `lock --nonblock` or `--timeout` gave up (exit 7).
    NotAcquired(String),
    /// `leader NAME`: no leader (exit 6).
    NoLeader(String),
    /// The cluster could not be reached or could not serve: what failed,
    /// then every endpoint and why (exit 5).
    Unavailable { summary: String, endpoints: Vec<(String, String)> },
    /// SIGINT or SIGTERM while waiting (exit 128 + the signal).
    Interrupted { what: String, signal: i32 },
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Usage(m) | Fail::NotAcquired(m) | Fail::NoLeader(m) => f.write_str(m),
            Fail::Unavailable { summary, endpoints } => {
                write!(f, "{summary}")?;
                for (endpoint, why) in endpoints {
                    write!(f, "\n  {endpoint}: {why}")?;
                }
                Ok(())
            }
            Fail::Interrupted { what, signal } => {
                write!(f, "interrupted by {} {what}", signal::name(*signal))
            }
        }
    }
}

impl std::error::Error for Fail {}

/// The exit code for an error, from its most specific cause.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    if let Some(f) = e.downcast_ref::<Fail>() {
        return match f {
            Fail::Usage(_) => EXIT_USAGE,
            Fail::NotAcquired(_) => EXIT_NOT_ACQUIRED,
            Fail::NoLeader(_) => EXIT_NO_LEADER,
            Fail::Unavailable { .. } => EXIT_UNAVAILABLE,
            Fail::Interrupted { signal, .. } => 128 + signal,
        };
    }
    match e.downcast_ref::<Error>() {
        Some(err) if err.is_ambiguous() => EXIT_AMBIGUOUS,
        Some(Error::Unavailable(_)) => EXIT_UNAVAILABLE,
        Some(Error::Invalid(_)) => EXIT_USAGE,
        Some(err) if err.kind() == baton_client::ErrorKind::InvalidPath => EXIT_USAGE,
        Some(err) if err.is_no_node() => EXIT_NOT_FOUND,
        _ => EXIT_OTHER,
    }
}

/// A usage error for `anyhow` (exit 2).
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    Fail::Usage(msg.into()).into()
}

/// A node's path, checked before anything is sent (a usage error, exit 2:
/// absolute, no empty or `.`/`..` part, no trailing `/`).
pub fn parse_path(s: &str) -> Result<String, String> {
    baton_proto::validate_path(s)?;
    Ok(s.to_string())
}

/// A sequential create's path: like [`parse_path`], but it may end in
/// `/` (the server appends the counter to it).
pub fn parse_path_prefix(s: &str) -> Result<String, String> {
    match s.strip_suffix('/') {
        Some(dir) if !dir.is_empty() => baton_proto::validate_path(&format!("{dir}/0"))?,
        _ => baton_proto::validate_path(s)?,
    }
    Ok(s.to_string())
}

/// `500ms`, `2s`, `1.5m`, `1h` (a bare number is seconds), to the nearest
/// nanosecond (`0.3s` is 300ms, not 299.999999ms).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?} (e.g. 500ms, 2s, 1m)"))?;
    let unit_nanos = match unit {
        "ms" => 1e6,
        "" | "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    let nanos = (n * unit_nanos).round();
    if !nanos.is_finite() || nanos < 0.0 || nanos > u64::MAX as f64 {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// A duration for people: to the millisecond (`10s`, `300ms`, `1.5s`).
pub fn human(d: Duration) -> String {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    format!("{:?}", Duration::from_millis(ms))
}

fn main() {
    // `baton __hold ...`: the keeper of a `lock`/`elect` command
    // (holder.rs), before any runtime or argument parsing.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(holder::ARG) {
        holder::main(&args[2..]);
    }
    cli_main();
}

#[tokio::main]
async fn cli_main() {
    // Like other command-line tools: `baton ls -R / | head` ends quietly
    // when `head` exits, instead of panicking on a broken pipe.
    // SAFETY: called before any thread writes to a pipe; SIG_DFL is valid.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let matches = Cli::command().get_matches();
    let sub = matches.subcommand_name().map(String::from);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    if cli.json && matches!(cli.cmd, Cmd::Lock(_) | Cmd::Elect(_)) {
        let msg = "--json is not supported by `lock` and `elect`: their standard output is the command's";
        usage_exit(sub.as_deref(), ErrorKind::ArgumentConflict, msg);
    }
    let code = match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            let code = exit_code(&e);
            if code == EXIT_USAGE {
                usage_exit(sub.as_deref(), ErrorKind::ValueValidation, &format!("{e:#}"));
            }
            eprintln!("baton: {e:#}");
            code
        }
    };
    std::process::exit(code);
}

/// Prints a usage error as clap does, with the subcommand's usage, and
/// exits 2.
fn usage_exit(sub: Option<&str>, kind: ErrorKind, msg: &str) -> ! {
    let mut cli = Cli::command();
    cli.build();
    let mut cmd = sub.and_then(|s| cli.find_subcommand(s).cloned()).unwrap_or(cli);
    cmd.error(kind, msg).exit()
}

/// Runs one command; its exit code.
async fn run(cli: Cli) -> anyhow::Result<i32> {
    let conn = Conn::new(&cli.conn)?;
    let out = Out { json: cli.json };
    // A transaction is read and parsed before any member is dialled.
    let txn = match &cli.cmd {
        Cmd::Session(SessionCmd::Txn(t)) => Some(t.prepare()?),
        _ => None,
    };
    conn.reach().await?;
    let done = |r: anyhow::Result<()>| r.map(|()| EXIT_OK);
    let result = match cli.cmd {
        Cmd::Session(SessionCmd::Txn(_)) => match txn {
            Some(txn) => done(conn.session(None, async |c| txn.run(c, out).await).await),
            None => unreachable!("a txn is prepared above"),
        },
        Cmd::Session(cmd) => done(cmd.run(&conn, out).await),
        Cmd::Status(c) => done(c.run(&conn, out).await),
        Cmd::Health(c) => done(c.run(&conn, out).await),
        Cmd::Member(c) => done(c.run(&conn, out).await),
        Cmd::Snapshot(c) => done(c.run(&conn, out).await),
        Cmd::Leader(c) => done(conn.session(None, async |s| c.run(s, out).await).await),
        Cmd::Lock(c) => c.run(&conn).await,
        Cmd::Elect(c) => c.run(&conn).await,
    };
    match result {
        Ok(code) => Ok(code),
        Err(e) => Err(conn.explain(e).await),
    }
}
