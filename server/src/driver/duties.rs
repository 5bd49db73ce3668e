//! What only a leader does, each at most once per its interval: propose
//! the cluster record (cluster.rs) and reap due container and TTL nodes
//! (state/mod.rs, "Reaping"). Promotions are driver/members.rs.
//!
//! Rules:
//! - [`LeaderDuties`] is made new on every leader change (driver/ready.rs,
//!   `on_soft_state`): nothing one term's leader saw is taken for the
//!   next's, and a new leader does each duty at its first chance.
//! - The cluster record is proposed at most once per election timeout
//!   (raft-rs may refuse or lose it; the next look proposes it again if it
//!   is still due).
//! - A node is reaped only if it was due at two looks in a row, one
//!   [`crate::state::REAP_INTERVAL_MS`] apart: a node made or changed
//!   between the looks is not taken away under its creator.
//! - Each returns the entry to propose as an effect (effect.rs); the
//!   driver proposes it.

use std::time::{Duration, Instant};

use baton_proto::{command, ClusterRecord, ReapNode, ReapNodes};

use crate::effect::Effect;

/// The leader's duties, with what each remembers between looks.
#[derive(Debug, Default)]
pub(super) struct LeaderDuties {
    /// When this leader last proposed a cluster record.
    cluster_proposed: Option<Instant>,
    /// Its last look for due nodes, and what it found due then.
    reap_looked: Option<Instant>,
    reap_seen: Vec<ReapNode>,
}

impl LeaderDuties {
    /// The cluster record `next` makes, if one is due and `every` has
    /// passed since the last one this leader proposed.
    pub fn cluster_record(
        &mut self,
        now: Instant,
        every: Duration,
        next: impl FnOnce() -> Option<ClusterRecord>,
    ) -> Option<Effect> {
        if self.cluster_proposed.is_some_and(|t| now.duration_since(t) < every) {
            return None;
        }
        let rec = next()?;
        tracing::info!(cluster = %rec.cluster_id, joined = ?rec.joined, "proposing the cluster record");
        self.cluster_proposed = Some(now);
        Some(Effect::Propose { body: command::Body::Cluster(rec), what: "cluster record" })
    }

    /// Every [`crate::state::REAP_INTERVAL_MS`], looks at what `due` finds
    /// and reaps what was due at the last look too.
    pub fn reap(&mut self, now: Instant, due: impl FnOnce() -> Vec<ReapNode>) -> Option<Effect> {
        let every = Duration::from_millis(crate::state::REAP_INTERVAL_MS);
        if self.reap_looked.is_some_and(|t| now.duration_since(t) < every) {
            return None;
        }
        self.reap_looked = Some(now);
        let due = due();
        let nodes: Vec<ReapNode> = due.iter().filter(|n| self.reap_seen.contains(n)).cloned().collect();
        self.reap_seen = due;
        if nodes.is_empty() {
            return None;
        }
        tracing::debug!(nodes = nodes.len(), "reaping container and TTL nodes");
        Some(Effect::Propose { body: command::Body::Reap(ReapNodes { nodes }), what: "reap" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &str, pzxid: u64) -> ReapNode {
        ReapNode { path: path.into(), pzxid, ..Default::default() }
    }

    fn reaped(e: Option<Effect>) -> Vec<String> {
        match e {
            Some(Effect::Propose { body: command::Body::Reap(r), what: "reap" }) => {
                r.nodes.into_iter().map(|n| n.path).collect()
            }
            None => Vec::new(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_is_reaped_only_when_due_at_two_looks_an_interval_apart() {
        let t0 = Instant::now();
        let every = Duration::from_millis(crate::state::REAP_INTERVAL_MS);
        let mut d = LeaderDuties::default();
        // First look: both due, nothing seen before.
        assert!(reaped(d.reap(t0, || vec![node("/a", 1), node("/b", 1)])).is_empty());
        // Within the interval there is no look at all.
        let looked = std::cell::Cell::new(false);
        let early = d.reap(t0 + every / 2, || {
            looked.set(true);
            vec![node("/a", 1)]
        });
        assert!(early.is_none() && !looked.get(), "looked before the interval");
        // Second look: /a is still due as it was; /b got a child since (its
        // pzxid moved) and /c is new: only /a goes.
        let second = d.reap(t0 + every, || vec![node("/a", 1), node("/b", 2), node("/c", 1)]);
        assert_eq!(reaped(second), ["/a"]);
        // Third look: /b and /c as seen at the second.
        let third = d.reap(t0 + every * 2, || vec![node("/b", 2), node("/c", 1)]);
        assert_eq!(reaped(third), ["/b", "/c"]);
        // A new leader's duties remember nothing.
        let mut fresh = LeaderDuties::default();
        assert!(reaped(fresh.reap(t0 + every * 2, || vec![node("/b", 2)])).is_empty());
    }

    #[test]
    fn the_cluster_record_is_proposed_at_most_once_per_interval_and_only_when_due() {
        let t0 = Instant::now();
        let every = Duration::from_millis(1000);
        let rec = || Some(ClusterRecord { cluster_id: "c1".into(), ..Default::default() });
        let mut d = LeaderDuties::default();
        // Nothing due: nothing proposed, and the next look is not held back.
        assert!(d.cluster_record(t0, every, || None).is_none());
        let first = d.cluster_record(t0 + Duration::from_millis(1), every, rec);
        assert!(matches!(first, Some(Effect::Propose { body: command::Body::Cluster(_), what: "cluster record" })));
        assert!(d.cluster_record(t0 + Duration::from_millis(500), every, rec).is_none(), "twice in an interval");
        assert!(d.cluster_record(t0 + Duration::from_millis(1001), every, rec).is_some());
    }
}
