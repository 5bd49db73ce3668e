//! The CLI door: `baton lock` (plain, `--shared`, `--write`, `--limit`) and `baton
//! elect`, the commands through which a script holds a lock or leads
//! (finding Z3: `kill -9` of `baton` left its command running while the
//! next holder was granted). Each hold is a
//! `baton` process of its own, with a session of its own, whose command is
//! this harness's binary in its hidden `cli-hold` role ([`hold_main`]):
//! - the command connects to a Unix socket the worker listens on and sends
//!   `BATON_FENCE_TOKEN`: that is the grant, and its token;
//! - it then runs until the worker writes `release` (it exits 0, and
//!   `baton` releases and exits) or until it is stopped (SIGTERM or
//!   SIGKILL from `baton`, or from `baton`'s keeper once `baton` died);
//! - the client's state is `Connected` from the start until the socket
//!   closes, then `Expired`: for the checkers, "the command still runs"
//!   is what "the holder believes it holds" means through this door;
//!   `holder-connected-after-expiry` then judges the CLI's promise that
//!   the command never runs beside the next holder's.
//!
//! One hold per client: once the `baton` process ends, the client is
//! `Expired` and the worker takes a fresh process (a new `baton`, a new
//! session). What a hold writes goes through the worker's native storage
//! client, as a script's `baton set --fence` would (the resource is not
//! the door under test); the election's observer is a native client too.
//!
//! `baton lock --timeout` gives up on its own (exit 7: `TimedOut`); `baton
//! elect` has no timeout, so a campaign that runs out is ended with
//! SIGTERM (the CLI withdraws and closes its session); a grant that came
//! just before is still reported, already `Expired`.
//!
//! `kill-client` (nemesis.rs) kills -9 a holder's `baton`: its keeper must
//! stop the command at once. Planted (`--cli-command-leaves-group`): the
//! command calls `setsid` first, leaving the group the keeper stops, as a
//! daemonizing command would; it then outlives its `baton`, as the command
//! did before the keeper.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_client::SessionState;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixListener;
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::record::OpError;

/// The hidden first argument that makes `baton-jepsen` a hold's command.
pub const HOLD_ARG: &str = "cli-hold";
/// After SIGTERM on a loss, how long `baton` waits before SIGKILL.
const GRACE: &str = "1s";
/// How long a release (the command's exit, then `baton`'s) may take.
const RELEASE_WAIT: Duration = Duration::from_secs(8);
/// Bound on a `baton` that neither grants nor gives up.
const SPAWN_SLACK: Duration = Duration::from_secs(15);

/// Synthetic session ids for the history (the CLI does not print its own).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What every CLI client of a run shares.
#[derive(Clone, Debug)]
pub struct CliOpts {
    /// The `baton` binary.
    pub baton: PathBuf,
    /// The `baton-jepsen` binary, whose `cli-hold` is the held command.
    pub holder: PathBuf,
    /// Where the holds' sockets and `baton`'s stderr go.
    pub dir: PathBuf,
    pub session: Duration,
    /// Planted: the command leaves `baton`'s process group.
    pub leaves_group: bool,
}

/// One `baton lock` / `baton elect` at most, through `endpoints`.
pub struct CliClient {
    opts: CliOpts,
    endpoints: Vec<String>,
    id: u64,
    state_tx: watch::Sender<SessionState>,
    state: watch::Receiver<SessionState>,
    /// The running `baton`'s pid (for `close` and `kill-client`).
    pid: Mutex<Option<u32>>,
}

/// A granted hold: the command's socket and its `baton`.
pub struct CliHold {
    c: Arc<CliClient>,
    token: u64,
    to_command: OwnedWriteHalf,
    child: Child,
}

impl CliClient {
    pub fn new(opts: CliOpts, endpoints: Vec<String>) -> Arc<CliClient> {
        let (state_tx, state) = watch::channel(SessionState::Connected);
        let id = (1 << 62) | NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Arc::new(CliClient { opts, endpoints, id, state_tx, state, pid: Mutex::new(None) })
    }

    pub fn session_id(&self) -> u64 {
        self.id
    }

    pub fn state(&self) -> watch::Receiver<SessionState> {
        self.state.clone()
    }

    /// The running `baton`'s pid, if one runs.
    pub fn pid(&self) -> Option<u32> {
        *self.pid.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ended(&self) {
        self.pid.lock().unwrap_or_else(|p| p.into_inner()).take();
        let _ = self.state_tx.send(SessionState::Expired);
    }

    /// Stops the running `baton` (SIGTERM: it withdraws or releases and
    /// closes its session).
    pub fn close(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGTERM);
        }
        let _ = self.state_tx.send(SessionState::Expired);
    }

    /// `baton lock NAME --timeout WAIT -- <hold>`.
    pub async fn lock(self: &Arc<Self>, name: &str, wait: Duration) -> Result<CliHold, OpError> {
        let timeout = format!("{}ms", wait.as_millis().max(1));
        self.hold(&["lock", name, "--timeout", &timeout], None).await
    }

    /// `baton lock NAME --shared|--write --timeout WAIT -- <hold>`.
    pub async fn rw_lock(self: &Arc<Self>, name: &str, write: bool, wait: Duration) -> Result<CliHold, OpError> {
        let timeout = format!("{}ms", wait.as_millis().max(1));
        let side = if write { "--write" } else { "--shared" };
        self.hold(&["lock", name, side, "--timeout", &timeout], None).await
    }

    /// `baton lock NAME --limit PERMITS --timeout WAIT -- <hold>`.
    pub async fn semaphore(self: &Arc<Self>, name: &str, permits: usize, wait: Duration) -> Result<CliHold, OpError> {
        let timeout = format!("{}ms", wait.as_millis().max(1));
        let limit = permits.to_string();
        self.hold(&["lock", name, "--limit", &limit, "--timeout", &timeout], None).await
    }

    /// `baton elect NAME --value VALUE -- <hold>`, given up after `wait`.
    pub async fn campaign(self: &Arc<Self>, name: &str, value: &str, wait: Duration) -> Result<CliHold, OpError> {
        self.hold(&["elect", name, "--value", value], Some(wait)).await
    }

    async fn hold(self: &Arc<Self>, args: &[&str], give_up: Option<Duration>) -> Result<CliHold, OpError> {
        let sock = self.opts.dir.join(format!("hold-{}-{}.sock", std::process::id(), self.id & 0xffff_ffff));
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).map_err(|e| self.fail(format!("socket {}: {e}", sock.display())))?;
        let log = std::fs::File::create(self.opts.dir.join(format!("baton-{}.log", self.id & 0xffff_ffff)))
            .map_err(|e| self.fail(format!("log: {e}")))?;
        let mut cmd = Command::new(&self.opts.baton);
        cmd.arg(format!("--endpoints={}", self.endpoints.join(",")))
            .args(args)
            .arg(format!("--session-timeout={}ms", self.opts.session.as_millis()))
            .arg(format!("--grace={GRACE}"))
            .arg("--")
            .arg(&self.opts.holder)
            .arg(HOLD_ARG)
            .arg(&sock);
        if self.opts.leaves_group {
            cmd.arg("--leave-group");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::from(log)).kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| self.fail(format!("spawn {}: {e}", self.opts.baton.display())))?;
        *self.pid.lock().unwrap_or_else(|p| p.into_inner()) = child.id();
        let limit = give_up.unwrap_or_default() + SPAWN_SLACK;
        let granted = tokio::select! {
            a = listener.accept() => a.ok(),
            s = child.wait() => {
                self.ended();
                let _ = std::fs::remove_file(&sock);
                return Err(match s.ok().and_then(|s| s.code()) {
                    Some(7) => OpError::TimedOut,
                    code => OpError::Cli(format!("baton {} exited {code:?} before a grant", args[0])),
                });
            }
            _ = tokio::time::sleep(give_up.unwrap_or(limit)) => None,
        };
        let granted = match granted {
            Some(g) => Some(g),
            None => {
                // Given up (or stuck): end it; a grant that came meanwhile
                // is still reported.
                if let Some(pid) = child.id() {
                    signal(pid, libc::SIGTERM);
                }
                tokio::time::timeout(Duration::from_millis(300), listener.accept()).await.ok().and_then(|a| a.ok())
            }
        };
        let _ = std::fs::remove_file(&sock);
        let Some((stream, _)) = granted else {
            let _ = tokio::time::timeout(RELEASE_WAIT, child.wait()).await;
            self.ended();
            return Err(OpError::TimedOut);
        };
        let (rd, to_command) = stream.into_split();
        let mut lines = BufReader::new(rd).lines();
        let token = match tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await {
            Ok(Ok(Some(t))) => t.trim().parse::<u64>().ok(),
            _ => None,
        };
        let Some(token) = token else {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(RELEASE_WAIT, child.wait()).await;
            self.ended();
            return Err(OpError::Cli("the command sent no token".into()));
        };
        // The command runs until its socket closes.
        let c = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(_)) = lines.next_line().await {}
            let _ = c.state_tx.send(SessionState::Expired);
        });
        Ok(CliHold { c: self.clone(), token, to_command, child })
    }

    fn fail(&self, why: String) -> OpError {
        self.ended();
        OpError::Cli(why)
    }
}

impl CliHold {
    pub fn token(&self) -> u64 {
        self.token
    }

    /// True while the command runs.
    pub fn holds(&self) -> bool {
        *self.c.state.borrow() == SessionState::Connected
    }

    /// Tells the command to end, then waits for `baton`: exit 0 is a
    /// release; 75 says the hold was lost while the command ran.
    pub async fn release(mut self) -> Result<(), OpError> {
        let _ = self.to_command.write_all(b"release\n").await;
        let status = tokio::time::timeout(RELEASE_WAIT, self.child.wait()).await;
        self.c.ended();
        match status {
            Ok(Ok(s)) if s.success() => Ok(()),
            Ok(Ok(s)) => Err(OpError::Cli(format!("baton exited {:?} on release", s.code()))),
            Ok(Err(e)) => Err(OpError::Cli(format!("baton: {e}"))),
            Err(_) => {
                let _ = self.child.start_kill();
                Err(OpError::Cli("baton did not exit within 8 s of the release".into()))
            }
        }
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child this harness spawned.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// The `baton-jepsen` binary: this process, or (a test binary in
/// `target/*/deps/`) the one cargo built beside it.
pub fn holder_bin() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    if me.file_name().is_some_and(|n| n == "baton-jepsen") {
        return Ok(me);
    }
    for dir in me.ancestors().skip(1).take(2) {
        let p = dir.join("baton-jepsen");
        if p.is_file() {
            return Ok(p);
        }
    }
    anyhow::bail!("baton-jepsen not found beside {}: build it (cargo build -p baton-jepsen)", me.display())
}

/// Kills `pid` with SIGKILL (the `kill-client` nemesis).
pub fn kill9(pid: u32) {
    signal(pid, libc::SIGKILL);
}

/// The hold's command: `cli-hold SOCKET [--leave-group]` (module doc).
/// Exits 0 on `release`, 1 when the socket closes first.
pub fn hold_main(args: &[String]) -> i32 {
    use std::io::{BufRead, Write};
    let Some(sock) = args.first() else {
        eprintln!("baton-jepsen {HOLD_ARG}: needs SOCKET");
        return 2;
    };
    if args.iter().any(|a| a == "--leave-group") {
        // SAFETY: setsid(2) in a single-threaded process.
        unsafe {
            libc::setsid();
        }
    }
    let token = std::env::var("BATON_FENCE_TOKEN").unwrap_or_default();
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(sock) else { return 1 };
    if writeln!(s, "{token}").is_err() {
        return 1;
    }
    let mut line = String::new();
    let _ = std::io::BufReader::new(&s).read_line(&mut line);
    i32::from(line.trim() != "release")
}
