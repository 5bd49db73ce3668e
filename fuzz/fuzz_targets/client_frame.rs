//! Fuzz target `client_frame`: arbitrary bytes as a client connection's
//! byte stream.
//!
//! The input goes through what `server/src/listener.rs` does with a socket:
//! the length-delimited codec (`baton_proto::codec`, at the server's default
//! limit), then `ClientFrame::decode` on each frame. Each decoded request is
//! routed by the driver's own router (`server/src/driver/route.rs`, every
//! flag at its default, a leader in contact), and the route carried out
//! against a `StateMachine` the way the driver would
//! (`server/src/driver/requests.rs`):
//! - a new session is a `NewSession` command and binds the "connection";
//! - an attach checks the session and its secret, then binds;
//! - a write is the router's `ClientWrite` command for the bound session;
//! - reads go through `fast_read` (stale, no watch) or `local_read`.
//!
//! Every command is encoded and decoded again before it is applied, as it
//! travels through the Raft log.
//!
//! Invariant: no panic, whatever the bytes.
#![no_main]

use std::sync::{Arc, RwLock};

use baton_proto::{command, request, ClientFrame, Command, NewSession, DEFAULT_MAX_FRAME};
use baton_server::acl::Caller;
use baton_server::config::Config;
use baton_server::driver::route::{self, check_spec, ConnFacts, Route};
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
    /// Every flag at its default.
    cfg: Config,
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

    /// The driver's own routing (`baton_server::driver::route::route`),
    /// then what the driver would do with the route, against the state
    /// machine alone.
    fn on_request(&mut self, req: baton_proto::Request) {
        let route = {
            let Ok(sm) = self.state.read() else { return };
            let caller = Caller::default;
            let conn = ConnFacts { session: self.session, secret: SECRET.to_vec().into(), caller: &caller, watches: 0 };
            route::route(req, &conn, &sm, &self.cfg, &Default::default(), true)
        };
        match route {
            Route::Reply(r) => {
                let _ = r.encode_to_vec();
            }
            Route::Propose { cmd, .. } => {
                if let Some(body) = cmd.body {
                    self.apply(body);
                }
            }
            Route::NewSession { timeout_ms, .. } => {
                self.apply(command::Body::NewSession(NewSession { timeout_ms, secret: SECRET.to_vec().into() }));
                self.session = Some(self.index);
            }
            Route::ReadIndex { req, .. } | Route::WaitApplied { req, .. } | Route::Serve(req) => self.serve(&req),
            Route::MemberChange { change, .. } => {
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
                let _ = baton_server::membership::plan(&v, &change);
            }
            Route::Keepalive { .. }
            | Route::AddWatch { .. }
            | Route::RemoveWatch { .. }
            | Route::Status { .. }
            | Route::Members { .. }
            | Route::BackupChunk { .. } => {}
        }
    }

    /// What the driver's `serve` does with a read or an attach, from the
    /// state machine.
    fn serve(&mut self, req: &baton_proto::Request) {
        use request::Body as B;
        match &req.body {
            Some(B::Attach(a)) => {
                let ok = self.state.read().map(|sm| sm.check_session(a.session_id, &a.secret).is_ok()).unwrap_or(false);
                if ok && a.watches.iter().all(|w| check_spec(w, &self.cfg).is_ok()) {
                    self.session = Some(a.session_id);
                }
            }
            _ => {
                let caller = Caller::default();
                if fast_read(&self.state, req, &caller).is_none() {
                    if let Ok(sm) = self.state.read() {
                        let _ = local_read(&sm, &req.body, &caller);
                    }
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut codec = baton_proto::codec(DEFAULT_MAX_FRAME);
    let mut buf = BytesMut::from(data);
    let mut conn =
        Conn { state: Arc::new(RwLock::new(StateMachine::new())), cfg: Config::defaults(1), session: None, index: 0 };
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
        conn.on_request(req);
    }
});
