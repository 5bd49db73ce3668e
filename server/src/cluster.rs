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
//!    joined is a wiped member;
//! 6. incarnations (finding A6): every data dir has a random incarnation,
//!    made and synced the first time the member starts, before any peer
//!    traffic ([`Incarnations`]). The hello carries the dialer's
//!    (`incarnation`) and the one it remembers for `to` (`to_incarnation`,
//!    0 if none). An acceptor remembers, on disk and before it reads a
//!    single raft message, the incarnation of every member it admits; a
//!    member that comes back with another one lost its data dir and is
//!    refused. A hello whose `to_incarnation` is not this member's own
//!    tells this member its data dir was replaced: `Verdict::Wiped`. This
//!    needs no leader and no log entry, so it holds from a member's first
//!    connection: a founding member wiped in the first seconds of a new
//!    cluster (before the leader recorded it as joined) is refused by
//!    every peer it had talked to, and stops when one of them dials it.
//!    A hello with incarnation 0 (an older member) skips the rule.
//!
//! A refused dialer gets a `PeerRefused` frame with the reason, and the
//! connection is closed; both ends log the reason. A dialer refused as
//! wiped (rule 5's member that joined and has no id, rule 6's other
//! incarnation) is told so (`wiped`) and stops with exit code 2, as a
//! removed one does (`removed`). Nothing of a refused
//! connection reaches raft-rs or the session code; frames before the hello
//! is accepted are limited to [`HELLO_FRAME_LIMIT`] bytes.
//!
//! What it does not cover: a wiped member that reaches only peers that
//! never admitted its old incarnation (they were down or cut off for all
//! of its old life) is taken for a new member by them until one that did
//! admit it dials it. Its old votes went to those that admitted it, so a
//! double vote needs the peers that knew it to be unreachable for the
//! whole of an election that the others hold.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use baton_proto::{ClusterRecord, ClusterSettings, PeerHello};
use rand::Rng;

use crate::kv::{Batch, Kv, KvError};
use crate::state::StateMachine;

/// This data dir's own incarnation (8 bytes, big-endian). One keyspace
/// with state/mod.rs and raft_store.rs: state/tests.rs `keys_are_distinct`.
pub(crate) const KEY_INCARNATION: &[u8] = b"o";
/// `m` + member id (8 bytes, big-endian) -> its incarnation as first admitted.
pub(crate) const PREFIX_PEER_INCARNATION: u8 = b'm';

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
    /// The dialer's data dir was wiped (rules 5 and 6): refuse, and tell
    /// it so (it stops, as when a peer's hello says so: `Wiped`).
    DialerWiped(String),
}

/// Rules 1, 2, 4, 5 and the second half of 6 (`mine`: this data dir's
/// incarnation). Rule 3 needs the certificate and the first half of 6 the
/// remembered incarnations: the transport applies them after this.
pub fn judge(me: u64, mine: u64, members: &BTreeSet<u64>, own: &ClusterRecord, h: &PeerHello) -> Verdict {
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
    if own.cluster_id.is_empty() && !h.cluster_id.is_empty() && h.to_joined {
        return Verdict::Wiped(format!(
            "member {} says this member ({me}) joined cluster {} but this data dir has no cluster id: it was \
             wiped or replaced. This member must not vote with its old id: remove it and add it back as a new \
             member (docs/security.md)",
            h.from, h.cluster_id
        ));
    }
    if let Some(wiped) = judge_own_incarnation(mine, h) {
        return wiped;
    }
    if own.cluster_id.is_empty() {
        return Verdict::Admit;
    }
    if h.cluster_id.is_empty() {
        if own.joined.contains(&h.from) {
            return Verdict::DialerWiped(format!(
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
pub fn hello(me: u64, to: u64, own: &ClusterRecord, inc: &Incarnations) -> PeerHello {
    PeerHello {
        from: me,
        to,
        cluster_version: 1,
        cluster_id: own.cluster_id.clone(),
        to_joined: own.joined.contains(&to),
        incarnation: inc.me,
        to_incarnation: inc.known(to).unwrap_or(0),
    }
}

/// Rule 6's first half, for the acceptor: `known` is what this member
/// remembers of `h.from`'s incarnation (`Incarnations::admit` holds the
/// lock around it).
pub fn judge_incarnation(known: Option<u64>, h: &PeerHello) -> Verdict {
    match known {
        Some(k) if h.incarnation != 0 && h.incarnation != k => Verdict::DialerWiped(format!(
            "member {} came back with another data dir (incarnation {:016x}, admitted before as {k:016x}): its \
             data dir was wiped or replaced. It must not vote with its old id: remove it and add it back as a \
             new member (docs/security.md)",
            h.from, h.incarnation
        )),
        _ => Verdict::Admit,
    }
}

/// Rule 6's second half, for the member dialed: a peer remembers this
/// member with another incarnation than its own.
fn judge_own_incarnation(mine: u64, h: &PeerHello) -> Option<Verdict> {
    (h.to_incarnation != 0 && h.to_incarnation != mine).then(|| {
        let cluster = match h.cluster_id.is_empty() {
            true => "a cluster with no id yet".to_string(),
            false => format!("cluster {}", h.cluster_id),
        };
        Verdict::Wiped(format!(
            "member {} of {cluster} admitted this member ({}) as incarnation {:016x}, but this data dir is \
             {mine:016x}: it was wiped or replaced. This member must not vote with its old id: remove it and add \
             it back as a new member (docs/security.md)",
            h.from, h.to, h.to_incarnation
        ))
    })
}

/// This data dir's incarnation and the other members' as this member
/// first admitted them (rule 6). Shared by the transport's tasks.
pub struct Incarnations {
    kv: Arc<dyn Kv>,
    /// This data dir's (never 0).
    pub me: u64,
    known: Mutex<BTreeMap<u64, u64>>,
}

impl Incarnations {
    /// Loads them from `kv`, making (and syncing) this data dir's own the
    /// first time.
    pub fn load(kv: Arc<dyn Kv>) -> Result<Self, KvError> {
        let be = |v: &[u8]| v.try_into().ok().map(u64::from_be_bytes);
        let me = match kv.get(KEY_INCARNATION)?.as_deref().and_then(be) {
            Some(me) if me != 0 => me,
            _ => {
                let me: u64 = rand::thread_rng().gen_range(1..=u64::MAX);
                let mut b = Batch::default();
                b.put(KEY_INCARNATION.to_vec(), me.to_be_bytes().to_vec());
                kv.write(b, true)?;
                me
            }
        };
        let mut known = BTreeMap::new();
        for (k, v) in kv.scan_prefix(&[PREFIX_PEER_INCARNATION])? {
            if let (Some(id), Some(inc)) = (be(&k[1..]), be(&v)) {
                known.insert(id, inc);
            }
        }
        Ok(Incarnations { kv, me, known: Mutex::new(known) })
    }

    /// The incarnation this member admitted `id` with, if it has.
    pub fn known(&self, id: u64) -> Option<u64> {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).get(&id).copied()
    }

    /// Rule 6 for an admitted hello: refused if `h.from` was admitted with
    /// another incarnation, else remembered (on disk, synced) before the
    /// connection's first raft message is read.
    pub fn admit(&self, h: &PeerHello) -> Verdict {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let verdict = judge_incarnation(known.get(&h.from).copied(), h);
        if verdict == Verdict::Admit && h.incarnation != 0 && !known.contains_key(&h.from) {
            let mut b = Batch::default();
            let mut key = vec![PREFIX_PEER_INCARNATION];
            key.extend_from_slice(&h.from.to_be_bytes());
            b.put(key, h.incarnation.to_be_bytes().to_vec());
            if let Err(e) = self.kv.write(b, true) {
                return Verdict::Refuse(format!("cannot record member {}'s incarnation: {e}", h.from));
            }
            known.insert(h.from, h.incarnation);
        }
        verdict
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
        PeerHello { from, to, cluster_version: 1, cluster_id: id.into(), to_joined, ..Default::default() }
    }

    #[test]
    fn the_hello_rule() {
        let members: BTreeSet<u64> = [1, 2, 3].into();
        let own = rec("c1", &[1, 2, 3]);
        let admit = |v: Verdict| v == Verdict::Admit;
        let refused = |v: Verdict| matches!(v, Verdict::Refuse(_));
        // Same cluster.
        assert!(admit(judge(1, 7, &members, &own, &h(2, 1, "c1", true))));
        // Rule 1 and 2.
        assert!(refused(judge(1, 7, &members, &own, &h(2, 3, "c1", true))));
        assert!(refused(judge(1, 7, &members, &own, &h(4, 1, "c1", false))));
        assert!(refused(judge(1, 7, &members, &own, &h(1, 1, "c1", true))));
        // Rule 5: another cluster; a wiped member; a member starting late.
        assert!(refused(judge(1, 7, &members, &own, &h(2, 1, "c2", false))));
        let Verdict::DialerWiped(why) = judge(1, 7, &members, &own, &h(3, 1, "", false)) else { panic!("admitted") };
        assert!(why.contains("wiped"), "{why}");
        assert!(admit(judge(1, 7, &members, &rec("c1", &[1, 2]), &h(3, 1, "", false))));
        // Rule 4: this member has no id.
        let none = rec("", &[]);
        assert!(admit(judge(3, 7, &members, &none, &h(1, 3, "", false))));
        assert!(admit(judge(3, 7, &members, &none, &h(1, 3, "c1", false))));
        assert!(matches!(judge(3, 7, &members, &none, &h(1, 3, "c1", true)), Verdict::Wiped(_)));
    }

    #[test]
    fn rule_6_incarnations() {
        let dir = tempfile::tempdir().expect("tmp");
        let kv: Arc<dyn Kv> = Arc::new(crate::kv::RocksKv::open(dir.path()).expect("open"));
        let inc = Incarnations::load(kv.clone()).expect("load");
        assert_ne!(inc.me, 0);
        let with =
            |from, incarnation, to_incarnation| PeerHello { incarnation, to_incarnation, ..h(from, 1, "", false) };
        // First contact is remembered; the same incarnation again is fine.
        assert_eq!(inc.admit(&with(2, 42, 0)), Verdict::Admit);
        assert_eq!(inc.admit(&with(2, 42, 0)), Verdict::Admit);
        // Another data dir under id 2 is refused, and says why.
        let Verdict::DialerWiped(why) = inc.admit(&with(2, 43, 0)) else { panic!("admitted a wiped member") };
        assert!(why.contains("wiped") && why.contains("add it back"), "{why}");
        // An older member (no incarnation) is judged by rules 1-5 only.
        assert_eq!(inc.admit(&with(3, 0, 0)), Verdict::Admit);
        assert_eq!(inc.known(3), None);
        // The memory and this member's own incarnation survive a restart.
        let me = inc.me;
        drop(inc);
        let again = Incarnations::load(kv).expect("reload");
        assert_eq!((again.me, again.known(2)), (me, Some(42)));
        assert_eq!(hello(1, 2, &rec("", &[]), &again).to_incarnation, 42);
        assert!(matches!(again.admit(&with(2, 44, 0)), Verdict::DialerWiped(_)));
        // A peer that admitted this member with another incarnation: this
        // data dir was replaced, whatever its cluster id says.
        let members: BTreeSet<u64> = [1, 2, 3].into();
        for own in [rec("", &[]), rec("c1", &[1, 2, 3])] {
            let id = own.cluster_id.clone();
            assert!(matches!(judge(1, me, &members, &own, &with(2, 42, me ^ 1)), Verdict::Wiped(_)));
            let ok = PeerHello { cluster_id: id, ..with(2, 42, me) };
            assert_eq!(judge(1, me, &members, &own, &ok), Verdict::Admit);
        }
        // ...but only a member can say so.
        assert!(matches!(judge(1, me, &members, &rec("", &[]), &with(9, 42, me ^ 1)), Verdict::Refuse(_)));
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
