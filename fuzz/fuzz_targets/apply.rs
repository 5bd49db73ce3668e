//! Fuzz target `apply`: an arbitrary sequence of log commands applied to a
//! `StateMachine`.
//!
//! The commands are structured (the `arbitrary` crate): new sessions,
//! expiries, and client writes (create, set, delete, multi with checks and
//! fences, close) on a small alphabet of paths (`/a`, `/a/b`, ... plus paths
//! created earlier, sequential ones included, and a few invalid ones), from
//! a small set of session ids (live, ended, or never created), with small
//! sequence numbers so that retries and the exactly-once window are hit.
//!
//! Writes may come from a superuser or not, and include the admin ops
//! (`reset_fence`, `set_settings` with good and bad settings); `Cluster`
//! entries carry cluster ids, joined members and seeds of the cluster-wide
//! settings (server/src/settings.rs), as a leader proposes them.
//!
//! Creates may ask for container and TTL nodes (bad combinations
//! included), and `Reap` entries list what the state machine itself finds
//! due at the entry's time plus arbitrary stale ones (wrong `czxid` or
//! `pzxid`), as a leader's late or repeated entry would.
//!
//! Invariants, checked after every command:
//! - no panic;
//! - `applied()` is the index just applied (monotone);
//! - a node's version, cversion and sequential counter never decrease while
//!   it exists (same `czxid`);
//! - `snapshot()` then `restore()` into a fresh `StateMachine` gives the
//!   same `dump()` and the same snapshot bytes;
//! - that restored copy, given the next command, answers the same reply as
//!   the original (derived state such as children and ephemerals is rebuilt
//!   right).
#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use baton_proto::{
    client_write, command, op, CheckFenceOp, CheckOp, ClientWrite, CloseSessionReq, ClusterRecord, ClusterSettings,
    Command, CreateOp, DeleteOp, ExpireSessions, MultiOp, NewSession, Op, ReapNode, ReapNodes, ResetFenceOp, SetOp,
    SetSettingsOp,
};
use baton_server::state::StateMachine;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

/// Path segments: few, so that paths collide.
const SEGMENTS: [&str; 3] = ["a", "b", "c"];
/// Superuser identities to pick from (the last is not a valid one).
const SUPERUSERS: [&str; 3] = ["x509:admin", "digest:root:aGFzaA==", "world:anyone"];
/// Invalid paths the state machine must refuse.
const BAD_PATHS: [&str; 6] = ["", "a", "/a/", "//a", "/a/..", "/a\0b"];

#[derive(Arbitrary, Debug)]
enum Step {
    NewSession {
        timeout_ms: u16,
    },
    Expire(Vec<SessionRef>),
    Write {
        session: SessionRef,
        seq: u8,
        acked_below: u8,
        op: WriteOp,
        superuser: bool,
    },
    /// A cluster record entry: an id (one of two), joined members, and a
    /// settings seed.
    Cluster {
        id: bool,
        joined: u8,
        seed: Option<(u8, bool)>,
    },
    /// An entry without a state change (a new leader's empty entry).
    Skip,
    /// A `ReapNodes` entry: what is due now, plus stale entries.
    Reap(Vec<(PathRef, u8, u8)>),
}

/// A session: one created earlier (live or ended), or an unknown id.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct SessionRef(u8);

#[derive(Arbitrary, Debug)]
enum WriteOp {
    Create(Create),
    Set { path: PathRef, data: u8, version: Option<i8> },
    Delete { path: PathRef, version: Option<i8> },
    Multi(Vec<MultiStep>),
    Close,
    ResetFence { resource: u8 },
    SetSettings { superusers: u8, open_admin: bool },
}

#[derive(Arbitrary, Debug)]
struct Create {
    path: PathRef,
    data: u8,
    ephemeral: bool,
    sequential: bool,
    parents: bool,
    container: bool,
    /// TTL in tens of ms, 0 for none (mod 4).
    ttl: u8,
}

#[derive(Arbitrary, Debug)]
enum MultiStep {
    Create(Create),
    Set { path: PathRef, data: u8, version: Option<i8> },
    Delete { path: PathRef, version: Option<i8> },
    Check { path: PathRef, version: Option<i8> },
    Fence { resource: u8, token: u8 },
    Empty,
}

#[derive(Arbitrary, Debug)]
enum PathRef {
    /// `/` followed by up to 3 segments from `SEGMENTS`.
    Alpha(Vec<u8>),
    /// A path created earlier (sequential names included).
    Created(u8),
    Bad(u8),
}

/// What the harness knows beyond the state machine: ids and paths to pick.
#[derive(Default)]
struct Known {
    sessions: Vec<u64>,
    paths: Vec<String>,
}

impl Known {
    fn session(&self, r: SessionRef) -> u64 {
        match self.sessions.get(r.0 as usize) {
            Some(id) => *id,
            None => 1_000_000 + r.0 as u64, // never a session: ids are log indexes
        }
    }

    fn path(&self, p: &PathRef) -> String {
        match p {
            PathRef::Alpha(segs) => {
                let mut s = String::new();
                for b in segs.iter().take(3) {
                    s.push('/');
                    s.push_str(SEGMENTS[*b as usize % SEGMENTS.len()]);
                }
                if s.is_empty() {
                    s.push('/');
                }
                s
            }
            PathRef::Created(i) if !self.paths.is_empty() => self.paths[*i as usize % self.paths.len()].clone(),
            PathRef::Created(_) => "/".into(),
            PathRef::Bad(i) => BAD_PATHS[*i as usize % BAD_PATHS.len()].into(),
        }
    }

    fn create(&self, c: &Create) -> CreateOp {
        CreateOp {
            path: self.path(&c.path),
            data: vec![c.data; c.data as usize % 4].into(),
            ephemeral: c.ephemeral,
            sequential: c.sequential,
            parents: c.parents,
            acl: Vec::new(),
            container: c.container,
            ttl_ms: (c.ttl % 4) as u64 * 10,
        }
    }

    fn command(&self, step: &Step, index: u64, sm: &StateMachine) -> Option<Command> {
        let time_ms = index as i64 * 10;
        let body = match step {
            Step::NewSession { timeout_ms } => {
                command::Body::NewSession(NewSession { timeout_ms: *timeout_ms as u32, secret: vec![1; 16].into() })
            }
            Step::Expire(ids) => command::Body::Expire(ExpireSessions {
                session_ids: ids.iter().take(4).map(|r| self.session(*r)).collect(),
            }),
            Step::Cluster { id, joined, seed } => command::Body::Cluster(ClusterRecord {
                cluster_id: if *id { "c1" } else { "c2" }.into(),
                joined: (1..=3).filter(|m| joined & (1 << m) != 0).collect(),
                settings: seed.map(|(pick, open_admin)| settings(pick, open_admin)),
                ..Default::default()
            }),
            Step::Write { session, seq, acked_below, op, superuser } => command::Body::Write(ClientWrite {
                session_id: self.session(*session),
                seq: *seq as u64 % 16,
                acked_below: *acked_below as u64 % 16,
                secret: vec![1; 16].into(),
                identities: Vec::new(),
                superuser: *superuser,
                epoch: 0,
                op: Some(self.write_op(op)),
            }),
            Step::Skip => return None,
            Step::Reap(stale) => {
                let mut nodes = sm.due_for_reaping(time_ms);
                nodes.extend(stale.iter().take(4).map(|(p, czxid, pzxid)| ReapNode {
                    path: self.path(p),
                    czxid: *czxid as u64 % 64,
                    pzxid: *pzxid as u64 % 64,
                }));
                command::Body::Reap(ReapNodes { nodes })
            }
        };
        Some(Command { origin: 1, request_id: index, time_ms, body: Some(body) })
    }

    fn write_op(&self, w: &WriteOp) -> client_write::Op {
        let version = |v: &Option<i8>| v.map(|v| v as i32 % 4);
        match w {
            WriteOp::Create(c) => client_write::Op::Create(self.create(c)),
            WriteOp::Set { path, data, version: v } => {
                client_write::Op::Set(SetOp { path: self.path(path), data: vec![*data; 2].into(), version: version(v) })
            }
            WriteOp::Delete { path, version: v } => {
                client_write::Op::Delete(DeleteOp { path: self.path(path), version: version(v) })
            }
            WriteOp::Multi(steps) => client_write::Op::Multi(MultiOp {
                ops: steps
                    .iter()
                    .take(6)
                    .map(|s| Op {
                        op: match s {
                            MultiStep::Create(c) => Some(op::Op::Create(self.create(c))),
                            MultiStep::Set { path, data, version: v } => Some(op::Op::Set(SetOp {
                                path: self.path(path),
                                data: vec![*data; 1].into(),
                                version: version(v),
                            })),
                            MultiStep::Delete { path, version: v } => {
                                Some(op::Op::Delete(DeleteOp { path: self.path(path), version: version(v) }))
                            }
                            MultiStep::Check { path, version: v } => {
                                Some(op::Op::Check(CheckOp { path: self.path(path), version: version(v) }))
                            }
                            MultiStep::Fence { resource, token } => Some(op::Op::CheckFence(CheckFenceOp {
                                resource: ["", "r1", "r2"][*resource as usize % 3].into(),
                                token: *token as u64 % 8,
                            })),
                            MultiStep::Empty => None,
                        },
                    })
                    .collect(),
            }),
            WriteOp::Close => client_write::Op::CloseSession(CloseSessionReq {}),
            WriteOp::ResetFence { resource } => {
                client_write::Op::ResetFence(ResetFenceOp { resource: ["", "r1", "r2"][*resource as usize % 3].into() })
            }
            WriteOp::SetSettings { superusers, open_admin } => {
                client_write::Op::SetSettings(SetSettingsOp { settings: Some(settings(*superusers, *open_admin)) })
            }
        }
    }
}

/// Settings naming the superusers `pick`'s bits choose (none, valid ones,
/// an invalid one).
fn settings(pick: u8, open_admin: bool) -> ClusterSettings {
    let superusers = SUPERUSERS.iter().enumerate().filter(|(i, _)| pick & (1 << i) != 0).map(|(_, s)| s.to_string());
    ClusterSettings { superusers: superusers.collect(), open_admin }
}

/// Per node (path) at the last check: czxid, version, cversion, next_seq.
type Seen = HashMap<String, (u64, i32, i32, u64)>;

fn nodes_of(sm: &StateMachine) -> Seen {
    let snap = baton_proto::Snapshot::decode(sm.snapshot().as_slice()).expect("our own snapshot decodes");
    snap.nodes
        .into_iter()
        .filter_map(|e| {
            let n = e.node?;
            let s = n.stat.unwrap_or_default();
            Some((e.path, (s.czxid, s.version, s.cversion, n.next_seq)))
        })
        .collect()
}

fn restored(sm: &StateMachine) -> StateMachine {
    let mut fresh = StateMachine::new();
    fresh.restore(&sm.snapshot()).expect("our own snapshot restores");
    fresh
}

fuzz_target!(|steps: Vec<Step>| {
    let mut sm = StateMachine::new();
    let mut twin = StateMachine::new();
    let mut known = Known::default();
    let mut seen = Seen::new();
    for (i, step) in steps.iter().take(64).enumerate() {
        let index = i as u64 + 1;
        let before = sm.applied();
        match known.command(step, index, &sm) {
            Some(cmd) => {
                let out = sm.apply(index, &cmd);
                let twin_out = twin.apply(index, &cmd);
                assert_eq!(
                    out.reply.map(|r| r.encode_to_vec()),
                    twin_out.reply.map(|r| r.encode_to_vec()),
                    "the restored copy answered differently at {index}: {step:?}"
                );
                assert_eq!(out.changes, twin_out.changes, "the restored copy changed other things at {index}");
                if matches!(cmd.body, Some(command::Body::NewSession(_))) {
                    known.sessions.push(index);
                }
            }
            None => {
                sm.skip(index);
                twin.skip(index);
            }
        }
        assert!(sm.applied() >= before, "applied went back from {before} to {}", sm.applied());
        assert_eq!(sm.applied(), index);

        let now = nodes_of(&sm);
        for (path, (czxid, version, cversion, next_seq)) in &now {
            if !known.paths.contains(path) {
                known.paths.push(path.clone());
            }
            if let Some(&(czxid0, version0, cversion0, next_seq0)) = seen.get(path) {
                if czxid0 == *czxid {
                    assert!(*version >= version0, "{path}: version {version0} -> {version} at {index}");
                    assert!(*cversion >= cversion0, "{path}: cversion {cversion0} -> {cversion} at {index}");
                    assert!(*next_seq >= next_seq0, "{path}: sequence {next_seq0} -> {next_seq} at {index}");
                }
            }
        }
        seen = now;

        let copy = restored(&sm);
        assert_eq!(sm.dump(), copy.dump(), "snapshot/restore changed the state at {index}");
        assert_eq!(sm.snapshot(), copy.snapshot(), "snapshot/restore changed the snapshot at {index}");
        twin = copy;
    }
});
