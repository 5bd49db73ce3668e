//! Record codecs: the store's keys and the records nodes and sessions are
//! kept as (on disk, in snapshots and backups).

use super::*;

pub(super) fn node_key(path: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(path.len() + 1);
    k.push(PREFIX_NODE);
    k.extend_from_slice(path.as_bytes());
    k
}

pub(super) fn session_key(id: u64) -> Vec<u8> {
    let mut k = vec![PREFIX_SESSION];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub(super) fn node_record(n: &Node) -> NodeRecord {
    NodeRecord { data: n.data.clone(), stat: Some(n.stat), next_seq: n.next_seq, acl: n.acl.clone() }
}

pub(super) fn node_from_record(r: NodeRecord) -> Node {
    Node { data: r.data, stat: r.stat.unwrap_or_default(), next_seq: r.next_seq, acl: r.acl }
}

pub(super) fn session_record(id: u64, s: &Session) -> SessionRecord {
    SessionRecord {
        id,
        timeout_ms: s.timeout_ms,
        secret: s.secret.clone(),
        replies: s
            .replies
            .iter()
            .map(|(seq, (digest, r))| CachedReply { seq: *seq, response: r.clone(), digest: *digest })
            .collect(),
        acked_below: s.acked_below,
        epoch: s.epoch,
    }
}

pub(super) fn session_from_record(r: SessionRecord) -> Session {
    Session {
        timeout_ms: r.timeout_ms,
        secret: r.secret,
        acked_below: r.acked_below,
        epoch: r.epoch,
        reply_bytes: r.replies.iter().map(|c| c.response.len()).sum(),
        replies: r.replies.into_iter().map(|c| (c.seq, (c.digest, c.response))).collect(),
        ephemerals: BTreeSet::new(),
    }
}
