//! Membership: who the cluster's members are, and how that changes.
//!
//! The configuration (voters and learners) is raft-rs's `ConfState`. It
//! changes only through `ConfChangeV2` log entries; each one is applied in
//! log order on every member, and the new `ConfState` is written in the
//! same batch as the applied index (driver/ready.rs), so a restart never
//! sees one without the other. Every member's addresses live in the state
//! machine's cluster record (cluster.rs), in snapshots with the rest.
//!
//! The rules:
//! 1. A new cluster's founding members (`--peers`) start from a snapshot at
//!    log index 1 holding their configuration. A member started with
//!    `--join` starts empty and learns the configuration from the leader's
//!    snapshot, never by replaying the log from the start (a log replayed
//!    from index 1 holds no founding configuration: it would see a cluster
//!    with no voters and could elect itself).
//! 2. Only the leader accepts a change (`NOT_LEADER` elsewhere, naming the
//!    leader), one at a time (`BUSY` while one is not yet applied), and
//!    answers once the entry is applied. A change raft-rs refuses on apply
//!    (the same refusal on every member) changes nothing and is answered
//!    `BAD_REQUEST`.
//! 3. A member is added as a learner: it receives the log but does not vote
//!    and is not counted in any quorum. `ADD` asks the leader to promote it
//!    once it is caught up (within [`PROMOTE_LAG`] entries of the leader's
//!    log); `ADD_LEARNER` keeps it a learner until `PROMOTE`, which is
//!    refused while it is not caught up. A voter that has not caught up
//!    would count towards quorums it cannot help make.
//! 4. Ids are never reused: an id once removed cannot be added again (a
//!    machine that comes back with the old id and old data would hold votes
//!    and entries of another life).
//! 5. Removing the leader first moves leadership to the most caught-up
//!    other voter; the request is answered `NOT_LEADER` and the client sends
//!    it to the new leader.
//! 6. Each member reports its own addresses (`--advertise-*`) as a log entry
//!    when the recorded ones differ; a report for an id outside the
//!    configuration changes nothing. A member dials the addresses it was
//!    started with (`--peers`, `--join`) before recorded ones ([`peer_addrs`]).
//! 9. `REPLACE` swaps a voter for a caught-up learner in one change of two
//!    steps (raft-rs joint consensus: the learner becomes a voter and the
//!    old voter leaves together; while joint, decisions need a majority of
//!    both the old and the new voters; the leader leaves the joint
//!    configuration on its own once it is applied). Replacing the leader
//!    moves leadership first (rule 5).
//! 8. `MOVE_LEADER` hands leadership to a caught-up voter (raft-rs's
//!    leader transfer: the target campaigns at once); the request is
//!    answered once the leader has sent the hand-over, and the client
//!    waits until the target leads.
//! 7. A removed member is refused by every peer (cluster.rs rule 2), and one
//!    that comes back finds itself outside the configuration.

use std::collections::BTreeMap;

use baton_proto::{member_change_req::Kind, ErrorCode, MemberChangeReq, MemberInfo, MemberRecord};
use raft::prelude::{ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState};

use crate::state::StateMachine;

/// A learner within this many entries of the leader's last index is caught
/// up (may be promoted).
pub const PROMOTE_LAG: u64 = 1000;

/// Every id in the configuration, voters first.
pub fn ids(cs: &ConfState) -> Vec<u64> {
    let mut v: Vec<u64> = cs.voters.iter().chain(&cs.voters_outgoing).chain(&cs.learners).copied().collect();
    v.sort_unstable();
    v.dedup();
    v
}

pub fn is_voter(cs: &ConfState, id: u64) -> bool {
    cs.voters.contains(&id) || cs.voters_outgoing.contains(&id)
}

pub fn is_learner(cs: &ConfState, id: u64) -> bool {
    cs.learners.contains(&id) || cs.learners_next.contains(&id)
}

/// The peer address this member dials for every member: the one it was
/// started with (`--peers` or `--join`: the operator's word for this
/// member, e.g. a proxy in the Jepsen harness), else the recorded one.
/// With no configuration yet (a joining member before the leader's
/// snapshot), the start addresses.
pub fn peer_addrs(cs: &ConfState, sm: &StateMachine, start: &BTreeMap<u64, String>) -> BTreeMap<u64, String> {
    let ids = ids(cs);
    if ids.is_empty() {
        return start.clone();
    }
    ids.into_iter()
        .filter_map(|id| {
            let recorded = || sm.member(id).map(|m| m.peer_addr.clone()).filter(|a| !a.is_empty());
            start.get(&id).cloned().or_else(recorded).map(|a| (id, a))
        })
        .collect()
}

/// What the leader does with a change request.
#[derive(Debug, PartialEq)]
pub enum Plan {
    Propose(ConfChangeV2),
    /// Rule 5: move leadership to this voter first.
    TransferTo(u64),
    /// Rule 8: move leadership to this voter (nothing else).
    MoveLeader(u64),
}

/// What the leader knows when it judges a change.
pub struct View<'a> {
    pub me: u64,
    pub conf: &'a ConfState,
    pub sm: &'a StateMachine,
    /// raft-rs's matched index of a member (0 if unknown).
    pub matched: &'a dyn Fn(u64) -> u64,
    pub last_index: u64,
    /// A change is proposed and not yet applied.
    pub pending: bool,
}

type Refusal = (ErrorCode, String);

/// Rules 2-5 for one request (the caller checks that it is the leader).
pub fn plan(v: &View, req: &MemberChangeReq) -> Result<Plan, Refusal> {
    let id = req.member_id;
    if id == 0 {
        return Err((ErrorCode::BadRequest, "member id 0 is reserved".into()));
    }
    if v.pending {
        return Err((ErrorCode::Busy, "another membership change is not applied yet; retry".into()));
    }
    let kind = Kind::try_from(req.kind).map_err(|_| (ErrorCode::BadRequest, "unknown member change".to_string()))?;
    let single = |t: ConfChangeType| {
        let mut c = ConfChangeSingle::default();
        c.set_change_type(t);
        c.node_id = id;
        c
    };
    let member = ids(v.conf).contains(&id);
    let change = match kind {
        Kind::Add | Kind::AddLearner => {
            if member {
                return Err((ErrorCode::NodeExists, format!("member {id} is already in the configuration")));
            }
            if v.sm.cluster().removed.contains(&id) {
                return Err((
                    ErrorCode::NodeExists,
                    format!("member {id} was removed; ids are never reused, add the machine with a new id"),
                ));
            }
            for (what, a) in [("--peer-addr", &req.peer_addr), ("--client-addr", &req.client_addr)] {
                crate::config::check_addr(a).map_err(|e| (ErrorCode::BadRequest, format!("{what}: {e}")))?;
            }
            single(ConfChangeType::AddLearnerNode)
        }
        Kind::Remove => {
            if !member {
                return Err((ErrorCode::NoNode, format!("member {id} is not in the configuration")));
            }
            if id == v.me {
                return hand_over(v, "remove");
            }
            single(ConfChangeType::RemoveNode)
        }
        Kind::Promote => {
            if is_voter(v.conf, id) {
                return Err((ErrorCode::NodeExists, format!("member {id} is a voter already")));
            }
            if !is_learner(v.conf, id) {
                return Err((ErrorCode::NoNode, format!("member {id} is not in the configuration")));
            }
            caught_up(v, id, "promote it")?;
            single(ConfChangeType::AddNode)
        }
        Kind::Replace => {
            let old = req.replaces;
            if !is_voter(v.conf, old) {
                return Err((ErrorCode::NoNode, format!("member {old} is not a voter")));
            }
            if !is_learner(v.conf, id) {
                return Err((ErrorCode::NoNode, format!("member {id} is not a learner (add it with --learner first)")));
            }
            caught_up(v, id, "replace")?;
            if old == v.me {
                return hand_over(v, "replace");
            }
            let mut cc = ConfChangeV2::default();
            cc.set_transition(ConfChangeTransition::Auto);
            let mut new = single(ConfChangeType::AddNode);
            new.node_id = id;
            let mut gone = single(ConfChangeType::RemoveNode);
            gone.node_id = old;
            cc.mut_changes().push(new);
            cc.mut_changes().push(gone);
            return Ok(Plan::Propose(cc));
        }
        Kind::MoveLeader => {
            if id == v.me {
                return Err((ErrorCode::NodeExists, format!("member {id} leads already")));
            }
            if !is_voter(v.conf, id) {
                return Err((ErrorCode::NoNode, format!("member {id} is not a voter")));
            }
            let lag = lag(v, id);
            if lag > PROMOTE_LAG {
                return Err((ErrorCode::Busy, format!("member {id} is {lag} entries behind; move leadership later")));
            }
            return Ok(Plan::MoveLeader(id));
        }
    };
    let mut cc = ConfChangeV2::default();
    cc.set_transition(ConfChangeTransition::Auto);
    cc.mut_changes().push(change);
    Ok(Plan::Propose(cc))
}

/// A learner within [`PROMOTE_LAG`] of the leader's log (rule 3).
fn caught_up(v: &View, id: u64, then: &str) -> Result<(), Refusal> {
    let lag = lag(v, id);
    if lag > PROMOTE_LAG || (v.matched)(id) == 0 {
        return Err((
            ErrorCode::Busy,
            format!("member {id} is {lag} entries behind the leader; {then} once caught up"),
        ));
    }
    Ok(())
}

/// Rule 5: the leader leaves only after handing leadership to the most
/// caught-up other voter.
fn hand_over(v: &View, what: &str) -> Result<Plan, Refusal> {
    let best = v.conf.voters.iter().filter(|&&o| o != v.me).max_by_key(|&&o| ((v.matched)(o), std::cmp::Reverse(o)));
    match best {
        Some(&to) => Ok(Plan::TransferTo(to)),
        None => Err((ErrorCode::BadRequest, format!("cannot {what} the only voter"))),
    }
}

fn lag(v: &View, id: u64) -> u64 {
    v.last_index.saturating_sub((v.matched)(id))
}

/// Rule 3: the first learner the leader should promote now.
pub fn next_promotion(v: &View) -> Option<u64> {
    if v.pending {
        return None;
    }
    v.conf
        .learners
        .iter()
        .copied()
        .find(|&id| v.sm.member(id).is_some_and(|m| m.auto_promote) && (v.matched)(id) > 0 && lag(v, id) <= PROMOTE_LAG)
}

/// Rule 6: the record this member should report about itself, if any.
pub fn self_report(me: u64, cs: &ConfState, sm: &StateMachine, peer: &str, client: &str) -> Option<MemberRecord> {
    if !ids(cs).contains(&me) {
        return None;
    }
    let same = sm.member(me).is_some_and(|m| m.peer_addr == peer && m.client_addr == client);
    (!same).then(|| MemberRecord { id: me, peer_addr: peer.into(), client_addr: client.into(), auto_promote: false })
}

/// The configuration as `baton member list` shows it.
pub fn list(
    cs: &ConfState,
    sm: &StateMachine,
    start: &BTreeMap<u64, String>,
    progress: Option<&View>,
) -> Vec<MemberInfo> {
    let peers = peer_addrs(cs, sm, start);
    ids(cs)
        .into_iter()
        .map(|id| {
            let rec = sm.member(id);
            let (matched, lag) = match progress {
                Some(v) => ((v.matched)(id), lag(v, id)),
                None => (0, 0),
            };
            MemberInfo {
                id,
                peer_addr: peers.get(&id).cloned().unwrap_or_default(),
                client_addr: rec.map(|m| m.client_addr.clone()).unwrap_or_default(),
                voter: is_voter(cs, id),
                matched,
                lag,
                auto_promote: rec.is_some_and(|m| m.auto_promote),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(voters: &[u64], learners: &[u64]) -> ConfState {
        ConfState::from((voters.to_vec(), learners.to_vec()))
    }

    fn req(kind: Kind, id: u64) -> MemberChangeReq {
        MemberChangeReq {
            kind: kind as i32,
            member_id: id,
            peer_addr: "10.0.0.4:7201".into(),
            client_addr: "db4.example:7101".into(),
            replaces: 0,
        }
    }

    #[test]
    fn the_change_rules() {
        let mut sm = StateMachine::new();
        let cs = conf(&[1, 2, 3], &[4]);
        let matched = |id: u64| match id {
            1 => 5000,
            2 => 4990,
            3 => 3900,
            4 => 3000,
            _ => 0,
        };
        let v = View { me: 1, conf: &cs, sm: &sm, matched: &matched, last_index: 5000, pending: false };
        // Rule 3: added as a learner.
        let Ok(Plan::Propose(cc)) = plan(&v, &req(Kind::Add, 5)) else { panic!("not proposed") };
        assert_eq!(cc.changes[0].get_change_type(), ConfChangeType::AddLearnerNode);
        assert_eq!(plan(&v, &req(Kind::Add, 2)).unwrap_err().0, ErrorCode::NodeExists);
        let mut bad = req(Kind::Add, 5);
        bad.peer_addr = "nowhere".into();
        assert_eq!(plan(&v, &bad).unwrap_err().0, ErrorCode::BadRequest);
        // Promotion waits for the learner to catch up (2000 behind).
        assert_eq!(plan(&v, &req(Kind::Promote, 4)).unwrap_err().0, ErrorCode::Busy);
        assert_eq!(plan(&v, &req(Kind::Promote, 2)).unwrap_err().0, ErrorCode::NodeExists);
        // Rule 5: removing the leader moves leadership to the best voter.
        assert_eq!(plan(&v, &req(Kind::Remove, 1)), Ok(Plan::TransferTo(2)));
        assert!(matches!(plan(&v, &req(Kind::Remove, 3)), Ok(Plan::Propose(_))));
        assert_eq!(plan(&v, &req(Kind::Remove, 9)).unwrap_err().0, ErrorCode::NoNode);
        // Rule 9: a caught-up learner replaces a voter in one joint change.
        let mut r = req(Kind::Replace, 4);
        r.replaces = 3;
        assert_eq!(plan(&v, &r).unwrap_err().0, ErrorCode::Busy, "member 4 is 2000 behind");
        let near = |id: u64| if id == 4 { 4990 } else { matched(id) };
        let v2 = View { matched: &near, ..v };
        let Ok(Plan::Propose(cc)) = plan(&v2, &r) else { panic!("not proposed") };
        assert_eq!(cc.changes.len(), 2, "joint: two changes at once");
        r.replaces = 1;
        assert_eq!(plan(&v2, &r), Ok(Plan::TransferTo(2)), "replacing the leader moves leadership first");
        // Rule 8: to a caught-up voter only.
        assert_eq!(plan(&v, &req(Kind::MoveLeader, 2)), Ok(Plan::MoveLeader(2)));
        assert_eq!(plan(&v, &req(Kind::MoveLeader, 3)).unwrap_err().0, ErrorCode::Busy);
        assert_eq!(plan(&v, &req(Kind::MoveLeader, 4)).unwrap_err().0, ErrorCode::NoNode);
        // Rule 2: one at a time.
        let busy = View { pending: true, ..v };
        assert_eq!(plan(&busy, &req(Kind::Remove, 3)).unwrap_err().0, ErrorCode::Busy);
        // Rule 4: ids are never reused.
        sm.remove_member(10, 7);
        let v = View { me: 1, conf: &cs, sm: &sm, matched: &matched, last_index: 5000, pending: false };
        assert_eq!(plan(&v, &req(Kind::Add, 7)).unwrap_err().0, ErrorCode::NodeExists);
    }

    #[test]
    fn auto_promotion_and_self_reports() {
        let mut sm = StateMachine::new();
        let cs = conf(&[1, 2, 3], &[4, 5]);
        sm.set_member(
            2,
            &MemberRecord { id: 4, peer_addr: "a:1".into(), client_addr: "b:2".into(), auto_promote: true },
        );
        sm.set_member(
            3,
            &MemberRecord { id: 5, peer_addr: "c:1".into(), client_addr: "d:2".into(), auto_promote: false },
        );
        let far = |id: u64| if id == 4 { 10 } else { 5000 };
        let v = View { me: 1, conf: &cs, sm: &sm, matched: &far, last_index: 5000, pending: false };
        assert_eq!(next_promotion(&v), None);
        let near = |_: u64| 4500;
        let v = View { matched: &near, ..v };
        assert_eq!(next_promotion(&v), Some(4));
        // Rule 6.
        assert!(self_report(4, &cs, &sm, "a:1", "b:2").is_none());
        assert_eq!(self_report(4, &cs, &sm, "a:9", "b:2").map(|r| r.peer_addr), Some("a:9".into()));
        assert!(self_report(9, &cs, &sm, "x:1", "y:2").is_none());
        // Addresses: the start ones first (a proxy, say), then recorded.
        let start: BTreeMap<u64, String> = [(1, "s1:1".to_string()), (4, "proxy:1".to_string())].into();
        let peers = peer_addrs(&cs, &sm, &start);
        assert_eq!(peers.get(&4).map(String::as_str), Some("proxy:1"));
        assert_eq!(peers.get(&5).map(String::as_str), Some("c:1"));
        assert_eq!(peers.get(&1).map(String::as_str), Some("s1:1"));
        assert!(!peers.contains_key(&2));
        assert_eq!(peer_addrs(&ConfState::default(), &sm, &start), start);
    }
}
