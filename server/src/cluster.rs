//! The cluster's identity, and who may talk to this member on the peer port.
//!
//! The cluster id is random, created once: the first leader of a new cluster
//! (one whose state has no id) proposes it as a log entry, so every member
//! stores the same id in its state machine (its data dir, and snapshots).
//! The leader then records, in further entries, each member whose log holds
//! that entry (its raft-rs `matched` index reached it): the `joined` set.
//! A member that joined and later shows up without an id has lost its data
//! dir. Letting it vote would let it vote twice in one term (it forgot its
//! vote): the classic wiped-disk hazard.
//!
//! A peer connection starts with the dialer's `PeerHello` (after the TLS
//! handshake when TLS is on). The acceptor admits it only if, in order:
//! 1. `to` is this member (the dialer reached whom it meant to);
//! 2. `from` is another member of the configuration (membership.rs: the
//!    applied `ConfState`; before a joining member has one, its `--join`
//!    list). One the cluster removed (`ClusterRecord::removed`) is refused
//!    with `removed` set, and on reading that it exits (exit code 2, as a
//!    wiped member does): a removed member never goes on serving its
//!    clients without a leader;
//! 3. with peer TLS on, the dialer's certificate (already verified against
//!    the peer CA) carries the DNS name `member-<from>.baton`;
//! 4. when this member has no cluster id: the hello does not say that this
//!    member joined the hello's cluster. If it does, this member's data dir
//!    was wiped: it refuses every peer and stops (`Verdict::Wiped`);
//! 5. when this member has an id: the hello carries the same id, or carries
//!    none and `from` has not joined (a member still starting for the first
//!    time). A different id is another cluster; no id from a member that
//!    joined is a wiped member.
//!
//! A refused dialer gets a `PeerRefused` frame with the reason, and the
//! connection is closed; both ends log the reason. Nothing of a refused
//! connection reaches raft-rs or the session code; frames before the hello
//! is accepted are limited to [`HELLO_FRAME_LIMIT`] bytes.
//!
//! What it does not cover: a member wiped before the leader recorded it as
//! joined (the first seconds of a new cluster, or of a member's life after
//! `member add`) is taken for a new member.

use std::collections::BTreeSet;

use baton_proto::{ClusterRecord, ClusterSettings, PeerHello};
use rand::Rng;

use crate::state::StateMachine;

/// Largest frame a peer may send before its hello is accepted.
pub const HELLO_FRAME_LIMIT: usize = 64 * 1024;

/// What the acceptor decided about a hello.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// Refuse this connection, with the reason for both logs.
    Refuse(String),
    /// This member's data dir was wiped: refuse and stop the member.
    Wiped(String),
    /// The dialer was removed from the cluster: refuse, and tell it so
    /// (it stops: a removed member serves no one).
    Removed(String),
}

/// Rules 1, 2, 4 and 5 (rule 3 needs the certificate: the transport).
pub fn judge(me: u64, members: &BTreeSet<u64>, own: &ClusterRecord, h: &PeerHello) -> Verdict {
    if h.to != me {
        return Verdict::Refuse(format!("member {} dialed member {} but reached member {me}", h.from, h.to));
    }
    if h.from != me && own.removed.contains(&h.from) {
        return Verdict::Removed(format!(
            "member {} was removed from cluster {} (ids are never reused): it must stop; add the machine back              with a new id (docs/operations.md)",
            h.from, own.cluster_id
        ));
    }
    if h.from == me || !members.contains(&h.from) {
        return Verdict::Refuse(format!("{} is not another member of this cluster ({members:?})", h.from));
    }
    if own.cluster_id.is_empty() {
        if !h.cluster_id.is_empty() && h.to_joined {
            return Verdict::Wiped(format!(
                "member {} says this member ({me}) joined cluster {} but this data dir has no cluster id: it was \
                 wiped or replaced. This member must not vote with its old id: remove it and add it back as a new \
                 member (docs/security.md)",
                h.from, h.cluster_id
            ));
        }
        return Verdict::Admit;
    }
    if h.cluster_id.is_empty() {
        if own.joined.contains(&h.from) {
            return Verdict::Refuse(format!(
                "member {} joined cluster {} but now has no cluster id: its data dir was wiped or replaced. It \
                 must not vote with its old id: remove it and add it back as a new member (docs/security.md)",
                h.from, own.cluster_id
            ));
        }
        return Verdict::Admit;
    }
    if h.cluster_id != own.cluster_id {
        return Verdict::Refuse(format!(
            "member {} belongs to cluster {}, this is cluster {}",
            h.from, h.cluster_id, own.cluster_id
        ));
    }
    Verdict::Admit
}

/// The hello this member sends to `to`.
pub fn hello(me: u64, to: u64, own: &ClusterRecord) -> PeerHello {
    PeerHello {
        from: me,
        to,
        cluster_version: 1,
        cluster_id: own.cluster_id.clone(),
        to_joined: own.joined.contains(&to),
    }
}

/// What the leader should propose about the cluster's identity, if
/// anything: a new id when there is none, else the members whose log now
/// holds the entry that set it (`matched(id)`: raft-rs's matched index)
/// and that are not yet recorded.
///
/// `seed`: this leader's flags' settings, proposed with the new id, or
/// alone when the record has an id but no settings (settings.rs).
pub fn next_record(
    sm: &StateMachine,
    members: impl IntoIterator<Item = u64>,
    matched: impl Fn(u64) -> u64,
    rng: &mut impl Rng,
    seed: &ClusterSettings,
) -> Option<ClusterRecord> {
    let own = sm.cluster();
    if own.cluster_id.is_empty() {
        let id: u128 = rng.gen();
        return Some(ClusterRecord {
            cluster_id: format!("{id:032x}"),
            settings: Some(seed.clone()),
            ..Default::default()
        });
    }
    if own.settings.is_none() {
        return Some(ClusterRecord {
            cluster_id: own.cluster_id.clone(),
            settings: Some(seed.clone()),
            ..Default::default()
        });
    }
    let new: Vec<u64> = members.into_iter().filter(|m| !own.joined.contains(m) && matched(*m) >= own.index).collect();
    (!new.is_empty()).then(|| ClusterRecord { cluster_id: own.cluster_id.clone(), joined: new, ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, joined: &[u64]) -> ClusterRecord {
        ClusterRecord { cluster_id: id.into(), index: 5, joined: joined.to_vec(), ..Default::default() }
    }

    fn h(from: u64, to: u64, id: &str, to_joined: bool) -> PeerHello {
        PeerHello { from, to, cluster_version: 1, cluster_id: id.into(), to_joined }
    }

    #[test]
    fn the_hello_rule() {
        let members: BTreeSet<u64> = [1, 2, 3].into();
        let own = rec("c1", &[1, 2, 3]);
        let admit = |v: Verdict| v == Verdict::Admit;
        let refused = |v: Verdict| matches!(v, Verdict::Refuse(_));
        // Same cluster.
        assert!(admit(judge(1, &members, &own, &h(2, 1, "c1", true))));
        // Rule 1 and 2.
        assert!(refused(judge(1, &members, &own, &h(2, 3, "c1", true))));
        assert!(refused(judge(1, &members, &own, &h(4, 1, "c1", false))));
        assert!(refused(judge(1, &members, &own, &h(1, 1, "c1", true))));
        // Rule 5: another cluster; a wiped member; a member starting late.
        assert!(refused(judge(1, &members, &own, &h(2, 1, "c2", false))));
        let Verdict::Refuse(why) = judge(1, &members, &own, &h(3, 1, "", false)) else { panic!("admitted") };
        assert!(why.contains("wiped"), "{why}");
        assert!(admit(judge(1, &members, &rec("c1", &[1, 2]), &h(3, 1, "", false))));
        // Rule 4: this member has no id.
        let none = rec("", &[]);
        assert!(admit(judge(3, &members, &none, &h(1, 3, "", false))));
        assert!(admit(judge(3, &members, &none, &h(1, 3, "c1", false))));
        assert!(matches!(judge(3, &members, &none, &h(1, 3, "c1", true)), Verdict::Wiped(_)));
    }

    #[test]
    fn the_leader_records_an_id_then_who_holds_it() {
        let mut rng = rand::thread_rng();
        let mut sm = StateMachine::new();
        let seed = ClusterSettings { superusers: vec!["x509:admin".into()], open_admin: false };
        let first = next_record(&sm, [1, 2, 3], |_| 0, &mut rng, &seed).expect("an id");
        assert_eq!(first.cluster_id.len(), 32);
        assert_eq!(first.settings.as_ref(), Some(&seed), "the id's entry seeds the settings");
        sm.set_cluster(7, &first);
        assert_eq!(sm.cluster().index, 7);
        // Member 3 has not stored entry 7 yet.
        let next = next_record(&sm, [1, 2, 3], |m| if m == 3 { 6 } else { 7 }, &mut rng, &seed).expect("joined");
        assert_eq!(next.joined, vec![1, 2]);
        sm.set_cluster(8, &next);
        assert!(next_record(&sm, [1, 2, 3], |m| if m == 3 { 6 } else { 8 }, &mut rng, &seed).is_none());
        // Another leader's flags never replace recorded settings.
        let other = ClusterSettings { superusers: Vec::new(), open_admin: true };
        sm.set_cluster(
            9,
            &ClusterRecord {
                cluster_id: first.cluster_id.clone(),
                settings: Some(other.clone()),
                ..Default::default()
            },
        );
        assert_eq!(sm.cluster().settings.as_ref(), Some(&seed));
        // A record from before settings were recorded gets them seeded.
        let mut old = StateMachine::new();
        old.set_cluster(3, &ClusterRecord { cluster_id: "c".into(), joined: vec![1, 2, 3], ..Default::default() });
        let s = next_record(&old, [1, 2, 3], |_| 9, &mut rng, &other).expect("a seed");
        assert_eq!((s.cluster_id.as_str(), s.settings.as_ref()), ("c", Some(&other)));
        // A second id never replaces the first.
        sm.set_cluster(9, &ClusterRecord { cluster_id: "other".into(), joined: vec![3], ..Default::default() });
        assert_eq!(sm.cluster().cluster_id, first.cluster_id);
        assert_eq!(sm.cluster().joined, vec![1, 2]);
    }
}
