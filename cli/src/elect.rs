//! Leader election: `elect NAME -- COMMAND` runs a command only while
//! leader (the client's `campaign`); `leader NAME` prints who leads, and
//! with `--watch` every change (`observe`).
//!
//! The leader's token (its node's creation index) is in BATON_FENCE_TOKEN,
//! so a deposed leader's writes can be fenced exactly like a stale lock
//! holder's. SIGINT and SIGTERM end a campaign (exit 130/143) or a watch
//! (exit 0: it is how a watch is stopped).

use std::time::Duration;

use baton_client::{Client, LeaderInfo};
use clap::Args;
use serde_json::json;

use crate::conn::Conn;
use crate::output::{Encoding, Out};
use crate::signal::Interrupts;
use crate::supervise::{OnSuspend, Supervised};

/// How long resigning may take once the command ended.
const RESIGN_TIMEOUT: Duration = Duration::from_secs(2);

/// Run a command only while leader of election NAME (its token in
/// BATON_FENCE_TOKEN, NAME in BATON_ELECTION_NAME).
#[derive(Args, Debug)]
#[command(after_help = "Exit: the command's code; 75 if leadership was lost while it ran; 130/143 if interrupted \
                        while campaigning.")]
pub struct Elect {
    /// The election's name (1 to 512 bytes, no `/`).
    name: String,
    /// The value others see as the leader's (default: HOSTNAME:PID).
    #[arg(long)]
    value: Option<String>,
    #[command(flatten)]
    run: Supervised,
}

impl Elect {
    /// Campaigns, runs the command while leader, resigns; the exit code.
    /// The session is closed whatever happens.
    pub async fn run(self, conn: &Conn) -> anyhow::Result<i32> {
        conn.session(Some(self.run.session_timeout), async |c| self.lead_and_run(c, conn).await).await
    }

    async fn lead_and_run(&self, c: &Client, conn: &Conn) -> anyhow::Result<i32> {
        let name = &self.name;
        let value = self.value.clone().unwrap_or_else(|| format!("{}:{}", hostname(), std::process::id()));
        let mut interrupts = Interrupts::new()?;
        let lead = tokio::select! {
            l = c.campaign(name, value.into_bytes()) => l?,
            e = interrupts.fail(format!("while campaigning in {name}")) => return Err(e),
        };
        let token = lead.fencing_token();
        eprintln!("baton: leader of {name} (token {token})");
        let env = [("BATON_FENCE_TOKEN", token.to_string()), ("BATON_ELECTION_NAME", name.to_string())];
        let lost = async {
            match self.run.on_suspend {
                OnSuspend::Kill => lead.lost().await,
                OnSuspend::Wait => lead.may_be_replaced().await,
            }
        };
        let what = format!("leadership of {name}");
        let code = self.run.run(&env, &conn.endpoints, lost, lead.verify(), &what).await?;
        let _ = tokio::time::timeout(RESIGN_TIMEOUT, lead.resign()).await;
        Ok(code)
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Print the current leader of election NAME (with --watch, every change).
#[derive(Args, Debug)]
pub struct Leader {
    /// The election's name.
    name: String,
    /// Keep printing each new leader until SIGINT or SIGTERM.
    #[arg(long)]
    watch: bool,
}

impl Leader {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        if !self.watch {
            let leader = c.leader(&self.name).await?;
            let none = leader.is_none();
            print_leader(leader, out);
            if none {
                return Err(crate::Fail::NoLeader(format!("election {} has no leader", self.name)).into());
            }
            return Ok(());
        }
        let mut interrupts = Interrupts::new()?;
        let mut obs = c.observe(&self.name).await?;
        loop {
            tokio::select! {
                l = obs.next() => match l {
                    Some(l) => print_leader(l, out),
                    None => anyhow::bail!("observer ended: session expired"),
                },
                _ = interrupts.recv() => return Ok(()),
            }
        }
    }
}

/// `VALUE (token N)`, or JSON with `leader` (or `leader_base64` when the
/// value is not UTF-8), `token` and `path`.
fn print_leader(l: Option<LeaderInfo>, out: Out) {
    match l {
        Some(l) => {
            let mut obj = serde_json::Map::new();
            Encoding::default().add_json_as(&mut obj, "leader", &l.value);
            obj.insert("token".into(), l.fencing_token.into());
            obj.insert("path".into(), l.path.into());
            out.emit(obj.into(), format!("{} (token {})", String::from_utf8_lossy(&l.value), l.fencing_token));
        }
        None => out.emit(json!({"leader": null}), "(no leader)"),
    }
}
