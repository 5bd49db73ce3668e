//! Writes waiting for their entry: the proposal bookkeeping.
//!
//! Every proposal this member makes for a client (a write, a new session,
//! a membership change) takes the next request id ([`Pending::next_id`]:
//! the count starts at a random value on every start, so an entry
//! proposed before a restart is never taken for one of this run's) and
//! waits here under it ([`Pending::wait`]) until one of:
//! - its entry applies on this member: the state machine's reply goes to
//!   the client ([`Pending::take`], driver/ready.rs);
//! - the request timeout passes ([`Pending::time_out`]): `TIMEOUT`, the
//!   write may or may not happen;
//! - the leader or the term changes ([`Pending::leader_changed`]):
//!   forwarded proposals may be lost with the old leader,
//!   `LEADER_CHANGED`, may or may not happen;
//! - the member stops ([`Pending::shutdown`]): `TIMEOUT`, may or may not
//!   happen.
//!
//! Nothing here sends anything: the answers are returned as effects
//! (effect.rs), which the driver carries out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_proto::ErrorCode;

use crate::effect::Effect;
use crate::message::ConnId;

/// A request waiting for its entry to be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PendingWrite {
    pub conn: ConnId,
    /// The client's request id (the reply's).
    pub client_id: u64,
    pub since: Instant,
    /// Bind the connection to the new session (CreateSession).
    pub bind_session: bool,
    /// A create's FIRST watch id (0: none; watches.rs, "The pushed
    /// grant"): registered when the entry applies, if the node is not first.
    pub first_watch: u64,
}

/// What a proposal's answer does besides answering.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Waits {
    pub bind_session: bool,
    pub first_watch: u64,
}

pub(super) struct Pending {
    next: u64,
    waiting: BTreeMap<u64, PendingWrite>,
}

impl Pending {
    /// `first`: the first request id (random: module doc).
    pub fn new(first: u64) -> Self {
        Pending { next: first, waiting: BTreeMap::new() }
    }

    /// The request id of the next proposal.
    pub fn next_id(&mut self) -> u64 {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        id
    }

    /// `w` waits for the entry proposed with request id `rid`.
    pub fn wait(&mut self, rid: u64, w: PendingWrite) {
        self.waiting.insert(rid, w);
    }

    /// The write waiting for `rid`'s entry, if one is (an entry another
    /// member proposed, or one already given up, has none here).
    pub fn take(&mut self, rid: u64) -> Option<PendingWrite> {
        self.waiting.remove(&rid)
    }

    /// Every write that waited more than `timeout` at `now`: `TIMEOUT`
    /// (ambiguous).
    pub fn time_out(&mut self, now: Instant, timeout: Duration) -> Vec<Effect> {
        let late: Vec<u64> =
            self.waiting.iter().filter(|(_, p)| now.duration_since(p.since) > timeout).map(|(k, _)| *k).collect();
        let late: Vec<PendingWrite> = late.into_iter().filter_map(|rid| self.waiting.remove(&rid)).collect();
        if !late.is_empty() {
            crate::metrics::proposal_failed("timeout", late.len());
        }
        let msg = "no commit within the request timeout; the write may or may not happen";
        late.into_iter().map(|p| Effect::reply(p.conn, p.client_id, ErrorCode::Timeout, msg)).collect()
    }

    /// The leader, the term or this member's role changed: every waiting
    /// write, `LEADER_CHANGED` (ambiguous), in request id order.
    pub fn leader_changed(&mut self) -> Vec<Effect> {
        let msg = "leader changed; the write may or may not happen (retry with the same seq)";
        let out = self.fail_all(ErrorCode::LeaderChanged, msg);
        if !out.is_empty() {
            crate::metrics::proposal_failed("leader_changed", out.len());
        }
        out
    }

    /// This member stops: every waiting write, `TIMEOUT` (ambiguous).
    pub fn shutdown(&mut self) -> Vec<Effect> {
        self.fail_all(ErrorCode::Timeout, "member shutting down; the write may or may not happen")
    }

    fn fail_all(&mut self, code: ErrorCode, msg: &str) -> Vec<Effect> {
        let all = std::mem::take(&mut self.waiting).into_values();
        all.map(|p| Effect::reply(p.conn, p.client_id, code, msg)).collect()
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_leaves_once_by_its_entry_its_timeout_or_a_leader_change() {
        let t0 = Instant::now();
        let w = |client_id, at: u64| PendingWrite {
            conn: 1,
            client_id,
            since: t0 + Duration::from_millis(at),
            bind_session: false,
            first_watch: 0,
        };
        let mut p = Pending::new(u64::MAX);
        let (a, b, c) = (p.next_id(), p.next_id(), p.next_id());
        assert_eq!((a, b, c), (u64::MAX, 0, 1), "ids go on past the top");
        p.wait(a, w(10, 0));
        p.wait(b, w(11, 500));
        p.wait(c, w(12, 900));
        // Its entry applies: the reply goes to request 10, once.
        assert_eq!(p.take(a).map(|x| x.client_id), Some(10));
        assert_eq!(p.take(a), None, "an entry applied twice answers once");
        // 1 s later, the one waiting since 500 ms is late; 900 ms is not.
        let late = p.time_out(t0 + Duration::from_millis(1600), Duration::from_secs(1));
        assert_eq!(answered(&late), [(11, ErrorCode::Timeout)]);
        assert_eq!(p.len(), 1);
        // A leader change answers the rest, ambiguous, once.
        assert_eq!(answered(&p.leader_changed()), [(12, ErrorCode::LeaderChanged)]);
        assert_eq!(p.len(), 0);
        assert!(p.leader_changed().is_empty());
    }

    #[test]
    fn a_stop_answers_every_waiting_write_in_request_order_to_its_connection() {
        let t0 = Instant::now();
        let mut p = Pending::new(7);
        for (conn, client_id) in [(3, 30), (4, 40), (3, 31)] {
            let rid = p.next_id();
            p.wait(rid, PendingWrite { conn, client_id, since: t0, bind_session: false, first_watch: 0 });
        }
        let out = p.shutdown();
        let to: Vec<(ConnId, u64, ErrorCode)> = out
            .iter()
            .filter_map(|e| match e {
                Effect::Reply { conn, id, code, msg } => {
                    assert!(msg.contains("may or may not"), "{msg}");
                    Some((*conn, *id, *code))
                }
                _ => None,
            })
            .collect();
        assert_eq!(to, [(3, 30, ErrorCode::Timeout), (4, 40, ErrorCode::Timeout), (3, 31, ErrorCode::Timeout)]);
        assert_eq!(p.take(7), None);
    }

    fn answered(out: &[Effect]) -> Vec<(u64, ErrorCode)> {
        out.iter().filter_map(Effect::answered).collect()
    }
}
