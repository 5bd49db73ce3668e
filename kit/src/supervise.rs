//! `batond cluster`'s watch over its members: a start that fails says so,
//! and a member that dies is reported and started again, as a supervisor
//! (systemd's `Restart=on-failure`) would.
//!
//! The rules:
//! - Before anything starts, every port the cluster will use is bound once
//!   ([`ports_free`]): a port in use fails the start, naming the member,
//!   the port's role and the address; nothing is started.
//! - Every member then has [`START_BOUND`] to accept connections on its
//!   client port ([`start_all`]). A member that exits first fails the
//!   start: the error gives its exit status and the end of its log (a data
//!   dir another member holds, a bad flag); the members already started
//!   are killed.
//! - While the cluster runs, [`Supervised::check`] (every
//!   [`CHECK_EVERY`]) sees a member that exited. One that failed (killed
//!   by a signal, or exit code 1) is started again after
//!   [`RESTART_DELAY`] on the same data dir, ports and log. Exit code 0 (a
//!   clean stop, SIGTERM), 2 (removed from the cluster, or a wiped data
//!   dir) and 3 (a damaged data dir): batond's codes for "do not restart
//!   me as is" are reported and not restarted. A member that failed [`MAX_FAILURES`] times within
//!   [`FAILURE_WINDOW`] is given up on, and the cluster stops.
//! - A stopped (SIGSTOPped) member has not exited: it is left alone.
//! - SIGTERM or Ctrl-C stops every member (SIGTERM, then SIGKILL after
//!   5 s) and exits 0, also when it comes while the members start: it is
//!   held from before the first member is spawned and acted on once the
//!   start is over (main.rs `run_cluster`). Before 2026-12-07 one that came
//!   before the banner killed `batond cluster` alone and orphaned its
//!   members (server/tests/member.rs
//!   `batond_cluster_terminated_while_starting_leaves_no_member_behind`).

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::member::{MemberSpec, Process};

/// How long a member may take to accept connections on its client port.
pub const START_BOUND: Duration = Duration::from_secs(30);
/// How often a running cluster looks at its members.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);
/// Between a member's failure and its restart.
pub const RESTART_DELAY: Duration = Duration::from_secs(1);
/// Failures within [`FAILURE_WINDOW`] after which a member is given up on.
pub const MAX_FAILURES: usize = 3;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Fails if any of `ports` (a member id, the port's role, its address) is
/// in use.
pub fn ports_free(ports: &[(u64, &str, SocketAddr)]) -> anyhow::Result<()> {
    for (id, role, addr) in ports {
        if let Err(e) = std::net::TcpListener::bind(addr) {
            bail!("member {id}'s {role} port {addr} is in use ({e}): is another cluster running on these ports?");
        }
    }
    Ok(())
}

/// Starts every member and waits (bounded by [`START_BOUND`]) until each
/// accepts connections on its client port; a member that exits first
/// fails the start (the rest are killed as they drop).
pub fn start_all(specs: &[MemberSpec], bin: &Path) -> anyhow::Result<Vec<Process>> {
    let mut procs = Vec::new();
    for spec in specs {
        procs.push(spec.start(bin)?);
    }
    let deadline = Instant::now() + START_BOUND;
    for (spec, p) in specs.iter().zip(procs.iter_mut()) {
        wait_serving(spec, p, deadline)?;
    }
    Ok(procs)
}

/// Until `p` accepts on its client port, exits (an error) or `deadline`
/// passes (an error).
fn wait_serving(spec: &MemberSpec, p: &mut Process, deadline: Instant) -> anyhow::Result<()> {
    loop {
        if let Some(code) = p.exit_code() {
            bail!(
                "member {} exited while starting ({}); the end of {}:\n{}",
                spec.id,
                status(code),
                spec.log.display(),
                log_tail(&spec.log)
            );
        }
        if TcpStream::connect_timeout(&spec.client_addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "member {} did not accept connections on {} within {START_BOUND:?}; the end of {}:\n{}",
                spec.id,
                spec.client_addr,
                spec.log.display(),
                log_tail(&spec.log)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An exit code as people read it (`Process::exit_code`: -1 is a signal).
fn status(code: i32) -> String {
    match code {
        -1 => "killed by a signal".into(),
        c => format!("exit code {c}"),
    }
}

/// The last lines of a member's log.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// What [`Supervised::check`] saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Failed, and started again: its new pid.
    Restarted { status: String, pid: u32 },
    /// Exited and not restarted (a clean stop, exit code 2 or 3).
    Stopped { status: String },
    /// Failed [`MAX_FAILURES`] times within [`FAILURE_WINDOW`], or could not
    /// be started again.
    GaveUp { why: String },
}

/// One member under watch.
pub struct Supervised {
    pub spec: MemberSpec,
    /// None once it has stopped for good.
    pub process: Option<Process>,
    failures: VecDeque<Instant>,
}

impl Supervised {
    pub fn new(spec: MemberSpec, process: Process) -> Supervised {
        Supervised { spec, process: Some(process), failures: VecDeque::new() }
    }

    /// Looks at the member once: None while it runs (or has stopped for
    /// good); otherwise what happened, the restart done (blocking for
    /// [`RESTART_DELAY`]).
    pub fn check(&mut self, bin: &Path) -> Option<Event> {
        let code = self.process.as_mut()?.exit_code()?;
        self.process = None;
        let status = status(code);
        if matches!(code, 0 | 2 | 3) {
            return Some(Event::Stopped { status });
        }
        let now = Instant::now();
        self.failures.push_back(now);
        while self.failures.front().is_some_and(|t| now.duration_since(*t) > FAILURE_WINDOW) {
            self.failures.pop_front();
        }
        if self.failures.len() >= MAX_FAILURES {
            return Some(Event::GaveUp {
                why: format!("{status}, its {} failure within {FAILURE_WINDOW:?}", self.failures.len()),
            });
        }
        std::thread::sleep(RESTART_DELAY);
        match self.spec.start(bin) {
            Ok(p) => {
                let pid = p.pid();
                self.process = Some(p);
                Some(Event::Restarted { status, pid })
            }
            Err(e) => Some(Event::GaveUp { why: format!("{status}, and starting it again failed: {e:#}") }),
        }
    }

    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }
}
