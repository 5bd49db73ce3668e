use super::*;
use crate::kv::BatchOp;
use crate::raft_store as rs;

#[test]
fn keys_are_distinct() {
    let mine = [KEY_APPLIED[0], PREFIX_NODE, PREFIX_SESSION, PREFIX_FENCE, KEY_CLUSTER[0], PREFIX_USER];
    let raft = [
        rs::KEY_HARD_STATE[0],
        rs::KEY_CONF_STATE[0],
        rs::KEY_TRUNCATED[0],
        rs::KEY_SNAPSHOT[0],
        rs::KEY_SNAPSHOT_DATA[0],
        rs::PREFIX_ENTRY,
        crate::cluster::KEY_INCARNATION[0],
        crate::cluster::PREFIX_PEER_INCARNATION,
    ];
    let all: BTreeSet<u8> = mine.iter().chain(raft.iter()).copied().collect();
    assert_eq!(all.len(), mine.len() + raft.len(), "two tables share a first key byte");
}

fn write(secret: &'static [u8]) -> Command {
    Command {
        body: Some(command::Body::Write(ClientWrite {
            session_id: 1,
            seq: 1,
            secret: Bytes::from_static(secret),
            op: Some(baton_proto::client_write::Op::Create(CreateOp { path: "/x".into(), ..Default::default() })),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn op(seq: u64, op: baton_proto::client_write::Op) -> Command {
    Command {
        body: Some(command::Body::Write(ClientWrite {
            session_id: 1,
            seq,
            secret: Bytes::from_static(b"s"),
            op: Some(op),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn code(a: &Applied) -> i32 {
    a.reply.as_ref().map_or(-1, |r| r.error)
}

#[test]
fn a_reused_sequence_number_with_another_op_is_refused_never_answered_with_the_first_reply() {
    use baton_proto::client_write::Op as W;
    let mut sm = StateMachine::new();
    let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
    sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
    let create = |p: &str| W::Create(CreateOp { path: p.into(), ..Default::default() });
    let first = sm.apply(2, &op(7, create("/w1")));
    assert_eq!(code(&first), 0);
    // The same write again: its first reply, unchanged.
    let again = sm.apply(3, &op(7, create("/w1")));
    assert_eq!(again.reply, first.reply);
    // Another write with that number: refused, not run.
    let other = sm.apply(4, &op(7, create("/w2")));
    assert_eq!(code(&other), ErrorCode::StaleSequence as i32, "{:?}", other.reply);
    assert!(sm.exists("/w2").unwrap().is_none());
    // The digest survives a snapshot.
    let mut restored = StateMachine::new();
    restored.restore(&sm.snapshot()).unwrap();
    let other = restored.apply(5, &op(7, create("/w2")));
    assert_eq!(code(&other), ErrorCode::StaleSequence as i32);
}

/// A multi of one `check_fence` on `resource` with `token`.
fn fence(resource: &str, token: u64) -> baton_proto::client_write::Op {
    let f = baton_proto::op::Op::CheckFence(CheckFenceOp { resource: resource.into(), token });
    baton_proto::client_write::Op::Multi(baton_proto::MultiOp { ops: vec![baton_proto::Op { op: Some(f) }] })
}

#[test]
fn a_fence_refuses_a_token_above_its_entrys_index_and_keeps_at_most_max_fences() {
    let mut sm = StateMachine::new();
    let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
    sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
    // The review's jam: the largest token, refused, and nothing kept.
    let jam = sm.apply(2, &op(1, fence("counter", u64::MAX)));
    assert_eq!(code(&jam), ErrorCode::BadRequest as i32);
    assert!(sm.fences.is_empty());
    // One index too far, refused; the entry's own index, taken.
    assert_eq!(code(&sm.apply(3, &op(2, fence("counter", 4)))), ErrorCode::BadRequest as i32);
    assert_eq!(code(&sm.apply(4, &op(3, fence("counter", 4)))), 0);
    assert_eq!(code(&sm.apply(5, &op(4, fence("counter", 3)))), ErrorCode::FenceRejected as i32);
    // The table is bounded: a new name past MAX_FENCES is BUSY, a
    // known one still works.
    for i in 0..MAX_FENCES - 1 {
        sm.fences.insert(format!("f{i}"), 1);
    }
    assert_eq!(code(&sm.apply(6, &op(5, fence("one-too-many", 6)))), ErrorCode::Busy as i32);
    assert_eq!(code(&sm.apply(7, &op(6, fence("counter", 7)))), 0);
}

#[test]
fn a_fence_guarded_by_its_node_needs_write_there() {
    use baton_proto::client_write::Op as W;
    let mut sm = StateMachine::new();
    let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
    sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
    let as_alice = |mut c: Command| {
        if let Some(command::Body::Write(w)) = &mut c.body {
            w.identities = vec!["user:alice".into()];
        }
        c
    };
    let guard = W::Create(CreateOp {
        path: format!("{FENCE_GUARDS}/billing"),
        parents: true,
        acl: vec![Acl { perms: acl::ALL, id: "user:alice".into() }],
        ..Default::default()
    });
    assert_eq!(code(&sm.apply(2, &op(1, guard))), 0);
    // Anyone else: NO_AUTH, nothing recorded; alice: taken.
    assert_eq!(code(&sm.apply(3, &op(2, fence("billing", 3)))), ErrorCode::NoAuth as i32);
    assert!(!sm.fences.contains_key("billing"));
    assert_eq!(code(&sm.apply(4, &as_alice(op(3, fence("billing", 4))))), 0);
    // A fence with no guard node is open.
    assert_eq!(code(&sm.apply(5, &op(4, fence("open", 5)))), 0);
}

/// The snapshot, encoded node by node, is what prost makes of the whole
/// record: the nodes sorted by path, every field in field order.
#[test]
fn a_snapshot_streamed_node_by_node_is_the_whole_records_encoding() {
    use baton_proto::client_write::Op as W;
    let mut sm = StateMachine::new();
    let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
    sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
    for (i, p) in ["/b", "/a", "/b/z", "/b/c", "/a0"].iter().enumerate() {
        let create =
            W::Create(CreateOp { path: p.to_string(), data: Bytes::from(vec![i as u8; i]), ..Default::default() });
        assert_eq!(code(&sm.apply(2 + i as u64, &op(1 + i as u64, create))), 0);
    }
    assert_eq!(code(&sm.apply(9, &op(8, fence("billing", 9)))), 0);
    // The same bytes from the records the state checkpointed in a store.
    let kv = crate::kv::MemKv::default();
    let mut batch = Batch::default();
    sm.flush(&mut batch);
    kv.write(batch, true).expect("write");
    let mut from_store = None;
    kv.with_view(&mut |view| from_store = Some(StateMachine::snapshot_from_store(view).expect("built")));
    assert_eq!(from_store, Some((9, sm.snapshot())));
    // And the backup (no secrets, no replies), as the snapshot thread
    // builds it off the driver.
    let mut backup = None;
    kv.with_view(&mut |view| backup = Some(StateMachine::backup_from_store(view).expect("built")));
    assert_eq!(backup, Some((9, sm.backup())));
    assert_ne!(sm.backup(), sm.snapshot(), "the session's secret and replies must make them differ");
    for bytes in [sm.snapshot(), sm.backup()] {
        let whole = baton_proto::Snapshot::decode(&bytes[..]).expect("decodes");
        let paths: Vec<&str> = whole.nodes.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/", "/a", "/a0", "/b", "/b/c", "/b/z"]);
        assert_eq!((whole.applied_index, whole.sessions.len(), whole.fences.len()), (9, 1, 1));
        assert_eq!(whole.encode_to_vec(), bytes);
    }
}

#[test]
fn a_backup_leaves_secrets_and_replies_out_and_a_restore_rekeys_the_sessions() {
    use baton_proto::client_write::Op as W;
    let mut sm = StateMachine::new();
    let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
    sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
    assert_eq!(code(&sm.apply(2, &op(1, W::Create(CreateOp { path: "/a".into(), ..Default::default() })))), 0);
    let full = baton_proto::Snapshot::decode(&sm.snapshot()[..]).unwrap();
    assert_eq!(full.sessions[0].secret.as_ref(), b"s", "a peer's snapshot keeps the secret");
    assert_eq!(full.sessions[0].replies.len(), 1);
    let backup = baton_proto::Snapshot::decode(&sm.backup()[..]).unwrap();
    assert_eq!(backup.sessions.len(), 1);
    assert!(backup.sessions[0].secret.is_empty());
    assert!(backup.sessions[0].replies.is_empty());
    assert_eq!(backup.nodes, full.nodes);
    // Restored, the session has a fresh secret: neither the old one nor
    // the empty one the backup carried opens it.
    let mut restored = StateMachine::new();
    restored.restore(&sm.backup()).unwrap();
    restored.rekey_sessions(&mut rand::thread_rng());
    assert!(restored.check_session(1, b"s").is_err());
    assert!(restored.check_session(1, b"").is_err());
}

#[test]
fn a_claim_moves_the_session_to_a_new_epoch_and_older_writes_fail_session_moved() {
    use baton_proto::client_write::Op as W;
    let mut sm = StateMachine::new();
    let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
    sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
    let create = |p: &str| W::Create(CreateOp { path: p.into(), ..Default::default() });
    let with_epoch = |seq: u64, epoch: u64, w: W| {
        let mut c = op(seq, w);
        if let Some(command::Body::Write(cw)) = &mut c.body {
            cw.epoch = epoch;
        }
        c
    };
    assert_eq!(code(&sm.apply(2, &op(1, create("/a")))), 0);
    let claim = sm.apply(3, &op(1, W::ClaimSession(baton_proto::ClaimSessionReq {})));
    assert_eq!(code(&claim), 0);
    assert_eq!(claim.reply.as_ref().map(|r| r.zxid), Some(3));
    // The old connection's next write (epoch 0): moved, not run.
    let old = sm.apply(4, &op(2, create("/old")));
    assert_eq!(code(&old), ErrorCode::SessionMoved as i32);
    assert!(sm.exists("/old").unwrap().is_none());
    // The claiming connection numbers from 1 again under epoch 3.
    let new = sm.apply(5, &with_epoch(1, 3, create("/new")));
    assert_eq!(code(&new), 0, "{:?}", new.reply);
    assert!(sm.exists("/new").unwrap().is_some());
    // An epoch no claim made.
    assert_eq!(code(&sm.apply(6, &with_epoch(2, 9, create("/x")))), ErrorCode::BadRequest as i32);
    // The epoch survives a snapshot.
    let mut restored = StateMachine::new();
    restored.restore(&sm.snapshot()).unwrap();
    assert_eq!(code(&restored.apply(7, &op(3, create("/old2")))), ErrorCode::SessionMoved as i32);
}

/// What a flush stages for the node at `path`: "put", "delete" or "".
fn staged(batch: &Batch, path: &str) -> &'static str {
    let key = node_key(path);
    match batch.ops.iter().rev().find(|o| matches!(o, BatchOp::Put(k, _) | BatchOp::Delete(k) if *k == key)) {
        Some(BatchOp::Put(..)) => "put",
        Some(_) => "delete",
        None => "",
    }
}

#[test]
fn a_node_born_and_gone_between_flushes_is_never_written() {
    use baton_proto::client_write::Op as W;
    let mut sm = StateMachine::new();
    let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
    sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
    let create = |p: &str| W::Create(CreateOp { path: p.into(), ..Default::default() });
    let delete = |p: &str| W::Delete(DeleteOp { path: p.into(), version: None });
    sm.apply(2, &op(1, create("/old")));
    sm.flush(&mut Batch::default());
    sm.apply(3, &op(2, create("/brief")));
    sm.apply(4, &op(3, delete("/brief")));
    sm.apply(5, &op(4, delete("/old")));
    sm.apply(6, &op(5, create("/again")));
    sm.apply(7, &op(6, delete("/again")));
    sm.apply(8, &op(7, create("/again")));
    let mut b = Batch::default();
    sm.flush(&mut b);
    assert_eq!(staged(&b, "/brief"), "", "a node that was never on disk got a tombstone");
    assert_eq!(staged(&b, "/old"), "delete", "a node on disk was deleted without a tombstone");
    assert_eq!(staged(&b, "/again"), "put");
    // The next window starts afresh: /again is on disk now.
    sm.apply(9, &op(8, delete("/again")));
    let mut b = Batch::default();
    sm.flush(&mut b);
    assert_eq!(staged(&b, "/again"), "delete");
}

#[test]
fn a_write_runs_only_with_its_sessions_secret() {
    let mut sm = StateMachine::new();
    let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"right") };
    sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
    let r = sm.apply(2, &write(b"wrong")).reply.expect("reply");
    assert_eq!(r.error, ErrorCode::SessionMoved as i32);
    assert!(sm.exists("/x").expect("exists").is_none(), "the forged write ran");
    let r = sm.apply(3, &write(b"right")).reply.expect("reply");
    assert_eq!(r.error, 0, "{r:?}");
    assert!(sm.exists("/x").expect("exists").is_some());
}

#[test]
fn containers_and_ttl_nodes_are_reaped_only_when_due_and_unchanged() {
    use baton_proto::client_write::Op as W;
    let mut sm = StateMachine::new();
    let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
    sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
    let at = |mut c: Command, t: i64| {
        c.time_ms = t;
        c
    };
    let create = |path: &str, container: bool, ttl_ms: u64| {
        W::Create(CreateOp { path: path.into(), container, ttl_ms, ..Default::default() })
    };
    let ok = |a: Applied| assert_eq!(a.reply.expect("reply").error, 0);
    ok(sm.apply(2, &at(op(1, create("/c", true, 0)), 1000)));
    ok(sm.apply(3, &at(op(2, create("/t", false, 500)), 1000)));
    ok(sm.apply(4, &at(op(3, create("/c/k", false, 0)), 1000)));
    // Bad kinds are refused before anything changes.
    let bad = CreateOp { path: "/e".into(), ephemeral: true, ttl_ms: 5, ..Default::default() };
    let r = sm.apply(5, &at(op(4, W::Create(bad)), 1000)).reply.expect("reply");
    assert_eq!(r.error, ErrorCode::BadRequest as i32);
    let bad = CreateOp { path: "/e".into(), container: true, sequential: true, ..Default::default() };
    assert_eq!(sm.apply(6, &op(5, W::Create(bad))).reply.expect("reply").error, ErrorCode::BadRequest as i32);
    // Nothing is due yet: the container has a child, the TTL has not run.
    assert!(sm.due_for_reaping(1400).is_empty());
    let due = sm.due_for_reaping(1501);
    assert_eq!(due.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), vec!["/t"]);
    // A set starts the TTL again: the entry the leader proposed before it deletes nothing.
    let set = W::Set(SetOp { path: "/t".into(), data: Bytes::from_static(b"v"), version: None });
    ok(sm.apply(7, &at(op(6, set), 1600)));
    let stale = Command {
        time_ms: 1700,
        body: Some(command::Body::Reap(baton_proto::ReapNodes { nodes: due })),
        ..Default::default()
    };
    assert!(sm.apply(8, &stale).changes.is_empty());
    assert!(sm.exists("/t").expect("exists").is_some(), "a TTL node changed within its TTL was reaped");
    // The container's last child goes: due, and the reap deletes it with its events.
    ok(sm.apply(9, &at(op(7, W::Delete(DeleteOp { path: "/c/k".into(), version: None })), 1700)));
    let due = sm.due_for_reaping(2200);
    assert_eq!(due.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), vec!["/c", "/t"]);
    // A child added between the look and the entry keeps the container.
    ok(sm.apply(10, &at(op(8, create("/c/k2", false, 0)), 2200)));
    let reap = Command {
        time_ms: 2200,
        body: Some(command::Body::Reap(baton_proto::ReapNodes { nodes: due })),
        ..Default::default()
    };
    let a = sm.apply(11, &reap);
    assert_eq!(a.changes, vec![Change::Deleted("/t".into()), Change::ChildrenChanged("/".into())]);
    assert!(sm.exists("/c").expect("exists").is_some());
    assert!(sm.exists("/t").expect("exists").is_none());
    // A container that never had a child stays; the index survives a restore.
    ok(sm.apply(12, &at(op(9, create("/never", true, 0)), 2200)));
    let mut copy = StateMachine::new();
    copy.restore(&sm.snapshot()).expect("restore");
    assert!(copy.due_for_reaping(i64::MAX).is_empty());
    ok(copy.apply(13, &at(op(10, W::Delete(DeleteOp { path: "/c/k2".into(), version: None })), 3000)));
    let due = copy.due_for_reaping(3000);
    assert_eq!(due.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), vec!["/c"]);
    let stat = copy.exists("/c").expect("exists").expect("stat");
    assert!(stat.container && stat.cversion > 0);
}
