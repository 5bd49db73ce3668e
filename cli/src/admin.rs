//! Operator commands that need no session: `status`, `health`, `member`,
//! `snapshot`. Each asks members directly (`baton_client::admin`), so it
//! works when the cluster cannot create sessions (no leader, a quorum lost).
//! The members are the endpoints given plus every member the cluster
//! records: one endpoint is enough.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

use baton_client::admin;
use baton_client::admin::Members;
use baton_client::MemberStatus;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::conn::{parse_addr, Conn};
use crate::output::{human_bytes, human_ms, Out};

/// Every member's client address: the ones given and the ones the cluster
/// records.
async fn discover(conn: &Conn) -> Vec<String> {
    let cfg = conn.config();
    let known = admin::members(&cfg).await.ok();
    // One member under two names (a given host name and the address the
    // cluster recorded) is asked, and listed, once: by what they resolve to.
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for e in admin::all_endpoints(&conn.endpoints, known.as_ref()) {
        let resolved = tokio::time::timeout(conn.dial_timeout, tokio::net::lookup_host(e.clone())).await;
        let addrs: Vec<std::net::SocketAddr> =
            resolved.ok().and_then(Result::ok).map(Iterator::collect).unwrap_or_default();
        if !addrs.is_empty() && addrs.iter().all(|a| seen.contains(a)) {
            continue;
        }
        seen.extend(addrs);
        out.push(e);
    }
    out
}

/// Every member's role, term, indexes, sessions, nodes, uptime, database
/// size and version. Exits 1 when no member sees a leader or one is
/// unreachable (5 when none is).
#[derive(Args, Debug)]
pub struct Status {
    /// Exit 0 as long as one member answers.
    #[arg(long)]
    partial: bool,
}

/// Column widths of the status table; negative: left-aligned.
const STATUS_WIDTHS: [i32; 12] = [-22, 3, -13, 5, 9, 9, 6, 8, 8, 8, 9, 7];
const STATUS_HEADER: [&str; 12] =
    ["endpoint", "id", "role", "term", "commit", "applied", "leader", "sessions", "nodes", "uptime", "db", "version"];

fn status_row(cells: &[String]) -> String {
    let cell = |(c, w): (&String, &i32)| match *w {
        w if w < 0 => format!("{c:<0$}", (-w) as usize),
        w => format!("{c:>0$}", w as usize),
    };
    cells.iter().zip(STATUS_WIDTHS.iter()).map(cell).collect::<Vec<_>>().join(" ")
}

fn status_json(e: &str, s: &MemberStatus) -> Value {
    json!({"endpoint": e, "id": s.id, "role": s.role, "term": s.term, "commit_index": s.commit_index,
           "applied_index": s.applied_index, "leader_id": s.leader_id, "first_index": s.first_index,
           "sessions": s.sessions, "nodes": s.nodes, "voters": s.voters, "learners": s.learners,
           "uptime_ms": s.uptime_ms, "db_bytes": s.db_bytes, "version": s.version, "cluster_id": s.cluster_id})
}

fn status_text(e: &str, s: &MemberStatus) -> String {
    let role = if s.learners.contains(&s.id) { "learner".to_string() } else { s.role.clone() };
    let (id, term, commit, applied) = (s.id, s.term, s.commit_index, s.applied_index);
    let (leader, sessions, nodes) = (s.leader_id, s.sessions, s.nodes);
    status_row(&[
        e.to_string(),
        id.to_string(),
        role,
        term.to_string(),
        commit.to_string(),
        applied.to_string(),
        leader.to_string(),
        sessions.to_string(),
        nodes.to_string(),
        human_ms(s.uptime_ms),
        human_bytes(s.db_bytes),
        s.version.clone(),
    ])
}

impl Status {
    pub async fn run(self, conn: &Conn, out: Out) -> anyhow::Result<()> {
        let cfg = conn.config();
        let all = discover(conn).await;
        if !out.json {
            println!("{}", status_row(&STATUS_HEADER.map(String::from)));
        }
        let (mut reachable, mut leaders, mut voters) = (0, BTreeSet::new(), BTreeSet::new());
        let mut seen = BTreeSet::new();
        // Every member at once, each within --dial-timeout.
        for (e, status) in all.iter().zip(admin::statuses(&cfg, &all).await) {
            match status {
                // The same member under another name (a given host name
                // and the address the cluster recorded).
                Ok(s) if !seen.insert(s.id) => reachable += 1,
                Ok(s) => {
                    reachable += 1;
                    leaders.extend(Some(s.leader_id).filter(|l| *l != 0));
                    voters.extend(s.voters.iter().copied());
                    out.emit(status_json(e, &s), status_text(e, &s));
                }
                Err(err) => {
                    out.emit(json!({"endpoint": e, "error": err.to_string()}), format!("{e:<22} unreachable: {err}"))
                }
            }
        }
        if !out.json {
            println!("voters: {voters:?}");
        }
        let unreachable = all.len() - reachable;
        if reachable == 0 {
            return Err(baton_client::Error::Unavailable("no member reachable".into()).into());
        }
        if !self.partial && leaders.is_empty() {
            anyhow::bail!("no member sees a leader");
        }
        if !self.partial && unreachable > 0 {
            anyhow::bail!("{unreachable} of {} members unreachable (--partial to accept)", all.len());
        }
        Ok(())
    }
}

/// Each member's health (like etcdctl endpoint health): it sees a leader
/// and has applied what is committed. Exits 1 if any is not (5 if none
/// answers).
#[derive(Args, Debug)]
pub struct Health {}

impl Health {
    pub async fn run(self, conn: &Conn, out: Out) -> anyhow::Result<()> {
        let cfg = conn.config();
        let all = discover(conn).await;
        let (mut bad, mut unreachable, mut seen) = (0, 0, BTreeSet::new());
        // Every member at once, each within --dial-timeout, each timed.
        let timed = futures::future::join_all(all.iter().map(|e| async {
            let t = Instant::now();
            let status = admin::status(&cfg, e).await;
            (status, t.elapsed())
        }))
        .await;
        for (e, (status, took)) in all.iter().zip(timed) {
            if status.as_ref().is_ok_and(|s| !seen.insert(s.id)) {
                continue; // the same member under another name
            }
            unreachable += status.is_err() as usize;
            let verdict = status.map_err(|e| e.to_string()).and_then(|s| admin::healthy(&s));
            bad += verdict.is_err() as usize;
            let json = json!({"endpoint": e, "health": verdict.is_ok(), "took_ms": took.as_millis() as u64,
                              "error": verdict.as_ref().err()});
            let text = match &verdict {
                Ok(()) => format!("{e} is healthy: took = {took:?}"),
                Err(why) => format!("{e} is unhealthy: {why}"),
            };
            out.emit(json, text);
        }
        if unreachable == all.len() {
            return Err(baton_client::Error::Unavailable("no member reachable".into()).into());
        }
        if bad > 0 {
            anyhow::bail!("{bad} of {} members unhealthy", all.len());
        }
        Ok(())
    }
}

#[derive(Subcommand, Debug)]
pub enum MemberCmd {
    /// Id, addresses, voter or learner, and (from the leader) match index
    /// and lag.
    List,
    /// Add a member (start it with `batond --join` after this). It joins as
    /// a learner and the leader promotes it to voter once it has caught up.
    Add {
        /// The new member's id (never used before in this cluster).
        id: u64,
        /// Where the other members reach its peer port, HOST:PORT (required).
        #[arg(long, required = true, value_parser = parse_addr, value_name = "HOST:PORT")]
        peer_addr: String,
        /// Where clients reach it, HOST:PORT (required).
        #[arg(long, required = true, value_parser = parse_addr, value_name = "HOST:PORT")]
        client_addr: String,
        /// Keep it a learner (no vote) until `member promote`.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a member (the leader hands over leadership first if it is
    /// the one removed). Its id can never be used again.
    Remove {
        /// The member's id.
        id: u64,
    },
    /// Make a caught-up learner a voter.
    Promote {
        /// The learner's id.
        id: u64,
    },
    /// Hand leadership to a caught-up voter (waits until it leads).
    MoveLeader {
        /// The voter's id.
        id: u64,
    },
    /// Swap voter OLD for caught-up learner NEW in one joint-consensus
    /// change (add NEW with --learner first).
    Replace {
        /// The voter to remove.
        old: u64,
        /// The learner to make a voter in its place.
        new: u64,
    },
}

impl MemberCmd {
    pub async fn run(self, conn: &Conn, out: Out) -> anyhow::Result<()> {
        let cfg = conn.change_config();
        let m = match self {
            MemberCmd::List => admin::members(&cfg).await?,
            MemberCmd::Add { id, peer_addr, client_addr, learner } => {
                admin::member_add(&cfg, id, &peer_addr, &client_addr, !learner).await?
            }
            MemberCmd::Remove { id } => admin::member_remove(&cfg, id).await?,
            MemberCmd::Promote { id } => admin::member_promote(&cfg, id).await?,
            MemberCmd::MoveLeader { id } => admin::member_move_leader(&cfg, id).await?,
            MemberCmd::Replace { old, new } => admin::member_replace(&cfg, old, new).await?,
        };
        print_members(&m, out);
        Ok(())
    }
}

fn print_members(m: &Members, out: Out) {
    // Match index and lag are known only to the leader.
    let from_leader = m.leader_id != 0 && m.answered_by == m.leader_id;
    if !out.json {
        println!("{:>3} {:<8} {:<24} {:<24} {:>10} {:>8}", "id", "role", "peer", "client", "matched", "lag");
    }
    for i in &m.members {
        // The text's facts, and its footer's, on every line (issue 28, U8).
        let json = json!({"id": i.id, "peer_addr": i.peer_addr, "client_addr": i.client_addr, "role": admin::role(i),
                          "leader": i.id == m.leader_id, "matched": from_leader.then_some(i.matched),
                          "lag": from_leader.then_some(i.lag), "auto_promote": i.auto_promote,
                          "cluster_id": m.cluster_id, "term": m.term, "leader_id": m.leader_id,
                          "answered_by": m.answered_by});
        let (matched, lag) =
            if from_leader { (i.matched.to_string(), i.lag.to_string()) } else { ("?".into(), "?".into()) };
        let role = format!("{}{}", admin::role(i), if i.id == m.leader_id { "*" } else { "" });
        let auto = if i.auto_promote { " auto-promote" } else { "" };
        let text = format!(
            "{:>3} {:<8} {:<24} {:<24} {:>10} {:>8}{auto}",
            i.id, role, i.peer_addr, i.client_addr, matched, lag
        );
        out.emit(json, text);
    }
    if !out.json {
        println!(
            "cluster {} term {}, leader {} (*), answered by member {}",
            m.cluster_id, m.term, m.leader_id, m.answered_by
        );
    }
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// Save the whole state, as of now (every acknowledged write), to FILE.
    Save {
        /// Where to write the backup (written beside it, then renamed).
        file: PathBuf,
    },
}

impl SnapshotCmd {
    pub async fn run(self, conn: &Conn, out: Out) -> anyhow::Result<()> {
        let SnapshotCmd::Save { file } = self;
        // A file that cannot be written is found before the cluster is asked.
        let tmp = file.with_extension("partial");
        let named = |what: &str, path: &std::path::Path, e: std::io::Error| {
            anyhow::anyhow!("snapshot save: {what} {}: {e}", path.display())
        };
        std::fs::File::create(&tmp).map_err(|e| named("cannot write", &tmp, e))?;
        let saved = admin::snapshot_save(&conn.config()).await;
        let (bytes, index) = match saved {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e.into());
            }
        };
        // Written beside, then renamed: a crash never leaves half a backup.
        std::fs::write(&tmp, &bytes).map_err(|e| named("writing", &tmp, e))?;
        std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| named("syncing", &tmp, e))?;
        std::fs::rename(&tmp, &file).map_err(|e| named(&format!("renaming {} to", tmp.display()), &file, e))?;
        let text = format!("saved {} ({} bytes) at index {index}", file.display(), bytes.len());
        out.emit(json!({"file": file, "index": index, "bytes": bytes.len()}), text);
        Ok(())
    }
}
