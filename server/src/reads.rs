//! Reads that wait: linearizable reads (and attaches) queued for a
//! ReadIndex round, and reads whose index is known waiting for this
//! member's applied index to reach it.
//!
//! A linearizable read, step by step:
//! 1. `on_request` queues it ([`Reads::push`]).
//! 2. At the end of the turn, [`Reads::issue`] gives every read queued in
//!    that turn one context, and the driver calls `RawNode::read_index`
//!    with it. On a follower raft-rs forwards it to the leader (at once:
//!    driver/ready.rs).
//! 3. The leader (`ReadOnlyOption::Safe`) records its commit index and
//!    confirms it still leads with a heartbeat round to a majority.
//! 4. The answer comes back in a Ready as a `ReadState`;
//!    [`Reads::on_read_states`] parks the batch's reads with that index.
//! 5. At the end of every turn, [`Reads::take_ready`] hands out the reads
//!    whose index this member has applied; the driver serves them from its
//!    state, with `zxid` = its applied index then (at least the read index).
//!
//! A leader or term change queues every outstanding batch again
//! ([`Reads::requeue`]), under new contexts, for the new leader. A `stale`
//! read skips all of this: it is answered from the member's state at once,
//! however far behind that is.
//!
//! Invariants:
//! - Every read queued in one loop turn shares one ReadIndex request; its
//!   context is this member's id followed by a counter, so contexts of
//!   different members never collide at the leader (which drops a
//!   duplicate), and the counter starts at a random value on every start,
//!   so an answer to a request made before a restart cannot be taken for
//!   a new one (finding S7).
//! - A read is answered only at an applied index at or past both its
//!   ReadIndex and its own `min_index` (an attach's last seen index).
//! - raft-rs drops a ReadIndex silently while the leader has not committed
//!   in its term, or while a follower knows no leader: unanswered batches
//!   are asked again as soon as this member sees the first commit of the
//!   current term (the driver's `reads_after_term_commit`: a batch asked
//!   when the leader changed has almost always met that drop, and a
//!   failover's re-attaching clients waited the whole retry for it), and
//!   otherwise after [`READ_INDEX_RETRY`]; reads older than the request
//!   timeout fail with TIMEOUT.
//!
//! Pure bookkeeping: time comes in as arguments; a read that fails is
//! returned as an effect (effect.rs), one that can be served as itself.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_proto::{ErrorCode, Request};
use raft::prelude::ReadState;

use crate::effect::Effect;
use crate::message::ConnId;

/// How long an unanswered ReadIndex waits before it is asked again.
pub const READ_INDEX_RETRY: Duration = Duration::from_millis(300);

/// A read (or attach) waiting for its ReadIndex or for `applied`.
pub struct Deferred {
    pub conn: ConnId,
    pub req: Request,
    pub since: Instant,
    /// Serve no earlier than this applied index (an attach's `last_zxid`).
    pub min_index: u64,
}

struct Batch {
    issued: Instant,
    reads: Vec<Deferred>,
}

pub struct Reads {
    me: u64,
    next_ctx: u64,
    queued: Vec<Deferred>,
    batches: BTreeMap<u64, Batch>,
    waiting: Vec<(u64, Deferred)>,
}

impl Reads {
    /// `first_ctx`: a random start for the context counter.
    pub fn new(me: u64, first_ctx: u64) -> Self {
        Reads { me, next_ctx: first_ctx, queued: Vec::new(), batches: BTreeMap::new(), waiting: Vec::new() }
    }

    /// Queues a read for the next ReadIndex round.
    pub fn push(&mut self, d: Deferred) {
        self.queued.push(d);
    }

    /// Parks a read until `applied >= index`.
    pub fn wait(&mut self, index: u64, d: Deferred) {
        self.waiting.push((index.max(d.min_index), d));
    }

    /// The context of a new ReadIndex request for everything queued, if
    /// anything is.
    pub fn issue(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.queued.is_empty() {
            return None;
        }
        let reads = std::mem::take(&mut self.queued);
        let ctx = self.next_ctx;
        self.next_ctx = self.next_ctx.wrapping_add(1);
        let mut rctx = self.me.to_be_bytes().to_vec();
        rctx.extend_from_slice(&ctx.to_be_bytes());
        self.batches.insert(ctx, Batch { issued: now, reads });
        Some(rctx)
    }

    /// ReadIndex answers: their reads now wait for the applied index.
    pub fn on_read_states(&mut self, states: &[ReadState]) {
        for rs in states {
            if rs.request_ctx.len() != 16 || rs.request_ctx[..8] != self.me.to_be_bytes() {
                continue;
            }
            let Ok(ctx) = <[u8; 8]>::try_from(&rs.request_ctx[8..16]) else { continue };
            if let Some(batch) = self.batches.remove(&u64::from_be_bytes(ctx)) {
                for d in batch.reads {
                    self.waiting.push((rs.index.max(d.min_index), d));
                }
            }
        }
    }

    /// The leader changed: ask the new one.
    pub fn requeue(&mut self) {
        for (_, b) in std::mem::take(&mut self.batches) {
            self.queued.extend(b.reads);
        }
    }

    /// Batches unanswered for [`READ_INDEX_RETRY`] are asked again; reads
    /// older than `timeout` fail with TIMEOUT (nothing changed).
    pub fn retry(&mut self, now: Instant, timeout: Duration) -> Vec<Effect> {
        let stale: Vec<u64> = self
            .batches
            .iter()
            .filter(|(_, b)| now.duration_since(b.issued) > READ_INDEX_RETRY)
            .map(|(k, _)| *k)
            .collect();
        let mut late = Vec::new();
        for ctx in stale {
            if let Some(b) = self.batches.remove(&ctx) {
                for d in b.reads {
                    if now.duration_since(d.since) > timeout {
                        let msg = "no ReadIndex within the request timeout (no leader?)";
                        late.push(Effect::reply(d.conn, d.req.id, ErrorCode::Timeout, msg));
                    } else {
                        self.queued.push(d);
                    }
                }
            }
        }
        late
    }

    /// Reads that can be served at `applied`; reads that waited longer
    /// than `timeout` for it fail with TIMEOUT, naming the index they
    /// needed.
    pub fn take_ready(&mut self, applied: u64, now: Instant, timeout: Duration) -> (Vec<Deferred>, Vec<Effect>) {
        if self.waiting.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let mut ready = Vec::new();
        let mut late = Vec::new();
        let mut still = Vec::new();
        for (idx, d) in std::mem::take(&mut self.waiting) {
            if idx <= applied {
                ready.push(d);
            } else if now.duration_since(d.since) > timeout {
                let msg = format!("this member has applied {applied}, the read needs {idx}");
                late.push(Effect::reply(d.conn, d.req.id, ErrorCode::Timeout, msg));
            } else {
                still.push((idx, d));
            }
        }
        self.waiting = still;
        (ready, late)
    }

    /// Forgets a closed connection's reads.
    pub fn remove_conn(&mut self, conn: ConnId) {
        self.queued.retain(|d| d.conn != conn);
        for b in self.batches.values_mut() {
            b.reads.retain(|d| d.conn != conn);
        }
        self.waiting.retain(|(_, d)| d.conn != conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(conn: ConnId, id: u64, since: Instant, min_index: u64) -> Deferred {
        Deferred { conn, req: Request { id, ..Default::default() }, since, min_index }
    }

    fn state(ctx: &[u8], index: u64) -> ReadState {
        ReadState { index, request_ctx: ctx.to_vec() }
    }

    fn ids(ds: &[Deferred]) -> Vec<u64> {
        ds.iter().map(|d| d.req.id).collect()
    }

    #[test]
    fn a_turns_reads_share_one_context_and_are_served_at_or_past_their_index() {
        let t0 = Instant::now();
        let mut r = Reads::new(2, u64::MAX);
        assert_eq!(r.issue(t0), None, "nothing queued, no ReadIndex");
        r.push(read(1, 10, t0, 0));
        r.push(read(1, 11, t0, 9));
        let ctx = r.issue(t0).expect("a context");
        assert_eq!(ctx[..8], 2u64.to_be_bytes(), "the member's id first");
        // Another member's answer, or an unknown context, is not ours.
        r.on_read_states(&[state(&[&3u64.to_be_bytes()[..], &ctx[8..]].concat(), 5), state(&ctx[..8], 5)]);
        assert!(ids(&r.take_ready(100, t0, Duration::from_secs(1)).0).is_empty());
        r.on_read_states(&[state(&ctx, 5)]);
        // At applied 4 nothing; at 5 the first; the second needs its own 9.
        assert!(ids(&r.take_ready(4, t0, Duration::from_secs(1)).0).is_empty());
        assert_eq!(ids(&r.take_ready(5, t0, Duration::from_secs(1)).0), [10]);
        let (ready, late) = r.take_ready(9, t0, Duration::from_secs(1));
        assert_eq!((ids(&ready), late.len()), (vec![11], 0));
        // The next context is the counter's next (it wrapped).
        r.push(read(1, 12, t0, 0));
        assert_eq!(r.issue(t0).expect("a context")[8..], 0u64.to_be_bytes());
    }

    #[test]
    fn unanswered_reads_are_asked_again_then_fail_with_timeout_and_nothing_else() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = Reads::new(1, 0);
        r.push(read(7, 70, t0, 0));
        r.push(read(7, 71, t0 + ms(800), 0));
        let first = r.issue(t0).expect("a context");
        // Before READ_INDEX_RETRY nothing is asked again.
        assert!(r.retry(t0 + ms(100), ms(1000)).is_empty());
        assert_eq!(r.issue(t0 + ms(100)), None);
        // After it, the old request's reads are queued again: the older one
        // is past the timeout and fails, the younger waits for a new context.
        let late = r.retry(t0 + ms(1200), ms(1000));
        assert_eq!(late.iter().filter_map(Effect::answered).collect::<Vec<_>>(), [(70, ErrorCode::Timeout)]);
        let second = r.issue(t0 + ms(1200)).expect("asked again");
        assert_ne!(first, second, "a new context");
        // An answer to the first request serves nothing now.
        r.on_read_states(&[state(&first, 1)]);
        assert!(ids(&r.take_ready(1, t0 + ms(1200), ms(1000)).0).is_empty());
        // A read that waits for an index this member does not reach in
        // time fails, naming both.
        r.on_read_states(&[state(&second, 50)]);
        let (ready, late) = r.take_ready(40, t0 + ms(2000), ms(1000));
        assert!(ready.is_empty());
        match &late[..] {
            [Effect::Reply { conn: 7, id: 71, code: ErrorCode::Timeout, msg }] => {
                assert!(msg.contains("applied 40") && msg.contains("needs 50"), "{msg}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_leader_change_asks_the_new_leader_and_a_closed_connection_is_forgotten() {
        let t0 = Instant::now();
        let mut r = Reads::new(1, 0);
        r.push(read(1, 10, t0, 0));
        r.push(read(2, 20, t0, 0));
        let old = r.issue(t0).expect("a context");
        r.requeue();
        r.remove_conn(2);
        let new = r.issue(t0).expect("queued again");
        assert_ne!(old, new);
        r.on_read_states(&[state(&new, 3)]);
        assert_eq!(ids(&r.take_ready(3, t0, Duration::from_secs(1)).0), [10]);
    }
}
