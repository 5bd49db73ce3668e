//! Carrying out effects (effect.rs): the one place where the driver
//! replies, sends watch events, sends to peers and proposes its own
//! entries.
//!
//! - [`Driver::execute`] answers at the current applied index (it reads
//!   the state: never while the state is locked).
//! - [`Driver::execute_at`] answers at a given index and never locks the
//!   state: applying an entry uses it while it holds the write lock.
//! - A response over `--max-reply-bytes` is answered TOO_LARGE instead
//!   (a children list of millions, say); a backup chunk is sent whole
//!   (at most backup::CHUNK, `Driver::send_uncapped`).

use super::*;
use crate::effect::Effect;

impl Driver {
    /// Carries out `effects` in order, answering at the applied index.
    pub(super) fn execute(&mut self, effects: impl IntoIterator<Item = Effect>, now: Instant) {
        let mut effects = effects.into_iter().peekable();
        if effects.peek().is_none() {
            return;
        }
        let zxid = self.sm().applied();
        self.execute_at(effects, zxid, now);
    }

    /// Carries out `effects` in order, answering at `zxid`; locks nothing.
    pub(super) fn execute_at(&mut self, effects: impl IntoIterator<Item = Effect>, zxid: u64, now: Instant) {
        for e in effects {
            match e {
                Effect::Send { to, out } => self.io.peers.send(to, out),
                Effect::Propose { body, what } => self.propose_own(body, now, what),
                other => self.deliver(other, zxid),
            }
        }
    }

    /// A reply or an event to its connection (dropped if it closed).
    pub(super) fn deliver(&self, e: Effect, zxid: u64) {
        use baton_proto::server_frame::Frame;
        let (conn, frame) = match e {
            Effect::Reply { conn, id, code: ErrorCode::Ok, .. } => {
                let body = Some(response::Body::Empty(Empty {}));
                (conn, Frame::Response(Response { id, zxid, body, ..Default::default() }))
            }
            Effect::Reply { conn, id, code, msg } => {
                let mut r = error_response(zxid, code, msg);
                r.id = id;
                (conn, Frame::Response(r))
            }
            Effect::Respond { conn, resp } => (conn, Frame::Response(capped(resp, self.cfg.limits.max_reply_bytes))),
            Effect::Event { conn, ev } => (conn, Frame::Event(ev)),
            Effect::Send { .. } | Effect::Propose { .. } => return,
        };
        if let Some(c) = self.conns.get(&conn) {
            c.tx.send(ServerFrame { frame: Some(frame) });
        }
    }

    /// Sends a response; one over `max_reply_bytes` is answered TOO_LARGE.
    pub(super) fn reply(&self, conn: ConnId, resp: Response) {
        self.deliver(Effect::Respond { conn, resp }, 0);
    }

    /// A response sent whole (a backup chunk: at most backup::CHUNK).
    pub(super) fn send_uncapped(&self, conn: ConnId, resp: Response) {
        if let Some(c) = self.conns.get(&conn) {
            c.tx.send(ServerFrame { frame: Some(baton_proto::server_frame::Frame::Response(resp)) });
        }
    }

    /// An empty success at the current applied index.
    pub(super) fn reply_ok(&self, conn: ConnId, id: u64) {
        self.deliver(Effect::reply(conn, id, ErrorCode::Ok, ""), self.sm().applied());
    }

    /// An error at the current applied index.
    pub(super) fn reply_err(&self, conn: ConnId, id: u64, code: ErrorCode, msg: impl Into<String>) {
        self.deliver(Effect::reply(conn, id, code, msg), self.sm().applied());
    }

    /// A fired watch's event, at `zxid`.
    pub(super) fn send_event(&self, f: &Fired, zxid: u64) {
        let ev = WatchEvent { watch_id: f.watch_id, r#type: f.ty as i32, path: f.path.clone(), zxid };
        self.deliver(Effect::Event { conn: f.conn, ev }, zxid);
    }

    /// Proposes an entry of this member's own (no client waits for it);
    /// a refusal (no leader, a transfer under way) is only logged: each
    /// caller proposes again on a later tick.
    pub(super) fn propose_own(&mut self, body: command::Body, now: Instant, what: &str) {
        let cmd =
            Command { origin: self.cfg.id, time_ms: self.clock.wall.at(now), body: Some(body), ..Default::default() };
        if let Err(e) = self.raw.propose(vec![], cmd.encode_to_vec()) {
            debug!("{what} not proposed: {e}");
        }
    }
}
