//! Reaping (the module doc's "Container and TTL nodes"): which container
//! and TTL nodes are due. The leader proposes them (driver); `apply`
//! deletes a listed node only if it is still due and unchanged.

use super::*;

impl StateMachine {
    /// `(czxid, pzxid)` of the container or TTL node at `path` if it is
    /// due for reaping at `time_ms` (module doc, "Reaping").
    pub(super) fn due(&self, path: &str, time_ms: i64) -> Option<(u64, u64)> {
        let n = self.nodes.get(path)?;
        let s = &n.stat;
        if s.num_children != 0 || s.ephemeral_owner != 0 {
            return None;
        }
        let due = (s.container && s.cversion > 0)
            || (s.ttl_ms > 0 && time_ms.saturating_sub(s.mtime) > s.ttl_ms.min(MAX_TTL_MS) as i64);
        due.then_some((s.czxid, s.pzxid))
    }

    /// Container and TTL nodes due for reaping at `time_ms`, at most
    /// [`MAX_REAP_PER_ENTRY`] (the leader's look; apply checks again).
    pub fn due_for_reaping(&self, time_ms: i64) -> Vec<baton_proto::ReapNode> {
        self.reapable
            .iter()
            .filter_map(|p| {
                self.due(p, time_ms).map(|(czxid, pzxid)| baton_proto::ReapNode { path: p.clone(), czxid, pzxid })
            })
            .take(MAX_REAP_PER_ENTRY)
            .collect()
    }
}
