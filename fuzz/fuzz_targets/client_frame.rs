//! Fuzz target `client_frame`: arbitrary bytes as a client connection's
//! byte stream.
//!
//! The input goes through what `server/src/listener.rs` does with a socket:
//! the length-delimited codec (`baton_proto::codec`, at the server's default
//! limit), then `ClientFrame::decode` on each frame. Each decoded request is
//! then played against a `StateMachine` the way the driver would
//! (`server/src/driver/requests.rs`):
//! - `create_session` becomes a `NewSession` command and binds the
//!   "connection" to the new session;
//! - `attach` checks the session and its secret, then binds;
//! - writes (`create`, `set`, `delete`, `multi`, `close_session`) become a
//!   `ClientWrite` command for the bound session;
//! - reads go through `fast_read` (stale, no watch) or `local_read`.
//!
//! Every command is encoded and decoded again before it is applied, as it
//! travels through the Raft log. The driver's `precheck_write` (private) is
//! not repeated: the state machine checks every write again, so it gets a
//! superset of what a real member proposes.
//!
//! Invariant: no panic, whatever the bytes.
#![no_main]

use std::sync::{Arc, RwLock};

use baton_proto::{
    client_write, command, request, ClientFrame, ClientWrite, Command, NewSession, WatchKind, WatchSpec,
    DEFAULT_MAX_FRAME,
};
use baton_server::acl::Caller;
use baton_server::state::StateMachine;
use baton_server::view::{fast_read, local_read, SharedState};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use tokio_util::codec::Decoder as _;

/// The secret every fuzzed session gets (the proposer picks it at random).
const SECRET: [u8; 16] = [7; 16];

/// One fuzzed connection and the state it writes to.
struct Conn {
    state: SharedState,
    /// The session bound to the connection (create or attach), as the
    /// driver's `Conn::session`.
    session: Option<u64>,
    /// Index of the last applied entry.
    index: u64,
}

impl Conn {
    fn apply(&mut self, body: command::Body) {
        self.index += 1;
        let cmd = Command { origin: 1, request_id: self.index, time_ms: self.index as i64, body: Some(body) };
        // Through the log: encoded by the proposer, decoded by every member.
        let Ok(cmd) = Command::decode(cmd.encode_to_vec().as_slice()) else {
            panic!("a command we encoded does not decode");
        };
        let Ok(mut sm) = self.state.write() else { return };
        let applied = sm.apply(self.index, &cmd);
        if let Some(reply) = applied.reply {
            let _ = reply.encode_to_vec();
        }
    }

    fn on_request(&mut self, req: request::Body, whole: &baton_proto::Request) {
        use request::Body as B;
        match req {
            B::CreateSession(cs) => {
                let timeout_ms = if cs.timeout_ms == 0 { 10_000 } else { cs.timeout_ms.clamp(1_000, 60_000) };
                self.apply(command::Body::NewSession(NewSession { timeout_ms, secret: SECRET.to_vec().into() }));
                self.session = Some(self.index);
            }
            B::Attach(a) => {
                let ok = self.state.read().map(|sm| sm.check_session(a.session_id, &a.secret).is_ok()).unwrap_or(false);
                if ok && a.watches.iter().all(spec_ok) {
                    self.session = Some(a.session_id);
                }
            }
            B::Get(r) | B::Exists(r) | B::Children(r) | B::GetAcl(r) => {
                if r.watch.as_ref().is_some_and(|w| !spec_ok(w)) {
                    return;
                }
                let caller = Caller::default();
                if fast_read(&self.state, whole, &caller).is_none() {
                    if let Ok(sm) = self.state.read() {
                        let _ = local_read(&sm, &whole.body, &caller);
                    }
                }
            }
            B::Auth(a) => {
                let _ = self.state.read().map(|sm| sm.verify_user(&a.user, &a.password));
            }
            B::AddWatch(w) => {
                let _ = w.watch.as_ref().map(spec_ok);
            }
            B::MemberChange(mc) => {
                // The leader's checks (membership.rs) on any request.
                let conf = raft::prelude::ConfState::from((vec![1, 2, 3], vec![4]));
                let Ok(sm) = self.state.read() else { return };
                let matched = |id: u64| id.saturating_mul(10);
                let v = baton_server::membership::View {
                    me: 1,
                    conf: &conf,
                    sm: &sm,
                    matched: &matched,
                    last_index: 40,
                    pending: false,
                };
                let _ = baton_server::membership::plan(&v, &mc);
            }
            B::Keepalive(_)
            | B::RemoveWatch(_)
            | B::Status(_)
            | B::ListUsers(_)
            | B::Whoami(_)
            | B::Members(_)
            | B::Snapshot(_) => {}
            B::CloseSession(_)
            | B::Create(_)
            | B::Set(_)
            | B::Delete(_)
            | B::Multi(_)
            | B::SetAcl(_)
            | B::AddUser(_)
            | B::RemoveUser(_)
            | B::ResetFence(_)
            | B::SetSettings(_)
            | B::ClaimSession(_) => {
                let Some(sid) = self.session else { return };
                if !self.state.read().map(|sm| sm.session_exists(sid)).unwrap_or(false) {
                    return;
                }
                let op = match req {
                    B::CloseSession(c) => client_write::Op::CloseSession(c),
                    B::Create(c) => client_write::Op::Create(c),
                    B::Set(s) => client_write::Op::Set(s),
                    B::Delete(d) => client_write::Op::Delete(d),
                    B::Multi(m) => client_write::Op::Multi(m),
                    B::SetAcl(a) => client_write::Op::SetAcl(a),
                    B::AddUser(u) => client_write::Op::AddUser(u),
                    B::RemoveUser(u) => client_write::Op::RemoveUser(u),
                    B::ClaimSession(c) => client_write::Op::ClaimSession(c),
                    B::ResetFence(f) => client_write::Op::ResetFence(f),
                    B::SetSettings(s) => client_write::Op::SetSettings(s),
                    _ => return,
                };
                // As a plain client: the connection's secret, no identity.
                self.apply(command::Body::Write(ClientWrite {
                    session_id: sid,
                    seq: whole.seq,
                    acked_below: whole.acked_below,
                    secret: SECRET.to_vec().into(),
                    identities: Vec::new(),
                    superuser: false,
                    epoch: whole.epoch,
                    op: Some(op),
                }));
            }
        }
    }
}

/// The driver's `check_spec`: a valid path and a known kind.
fn spec_ok(spec: &WatchSpec) -> bool {
    baton_proto::validate_path(&spec.path).is_ok() && WatchKind::try_from(spec.kind).is_ok()
}

fuzz_target!(|data: &[u8]| {
    let mut codec = baton_proto::codec(DEFAULT_MAX_FRAME);
    let mut buf = BytesMut::from(data);
    let mut conn = Conn { state: Arc::new(RwLock::new(StateMachine::new())), session: None, index: 0 };
    loop {
        let frame = match codec.decode(&mut buf) {
            Ok(Some(frame)) => frame,
            // Incomplete frame: the server would wait for more bytes; at
            // end of stream the codec reports the leftover.
            Ok(None) => {
                let _ = codec.decode_eof(&mut buf);
                break;
            }
            // Over the limit: the server answers TOO_LARGE and closes.
            Err(_) => break,
        };
        let req = match ClientFrame::decode(frame) {
            Ok(ClientFrame { request: Some(r) }) => r,
            // No request, or undecodable: BAD_REQUEST and close.
            Ok(ClientFrame { request: None }) | Err(_) => break,
        };
        if req.id == 0 {
            continue; // reserved: BAD_REQUEST, the connection stays
        }
        if let Some(body) = req.body.clone() {
            conn.on_request(body, &req);
        }
    }
});
