//! Effects: what the driver's parts decide, as values.
//!
//! Rules:
//! - A part (sessions.rs, reads.rs, driver/pending.rs, the leader's duties
//!   in driver/duties.rs) never replies, sends or proposes. It takes state
//!   and time and returns [`Effect`]s; its unit tests assert on them.
//! - The driver carries them out in one place, `Driver::execute`
//!   (driver/execute.rs), in the order they were returned.
//! - Carrying out an effect never locks the state machine when the caller
//!   gives the index to answer at (`Driver::execute_at`): applying an entry
//!   queues its replies and events while it holds the state's write lock
//!   (driver/ready.rs).
//! - A reply to a connection that has closed is dropped; a message to a
//!   member the transport does not know is dropped by the transport.

use baton_proto::{command, ErrorCode, Response, WatchEvent};

use crate::message::{ConnId, PeerOut};

/// Something for the driver to do.
#[derive(Debug, Clone)]
pub enum Effect {
    /// Answer request `id` on `conn` with an empty success (`code` Ok) or
    /// the error `code` with `msg`.
    Reply { conn: ConnId, id: u64, code: ErrorCode, msg: String },
    /// Answer with a whole response (capped at `--max-reply-bytes`: one
    /// over it is answered TOO_LARGE instead).
    Respond { conn: ConnId, resp: Response },
    /// A watch event to `conn`.
    Event { conn: ConnId, ev: WatchEvent },
    /// A message to another member.
    Send { to: u64, out: PeerOut },
    /// An entry of this member's own that no client waits for (expiry,
    /// the cluster record, reaping). A refusal (no leader, a transfer under
    /// way) is only logged: its part proposes again on a later tick.
    Propose { body: command::Body, what: &'static str },
}

impl Effect {
    /// An error reply (or an empty success, for `ErrorCode::Ok`).
    pub fn reply(conn: ConnId, id: u64, code: ErrorCode, msg: impl Into<String>) -> Effect {
        Effect::Reply { conn, id, code, msg: msg.into() }
    }

    /// The request this effect answers, and its code (tests: who was
    /// answered what).
    pub fn answered(&self) -> Option<(u64, ErrorCode)> {
        match self {
            Effect::Reply { id, code, .. } => Some((*id, *code)),
            Effect::Respond { resp, .. } => Some((resp.id, ErrorCode::try_from(resp.error).unwrap_or(ErrorCode::Ok))),
            _ => None,
        }
    }
}
