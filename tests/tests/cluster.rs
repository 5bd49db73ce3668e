//! End-to-end tests: three real `batond` processes on loopback, real TCP,
//! RocksDB with fsync, kill -9. Each test starts its own cluster.

use std::collections::BTreeSet;
use std::time::Duration;

use baton_client::{ClientConfig, CreateOptions, Error, ErrorKind, EventType, SessionState};
use baton_proto::ErrorCode;
use baton_proto::{request, response, AttachReq, CreateOp, Request};
use baton_tests::raw::RawConn;
use baton_tests::Cluster;

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn code<T>(r: Result<T, Error>) -> Option<ErrorKind> {
    r.err().map(|e| e.kind())
}

#[tokio::test]
async fn t10_writes_replicate_to_every_member() {
    let c = Cluster::start(3, &[]).await;
    let client = c.client().await;
    for i in 0..20 {
        client.create(&format!("/r{i}"), format!("v{i}"), CreateOptions::persistent()).await.unwrap();
    }
    let last = client.last_zxid().await;
    for id in 1..=3 {
        c.wait_applied(id, last, SECS(10)).await;
        // Stale read straight from this member's local state.
        let one = Client1::new(&c, id).await;
        for i in 0..20 {
            let (d, _) = one.0.get_opts(&format!("/r{i}"), true).await.unwrap();
            assert_eq!(&d[..], format!("v{i}").as_bytes(), "member {id} /r{i}");
        }
    }
    // Linearizable reads from every member see the latest write at once.
    client.set("/r0", "new", None).await.unwrap();
    for id in 1..=3 {
        let one = Client1::new(&c, id).await;
        assert_eq!(&one.0.get("/r0").await.unwrap().0[..], b"new", "member {id}");
    }
}

/// A client pinned to one member (only that endpoint).
struct Client1(baton_client::Client);
impl Client1 {
    async fn new(c: &Cluster, id: u64) -> Client1 {
        Client1(c.client_with(ClientConfig::new([c.endpoint(id)])).await)
    }
}

#[tokio::test]
async fn t20_leader_kill_loses_no_acknowledged_write() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.wait_leader(SECS(10)).await;
    let follower = if leader == 1 { 2 } else { 1 };
    let client = c.client_with(ClientConfig::new(c.endpoints_from(follower))).await;
    let mut acked = Vec::new();
    for i in 0..30 {
        client.create(&format!("/k{i}"), "x", CreateOptions::persistent()).await.unwrap();
        acked.push(i);
    }
    c.kill(leader);
    let new_leader = c.wait_leader(SECS(15)).await;
    assert_ne!(new_leader, leader);
    // Writes keep flowing through the new leader...
    for i in 30..40 {
        client.create(&format!("/k{i}"), "x", CreateOptions::persistent()).await.unwrap();
        acked.push(i);
    }
    // ...and nothing acknowledged before the kill is lost.
    let kids: BTreeSet<String> = client.children("/").await.unwrap().into_iter().collect();
    for i in acked {
        assert!(kids.contains(&format!("k{i}")), "acknowledged /k{i} lost after leader kill");
    }
}

#[tokio::test]
async fn t30_follower_restarts_and_catches_up_through_a_snapshot() {
    let mut c = Cluster::start(3, &["--snapshot-entries=50"]).await;
    let leader = c.wait_leader(SECS(10)).await;
    let down = if leader == 3 { 2 } else { 3 };
    let client = c.client_with(ClientConfig::new(c.endpoints_from(leader))).await;
    client.create("/before", "1", CreateOptions::persistent()).await.unwrap();
    c.kill(down);
    for i in 0..300 {
        client.create(&format!("/s{i:03}"), format!("{i}"), CreateOptions::persistent()).await.unwrap();
    }
    let last = client.last_zxid().await;
    let ls = c.status(leader).await.unwrap();
    assert!(ls.first_index > 100, "leader compacted its log (first index {})", ls.first_index);
    c.start_member(down);
    let s = c.wait_applied(down, last, SECS(20)).await;
    // Its log now starts after the snapshot it installed.
    assert!(s.first_index > 100, "restarted member's log starts at {}, expected a snapshot install", s.first_index);
    assert!(c.log(down).contains("installing snapshot"), "no snapshot install in member {down}'s log");
    let one = Client1::new(&c, down).await;
    assert_eq!(&one.0.get_opts("/s299", true).await.unwrap().0[..], b"299");
    assert_eq!(&one.0.get_opts("/before", true).await.unwrap().0[..], b"1");
    assert_eq!(one.0.children("/").await.unwrap().len(), 301);
}

/// The applied index in a member log's last "raft node started" line.
fn restart_applied(log: &str) -> u64 {
    let line = log.lines().rev().find(|l| l.contains("raft node started")).unwrap_or_default();
    let field = line.split_whitespace().find_map(|w| w.strip_prefix("applied=")).unwrap_or_default();
    field.trim_matches(|ch: char| !ch.is_ascii_digit()).parse().unwrap_or(u64::MAX)
}

#[tokio::test]
async fn t40_kill_all_then_restart_keeps_every_acknowledged_write() {
    let mut c = Cluster::start(3, &[]).await;
    let client = c.client().await;
    let mut paths = Vec::new();
    for i in 0..25 {
        let (p, _) = client.create("/seq-", format!("{i}"), CreateOptions::persistent().sequential()).await.unwrap();
        paths.push(p);
    }
    let last = client.set(&paths[0], "changed", Some(0)).await.unwrap().mzxid;
    drop(client);
    for id in 1..=3 {
        c.kill(id);
    }
    for id in 1..=3 {
        c.start_member(id);
    }
    c.wait_leader(SECS(20)).await;
    // The state's keys are checkpointed at most once a second
    // (driver/ready.rs): the members restarted from an older applied index
    // and replayed the log after it. If none did, this test no longer
    // covers the replay.
    let started_at: Vec<u64> = (1..=3).map(|id| restart_applied(&c.log(id))).collect();
    assert!(started_at.iter().any(|&a| a < last), "restart applied indexes {started_at:?}, last write {last}");
    let client = c.client().await;
    for (i, p) in paths.iter().enumerate() {
        let (d, s) = client.get(p).await.unwrap();
        if i == 0 {
            assert_eq!((&d[..], s.version), (&b"changed"[..], 1));
        } else {
            assert_eq!(&d[..], format!("{i}").as_bytes());
        }
    }
    // The sequential counter survived too: no number is reused.
    let (p, _) = client.create("/seq-", "after", CreateOptions::persistent().sequential()).await.unwrap();
    assert_eq!(p, "/seq-0000000025");
}

#[tokio::test]
async fn t50_session_expiry_deletes_ephemerals_and_fires_watches() {
    let c = Cluster::start(3, &[]).await;
    let watcher = c.client().await;
    // A client that dies: a raw session whose keepalives just stop.
    let mut raw = RawConn::connect(&c.endpoint(1)).await;
    let cs = raw.create_session(1, 2000).await;
    assert_eq!(cs.timeout_ms, 2000);
    let r = raw
        .call(Request {
            id: 2,
            seq: 1,
            body: Some(request::Body::Create(CreateOp { path: "/eph".into(), ephemeral: true, ..Default::default() })),
            ..Default::default()
        })
        .await;
    assert_eq!(r.error, 0, "{r:?}");
    let (stat, mut w) = watcher.exists_watch("/eph").await.unwrap();
    assert_eq!(stat.unwrap().ephemeral_owner, cs.session_id);
    let (_, _, mut kids) = watcher.children_watch("/").await.unwrap();
    drop(raw);
    // Not before the timeout...
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(watcher.exists("/eph").await.unwrap().is_some(), "ephemeral deleted before its session timed out");
    // ...but soon after it.
    let ev = tokio::time::timeout(SECS(8), w.next()).await.expect("watch fired").expect("event");
    assert_eq!((ev.event_type, ev.path.as_str()), (EventType::NodeDeleted, "/eph"));
    let ev = tokio::time::timeout(SECS(2), kids.next()).await.expect("children watch fired").expect("event");
    assert_eq!(ev.event_type, EventType::NodeChildrenChanged);
    assert!(watcher.exists("/eph").await.unwrap().is_none());
    // One-shot: no second event.
    assert!(w.next().await.is_none());
    // The dead session is gone for good.
    let mut raw = RawConn::connect(&c.endpoint(2)).await;
    let r = raw.attach(1, cs.session_id, cs.secret.clone()).await;
    assert_eq!(r.error, ErrorCode::SessionExpired as i32);
}

#[tokio::test]
async fn t60_session_survives_the_death_of_its_member() {
    let mut c = Cluster::start(3, &[]).await;
    let client = c.client_with(ClientConfig::new(c.endpoints_from(1)).session_timeout(SECS(4))).await;
    let mut state = client.state();
    let seen = tokio::spawn(async move {
        let mut seen = vec![*state.borrow_and_update()];
        while state.changed().await.is_ok() {
            seen.push(*state.borrow_and_update());
            if seen.len() >= 3 {
                break;
            }
        }
        seen
    });
    client.create("/mine", "x", CreateOptions::ephemeral()).await.unwrap();
    client.create("/watched", "0", CreateOptions::persistent()).await.unwrap();
    let (_, _, mut w) = client.get_watch("/watched").await.unwrap();
    let other = c.client_with(ClientConfig::new(c.endpoints_from(2))).await;
    // Freeze the client's member: it hears nothing, so it moves elsewhere.
    c.pause(1, true);
    // A change made while the client is cut off must not be missed: it
    // fires when the client re-registers its watch on another member.
    other.set("/watched", "changed", None).await.unwrap();
    let ev =
        tokio::time::timeout(SECS(15), w.next()).await.expect("missed change fired after reconnect").expect("event");
    assert_eq!(ev.event_type, EventType::NodeDataChanged);
    c.kill(1);
    let states = tokio::time::timeout(SECS(5), seen).await.expect("state changes").unwrap();
    assert_eq!(states, vec![SessionState::Connected, SessionState::Suspended, SessionState::Connected]);
    // The session outlived a whole timeout: its ephemeral is still there.
    tokio::time::sleep(SECS(5)).await;
    assert!(other.exists("/mine").await.unwrap().is_some(), "ephemeral lost although the session was resumed");
    client.set("/mine", "y", None).await.unwrap();
    assert_eq!(*client.state().borrow(), SessionState::Connected);
}

#[tokio::test]
async fn t70_concurrent_sequential_creates_are_unique_and_increasing() {
    let c = Cluster::start(3, &[]).await;
    let setup = c.client().await;
    setup.create("/q", "", CreateOptions::persistent()).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..12u64 {
        let eps = c.endpoints_from(i % 3 + 1);
        tasks.push(tokio::spawn(async move {
            let cl = baton_client::Client::connect_with(ClientConfig::new(eps)).await.unwrap();
            let mut out = Vec::new();
            for _ in 0..15 {
                let (p, s) = cl.create("/q/n-", "", CreateOptions::ephemeral_sequential()).await.unwrap();
                out.push((p, s.czxid));
            }
            cl.close().await.unwrap();
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert_eq!(all.len(), 180);
    let names: BTreeSet<&String> = all.iter().map(|(p, _)| p).collect();
    assert_eq!(names.len(), 180, "duplicate sequential names");
    // Order by name == order by commit index: strictly increasing.
    all.sort();
    for w in all.windows(2) {
        assert!(w[0].1 < w[1].1, "{:?} then {:?}", w[0], w[1]);
    }
    // Closed sessions took their ephemerals with them.
    assert!(setup.children("/q").await.unwrap().is_empty());
}

#[tokio::test]
async fn t80_a_retried_write_after_a_dropped_reply_applies_once() {
    let c = Cluster::start(3, &[]).await;
    let mut raw = RawConn::connect(&c.endpoint(1)).await;
    let cs = raw.create_session(1, 10_000).await;
    let create = |id| Request {
        id,
        seq: 1,
        acked_below: 1,
        epoch: 0,
        first_watch_id: 0,
        body: Some(request::Body::Create(CreateOp { path: "/once-".into(), sequential: true, ..Default::default() })),
    };
    // Send, then drop the connection without reading the reply.
    raw.send(create(2)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(raw);
    // Resume the session elsewhere and retry with the same sequence number.
    let mut raw = RawConn::connect(&c.endpoint(2)).await;
    let r = raw.attach(1, cs.session_id, cs.secret.clone()).await;
    assert_eq!(r.error, 0, "{r:?}");
    let r1 = raw.call(create(2)).await;
    let r2 = raw.call(create(3)).await;
    let path = |r: &baton_proto::Response| match &r.body {
        Some(response::Body::Create(c)) => c.path.clone(),
        other => panic!("{other:?} {}", r.message),
    };
    assert_eq!(path(&r1), "/once-0000000000");
    assert_eq!(path(&r2), "/once-0000000000", "retry ran twice");
    let client = c.client().await;
    let once: Vec<String> =
        client.children("/").await.unwrap().into_iter().filter(|k| k.starts_with("once-")).collect();
    assert_eq!(once, vec!["once-0000000000".to_string()]);
    // Once acknowledged (acked_below past it), an old retry is refused.
    let r = raw
        .call(Request {
            id: 4,
            seq: 2,
            acked_below: 2,
            epoch: 0,
            first_watch_id: 0,
            body: Some(request::Body::Create(CreateOp { path: "/two".into(), ..Default::default() })),
        })
        .await;
    assert_eq!(r.error, 0);
    let r = raw.call(create(5)).await;
    assert_eq!(r.error, ErrorCode::StaleSequence as i32, "{r:?}");
}

#[tokio::test]
async fn t90_bad_input_gets_typed_errors_and_the_cluster_stays_up() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = Cluster::start(3, &[]).await;
    let client = c.client().await;
    client.create("/keep", "safe", CreateOptions::persistent()).await.unwrap();

    // Garbage bytes on the client port: BAD_REQUEST, then closed.
    let mut s = tokio::net::TcpStream::connect(c.endpoint(1)).await.unwrap();
    s.write_all(&[0, 0, 0, 8, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa, 0xf9, 0xf8]).await.unwrap();
    let mut raw = RawConn { f: tokio_util::codec::Framed::new(s, baton_proto::codec(1 << 20)), events: vec![] };
    let r = raw.recv().await.expect("an error response");
    assert_eq!(r.error, ErrorCode::BadRequest as i32, "{r:?}");
    assert!(raw.recv().await.is_none(), "connection should be closed");

    // An oversized frame header: TOO_LARGE, then closed.
    let mut s = tokio::net::TcpStream::connect(c.endpoint(2)).await.unwrap();
    s.write_all(&(100u32 << 20).to_be_bytes()).await.unwrap();
    let mut raw = RawConn { f: tokio_util::codec::Framed::new(s, baton_proto::codec(1 << 20)), events: vec![] };
    let r = raw.recv().await.expect("an error response");
    assert_eq!(r.error, ErrorCode::TooLarge as i32, "{r:?}");

    // Garbage on a peer port: the member drops the connection, stays up.
    let leader = c.wait_leader(SECS(5)).await;
    let mut s = tokio::net::TcpStream::connect(c.peer_addr(leader)).await.unwrap();
    s.write_all(b"\x00\x00\x00\x05hello garbage garbage").await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(SECS(5), s.read(&mut buf)).await.expect("closed").unwrap_or(0);
    assert_eq!(n, 0);

    // Typed errors through the client.
    for bad in ["", "nope", "/a/", "/a//b", "/a/./b", "/a/../b"] {
        assert_eq!(
            code(client.create(bad, "", CreateOptions::persistent()).await),
            Some(ErrorKind::InvalidPath),
            "{bad:?}"
        );
    }
    assert_eq!(
        code(client.create(&format!("/{}", "x".repeat(5000)), "", CreateOptions::persistent()).await),
        Some(ErrorKind::InvalidPath)
    );
    assert_eq!(
        code(client.create("/big", vec![0u8; (1 << 20) + 1], CreateOptions::persistent()).await),
        Some(ErrorKind::TooLarge)
    );
    assert_eq!(code(client.get("/missing").await), Some(ErrorKind::NoNode));
    assert_eq!(code(client.create("/keep", "", CreateOptions::persistent()).await), Some(ErrorKind::NodeExists));
    assert_eq!(code(client.set("/keep", "x", Some(7)).await), Some(ErrorKind::BadVersion));
    assert_eq!(code(client.delete("/keep", Some(7)).await), Some(ErrorKind::BadVersion));
    client.create("/parent/child", "", CreateOptions::persistent().with_parents()).await.unwrap();
    assert_eq!(code(client.delete("/parent", None).await), Some(ErrorKind::NotEmpty));
    client.create("/e", "", CreateOptions::ephemeral()).await.unwrap();
    assert_eq!(
        code(client.create("/e/kid", "", CreateOptions::persistent()).await),
        Some(ErrorKind::NoChildrenForEphemerals)
    );
    assert_eq!(code(client.delete("/", None).await), Some(ErrorKind::InvalidPath));

    // Unknown session and wrong secret.
    let mut raw = RawConn::connect(&c.endpoint(3)).await;
    let r = raw.attach(1, 999_999, Default::default()).await;
    assert_eq!(r.error, ErrorCode::SessionExpired as i32);
    let r = raw
        .call(Request {
            id: 2,
            body: Some(request::Body::Attach(AttachReq {
                session_id: client.session_id(),
                secret: vec![1, 2].into(),
                ..Default::default()
            })),
            ..Default::default()
        })
        .await;
    assert_eq!(r.error, ErrorCode::SessionMoved as i32);
    // A write without a session, and a request from a future protocol.
    let r = raw
        .call(Request {
            id: 3,
            seq: 1,
            body: Some(request::Body::Create(CreateOp { path: "/x".into(), ..Default::default() })),
            ..Default::default()
        })
        .await;
    assert_eq!(r.error, ErrorCode::BadRequest as i32);
    let r = raw.call(Request { id: 4, body: None, ..Default::default() }).await;
    assert_eq!(r.error, ErrorCode::BadRequest as i32);

    // Everything still up, nothing lost, nothing half-written.
    for id in 1..=3 {
        assert!(c.status(id).await.is_some(), "member {id} died");
    }
    assert_eq!(&client.get("/keep").await.unwrap().0[..], b"safe");
    assert!(client.exists("/big").await.unwrap().is_none());
    assert!(client.exists("/x").await.unwrap().is_none());
}

#[tokio::test]
async fn t95_watches_fire_once_in_log_order() {
    let c = Cluster::start(3, &[]).await;
    let a = c.client_with(ClientConfig::new(c.endpoints_from(1))).await;
    let b = c.client_with(ClientConfig::new(c.endpoints_from(2))).await;
    a.create("/w", "0", CreateOptions::persistent()).await.unwrap();
    let (_, _, mut data) = a.get_watch("/w").await.unwrap();
    let (_, _, mut kids) = a.children_watch("/w").await.unwrap();
    let mut all = a.watch("/w", baton_client::WatchKind::Exists, baton_client::WatchMode::Persistent).await.unwrap();
    let s1 = b.set("/w", "1", None).await.unwrap();
    let s2 = b.set("/w", "2", None).await.unwrap();
    let (_, k) = b.create("/w/k", "", CreateOptions::persistent()).await.unwrap();
    let ev = data.next().await.unwrap();
    assert_eq!((ev.event_type, ev.zxid), (EventType::NodeDataChanged, s1.mzxid));
    assert!(data.next().await.is_none(), "one-shot watch fired twice");
    let ev = kids.next().await.unwrap();
    assert_eq!((ev.event_type, ev.zxid), (EventType::NodeChildrenChanged, k.czxid));
    // The persistent watch sees both changes, in log order.
    let e1 = all.next().await.unwrap();
    let e2 = all.next().await.unwrap();
    assert_eq!((e1.zxid, e2.zxid), (s1.mzxid, s2.mzxid));
    // A watch event arrives before a read can show the change.
    let (_, _, mut d2) = a.get_watch("/w").await.unwrap();
    b.set("/w", "3", None).await.unwrap();
    let (d, _) = a.get("/w").await.unwrap();
    assert_eq!(&d[..], b"3");
    let ev = tokio::time::timeout(Duration::from_millis(1), d2.next())
        .await
        .expect("event queued before the read reply")
        .unwrap();
    assert_eq!(ev.event_type, EventType::NodeDataChanged);
}
