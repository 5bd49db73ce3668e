//! The command that `lock` and `elect` run while they hold: a child in its
//! own process group, stopped (SIGTERM, then SIGKILL after `--grace`) when
//! the hold is lost, and checked with the cluster after it ends on its own.
//!
//! Invariants:
//! - the child never outlives a loss the CLI saw: the CLI waits for it to
//!   exit before it returns;
//! - the child's group never outlives the CLI, however the CLI dies
//!   (`kill -9`, the OOM killer): a keeper process between them stops it
//!   (holder.rs);
//! - SIGINT and SIGTERM sent to the CLI are passed on to the child's group
//!   (a terminal's Ctrl-C does not reach it directly: it has its own group),
//!   and the CLI exits with the child's code;
//! - exit [`EXIT_LOST`] means the hold was lost while the command ran,
//!   whether the CLI stopped it or found out afterwards (e.g. the process
//!   was paused past its session).
//!
//! It cannot stop a paused or slow command from acting after the loss:
//! only a fence checked by the resource can (BATON_FENCE_TOKEN).

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use baton_client::SessionState;
use clap::{Args, ValueEnum};

use crate::signal::Interrupts;
use crate::{parse_duration, EXIT_LOST};

/// How long `verify` may take after the command ended.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// What `lock` / `elect` do with the command while the session is
/// suspended (Curator's connection-state error policies).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnSuspend {
    /// Keep running through a suspension until the session expires or its
    /// last proof of life is 2/3 of the timeout old, when another holder
    /// may be granted soon with clocks 10% apart (session-based policy,
    /// with the margin: `Client::may_be_lost_at`).
    Wait,
    /// Stop the command at the first doubt (standard policy).
    Kill,
}

/// The flags `lock` and `elect` share: the session and the command.
#[derive(Args, Debug)]
pub struct Supervised {
    /// Session timeout: how long after this process dies (or is cut off)
    /// the hold is freed for others.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub session_timeout: Duration,
    /// After SIGTERM on a loss, wait this long before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    grace: Duration,
    /// When the session is suspended (e.g. its member restarts): `wait`
    /// keeps the command running until the session expires or 2/3 of the
    /// session timeout pass after its last proof of life (the rest is the
    /// margin before anyone else may hold); `kill` stops it at once.
    #[arg(long, value_enum, default_value = "wait")]
    pub on_suspend: OnSuspend,
    /// The command to run and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

impl Supervised {
    /// Runs the command with `env` (and BATON_ENDPOINTS); stops it if
    /// `lost` resolves first. After the command ends on its own, `verify`
    /// asks the cluster whether the hold survived; if not, the command may
    /// have run on past it, and the exit code says so. `what` names the
    /// hold in messages ("lock jobs").
    pub async fn run(
        &self,
        env: &[(&str, String)],
        endpoints: &[String],
        lost: impl Future<Output = SessionState>,
        verify: impl Future<Output = baton_client::Result<bool>>,
        what: &str,
    ) -> anyhow::Result<i32> {
        let code = self.run_until_lost(env, endpoints, lost, what).await?;
        if code != EXIT_LOST && !tokio::time::timeout(VERIFY_TIMEOUT, verify).await.is_ok_and(|r| r.unwrap_or(false)) {
            eprintln!("baton: {what} was lost while the command ran (its session expired)");
            return Ok(EXIT_LOST);
        }
        Ok(code)
    }

    async fn run_until_lost(
        &self,
        env: &[(&str, String)],
        endpoints: &[String],
        lost: impl Future<Output = SessionState>,
        what: &str,
    ) -> anyhow::Result<i32> {
        // Through the keeper (holder.rs): the command's group never
        // outlives this process, however it dies.
        let (mut cmd, _keeper) = crate::holder::command(&self.command, self.grace)?;
        cmd.process_group(0).env("BATON_ENDPOINTS", endpoints.join(","));
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut interrupts = Interrupts::new()?;
        let mut child = cmd.spawn().map_err(|e| anyhow::anyhow!("cannot run {:?}: {e}", self.command[0]))?;
        let group = child.id().unwrap_or(0) as i32;
        let code = |s: std::process::ExitStatus| s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0));
        tokio::pin!(lost);
        tokio::select! {
            s = child.wait() => Ok(code(s?)),
            state = &mut lost => {
                eprintln!("baton: {what} lost (session {state:?}); stopping the command");
                signal_group(group, libc::SIGTERM);
                if tokio::time::timeout(self.grace, child.wait()).await.is_err() {
                    eprintln!("baton: command still running after {}; killing it", crate::human(self.grace));
                    signal_group(group, libc::SIGKILL);
                    let _ = child.wait().await;
                }
                Ok(EXIT_LOST)
            }
            sig = interrupts.recv() => {
                signal_group(group, sig);
                Ok(code(child.wait().await?))
            }
        }
    }
}

/// Sends `sig` to the process group `group` (nothing if it is unknown).
fn signal_group(group: i32, sig: i32) {
    if group > 0 {
        // SAFETY: kill(2) on the process group of a child we spawned.
        unsafe {
            libc::kill(-group, sig);
        }
    }
}
