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
//!   are asked again after [`READ_INDEX_RETRY`], and reads older than the
//!   request timeout fail with TIMEOUT.
//!
//! Pure bookkeeping: time comes in as arguments.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_proto::Request;
use raft::prelude::ReadState;

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
    /// older than `timeout` are returned (to fail with TIMEOUT).
    pub fn retry(&mut self, now: Instant, timeout: Duration) -> Vec<Deferred> {
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
                        late.push(d);
                    } else {
                        self.queued.push(d);
                    }
                }
            }
        }
        late
    }

    /// Reads that can be served at `applied`, and reads that waited longer
    /// than `timeout` for it (with the index they needed).
    pub fn take_ready(
        &mut self,
        applied: u64,
        now: Instant,
        timeout: Duration,
    ) -> (Vec<Deferred>, Vec<(u64, Deferred)>) {
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
                late.push((idx, d));
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
