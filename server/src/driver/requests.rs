//! What the driver answers clients: writes are checked and proposed,
//! linearizable reads and attaches queued for a ReadIndex, keepalives handed
//! to the session layer, local reads served; and the listeners' fast path
//! for local reads that needs no driver turn.
//!
//! Every request on a connection bound to a session touches the session
//! (sessions.rs). Then, by kind:
//! - **Writes** (`create`, `set`, `delete`, `multi`, `close_session`,
//!   `set_acl`, `add_user`, `remove_user`, `claim_session`): the connection must be bound to
//!   a session (`BAD_REQUEST`) that exists here (`SESSION_EXPIRED`);
//!   `precheck_write` refuses a `multi` over `--max-multi-ops`
//!   (`TOO_LARGE`), an empty op in a `multi` (`BAD_REQUEST`), `seq` 0
//!   (`BAD_REQUEST`), data over 1 MiB (`TOO_LARGE`) and an invalid path
//!   (`INVALID_PATH`). None of these refusals reaches the log, so none is
//!   cached: a retry with the same `seq` runs normally. Then `propose`
//!   wraps the request in a `Command` (`origin` = this member,
//!   `request_id` = the next of this member's counter, `time_ms` = the wall
//!   clock at `now`; the write carries the session's secret and the
//!   connection's identities) and records it as pending; raft-rs refusing
//!   it (no leader known) is `NO_LEADER` at once.
//! - **`create_session`**: `BUSY` over `--max-sessions`, else the timeout
//!   is negotiated (`Config::negotiate_timeout`), a random secret drawn and
//!   a `NewSession` entry proposed; the connection is bound when it applies.
//! - **Linearizable reads** (`get`, `exists`, `children`, `get_acl`) and a
//!   new backup (`snapshot` with `backup_id` 0) wait for the turn's
//!   ReadIndex (reads.rs) and are served by `serve`. A watch in a read is
//!   checked first (`check_spec`: a valid path and a known kind, and room
//!   under `--max-watches`) and registered in `serve`, in the same step
//!   that reads the state.
//! - **`attach`**: refused `NO_LEADER` by a member that has not heard from
//!   a leader within an election timeout, else queued like a linearizable
//!   read and served once the member has applied both the ReadIndex and the
//!   client's `last_zxid`. Then `attach` checks the secret, that this leader
//!   has not proposed the session's expiry (`BUSY`), and *every* watch
//!   (`check_spec`, `--max-watches`): one bad watch fails the whole attach,
//!   and nothing is bound or registered. A lagging member or one cut off
//!   from the leader never resumes a session whose expiry committed.
//! - **`keepalive`**: `on_keepalive`, then the session layer answers it
//!   once a quorum recorded the touch (sessions.rs).
//! - **Answered at once from local state**: stale reads with a watch,
//!   `add_watch` (registered at the current applied index, nothing replayed),
//!   `remove_watch`, `status`, `whoami`, `members`, `list_users`, a backup's
//!   next chunk.
//! - **`member_change`**: driver/members.rs (the rules: membership.rs).
//! - **Stale reads without a watch** never reach the driver: the listener
//!   answers them from the shared state (view.rs `fast_read`; not when deliberate
//!   bugs are on, which act in the driver).

use super::*;

impl Driver {
    /// Sends a response; one over `max_reply_bytes` is answered TOO_LARGE
    /// instead (a children list of millions, say).
    pub(super) fn reply(&self, conn: ConnId, resp: Response) {
        let Some(c) = self.conns.get(&conn) else { return };
        let resp = capped(resp, self.cfg.limits.max_reply_bytes);
        c.tx.send(ServerFrame { frame: Some(baton_proto::server_frame::Frame::Response(resp)) });
    }

    /// Who is asking on `conn` (acl.rs).
    pub(super) fn caller(&self, conn: ConnId) -> Caller {
        let ids = self.conns.get(&conn).map(|c| c.tx.identities()).unwrap_or_default();
        Caller::new(ids, &self.settings.superusers)
    }

    /// The cluster-wide settings this member follows (settings.rs; never
    /// locks the state: see `Driver::settings`).
    pub(super) fn settings(&self) -> baton_proto::ClusterSettings {
        self.settings.clone()
    }

    /// Room for `n` more watches on `conn` (the `max_watches` cap).
    fn watch_room(&self, conn: ConnId, n: usize) -> Result<(), (ErrorCode, String)> {
        let (has, max) = (self.watches.count(conn), self.cfg.limits.max_watches);
        if has + n > max {
            return Err((
                ErrorCode::Busy,
                format!("this connection holds {has} watches, at most {max} (--max-watches)"),
            ));
        }
        Ok(())
    }

    /// An empty success at the current applied index.
    pub(super) fn reply_ok(&self, conn: ConnId, id: u64) {
        let r = Response {
            id,
            zxid: self.sm().applied(),
            body: Some(response::Body::Empty(Empty {})),
            ..Default::default()
        };
        self.reply(conn, r);
    }

    pub(super) fn reply_err(&self, conn: ConnId, id: u64, code: ErrorCode, msg: impl Into<String>) {
        let mut r = error_response(self.sm().applied(), code, msg);
        r.id = id;
        self.reply(conn, r);
    }

    pub(super) fn on_request(&mut self, conn: ConnId, req: Request, now: Instant) {
        let Some(c) = self.conns.get(&conn) else { return };
        let session = c.session;
        let secret = c.secret.clone();
        if let Some(sid) = session {
            let st = self.state();
            let sm = read(&st);
            self.sessions.touch(sid, &sm, now);
        }
        let id = req.id;
        use request::Body as B;
        match &req.body {
            None => self.reply_err(conn, id, ErrorCode::BadRequest, "empty or unknown request (newer protocol?)"),
            Some(B::Status(_)) => {
                let r = Response {
                    id,
                    zxid: self.sm().applied(),
                    body: Some(response::Body::Status(self.status())),
                    ..Default::default()
                };
                self.reply(conn, r);
            }
            Some(B::CreateSession(cs)) => {
                let max = self.cfg.limits.max_sessions;
                if self.sm().session_count() >= max {
                    let msg = format!("the cluster has {max} sessions (--max-sessions); retry later");
                    return self.reply_err(conn, id, ErrorCode::Busy, msg);
                }
                let timeout = self.cfg.negotiate_timeout(cs.timeout_ms);
                let secret: [u8; 16] = self.rng.gen();
                let cmd = Command {
                    body: Some(command::Body::NewSession(NewSession {
                        timeout_ms: timeout,
                        secret: secret.to_vec().into(),
                    })),
                    ..Default::default()
                };
                self.propose(conn, id, cmd, true, now);
            }
            Some(B::Attach(a)) => {
                // Checked against a linearizable state (a lagging member or
                // one cut off from the leader must not resume a session whose
                // expiry committed), at or past what the client saw.
                let min_index = a.last_zxid;
                if self.cfg.faults.attach_from_local_state() {
                    // Deliberate bug: no leader check, no ReadIndex.
                    self.reads.wait(min_index, Deferred { conn, req, since: now, min_index });
                    return;
                }
                if !self.leader_alive(now) {
                    return self.reply_err(conn, id, ErrorCode::NoLeader, "this member has no contact with a leader");
                }
                self.reads.push(Deferred { conn, req, since: now, min_index });
            }
            Some(B::Keepalive(_)) => self.on_keepalive(conn, id, session, now),
            Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)) | Some(B::GetAcl(r)) => {
                let checked = r.watch.as_ref().map(|w| check_spec(w).and_then(|_| self.watch_room(conn, 1)));
                if let Some(Err((code, msg))) = checked {
                    return self.reply_err(conn, id, code, msg);
                }
                if r.stale || self.cfg.faults.stale_reads() {
                    self.serve(conn, &req, now);
                } else {
                    self.reads.push(Deferred { conn, req, since: now, min_index: 0 });
                }
            }
            Some(B::AddWatch(w)) => {
                let Some(spec) = w.watch.clone() else {
                    return self.reply_err(conn, id, ErrorCode::BadRequest, "add_watch without a watch");
                };
                let caller = self.caller(conn);
                let allowed = check_spec(&spec)
                    .and_then(|_| self.watch_room(conn, 1))
                    .and_then(|_| self.sm().check_read(&spec.path, &caller, "watch"));
                if let Err((code, msg)) = allowed {
                    return self.reply_err(conn, id, code, msg);
                }
                let st = self.state();
                self.watches.add(conn, &spec, &read(&st));
                self.reply_ok(conn, id);
            }
            Some(B::RemoveWatch(rw)) => {
                self.watches.remove(conn, rw.watch_id);
                self.reply_ok(conn, id);
            }
            Some(B::Auth(_)) => {
                self.reply_err(conn, id, ErrorCode::BadRequest, "auth is answered by the listener; retry")
            }
            Some(B::Whoami(_)) => {
                let mut names = vec![crate::acl::ANYONE.to_string()];
                names.extend(self.caller(conn).identities);
                let body = response::Body::Names(NamesResp { names });
                self.reply(conn, Response { id, zxid: self.sm().applied(), body: Some(body), ..Default::default() });
            }
            Some(B::Snapshot(s)) => {
                let settings = self.settings();
                if !crate::settings::admin_allowed(&settings, self.caller(conn).superuser) {
                    let msg = crate::settings::admin_refusal(&settings, "backups");
                    return self.reply_err(conn, id, ErrorCode::NoAuth, msg);
                }
                if s.backup_id != 0 {
                    return self.send_backup_chunk(conn, id, s.backup_id, s.offset);
                }
                // A new backup holds every acknowledged write: after a ReadIndex.
                if !self.leader_alive(now) {
                    return self.reply_err(conn, id, ErrorCode::NoLeader, "this member has no contact with a leader");
                }
                self.reads.push(Deferred { conn, req, since: now, min_index: 0 });
            }
            Some(B::Members(_)) => {
                let body = response::Body::Members(self.members_resp());
                self.reply(conn, Response { id, zxid: self.sm().applied(), body: Some(body), ..Default::default() });
            }
            Some(B::MemberChange(mc)) => self.on_member_change(conn, id, mc, now),
            Some(B::ListUsers(_)) => {
                if !self.caller(conn).superuser {
                    return self.reply_err(conn, id, ErrorCode::NoAuth, "list-users needs a superuser (--superuser)");
                }
                let body = response::Body::Names(NamesResp { names: self.sm().user_names() });
                self.reply(conn, Response { id, zxid: self.sm().applied(), body: Some(body), ..Default::default() });
            }
            Some(B::CloseSession(_))
            | Some(B::Create(_))
            | Some(B::Set(_))
            | Some(B::Delete(_))
            | Some(B::Multi(_))
            | Some(B::SetAcl(_))
            | Some(B::AddUser(_))
            | Some(B::RemoveUser(_))
            | Some(B::ResetFence(_))
            | Some(B::SetSettings(_))
            | Some(B::ClaimSession(_)) => {
                let Some(sid) = session else {
                    return self.reply_err(
                        conn,
                        id,
                        ErrorCode::BadRequest,
                        "writes need a session: create or attach one first",
                    );
                };
                if !self.sm().session_exists(sid) {
                    return self.reply_err(conn, id, ErrorCode::SessionExpired, format!("session {sid:#x} expired"));
                }
                if let Some(msg) = precheck_write(&req, self.cfg.limits.max_multi_ops) {
                    return self.reply_err(conn, id, msg.0, msg.1);
                }
                let op = match req.body {
                    Some(B::CloseSession(c)) => client_write::Op::CloseSession(c),
                    Some(B::Create(c)) => client_write::Op::Create(c),
                    Some(B::Set(s)) => client_write::Op::Set(s),
                    Some(B::Delete(d)) => client_write::Op::Delete(d),
                    Some(B::Multi(m)) => client_write::Op::Multi(m),
                    Some(B::SetAcl(a)) => client_write::Op::SetAcl(a),
                    Some(B::AddUser(u)) => client_write::Op::AddUser(u),
                    Some(B::RemoveUser(u)) => client_write::Op::RemoveUser(u),
                    Some(B::ClaimSession(c)) => client_write::Op::ClaimSession(c),
                    Some(B::ResetFence(f)) => client_write::Op::ResetFence(f),
                    Some(B::SetSettings(s)) => client_write::Op::SetSettings(s),
                    _ => return,
                };
                let caller = self.caller(conn);
                let cmd = Command {
                    body: Some(command::Body::Write(ClientWrite {
                        session_id: sid,
                        seq: req.seq,
                        acked_below: req.acked_below,
                        epoch: req.epoch,
                        secret,
                        identities: caller.identities,
                        superuser: caller.superuser,
                        op: Some(op),
                    })),
                    ..Default::default()
                };
                self.propose(conn, id, cmd, false, now);
            }
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
        if !exists {
            return self.reply_err(conn, id, ErrorCode::SessionExpired, format!("session {sid:#x} expired"));
        }
        if self.sessions.is_expiring(sid) {
            return self.reply_err(conn, id, ErrorCode::Busy, "this session's expiry is proposed; retry");
        }
        let st = self.state();
        let sm = read(&st);
        self.sessions.keepalive(conn, id, sid, &sm, now);
    }

    pub(super) fn propose(&mut self, conn: ConnId, client_id: u64, mut cmd: Command, bind_session: bool, now: Instant) {
        let rid = self.next_request_id;
        self.next_request_id += 1;
        cmd.origin = self.cfg.id;
        cmd.request_id = rid;
        cmd.time_ms = self.wall.at(now);
        match self.raw.propose(vec![], cmd.encode_to_vec()) {
            Ok(()) => {
                self.pending.insert(rid, PendingWrite { conn, client_id, since: now, bind_session });
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

    /// A new backup (backup.rs) of the state as applied now, kept for its
    /// chunks to be fetched; answers the first chunk.
    fn take_backup(&mut self, conn: ConnId, id: u64) {
        let (data, index) = {
            let sm = self.sm();
            (sm.backup(), sm.applied())
        };
        let term = self.raw.raft.raft_log.term(index).unwrap_or(0);
        let backup_id = self.rng.gen_range(1..u64::MAX);
        let sha = crate::backup::sha256(&data);
        info!(backup_id, index, bytes = data.len(), "backup taken");
        self.backup = Some(Backup { id: backup_id, index, term, sha, data: Arc::new(data) });
        self.send_backup_chunk(conn, id, backup_id, 0);
    }

    fn send_backup_chunk(&self, conn: ConnId, id: u64, backup_id: u64, offset: u64) {
        let Some(b) = self.backup.as_ref().filter(|b| b.id == backup_id) else {
            let msg = format!("backup {backup_id:#x} is gone from this member (another was taken); start again");
            return self.reply_err(conn, id, ErrorCode::NoNode, msg);
        };
        let total = b.data.len() as u64;
        if offset > total {
            return self.reply_err(conn, id, ErrorCode::BadRequest, format!("offset {offset} is past {total}"));
        }
        let end = (offset as usize + crate::backup::CHUNK).min(b.data.len());
        let chunk = baton_proto::SnapshotChunk {
            backup_id,
            index: b.index,
            term: b.term,
            total,
            offset,
            data: bytes::Bytes::copy_from_slice(&b.data[offset as usize..end]),
            sha256: b.sha.clone().into(),
            cluster_id: self.sm().cluster().cluster_id.clone(),
        };
        let r = Response { id, zxid: b.index, body: Some(response::Body::Snapshot(chunk)), ..Default::default() };
        // Not capped by --max-reply-bytes: a chunk is at most backup::CHUNK.
        if let Some(c) = self.conns.get(&conn) {
            c.tx.send(ServerFrame { frame: Some(baton_proto::server_frame::Frame::Response(r)) });
        }
    }

    /// Answers a read (or attach) from local state.
    pub(super) fn serve(&mut self, conn: ConnId, req: &Request, now: Instant) {
        use request::Body as B;
        let id = req.id;
        if let Some(B::Snapshot(_)) = &req.body {
            return self.take_backup(conn, id);
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
        let result = match (&req.body, result) {
            (Some(B::Attach(a)), Ok(body)) => self.attach(conn, a, now).map(|_| body),
            (Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)), Ok(body)) => {
                if let Some(spec) = &r.watch {
                    let st = self.state();
                    self.watches.add(conn, spec, &read(&st));
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
    }

    pub(super) fn attach(&mut self, conn: ConnId, a: &AttachReq, now: Instant) -> Result<(), (ErrorCode, String)> {
        self.sm().check_session(a.session_id, &a.secret)?;
        if self.sessions.is_expiring(a.session_id) {
            return Err((ErrorCode::Busy, "this session's expiry is proposed; retry".into()));
        }
        for spec in &a.watches {
            check_spec(spec)?;
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
            let one_shot_exists = spec.kind == WatchKind::Exists as i32 && !spec.persistent;
            if !one_shot_exists && sm.check_read(&spec.path, &caller, "watch").is_err() {
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
            // A one-shot that fired is done; a persistent one goes on.
            if missed.is_empty() || spec.persistent || spec.kind == WatchKind::Recursive as i32 {
                self.watches.add(conn, spec, &sm);
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

    pub(super) fn send_event(&self, f: &Fired, zxid: u64) {
        if let Some(c) = self.conns.get(&f.conn) {
            let ev = WatchEvent { watch_id: f.watch_id, r#type: f.ty as i32, path: f.path.clone(), zxid };
            c.tx.send(ServerFrame { frame: Some(baton_proto::server_frame::Frame::Event(ev)) });
        }
    }
}

/// Checks a watch registration: a valid path and a known kind.
fn check_spec(spec: &WatchSpec) -> Result<(), (ErrorCode, String)> {
    baton_proto::validate_path(&spec.path).map_err(|m| (ErrorCode::InvalidPath, m))?;
    WatchKind::try_from(spec.kind)
        .map(|_| ())
        .map_err(|_| (ErrorCode::BadRequest, format!("unknown watch kind {} (newer protocol?)", spec.kind)))
}

/// Checks a write before it is proposed (the state machine checks again).
fn precheck_write(req: &Request, max_ops: usize) -> Option<(ErrorCode, String)> {
    use request::Body as B;
    if let Some(B::Multi(m)) = &req.body {
        if m.ops.len() > max_ops {
            let msg = format!("a multi of {} operations, over {max_ops} (--max-multi-ops)", m.ops.len());
            return Some((ErrorCode::TooLarge, msg));
        }
    }
    let mut paths: Vec<&str> = Vec::new();
    let mut data = 0usize;
    match &req.body {
        Some(B::Create(c)) => {
            paths.push(&c.path);
            data = c.data.len();
        }
        Some(B::Set(s)) => {
            paths.push(&s.path);
            data = s.data.len();
        }
        Some(B::Delete(d)) => paths.push(&d.path),
        Some(B::SetAcl(a)) => paths.push(&a.path),
        Some(B::Multi(m)) => {
            for o in &m.ops {
                match &o.op {
                    Some(baton_proto::op::Op::Create(c)) => {
                        paths.push(&c.path);
                        data = data.max(c.data.len());
                    }
                    Some(baton_proto::op::Op::Set(s)) => {
                        paths.push(&s.path);
                        data = data.max(s.data.len());
                    }
                    Some(baton_proto::op::Op::Delete(d)) => paths.push(&d.path),
                    Some(baton_proto::op::Op::Check(c)) => paths.push(&c.path),
                    Some(baton_proto::op::Op::SetAcl(a)) => paths.push(&a.path),
                    Some(baton_proto::op::Op::CheckFence(_)) => {}
                    None => return Some((ErrorCode::BadRequest, "empty op in multi".into())),
                }
            }
        }
        _ => {}
    }
    if req.seq == 0 {
        return Some((ErrorCode::BadRequest, "write without a sequence number".into()));
    }
    if data > baton_proto::MAX_DATA {
        return Some((ErrorCode::TooLarge, format!("data is {data} bytes, over {}", baton_proto::MAX_DATA)));
    }
    for p in paths {
        if let Err(m) = baton_proto::validate_path(p) {
            return Some((ErrorCode::InvalidPath, m));
        }
    }
    None
}
