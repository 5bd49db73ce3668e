//! Carrying out a client request's route (driver/route.rs has the rules;
//! replies go out through driver/execute.rs): proposals (`propose`: `origin`
//! = this member, `request_id` = the next of this member's counter,
//! `time_ms` = the wall clock at `now`; raft-rs refusing it, no leader
//! known, is `NO_LEADER` at once), the ReadIndex queue (reads.rs) and what
//! it serves (`serve`: the read, the attach with its watches, a new
//! backup), keepalives (the session layer, sessions.rs), watches,
//! membership changes (driver/members.rs) and backup chunks.

use super::*;
use crate::sessions::not_live_msg;

impl Driver {
    /// Who is asking on `conn` (acl.rs).
    pub(super) fn caller(&self, conn: ConnId) -> Caller {
        Caller::new(self.identities(conn), &self.followed.current.superusers)
    }

    /// What `conn` authenticated as.
    fn identities(&self, conn: ConnId) -> Vec<String> {
        self.conns.get(&conn).map(|c| c.tx.identities()).unwrap_or_default()
    }

    /// The settings as the state applied so far has them, and whether
    /// `conn`'s caller is one of their superusers: what an admin request
    /// is checked against again once its ReadIndex is applied (route.rs;
    /// settings.rs, "checked again"). [`Driver::settings`] catches up with
    /// the state only on the next tick.
    pub(super) fn power_as_applied(&self, conn: ConnId) -> (baton_proto::ClusterSettings, bool) {
        let settings = crate::settings::effective(self.sm().cluster().settings.as_ref(), &self.cfg);
        let superuser = Caller::new(self.identities(conn), &settings.superusers).superuser;
        (settings, superuser)
    }

    /// The cluster-wide settings this member follows (settings.rs; never
    /// locks the state: see `Driver::settings`).
    pub(super) fn settings(&self) -> baton_proto::ClusterSettings {
        self.followed.current.clone()
    }

    /// Room for `n` more watches on `conn` (the `max_watches` cap).
    pub(super) fn watch_room(&self, conn: ConnId, n: usize) -> Result<(), (ErrorCode, String)> {
        let (has, max) = (self.watches.count(conn), self.cfg.limits.max_watches);
        if has + n > max {
            return Err((
                ErrorCode::Busy,
                format!("this connection holds {has} watches, at most {max} (--max-watches)"),
            ));
        }
        Ok(())
    }

    pub(super) fn on_request(&mut self, conn: ConnId, req: Request, now: Instant) {
        let Some(c) = self.conns.get(&conn) else { return };
        let (session, secret) = (c.session, c.secret.clone());
        let st = self.state();
        let sm = read(&st);
        if let Some(sid) = session {
            self.sessions.touch(sid, &sm, now);
        }
        let caller = || self.caller(conn);
        let facts = route::ConnFacts { session, secret, caller: &caller, watches: self.watches.count(conn) };
        let leader_alive = self.leader_alive(now);
        // A create's FIRST watch (watches.rs, "The pushed grant") is set
        // when its entry applies here, not carried in the log.
        let first_watch = match &req.body {
            Some(request::Body::Create(_)) if !self.cfg.faults.no_first_watch() => req.first_watch_id,
            _ => 0,
        };
        let route = route::route(req, &facts, &sm, &self.cfg, &self.followed.current, leader_alive);
        drop(sm);
        self.carry_out(conn, route, first_watch, now);
    }

    /// Does what [`route::route`] decided.
    fn carry_out(&mut self, conn: ConnId, route: Route, first_watch: u64, now: Instant) {
        match route {
            Route::Reply(r) => self.reply(conn, r),
            Route::Propose { id, cmd } => {
                let waits = Waits { bind_session: false, first_watch };
                self.propose(conn, id, cmd, waits, now)
            }
            Route::NewSession { id, timeout_ms } => {
                let secret: [u8; 16] = self.rng.gen();
                let body = command::Body::NewSession(NewSession { timeout_ms, secret: secret.to_vec().into() });
                let waits = Waits { bind_session: true, first_watch: 0 };
                self.propose(conn, id, Command { body: Some(body), ..Default::default() }, waits, now);
            }
            Route::ReadIndex { req, min_index } => self.reads.push(Deferred { conn, req, since: now, min_index }),
            Route::WaitApplied { req, min_index } => {
                self.reads.wait(min_index, Deferred { conn, req, since: now, min_index })
            }
            Route::Serve(req) => self.serve(conn, &req, now),
            Route::Keepalive { id, session } => self.on_keepalive(conn, id, session, now),
            Route::AddWatch { id, spec } => {
                let st = self.state();
                let sm = read(&st);
                let (due, zxid) = (self.watches.add(conn, &spec, &sm), sm.applied());
                drop(sm);
                self.reply_ok(conn, id);
                if let Some(f) = due {
                    self.send_event(&f, zxid);
                }
            }
            Route::RemoveWatch { id, watch_id } => {
                self.watches.remove(conn, watch_id);
                self.reply_ok(conn, id);
            }
            Route::Status { id } => {
                let body = response::Body::Status(self.status());
                self.reply(conn, Response { id, zxid: self.sm().applied(), body: Some(body), ..Default::default() });
            }
            Route::Members { id } => {
                let body = response::Body::Members(self.members_resp());
                self.reply(conn, Response { id, zxid: self.sm().applied(), body: Some(body), ..Default::default() });
            }
            Route::MemberChange { id, change } => self.on_member_change(conn, id, &change, now),
            Route::BackupChunk { id, backup_id, offset } => self.send_backup_chunk(conn, id, backup_id, offset),
        }
    }

    /// A keepalive is answered OK only once a quorum has recorded the touch
    /// in the current leader's term (`sessions.rs`, the rule).
    pub(super) fn on_keepalive(&mut self, conn: ConnId, id: u64, session: Option<u64>, now: Instant) {
        let Some(sid) = session else {
            return self.reply_err(conn, id, ErrorCode::BadRequest, "no session attached to this connection");
        };
        let exists = self.sm().session_exists(sid);
        if self.cfg.faults.contact_from_local_answers() {
            // Deliberate bug: vouch from local state alone.
            return match exists {
                true => self.reply_ok(conn, id),
                false => self.reply_err(conn, id, ErrorCode::SessionExpired, format!("session {sid:#x} expired")),
            };
        }
        if !self.leader_alive(now) {
            // A member cut off from the leader cannot vouch for the session:
            // the majority side may be expiring it right now.
            return self.reply_err(conn, id, ErrorCode::NoLeader, "this member has no contact with a leader");
        }
        if let Some((code, msg)) = not_live_msg(sid, self.sm().session_state(sid)) {
            return self.reply_err(conn, id, code, msg);
        }
        if self.sessions.is_expiring(sid) {
            return self.reply_err(conn, id, ErrorCode::Busy, "this session's expiry is proposed; retry");
        }
        let st = self.state();
        let sm = read(&st);
        self.sessions.keepalive(conn, id, sid, &sm, now);
    }

    pub(super) fn propose(&mut self, conn: ConnId, client_id: u64, mut cmd: Command, waits: Waits, now: Instant) {
        let rid = self.pending.next_id();
        cmd.origin = self.cfg.id;
        cmd.request_id = rid;
        cmd.time_ms = self.clock.wall.at(now);
        match self.raw.propose(vec![], cmd.encode_to_vec()) {
            Ok(()) => {
                let Waits { bind_session, first_watch } = waits;
                self.pending.wait(rid, PendingWrite { conn, client_id, since: now, bind_session, first_watch });
            }
            Err(e) => {
                crate::metrics::proposal_failed("not_proposed", 1);
                self.reply_err(
                    conn,
                    client_id,
                    ErrorCode::NoLeader,
                    format!("proposal refused ({e}); no leader known, retry"),
                )
            }
        }
    }

    /// A new backup (backup.rs) of the state as applied now: a checkpoint
    /// of it goes to the store, and the snapshot thread encodes that
    /// checkpoint off the driver (syncer.rs); [`Driver::on_backup_built`]
    /// keeps it for its chunks and answers the first. One build at a time
    /// on a member (a snapshot or a backup): `BUSY` meanwhile, which the
    /// client retries.
    fn take_backup(&mut self, conn: ConnId, id: u64) {
        let (settings, superuser) = self.power_as_applied(conn);
        if !crate::settings::admin_allowed(&settings, superuser) {
            return self.reply_err(conn, id, ErrorCode::NoAuth, crate::settings::admin_refusal(&settings, "backups"));
        }
        if self.snapshot_building.is_some() || self.backup_building.is_some() {
            let msg = "a snapshot or another backup is being built on this member; retry";
            return self.reply_err(conn, id, ErrorCode::Busy, msg);
        }
        let mut batch = Batch::default();
        self.sm_mut().flush(&mut batch);
        if let Err(e) = self.raw.mut_store().stage_commit(&mut batch) {
            return self.reply_err(conn, id, ErrorCode::Internal, format!("no checkpoint for the backup: {e}"));
        }
        self.backup_building = Some((conn, id));
        self.io.persist.submit(SyncJob { backup: true, ..SyncJob::plain(batch) });
    }

    /// The snapshot thread's answer to [`Driver::take_backup`].
    pub(super) fn on_backup_built(&mut self, built: crate::syncer::BuiltBackup) {
        let Some((conn, id)) = self.backup_building.take() else { return };
        let (b, sha) = match built {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "a backup could not be built");
                return self.reply_err(conn, id, ErrorCode::Internal, format!("the backup could not be built: {e}"));
            }
        };
        let term = self.raw.raft.raft_log.term(b.index).unwrap_or(0);
        let backup_id = self.rng.gen_range(1..u64::MAX);
        let (index, bytes, ms) = (b.index, b.data.len(), b.took.as_millis() as u64);
        info!(backup_id, index, bytes, ms, "backup taken (built off the driver)");
        self.backup = Some(crate::backup::Taken::built(backup_id, index, term, b.data, sha));
        self.send_backup_chunk(conn, id, backup_id, 0);
    }

    /// Answers one chunk of the kept backup; the last one lets it go
    /// (backup.rs: it is 144 MB at 1M nodes).
    pub(super) fn send_backup_chunk(&mut self, conn: ConnId, id: u64, backup_id: u64, offset: u64) {
        let cluster_id = self.sm().cluster().cluster_id.clone();
        let chunk = match crate::backup::Taken::hand_out(&mut self.backup, backup_id, offset, &cluster_id) {
            Ok(c) => c,
            Err((code, msg)) => return self.reply_err(conn, id, code, msg),
        };
        if self.backup.is_none() {
            crate::memory::release();
        }
        let r = Response { id, zxid: chunk.index, body: Some(response::Body::Snapshot(chunk)), ..Default::default() };
        // Not capped by --max-reply-bytes: a chunk is at most backup::CHUNK.
        self.send_uncapped(conn, r);
    }

    /// Answers a read (or attach) from local state.
    pub(super) fn serve(&mut self, conn: ConnId, req: &Request, now: Instant) {
        use request::Body as B;
        let id = req.id;
        if let Some(B::Snapshot(_)) = &req.body {
            return self.take_backup(conn, id);
        }
        if let Some(B::ListUsers(_)) = &req.body {
            if !self.power_as_applied(conn).1 {
                return self.reply_err(conn, id, ErrorCode::NoAuth, super::route::LIST_USERS_REFUSED);
            }
            let sm = self.sm();
            let body = response::Body::Names(baton_proto::NamesResp { names: sm.user_names() });
            let r = Response { id, zxid: sm.applied(), body: Some(body), ..Default::default() };
            drop(sm);
            return self.reply(conn, r);
        }
        let caller = self.caller(conn);
        let (zxid, result) = {
            let sm = self.sm();
            let zxid = sm.applied();
            let result: Result<response::Body, (ErrorCode, String)> = match &req.body {
                Some(B::Get(_)) | Some(B::Exists(_)) | Some(B::GetAcl(_)) => local_read(&sm, &req.body, &caller),
                Some(B::Children(r)) => sm
                    .check_read(&r.path, &caller, "children")
                    .and_then(|_| sm.children(&r.path))
                    .map(|(mut children, stat)| {
                        if self.cfg.faults.grant_without_predecessor() {
                            let me = self.conns.get(&conn).and_then(|c| c.session).unwrap_or(0);
                            children.retain(|k| {
                                let owner = sm
                                    .stat_of(&format!("{}/{k}", r.path.trim_end_matches('/')))
                                    .map(|s| s.ephemeral_owner);
                                owner.is_none_or(|o| o == 0 || o == me)
                            });
                        }
                        response::Body::Children(ChildrenResp { children, stat: Some(stat) })
                    }),
                Some(B::Attach(_)) => Ok(response::Body::Empty(Empty {})),
                _ => Err((ErrorCode::BadRequest, "not a read".into())),
            };
            (zxid, result)
        };
        let mut due = None;
        let result = match (&req.body, result) {
            (Some(B::Attach(a)), Ok(body)) => self.attach(conn, a, now).map(|_| body),
            (Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)), Ok(body)) => {
                if let Some(spec) = &r.watch {
                    let st = self.state();
                    due = self.watches.add(conn, spec, &read(&st));
                }
                Ok(body)
            }
            (_, r) => r,
        };
        let resp = match result {
            Ok(body) => Response { id, zxid, body: Some(body), ..Default::default() },
            Err((code, msg)) => {
                let mut r = error_response(zxid, code, msg);
                r.id = id;
                r
            }
        };
        self.reply(conn, resp);
        if let Some(f) = due {
            self.send_event(&f, zxid);
        }
    }

    pub(super) fn attach(&mut self, conn: ConnId, a: &AttachReq, now: Instant) -> Result<(), (ErrorCode, String)> {
        self.sm().check_session(a.session_id, &a.secret)?;
        if self.sessions.is_expiring(a.session_id) {
            return Err((ErrorCode::Busy, "this session's expiry is proposed; retry".into()));
        }
        for spec in &a.watches {
            check_spec(spec, &self.cfg)?;
        }
        if !a.watches.is_empty() {
            self.watch_room(conn, a.watches.len())?;
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.session = Some(a.session_id);
            c.secret = a.secret.clone();
        }
        let st = self.state();
        let sm = read(&st);
        self.sessions.touch(a.session_id, &sm, now);
        let caller = self.caller(conn);
        for spec in &a.watches {
            // READ on the node, as the read or add_watch that first set it
            // needed (a one-shot exists watch needs nothing); a watch on a
            // node this connection may not read is not registered and
            // replays nothing (finding Z8: setWatches handed an
            // unauthenticated client every name under a node it could not
            // list).
            // (A FIRST watch, like it, names no node but its own.)
            let one_shot_exists = spec.kind == WatchKind::Exists as i32 && !spec.persistent;
            let first = spec.kind == WatchKind::First as i32;
            if !one_shot_exists && !first && sm.check_read(&spec.path, &caller, "watch").is_err() {
                continue;
            }
            let missed = missed_events(&sm, spec, a.last_zxid);
            let recursive = spec.kind == WatchKind::Recursive as i32;
            for (ty, path) in &missed {
                let f = Fired { conn, watch_id: spec.watch_id, ty: *ty, path: path.clone(), recursive };
                if self.visible(&sm, &f) {
                    self.send_event(&f, sm.applied());
                }
            }
            // A one-shot that fired is done; a persistent one goes on (and
            // a FIRST watch that is not due was not due at the check).
            if missed.is_empty() || spec.persistent || spec.kind == WatchKind::Recursive as i32 {
                if let Some(f) = self.watches.add(conn, spec, &sm) {
                    self.send_event(&f, sm.applied());
                }
            }
        }
        Ok(())
    }

    /// Whether `f` may go to its connection: an event of a recursive watch
    /// names a node below the watched one, and goes only to a connection
    /// that may READ that node (for a node that is gone, its nearest
    /// ancestor still there), as ZooKeeper 3.8.4 filters them
    /// (CVE-2024-23944). Other events name the watched node itself, which
    /// the watch's registration already checked.
    pub(super) fn visible(&self, sm: &StateMachine, f: &Fired) -> bool {
        if !f.recursive {
            return true;
        }
        let caller = self.caller(f.conn);
        let mut at = f.path.as_str();
        while at != "/" && sm.stat_of(at).is_none() {
            at = match at.rfind('/') {
                Some(0) | None => "/",
                Some(i) => &at[..i],
            };
        }
        sm.check_read(at, &caller, "watch").is_ok()
    }
}
