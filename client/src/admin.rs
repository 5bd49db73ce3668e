//! Operator calls that need no session: the configuration, membership
//! changes, every member's status and health. Each call opens a short
//! connection (TLS and `--user` as in the [`ClientConfig`]) to one member.
//!
//! Questions (`status`, `members`) are asked of every endpoint at once, and
//! a member must answer one within the configuration's `connect_timeout`
//! (the CLI's `--dial-timeout`): a member that accepts the connection but
//! does not answer (stopped, or hung) counts as unreachable after that,
//! not after a fixed wait, and never holds up the others.
//!
//! Membership changes go to the leader: each call asks any member
//! who leads, sends the change there, and follows `NOT_LEADER` answers (a
//! removed leader hands over first) until `op_timeout`. A change that
//! timed out may or may not have happened ([`Error::Ambiguous`]): look at
//! [`members`] before sending it again.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use baton_proto::{member_change_req::Kind, request, response, ErrorCode, MemberChangeReq, Response};

use crate::{session, ClientConfig, Error, ErrorKind, MemberStatus, Result};

/// One member of the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberInfo {
    /// Its id.
    pub id: u64,
    /// Where the other members reach it.
    pub peer_addr: String,
    /// Where clients reach it.
    pub client_addr: String,
    /// A voter (false: a learner).
    pub voter: bool,
    /// From the leader only: its last stored index.
    pub matched: u64,
    /// From the leader only: how far it is behind the leader's log.
    pub lag: u64,
    /// A learner the leader promotes once it has caught up.
    pub auto_promote: bool,
}

/// The configuration, as the member that answered sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    /// Every member, voters and learners.
    pub members: Vec<MemberInfo>,
    /// The leader the answering member knows of (0: none).
    pub leader_id: u64,
    /// The cluster's id.
    pub cluster_id: String,
    /// The member that answered.
    pub answered_by: u64,
    /// Its term.
    pub term: u64,
}

impl From<baton_proto::MembersResp> for Members {
    fn from(m: baton_proto::MembersResp) -> Self {
        let members = m
            .members
            .into_iter()
            .map(|i| MemberInfo {
                id: i.id,
                peer_addr: i.peer_addr,
                client_addr: i.client_addr,
                voter: i.voter,
                matched: i.matched,
                lag: i.lag,
                auto_promote: i.auto_promote,
            })
            .collect();
        Members { members, leader_id: m.leader_id, cluster_id: m.cluster_id, answered_by: m.answered_by, term: m.term }
    }
}

/// How long one member has to answer one call.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

async fn call(cfg: &ClientConfig, endpoint: &str, body: request::Body) -> Result<Response> {
    call_within(cfg, endpoint, body, CALL_TIMEOUT).await
}

/// A question (status, members): answered within `connect_timeout`.
async fn ask(cfg: &ClientConfig, endpoint: &str, body: request::Body) -> Result<Response> {
    call_within(cfg, endpoint, body, cfg.connect_timeout).await
}

async fn call_within(cfg: &ClientConfig, endpoint: &str, body: request::Body, timeout: Duration) -> Result<Response> {
    let r = session::one_shot(endpoint, body, timeout, cfg.tls.as_ref(), cfg.auth.as_ref()).await?;
    if r.error != 0 {
        let code = ErrorCode::try_from(r.error).unwrap_or(ErrorCode::Internal);
        return Err(match code {
            ErrorCode::NoAuth => Error::NoAuth(r.message),
            ErrorCode::Timeout | ErrorCode::LeaderChanged => Error::Ambiguous(r.message),
            _ => Error::Server { kind: ErrorKind::from_code(code).unwrap_or(ErrorKind::Internal), message: r.message },
        });
    }
    Ok(r)
}

fn members_body(r: Response) -> Result<Members> {
    match r.body {
        Some(response::Body::Members(m)) => Ok(m.into()),
        _ => Err(Error::unexpected()),
    }
}

/// Every endpoint given plus every member's client address the cluster
/// knows, given ones first.
pub fn all_endpoints(given: &[String], members: Option<&Members>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let known = members.into_iter().flat_map(|m| m.members.iter().map(|i| i.client_addr.clone()));
    for e in given.iter().cloned().chain(known) {
        if !e.is_empty() && seen.insert(e.clone()) {
            out.push(e);
        }
    }
    out
}

/// The configuration, from the leader when it can be reached (its answer
/// has every member's match index and lag), else from any member.
pub async fn members(cfg: &ClientConfig) -> Result<Members> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let ask_members = |e: String| async move {
        ask(cfg, &e, request::Body::Members(Default::default())).await.and_then(members_body)
    };
    // Every endpoint at once; the first leader's answer wins.
    let mut answers: FuturesUnordered<_> = cfg.endpoints.iter().cloned().map(ask_members).collect();
    let mut last = Error::Unavailable("no endpoint".into());
    let mut any: Option<Members> = None;
    while let Some(r) = answers.next().await {
        match r {
            Ok(m) if m.leader_id != 0 && m.answered_by == m.leader_id => return Ok(m),
            Ok(m) => {
                if any.is_none() {
                    // The leader it names may not be among the endpoints.
                    if let Some(l) = leader_endpoint(&m).filter(|l| !cfg.endpoints.contains(l)) {
                        answers.push(ask_members(l));
                    }
                    any = Some(m);
                }
            }
            Err(err @ Error::NoAuth(_)) => return Err(err),
            Err(err) => last = err,
        }
    }
    any.ok_or(last)
}

fn leader_endpoint(m: &Members) -> Option<String> {
    m.members.iter().find(|i| i.id == m.leader_id).map(|i| i.client_addr.clone()).filter(|a| !a.is_empty())
}

/// Sends a membership change to the leader and returns the configuration
/// after it was applied.
async fn member_change(cfg: &ClientConfig, req: MemberChangeReq) -> Result<Members> {
    let deadline = Instant::now() + cfg.op_timeout;
    let mut last = String::from("no leader found");
    while Instant::now() < deadline {
        let leader = match members(cfg).await {
            Ok(m) => leader_endpoint(&m),
            Err(e @ Error::NoAuth(_)) => return Err(e),
            Err(e) => {
                last = e.to_string();
                None
            }
        };
        if let Some(l) = leader {
            match call(cfg, &l, request::Body::MemberChange(req.clone())).await {
                Ok(r) => return members_body(r),
                Err(Error::Server { kind: ErrorKind::NotLeader | ErrorKind::NoLeader, message }) => last = message,
                Err(Error::Server { kind: ErrorKind::Busy, message }) if message.contains("not applied yet") => {
                    last = message
                }
                Err(Error::Unavailable(m)) => last = m,
                Err(e) => return Err(e),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(Error::Unavailable(format!("membership change not made: {last}")))
}

/// `member add`: as a learner; `voter` asks the leader to promote it once
/// it has caught up.
pub async fn member_add(cfg: &ClientConfig, id: u64, peer: &str, client: &str, voter: bool) -> Result<Members> {
    let kind = if voter { Kind::Add } else { Kind::AddLearner };
    let req = MemberChangeReq {
        kind: kind as i32,
        member_id: id,
        peer_addr: peer.into(),
        client_addr: client.into(),
        replaces: 0,
    };
    member_change(cfg, req).await
}

/// Removes member `id` (the leader hands over first if it is the one);
/// its id is never used again.
pub async fn member_remove(cfg: &ClientConfig, id: u64) -> Result<Members> {
    member_change(cfg, MemberChangeReq { kind: Kind::Remove as i32, member_id: id, ..Default::default() }).await
}

/// Makes caught-up learner `id` a voter.
pub async fn member_promote(cfg: &ClientConfig, id: u64) -> Result<Members> {
    member_change(cfg, MemberChangeReq { kind: Kind::Promote as i32, member_id: id, ..Default::default() }).await
}

/// `baton snapshot save`: a backup of the whole state at a linearizable
/// point (every write acknowledged before this call is in it), fetched in
/// chunks from one member and checked against its SHA-256. Returns the
/// encoded `BackupFile` and its index (server/src/backup.rs).
pub async fn snapshot_save(cfg: &ClientConfig) -> Result<(Vec<u8>, u64)> {
    let mut last = Error::Unavailable("no endpoint".into());
    for e in &cfg.endpoints {
        match save_from(cfg, e).await {
            Ok(x) => return Ok(x),
            Err(err @ Error::NoAuth(_)) => return Err(err),
            Err(err) => last = err,
        }
    }
    Err(last)
}

async fn save_from(cfg: &ClientConfig, endpoint: &str) -> Result<(Vec<u8>, u64)> {
    let chunk = |r: Response| match r.body {
        Some(response::Body::Snapshot(c)) => Ok(c),
        _ => Err(Error::unexpected()),
    };
    let req = |backup_id, offset| request::Body::Snapshot(baton_proto::SnapshotReq { backup_id, offset });
    let first = chunk(call(cfg, endpoint, req(0, 0)).await?)?;
    let mut data = Vec::with_capacity(first.total as usize);
    data.extend_from_slice(&first.data);
    while (data.len() as u64) < first.total {
        let c = chunk(call(cfg, endpoint, req(first.backup_id, data.len() as u64)).await?)?;
        if c.offset != data.len() as u64 || c.data.is_empty() || c.backup_id != first.backup_id {
            return Err(Error::Unavailable(format!("{endpoint}: the backup's chunks do not line up")));
        }
        data.extend_from_slice(&c.data);
    }
    let sha = ring::digest::digest(&ring::digest::SHA256, &data);
    if sha.as_ref() != &first.sha256[..] {
        return Err(Error::Unavailable(format!("{endpoint}: the backup's checksum does not match")));
    }
    let file = baton_proto::BackupFile {
        version: 1,
        index: first.index,
        term: first.term,
        cluster_id: first.cluster_id,
        sha256: first.sha256,
        state: data.into(),
    };
    use prost::Message as _;
    Ok((file.encode_to_vec(), first.index))
}

/// `member replace`: voter `old` leaves and caught-up learner `new`
/// becomes a voter, in one joint-consensus change. The leader answers once
/// the joint configuration is applied; this waits (up to `op_timeout`)
/// until the leader has also left it, so `old` is gone from the answer.
pub async fn member_replace(cfg: &ClientConfig, old: u64, new: u64) -> Result<Members> {
    let deadline = Instant::now() + cfg.op_timeout;
    let req = MemberChangeReq { kind: Kind::Replace as i32, member_id: new, replaces: old, ..Default::default() };
    let mut m = member_change(cfg, req).await?;
    while m.members.iter().any(|i| i.id == old) {
        if Instant::now() >= deadline {
            return Err(Error::Ambiguous(format!("member {old} is still in the (joint) configuration")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Ok(now) = members(cfg).await {
            m = now;
        }
    }
    Ok(m)
}

/// `member move-leader`: hands leadership to voter `id` and waits (up to
/// `op_timeout`) until the cluster says it leads.
pub async fn member_move_leader(cfg: &ClientConfig, id: u64) -> Result<Members> {
    let deadline = Instant::now() + cfg.op_timeout;
    member_change(cfg, MemberChangeReq { kind: Kind::MoveLeader as i32, member_id: id, ..Default::default() }).await?;
    loop {
        match members(cfg).await {
            Ok(m) if m.leader_id == id => return Ok(m),
            Ok(m) if Instant::now() >= deadline => {
                return Err(Error::Unavailable(format!(
                    "member {} still leads; member {id} did not take over",
                    m.leader_id
                )))
            }
            Err(e) if Instant::now() >= deadline => return Err(e),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// One member's status, or why it could not be had (within
/// `connect_timeout`).
pub async fn status(cfg: &ClientConfig, endpoint: &str) -> Result<MemberStatus> {
    let r = ask(cfg, endpoint, request::Body::Status(Default::default())).await?;
    match r.body {
        Some(response::Body::Status(s)) => Ok(s.into()),
        _ => Err(Error::unexpected()),
    }
}

/// Every endpoint's status, asked at once, in the order given.
pub async fn statuses(cfg: &ClientConfig, endpoints: &[String]) -> Vec<Result<MemberStatus>> {
    futures::future::join_all(endpoints.iter().map(|e| status(cfg, e))).await
}

/// The health rule, as `GET /health` on the member applies it.
pub fn healthy(s: &MemberStatus) -> std::result::Result<(), String> {
    s.healthy()
}

/// A member as `baton member list` prints it.
pub fn role(m: &MemberInfo) -> &'static str {
    if m.voter {
        "voter"
    } else {
        "learner"
    }
}
