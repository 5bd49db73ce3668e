//! The driver's side of membership (the rules are in `membership.rs`):
//! change requests on the leader, applying `ConfChangeV2` entries, the
//! leader's automatic promotions, each member's report of its own
//! addresses, and telling the transport whom to connect to.

use baton_proto::{member_change_req::Kind, ConfContext, MemberChangeReq, MembersResp};

use super::*;
use crate::membership::{self, Plan, View};

impl Driver {
    /// The transport follows the configuration (called after anything that
    /// may change it: start, a snapshot, a change, an address report).
    pub(super) fn members_changed(&mut self) {
        let now = {
            let st = self.state();
            let sm = read(&st);
            membership::peer_addrs(self.raw.store().conf_state(), &sm, &self.cfg.peers)
        };
        if now != self.membership.addrs {
            info!(members = ?now, "members");
            self.io.peers.set_members(&now);
            self.membership.addrs = now;
        }
    }

    fn view_with<R>(&self, f: impl FnOnce(&View) -> R) -> R {
        let st = self.state();
        let sm = read(&st);
        let prs = self.raw.raft.prs();
        let matched = |id: u64| prs.get(id).map_or(0, |p| p.matched);
        let v = View {
            me: self.cfg.id,
            conf: self.raw.store().conf_state(),
            sm: &sm,
            matched: &matched,
            last_index: self.raw.raft.raft_log.last_index(),
            pending: self.raw.raft.has_pending_conf(),
        };
        f(&v)
    }

    pub(super) fn members_resp(&self) -> MembersResp {
        let leader = self.raw.raft.state == StateRole::Leader;
        let members = self
            .view_with(|v| membership::list(self.raw.store().conf_state(), v.sm, &self.cfg.peers, leader.then_some(v)));
        MembersResp {
            members,
            leader_id: self.raw.raft.leader_id,
            cluster_id: self.sm().cluster().cluster_id.clone(),
            answered_by: self.cfg.id,
            term: self.raw.raft.term,
        }
    }

    /// A change request (membership.rs rules 2-5).
    pub(super) fn on_member_change(&mut self, conn: ConnId, id: u64, req: &MemberChangeReq, now: Instant) {
        if self.raw.raft.state != StateRole::Leader {
            let leader = self.raw.raft.leader_id;
            let msg = match leader {
                0 => "no leader is known; retry".to_string(),
                l => format!("member {l} is the leader; membership changes go to it"),
            };
            return self.reply_err(conn, id, ErrorCode::NotLeader, msg);
        }
        // Power as of every entry before this term (settings.rs, "checked
        // again"): until then a new leader may not have applied the
        // settings record its log holds.
        if !self.sessions.caught_up(self.sm().applied()) {
            let msg =
                format!("member {} was just elected and is applying the entries before its term; retry", self.cfg.id);
            return self.reply_err(conn, id, ErrorCode::NoLeader, msg);
        }
        let (settings, superuser) = self.power_as_applied(conn);
        if !crate::settings::admin_allowed(&settings, superuser) {
            let msg = crate::settings::admin_refusal(&settings, "membership changes");
            return self.reply_err(conn, id, ErrorCode::NoAuth, msg);
        }
        match self.view_with(|v| membership::plan(v, req)) {
            Err((code, msg)) => self.reply_err(conn, id, code, msg),
            Ok(Plan::MoveLeader(to)) => {
                info!(to, "moving leadership to member {to}");
                self.raw.transfer_leader(to);
                self.reply(
                    conn,
                    Response {
                        id,
                        zxid: self.sm().applied(),
                        body: Some(response::Body::Members(self.members_resp())),
                        ..Default::default()
                    },
                );
            }
            Ok(Plan::TransferTo(to)) => {
                info!(to, "removing the leader: leadership moves to member {to} first");
                self.raw.transfer_leader(to);
                let msg = format!("leadership is moving to member {to}; send the removal to it");
                self.reply_err(conn, id, ErrorCode::NotLeader, msg);
            }
            Ok(Plan::Propose(mut cc)) => {
                let rid = self.pending.next_id();
                let member = matches!(Kind::try_from(req.kind), Ok(Kind::Add) | Ok(Kind::AddLearner)).then(|| {
                    baton_proto::MemberRecord {
                        id: req.member_id,
                        peer_addr: req.peer_addr.clone(),
                        client_addr: req.client_addr.clone(),
                        auto_promote: req.kind == Kind::Add as i32,
                    }
                });
                cc.context = ConfContext { origin: self.cfg.id, request_id: rid, member }.encode_to_vec().into();
                info!(change = ?cc.changes, "proposing a membership change");
                if let Err(e) = self.raw.propose_conf_change(vec![], cc) {
                    return self.reply_err(conn, id, ErrorCode::NoLeader, format!("not proposed: {e}"));
                }
                self.pending
                    .wait(rid, PendingWrite { conn, client_id: id, since: now, bind_session: false, first_watch: 0 });
            }
        }
    }

    /// Applies a configuration change entry: raft-rs's configuration, the
    /// members' addresses, and the new `ConfState` staged into `batch` with
    /// the applied index.
    pub(super) fn apply_conf_entry(&mut self, e: &Entry, batch: &mut Batch) -> anyhow::Result<()> {
        let cc = conf_change_of(e)?;
        let ctx = ConfContext::decode(&cc.context[..]).unwrap_or_default();
        let result = match self.raw.apply_conf_change(&cc) {
            Ok(cs) => {
                self.record_members(e.index, &cc, &ctx);
                let joint = !cs.voters_outgoing.is_empty();
                info!(index = e.index, voters = ?cs.voters, learners = ?cs.learners, joint, "configuration changed");
                let all = cs.voters.iter().chain(&cs.learners).chain(&cs.voters_outgoing).chain(&cs.learners_next);
                if all.clone().all(|&m| m != self.cfg.id) && !cs.voters.is_empty() {
                    error!("this member was removed from the cluster: it takes no further part in it");
                    self.membership.removed = true;
                }
                self.raw.mut_store().set_conf_state(cs, batch)?;
                Ok(())
            }
            Err(err) => {
                warn!(index = e.index, "membership change refused: {err}");
                self.sm_mut().skip(e.index);
                Err(err.to_string())
            }
        };
        self.members_changed();
        if ctx.origin == self.cfg.id {
            if let Some(p) = self.pending.take(ctx.request_id) {
                let answer = match result {
                    Ok(()) => {
                        let body = Some(response::Body::Members(self.members_resp()));
                        let resp = Response { id: p.client_id, zxid: e.index, body, ..Default::default() };
                        Effect::Respond { conn: p.conn, resp }
                    }
                    Err(msg) => Effect::reply(p.conn, p.client_id, ErrorCode::BadRequest, msg),
                };
                self.deliver(answer, e.index);
            }
        }
        Ok(())
    }

    /// The state's side of an applied change: a new learner's record, a
    /// promoted member's auto-promotion done, a removed member's record
    /// gone; the entry's index applied.
    fn record_members(&mut self, index: u64, cc: &ConfChangeV2, ctx: &ConfContext) {
        let mut sm = self.sm_mut();
        for c in &cc.changes {
            match c.get_change_type() {
                ConfChangeType::AddLearnerNode => {
                    if let Some(m) = ctx.member.as_ref().filter(|m| m.id == c.node_id) {
                        sm.set_member(index, m);
                    }
                }
                ConfChangeType::AddNode => sm.set_auto_promote(c.node_id, false),
                ConfChangeType::RemoveNode => sm.remove_member(index, c.node_id),
            }
        }
        sm.skip(index);
    }

    /// The leader's automatic promotion of a caught-up learner (rule 3).
    pub(super) fn maybe_promote(&mut self) {
        if self.raw.raft.state != StateRole::Leader {
            return;
        }
        let Some(id) = self.view_with(membership::next_promotion) else { return };
        let req = MemberChangeReq { kind: Kind::Promote as i32, member_id: id, ..Default::default() };
        if let Ok(Plan::Propose(mut cc)) = self.view_with(|v| membership::plan(v, &req)) {
            cc.context = ConfContext { origin: self.cfg.id, request_id: 0, member: None }.encode_to_vec().into();
            info!(member = id, "member caught up: promoting it to voter");
            if let Err(e) = self.raw.propose_conf_change(vec![], cc) {
                debug!("promotion not proposed: {e}");
            }
        }
    }

    /// This member's report of its own addresses (rule 6), at most once per
    /// election timeout, once it has a leader.
    pub(super) fn maybe_report(&mut self, now: Instant) {
        if self.raw.raft.leader_id == 0
            || self.membership.reported.is_some_and(|t| now.duration_since(t) < self.cfg.election_timeout())
        {
            return;
        }
        let rec = {
            let st = self.state();
            let sm = read(&st);
            let (p, c) = (&self.cfg.advertise_peer_addr, &self.cfg.advertise_client_addr);
            membership::self_report(self.cfg.id, self.raw.store().conf_state(), &sm, p, c)
        };
        let Some(rec) = rec else { return };
        self.membership.reported = Some(now);
        self.propose_own(command::Body::Member(rec), now, "address report");
    }
}

/// A configuration change entry as a `ConfChangeV2` (a V1 change becomes
/// a single-step one).
fn conf_change_of(e: &Entry) -> anyhow::Result<ConfChangeV2> {
    let mut cc = ConfChangeV2::default();
    if e.entry_type == EntryType::EntryConfChange {
        let mut v1 = ConfChange::default();
        protobuf::Message::merge_from_bytes(&mut v1, &e.data)?;
        let mut one = ConfChangeSingle::default();
        one.set_change_type(v1.get_change_type());
        one.node_id = v1.node_id;
        cc.mut_changes().push(one);
        cc.context = v1.context;
    } else {
        protobuf::Message::merge_from_bytes(&mut cc, &e.data)?;
    }
    Ok(cc)
}
