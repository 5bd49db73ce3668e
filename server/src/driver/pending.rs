//! Writes waiting for their entry: the proposal bookkeeping.
//!
//! Every proposal this member makes for a client (a write, a new session,
//! a membership change) takes the next request id ([`Pending::next_id`]:
//! the count starts at a random value on every start, so an entry
//! proposed before a restart is never taken for one of this run's) and
//! waits here under it ([`Pending::wait`]) until one of:
//! - its entry applies on this member: the state machine's reply goes to
//!   the client ([`Pending::take`], driver/ready.rs);
//! - the request timeout passes ([`Pending::late`]): `TIMEOUT`, the write
//!   may or may not happen;
//! - the leader or the term changes ([`Pending::take_all`]): forwarded
//!   proposals may be lost with the old leader, `LEADER_CHANGED`, may or
//!   may not happen;
//! - the member stops ([`Pending::take_all`]): `TIMEOUT`, may or may not
//!   happen.
//!
//! Nothing here sends anything: the driver answers what these return.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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

    /// Every write that waited more than `timeout` at `now`, taken.
    pub fn late(&mut self, now: Instant, timeout: Duration) -> Vec<PendingWrite> {
        let late: Vec<u64> =
            self.waiting.iter().filter(|(_, p)| now.duration_since(p.since) > timeout).map(|(k, _)| *k).collect();
        late.into_iter().filter_map(|rid| self.waiting.remove(&rid)).collect()
    }

    /// Every waiting write, taken, in request id order.
    pub fn take_all(&mut self) -> Vec<PendingWrite> {
        std::mem::take(&mut self.waiting).into_values().collect()
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
        let late = p.late(t0 + Duration::from_millis(1600), Duration::from_secs(1));
        assert_eq!(late.iter().map(|x| x.client_id).collect::<Vec<_>>(), [11]);
        assert_eq!(p.len(), 1);
        // A leader change takes the rest.
        assert_eq!(p.take_all().iter().map(|x| x.client_id).collect::<Vec<_>>(), [12]);
        assert_eq!(p.len(), 0);
    }
}
