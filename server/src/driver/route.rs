//! Routing: what the driver does with a client request, as a pure function
//! ([`route`]) of the request, the connection (its session, who is asking,
//! how many watches it holds), the state machine, the configuration, the
//! cluster's settings and one fact of the moment (whether this member hears
//! from a leader). It returns a [`Route`]; the driver carries it out
//! (driver/requests.rs: replies, proposals, the ReadIndex queue, the
//! session layer). The fuzz target `client_frame` calls the same function.
//!
//! The rules: writes are checked and proposed, linearizable reads and
//! attaches queued for a ReadIndex, keepalives handed to the session layer,
//! local reads served; and the listeners' fast path for local reads needs
//! no driver turn (view.rs).
//!
//! Every request on a connection bound to a session touches the session
//! (sessions.rs; the driver does it before routing). Then, by kind:
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
//! - **Linearizable reads** (`get`, `exists`, `children`, `get_acl`), a
//!   new backup (`snapshot` with `backup_id` 0) and `list_users` wait for
//!   the turn's ReadIndex (reads.rs) and are served by `serve`. The two
//!   admin requests are checked twice: here, against the settings this
//!   member follows now, and in `serve`, against the settings as applied
//!   once the ReadIndex is (settings.rs, "checked again"): a member that
//!   had not yet applied the cluster's settings, and so followed its own
//!   flags, cannot grant by them what the record refuses. A watch in a read is
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
//!   `remove_watch`, `status`, `whoami`, `members`, a backup's next chunk.
//! - **`member_change`**: driver/members.rs (the rules: membership.rs).
//! - **Stale reads without a watch** never reach the driver: the listener
//!   answers them from the shared state (view.rs `fast_read`; not when deliberate
//!   bugs are on, which act in the driver).

use baton_proto::{
    client_write, command, request, response, ClientWrite, ClusterSettings, Command, ErrorCode, MemberChangeReq,
    NamesResp, Request, Response, WatchKind, WatchSpec,
};

use crate::acl::Caller;
use crate::config::Config;
use crate::sessions::not_live_msg;
use crate::state::{error_response, StateMachine};

/// What routing needs to know about the connection a request came on.
pub struct ConnFacts<'a> {
    /// The session it is bound to.
    pub session: Option<u64>,
    /// That session's secret (every write carries it).
    pub secret: bytes::Bytes,
    /// Who is asking (acl.rs); asked only by the requests that need it.
    pub caller: &'a dyn Fn() -> Caller,
    /// Watches it holds (the `--max-watches` cap).
    pub watches: usize,
}

/// What the driver does with a request.
#[derive(Debug)]
pub enum Route {
    /// Answer now: a refusal (nothing happened) or an answer made from
    /// the state.
    Reply(Response),
    /// Propose this client write (`origin`, `request_id` and `time_ms`
    /// are the driver's to fill).
    Propose { id: u64, cmd: Command },
    /// Propose a new session with this timeout; the driver draws its
    /// secret and binds the connection when it applies.
    NewSession { id: u64, timeout_ms: u32 },
    /// Wait for a ReadIndex round (reads.rs), then serve it once this
    /// member has applied `min_index` too.
    ReadIndex { req: Request, min_index: u64 },
    /// Deliberate bug `attach-from-local-state`: wait for `min_index`
    /// only, no leader check and no ReadIndex.
    WaitApplied { req: Request, min_index: u64 },
    /// Serve now from this member's state (a stale read).
    Serve(Request),
    /// The session layer answers it (sessions.rs), for the connection's
    /// session.
    Keepalive { id: u64, session: Option<u64> },
    /// Register this watch at the current applied index; answer OK.
    AddWatch { id: u64, spec: WatchSpec },
    /// Drop this watch; answer OK.
    RemoveWatch { id: u64, watch_id: u64 },
    /// The driver's own status.
    Status { id: u64 },
    /// The configuration's members.
    Members { id: u64 },
    /// A membership change (driver/members.rs).
    MemberChange { id: u64, change: MemberChangeReq },
    /// The next chunk of the backup this member took.
    BackupChunk { id: u64, backup_id: u64, offset: u64 },
}

/// The route of `req` (the module doc has the rules).
pub fn route(
    req: Request,
    conn: &ConnFacts,
    sm: &StateMachine,
    cfg: &Config,
    settings: &ClusterSettings,
    leader_alive: bool,
) -> Route {
    use request::Body as B;
    let id = req.id;
    let refuse = |code: ErrorCode, msg: String| refusal(id, sm, code, msg);
    let no_leader = || refuse(ErrorCode::NoLeader, "this member has no contact with a leader".into());
    match &req.body {
        None => refuse(ErrorCode::BadRequest, "empty or unknown request (newer protocol?)".into()),
        Some(B::Status(_)) => Route::Status { id },
        Some(B::CreateSession(cs)) => {
            let max = cfg.limits.max_sessions;
            if sm.session_count() >= max {
                return refuse(
                    ErrorCode::Busy,
                    format!("the cluster has {max} sessions (--max-sessions); retry later"),
                );
            }
            Route::NewSession { id, timeout_ms: cfg.negotiate_timeout(cs.timeout_ms) }
        }
        Some(B::Attach(a)) => {
            // Checked against a linearizable state (a lagging member or
            // one cut off from the leader must not resume a session whose
            // expiry committed), at or past what the client saw.
            let min_index = a.last_zxid;
            if cfg.faults.attach_from_local_state() {
                return Route::WaitApplied { req, min_index };
            }
            if !leader_alive {
                return no_leader();
            }
            Route::ReadIndex { req, min_index }
        }
        Some(B::Keepalive(_)) => Route::Keepalive { id, session: conn.session },
        Some(B::Get(_)) | Some(B::Exists(_)) | Some(B::Children(_)) | Some(B::GetAcl(_)) | Some(B::AddWatch(_)) => {
            read_route(req, conn, sm, cfg)
        }
        Some(B::RemoveWatch(rw)) => Route::RemoveWatch { id, watch_id: rw.watch_id },
        Some(B::Auth(_)) => refuse(ErrorCode::BadRequest, "auth is answered by the listener; retry".into()),
        Some(B::Whoami(_)) | Some(B::Snapshot(_)) | Some(B::ListUsers(_)) => {
            admin_route(req, conn, sm, settings, leader_alive)
        }
        Some(B::Members(_)) => Route::Members { id },
        Some(B::MemberChange(mc)) => Route::MemberChange { id, change: mc.clone() },
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
        | Some(B::ClaimSession(_)) => write_route(req, conn, sm, cfg),
    }
}

/// Who am I, backups, the user list: answered from the caller's
/// identities and the cluster's settings.
fn admin_route(
    req: Request,
    conn: &ConnFacts,
    sm: &StateMachine,
    settings: &ClusterSettings,
    leader_alive: bool,
) -> Route {
    use request::Body as B;
    let id = req.id;
    let refuse = |code: ErrorCode, msg: String| refusal(id, sm, code, msg);
    match &req.body {
        Some(B::Whoami(_)) => {
            let mut names = vec![crate::acl::ANYONE.to_string()];
            names.extend((conn.caller)().identities);
            answer(id, sm, response::Body::Names(NamesResp { names }))
        }
        Some(B::Snapshot(s)) => {
            if !crate::settings::admin_allowed(settings, (conn.caller)().superuser) {
                return refuse(ErrorCode::NoAuth, crate::settings::admin_refusal(settings, "backups"));
            }
            if s.backup_id != 0 {
                return Route::BackupChunk { id, backup_id: s.backup_id, offset: s.offset };
            }
            // A new backup holds every acknowledged write: after a ReadIndex.
            if !leader_alive {
                return refuse(ErrorCode::NoLeader, "this member has no contact with a leader".into());
            }
            Route::ReadIndex { req, min_index: 0 }
        }
        Some(B::ListUsers(_)) => {
            if !(conn.caller)().superuser {
                return refuse(ErrorCode::NoAuth, LIST_USERS_REFUSED.into());
            }
            // Served after a ReadIndex, its power checked again then.
            if !leader_alive {
                return refuse(ErrorCode::NoLeader, "this member has no contact with a leader".into());
            }
            Route::ReadIndex { req, min_index: 0 }
        }
        _ => refuse(ErrorCode::BadRequest, "not an admin request".into()),
    }
}

/// Why `list_users` was refused.
pub(super) const LIST_USERS_REFUSED: &str = "list-users needs a superuser (--superuser)";

/// A refusal: nothing happened.
fn refusal(id: u64, sm: &StateMachine, code: ErrorCode, msg: String) -> Route {
    let mut r = error_response(sm.applied(), code, msg);
    r.id = id;
    Route::Reply(r)
}

/// An answer made from the state now.
fn answer(id: u64, sm: &StateMachine, body: response::Body) -> Route {
    Route::Reply(Response { id, zxid: sm.applied(), body: Some(body), ..Default::default() })
}

/// Room for one more watch on the connection (`--max-watches`).
fn watch_room(conn: &ConnFacts, cfg: &Config) -> Result<(), (ErrorCode, String)> {
    let max = cfg.limits.max_watches;
    if conn.watches + 1 > max {
        return Err((
            ErrorCode::Busy,
            format!("this connection holds {} watches, at most {max} (--max-watches)", conn.watches),
        ));
    }
    Ok(())
}

/// A read (get, exists, children, get_acl) or a watch registration.
fn read_route(req: Request, conn: &ConnFacts, sm: &StateMachine, cfg: &Config) -> Route {
    use request::Body as B;
    let id = req.id;
    match &req.body {
        Some(B::AddWatch(w)) => {
            let Some(spec) = w.watch.clone() else {
                return refusal(id, sm, ErrorCode::BadRequest, "add_watch without a watch".into());
            };
            let allowed = check_spec(&spec, cfg)
                .and_then(|_| watch_room(conn, cfg))
                .and_then(|_| sm.check_read(&spec.path, &(conn.caller)(), "watch"));
            match allowed {
                Err((code, msg)) => refusal(id, sm, code, msg),
                Ok(()) => Route::AddWatch { id, spec },
            }
        }
        Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)) | Some(B::GetAcl(r)) => {
            let checked = r.watch.as_ref().map(|w| check_spec(w, cfg).and_then(|_| watch_room(conn, cfg)));
            if let Some(Err((code, msg))) = checked {
                return refusal(id, sm, code, msg);
            }
            match r.stale || cfg.faults.stale_reads() {
                true => Route::Serve(req),
                false => Route::ReadIndex { req, min_index: 0 },
            }
        }
        _ => refusal(id, sm, ErrorCode::BadRequest, "not a read".into()),
    }
}

/// A client write: checked for a live session and its shape, then
/// proposed with the session's secret and the caller's identities.
fn write_route(req: Request, conn: &ConnFacts, sm: &StateMachine, cfg: &Config) -> Route {
    use request::Body as B;
    let id = req.id;
    let refuse = |code: ErrorCode, msg: String| refusal(id, sm, code, msg);
    let Some(sid) = conn.session else {
        return refuse(ErrorCode::BadRequest, "writes need a session: create or attach one first".into());
    };
    if let Some((code, msg)) = not_live_msg(sid, sm.session_state(sid)) {
        return refuse(code, msg);
    }
    if let Some((code, msg)) = precheck_write(&req, cfg.limits.max_multi_ops) {
        return refuse(code, msg);
    }
    let (seq, acked_below, epoch) = (req.seq, req.acked_below, req.epoch);
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
        _ => return refuse(ErrorCode::BadRequest, "not a write".into()),
    };
    let caller = (conn.caller)();
    let write = ClientWrite {
        session_id: sid,
        seq,
        acked_below,
        epoch,
        secret: conn.secret.clone(),
        identities: caller.identities,
        superuser: caller.superuser,
        op: Some(op),
    };
    Route::Propose { id, cmd: Command { body: Some(command::Body::Write(write)), ..Default::default() } }
}

/// Checks a watch registration: a valid path and a known kind.
pub fn check_spec(spec: &WatchSpec, cfg: &Config) -> Result<(), (ErrorCode, String)> {
    baton_proto::validate_path(&spec.path).map_err(|m| (ErrorCode::InvalidPath, m))?;
    let unknown = || (ErrorCode::BadRequest, format!("unknown watch kind {} (newer protocol?)", spec.kind));
    match WatchKind::try_from(spec.kind) {
        Ok(WatchKind::First) if cfg.faults.no_first_watch() => Err(unknown()),
        Ok(_) => Ok(()),
        Err(_) => Err(unknown()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use baton_proto::{
        AttachReq, CreateOp, CreateSessionReq, ListUsersReq, MultiOp, NewSession, Op, ReadReq, SnapshotReq,
    };

    /// A state machine holding session 1.
    fn with_session() -> StateMachine {
        let mut sm = StateMachine::new();
        let ns = NewSession { timeout_ms: 1000, secret: bytes::Bytes::from_static(b"s") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        sm
    }

    fn req(body: request::Body) -> Request {
        Request { id: 9, seq: 1, body: Some(body), ..Default::default() }
    }

    fn run(r: Request, session: Option<u64>, sm: &StateMachine, cfg: &Config, leader: bool, watches: usize) -> Route {
        let caller = Caller::default;
        let conn = ConnFacts { session, secret: bytes::Bytes::from_static(b"s"), caller: &caller, watches };
        route(r, &conn, sm, cfg, &ClusterSettings::default(), leader)
    }

    fn refused(route: &Route) -> Option<ErrorCode> {
        match route {
            Route::Reply(r) if r.error != 0 => {
                assert_eq!(r.id, 9, "a refusal answers the request's id");
                ErrorCode::try_from(r.error).ok()
            }
            _ => None,
        }
    }

    #[test]
    fn writes_need_a_live_session_and_pass_the_prechecks() {
        let (sm, cfg) = (with_session(), Config::defaults(1));
        let create = |path: &str| req(request::Body::Create(CreateOp { path: path.into(), ..Default::default() }));
        assert_eq!(refused(&run(create("/a"), None, &sm, &cfg, true, 0)), Some(ErrorCode::BadRequest));
        // Not yet applied here (id above the applied index 1) is not expired.
        assert_eq!(refused(&run(create("/a"), Some(5), &sm, &cfg, true, 0)), Some(ErrorCode::Busy));
        let ns = NewSession { timeout_ms: 1000, secret: bytes::Bytes::from_static(b"s") };
        let mut later = with_session();
        later.apply(7, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        assert_eq!(refused(&run(create("/a"), Some(5), &later, &cfg, true, 0)), Some(ErrorCode::SessionExpired));
        assert_eq!(refused(&run(create("no-slash"), Some(1), &sm, &cfg, true, 0)), Some(ErrorCode::InvalidPath));
        let zero_seq = Request { seq: 0, ..create("/a") };
        assert_eq!(refused(&run(zero_seq, Some(1), &sm, &cfg, true, 0)), Some(ErrorCode::BadRequest));
        let ops = vec![Op::default(); cfg.limits.max_multi_ops + 1];
        let multi = req(request::Body::Multi(MultiOp { ops }));
        assert_eq!(refused(&run(multi, Some(1), &sm, &cfg, true, 0)), Some(ErrorCode::TooLarge));
        // A good one becomes the write, with the session's secret.
        let Route::Propose { id: 9, cmd } = run(create("/a"), Some(1), &sm, &cfg, true, 0) else {
            panic!("not proposed")
        };
        let Some(command::Body::Write(w)) = cmd.body else { panic!("not a write") };
        assert_eq!((w.session_id, w.seq, &w.secret[..]), (1, 1, &b"s"[..]));
        assert!(matches!(w.op, Some(client_write::Op::Create(c)) if c.path == "/a"));
    }

    #[test]
    fn reads_wait_for_a_read_index_unless_stale_and_watches_are_checked_first() {
        let (sm, cfg) = (with_session(), Config::defaults(1));
        let get = |stale: bool, watch: Option<WatchSpec>| {
            req(request::Body::Get(ReadReq { path: "/a".into(), stale, watch }))
        };
        assert!(matches!(run(get(false, None), None, &sm, &cfg, true, 0), Route::ReadIndex { min_index: 0, .. }));
        assert!(matches!(run(get(true, None), None, &sm, &cfg, true, 0), Route::Serve(_)));
        let bad = WatchSpec { path: "bad".into(), ..Default::default() };
        assert_eq!(refused(&run(get(true, Some(bad)), None, &sm, &cfg, true, 0)), Some(ErrorCode::InvalidPath));
        let ok = WatchSpec { path: "/a".into(), ..Default::default() };
        let full = cfg.limits.max_watches;
        assert_eq!(refused(&run(get(false, Some(ok)), None, &sm, &cfg, true, full)), Some(ErrorCode::Busy));
    }

    #[test]
    fn attach_and_new_backups_need_a_leader_in_contact() {
        let (sm, cfg) = (with_session(), Config::defaults(1));
        let attach = || req(request::Body::Attach(AttachReq { session_id: 1, last_zxid: 4, ..Default::default() }));
        assert_eq!(refused(&run(attach(), None, &sm, &cfg, false, 0)), Some(ErrorCode::NoLeader));
        assert!(matches!(run(attach(), None, &sm, &cfg, true, 0), Route::ReadIndex { min_index: 4, .. }));
        // Deliberate bugs act only when compiled in (faults.rs).
        #[cfg(feature = "fault-injection")]
        {
            let bug = Config {
                faults: crate::faults::Faults::parse(&["attach-from-local-state".into()]).expect("fault"),
                ..cfg.clone()
            };
            assert!(matches!(run(attach(), None, &sm, &bug, false, 0), Route::WaitApplied { min_index: 4, .. }));
        }
        // Backups: admins only (none here, and no open admin), then a leader.
        let snap = |backup_id| req(request::Body::Snapshot(SnapshotReq { backup_id, offset: 3 }));
        assert_eq!(refused(&run(snap(0), None, &sm, &cfg, true, 0)), Some(ErrorCode::NoAuth));
        let open = ClusterSettings { open_admin: true, ..Default::default() };
        let caller = Caller::default;
        let conn = ConnFacts { session: None, secret: Default::default(), caller: &caller, watches: 0 };
        assert_eq!(refused(&route(snap(0), &conn, &sm, &cfg, &open, false)), Some(ErrorCode::NoLeader));
        assert!(matches!(route(snap(0), &conn, &sm, &cfg, &open, true), Route::ReadIndex { .. }));
        assert!(matches!(
            route(snap(5), &conn, &sm, &cfg, &open, true),
            Route::BackupChunk { id: 9, backup_id: 5, offset: 3 }
        ));
        let users = || req(request::Body::ListUsers(ListUsersReq {}));
        assert_eq!(refused(&run(users(), None, &sm, &cfg, true, 0)), Some(ErrorCode::NoAuth));
        // A superuser's list waits for a ReadIndex (checked again when served).
        let root = || Caller { identities: vec!["user:root".into()], superuser: true };
        let su = ConnFacts { session: None, secret: Default::default(), caller: &root, watches: 0 };
        assert!(matches!(route(users(), &su, &sm, &cfg, &open, true), Route::ReadIndex { .. }));
        assert_eq!(refused(&route(users(), &su, &sm, &cfg, &open, false)), Some(ErrorCode::NoLeader));
    }

    #[test]
    fn new_sessions_are_capped_and_their_timeout_negotiated() {
        let (sm, cfg) = (with_session(), Config::defaults(1));
        let cs = |timeout_ms| req(request::Body::CreateSession(CreateSessionReq { timeout_ms }));
        assert!(matches!(run(cs(10), None, &sm, &cfg, true, 0), Route::NewSession { id: 9, timeout_ms: 1000 }));
        let full = Config { limits: crate::config::Limits { max_sessions: 1, ..cfg.limits.clone() }, ..cfg.clone() };
        assert_eq!(refused(&run(cs(5000), None, &sm, &full, true, 0)), Some(ErrorCode::Busy));
        assert_eq!(
            refused(&run(Request { id: 9, ..Default::default() }, None, &sm, &cfg, true, 0)),
            Some(ErrorCode::BadRequest)
        );
    }
}
