//! The ZooKeeper port (server/src/zk/) with clients nobody here wrote:
//! Rust's `zookeeper-client` crate, and Debian's `zkCli.sh` (the Java
//! client; installed by `make rival-deps`, which `make test` runs first).
//!
//! t10: every operation the crate offers that the port serves, with its
//! errors, sequential names, container nodes, stats, watches (one-shot, persistent,
//! recursive) and multis; nodes made through one port read through the
//! other.
//! t12: container and TTL nodes: reaped by the cluster once due (a
//! container once its last child goes, a TTL node once childless and
//! unchanged past its TTL), with their delete events; never before.
//! t13: removeWatches and checkWatches: a removed watch sends no event;
//! NO_WATCHER for a watch that is not there.
//! t20: a ZooKeeper session resumes on another member after its member is
//! killed -9, keeps its ephemeral node, and still gets its watch.
//! t21: a session on the leader when it is killed -9: its watches (exists
//! on a present node, data, children, exists on a missing node) fire on
//! the member it moves to, for changes made while it was away and after;
//! a write on another member right after the kill ends in a connection
//! loss, never in a reply code ZooKeeper does not send.
//! t22: a resumed session's connections never share a write's sequence
//! number (finding Z2): a create sent to a paused member's connection and
//! dropped, the session resumed on the leader, the member resumed, a
//! create on the new connection is answered with its own path and runs;
//! the old one is refused SESSION_MOVED. With `zk-resume-without-claim`
//! and `reply-without-digest` planted, the same steps answer the new
//! create with the old one's reply (the finding); with the first alone,
//! the op digest turns the clash into a definite error.
//! t23: a member cut off from its peers, its ZooKeeper client's link kept
//! (finding Z1): the client, reading every 300 ms, gets no reply and is
//! not `SyncConnected` from the moment another session sees its ephemeral
//! node gone (its lock taken over). With `zk-speak-unvouched` planted the
//! client goes on reading after that, as the review saw.
//! t24: replies far past `--max-queued-bytes` in total, read as they come,
//! keep flowing (finding Z4: the port never credited the queue's gauge,
//! so every connection fell silent after 64 MiB of replies in all).
//! t25: `multiRead` keeps to `--max-multi-ops` and `--max-reply-bytes`
//! (finding Z6: 60 reads of a 1 MB node made one 60 MB reply).
//! t26: a watch the member refused (`--max-watches`, an invalid path) is
//! not kept by the port: `checkWatches` finds none (finding Z5: refused
//! watches piled up in the port, past the cap).
//! t27: one notification per connection per change, however many of the
//! connection's watches it fires (finding Z9: one each before).
//! t28: a reply the port answers itself (getAllChildrenNumber,
//! getEphemerals, checkWatches) never shows an older state than an
//! earlier reply of the session, while another client writes (finding
//! Z10: it was computed at once, ahead of earlier reads).
//! t29: watches re-registered by setWatches2 and recursive watches see
//! only what their connection may READ (finding Z8, CVE-2024-23944's
//! class): an unauthenticated client refused `getChildren /secret` gets
//! no name under it, neither replayed from relativeZxid 0 nor live.
//! t30: zkCli.sh's scripted session, its output asserted.
//! t40: bad input (garbage, oversized and truncated frames, an unknown
//! opcode after the handshake) closes that connection only; the member
//! keeps serving, and four-letter words follow the whitelist.
//! t41: one `--max-connections` for both client ports (finding Z7: each
//! port had its own): ZooKeeper connections fill it, a native one is
//! refused BUSY, and gets in once one closes.

use std::time::Duration;

use baton_tests::Cluster;
use zookeeper_client as zk;

fn anyone() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

async fn connect(endpoints: &[String]) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(6))
        .connect(&endpoints.join(","))
        .await
        .expect("zookeeper-client connects to the ZooKeeper port")
}

async fn next_event(w: &mut zk::PersistentWatcher) -> zk::WatchedEvent {
    tokio::time::timeout(Duration::from_secs(10), w.changed()).await.expect("event within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_zookeeper_client_crate_operations_watches_and_multis() {
    let c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    assert_eq!(eps.len(), 3);
    let a = connect(&eps[..1]).await;
    let b = connect(&eps[1..2]).await;

    // create, get, set with versions, exists, children.
    let (stat, _) = a.create("/app", b"v0", &anyone()).await.expect("create");
    assert_eq!(stat.version, 0);
    assert!(stat.czxid > 0, "czxid is the log index that created the node");
    assert_eq!(a.create("/app", b"x", &anyone()).await.unwrap_err(), zk::Error::NodeExists);
    assert_eq!(a.create("/no/parent", b"", &anyone()).await.unwrap_err(), zk::Error::NoNode);
    // Any valid name, one ending in ten digits included (epoch seconds),
    // as ZooKeeper (finding Z11: refused BadArguments before).
    a.create("/tens", b"", &anyone()).await.expect("create /tens");
    a.create("/tens/job-1733212345", b"", &anyone()).await.expect("a name ending in ten digits");
    let seq = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
    a.create("/tens/n-0000000000", b"", &anyone()).await.expect("a name like a sequential one");
    let (_, seq_name) = a.create("/tens/n-", b"", &seq).await.expect("sequential");
    assert_eq!(seq_name.into_i64(), 1, "the sequential create skipped the taken number");
    // createContainer (Curator makes its recipes' parents so): a node that
    // takes children, marked as ZooKeeper marks it (t12 has its reaping).
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let (cstat, _) = a.create("/box", b"", &container).await.expect("createContainer");
    assert_eq!(cstat.ephemeral_owner, i64::MIN, "ZooKeeper's container mark");
    a.create("/box/lock-", b"", &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()))
        .await
        .expect("a child in a container");
    let stat = a.set_data("/app", b"v1", Some(0)).await.expect("set at version 0");
    assert_eq!(stat.version, 1);
    assert_eq!(a.set_data("/app", b"v2", Some(0)).await.unwrap_err(), zk::Error::BadVersion);
    // b reads through member 2 after a sync (ZooKeeper's read-your-writes
    // across sessions).
    b.sync("/app").await.expect("sync");
    let (data, s) = b.get_data("/app").await.expect("get");
    assert_eq!((data.as_slice(), s.version, s.czxid), (&b"v1"[..], 1, stat.czxid));
    assert!(b.check_stat("/nothing").await.expect("exists").is_none());

    // Ephemeral sequential: ZooKeeper's 10-digit suffix, owner = session.
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (s1, q1) = a.create("/app/lock-", b"", &eph).await.expect("sequential");
    let (_, q2) = a.create("/app/lock-", b"", &eph).await.expect("sequential");
    assert!(q2.into_i64() > q1.into_i64());
    assert_eq!(s1.ephemeral_owner, a.session_id().0);
    // b's member may not have applied a's creates yet: ZooKeeper promises
    // another session's writes only after a sync.
    b.sync("/app").await.expect("sync");
    let mut kids = b.list_children("/app").await.expect("children");
    kids.sort();
    assert_eq!(kids, vec![format!("lock-{q1}"), format!("lock-{q2}")]);
    assert_eq!(kids[0].len(), "lock-".len() + 10);
    let (kids2, parent) = b.get_children("/app").await.expect("children2");
    assert_eq!((kids2.len(), parent.num_children), (2, 2));
    assert_eq!(a.count_descendants_number("/app").await.expect("all children number"), 2);
    assert_eq!(a.list_ephemerals("/app").await.expect("ephemerals").len(), 2);
    assert_eq!(a.delete("/app", None).await.unwrap_err(), zk::Error::NotEmpty);

    // A one-shot data watch: the event comes, then the setter's reply.
    let (_, _, w) = b.get_and_watch_data("/app").await.expect("get + watch");
    a.set_data("/app", b"v2", None).await.expect("set");
    let e = tokio::time::timeout(Duration::from_secs(10), w.changed()).await.expect("data watch fired");
    assert_eq!((e.event_type, e.path.as_str()), (zk::EventType::NodeDataChanged, "/app"));
    // An exists watch on a missing node fires on its create.
    let (none, w) = b.check_and_watch_stat("/later").await.expect("exists + watch");
    assert!(none.is_none());
    a.create("/later", b"", &anyone()).await.expect("create");
    let e = tokio::time::timeout(Duration::from_secs(10), w.changed()).await.expect("exists watch fired");
    assert_eq!(e.event_type, zk::EventType::NodeCreated);
    // A children watch.
    let (_, w) = b.list_and_watch_children("/app").await.expect("children + watch");
    a.create("/app/c", b"", &anyone()).await.expect("create child");
    let e = tokio::time::timeout(Duration::from_secs(10), w.changed()).await.expect("children watch fired");
    assert_eq!((e.event_type, e.path.as_str()), (zk::EventType::NodeChildrenChanged, "/app"));

    // Persistent recursive: every change below, each naming its node.
    let mut rec = b.watch("/app", zk::AddWatchMode::PersistentRecursive).await.expect("addWatch");
    a.create("/app/c/d", b"", &anyone()).await.expect("create");
    a.set_data("/app/c/d", b"x", None).await.expect("set");
    a.delete("/app/c/d", None).await.expect("delete");
    let got: Vec<(zk::EventType, String)> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            let e = next_event(&mut rec).await;
            v.push((e.event_type, e.path));
        }
        v
    };
    assert_eq!(
        got,
        vec![
            (zk::EventType::NodeCreated, "/app/c/d".to_string()),
            (zk::EventType::NodeDataChanged, "/app/c/d".to_string()),
            (zk::EventType::NodeDeleted, "/app/c/d".to_string()),
        ]
    );

    // Multi: all or nothing, with ZooKeeper's per-op results.
    let mut m = a.new_multi_writer();
    m.add_create("/m1", b"1", &anyone()).expect("op");
    m.add_check_version("/app", 2).expect("op");
    m.add_set_data("/later", b"y", None).expect("op");
    let r = m.commit().await.expect("multi");
    assert_eq!(r.len(), 3);
    let mut m = a.new_multi_writer();
    m.add_create("/m2", b"2", &anyone()).expect("op");
    m.add_check_version("/app", 99).expect("op");
    match m.commit().await {
        Err(zk::MultiWriteError::OperationFailed { index: 1, source: zk::Error::BadVersion }) => {}
        other => panic!("a failed check fails the multi at index 1 with BadVersion: {other:?}"),
    }
    assert!(a.check_stat("/m2").await.expect("exists").is_none(), "nothing of a failed multi applied");
    let mut r = a.new_multi_reader();
    r.add_get_data("/m1").expect("op");
    r.add_get_children("/app").expect("op");
    r.add_get_data("/absent").expect("op");
    let res = r.commit().await.expect("multiRead");
    assert!(matches!(&res[0], zk::MultiReadResult::Data { data, .. } if data == b"1"));
    assert!(matches!(&res[1], zk::MultiReadResult::Children { children } if children.len() == 3));
    assert!(matches!(&res[2], zk::MultiReadResult::Error { err: zk::Error::NoNode }));

    // One state machine: what ZooKeeper made, Baton's client reads.
    let native = c.client().await;
    let (data, stat) = native.get("/m1").await.expect("native get");
    assert_eq!(&data[..], b"1");
    assert!(stat.czxid > 0);
    let _ = native.close().await;

    // Closing a's session removes its ephemerals.
    drop(a);
    baton_tests::eventually(Duration::from_secs(10), "a's ephemerals gone", || async {
        let k = b.list_children("/app").await.ok()?;
        (k.len() == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t12_container_and_ttl_nodes_are_reaped_once_due_and_not_before() {
    let c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    let a = connect(&eps[..1]).await;
    let b = connect(&eps[1..2]).await;
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let ttl =
        |ms: u64| zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()).with_ttl(Duration::from_millis(ms));

    // A container with a child, and one that never had a child.
    a.create("/q", b"", &container).await.expect("createContainer");
    a.create("/q/item", b"", &anyone()).await.expect("child");
    a.create("/idle", b"", &container).await.expect("createContainer");
    // TTL nodes: one alone, one with a child, one kept alive by sets.
    let (tstat, _) = a.create("/t1", b"", &ttl(1000)).await.expect("createTTL");
    assert_eq!(tstat.ephemeral_owner, (0xff_u64 << 56 | 1000) as i64, "ZooKeeper's TTL mark");
    let seq = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all()).with_ttl(Duration::from_secs(1));
    let (_, n) = a.create("/ts-", b"", &seq).await.expect("sequential TTL");
    let ts = format!("/ts-{n}");
    a.create("/t2", b"", &ttl(1000)).await.expect("createTTL");
    a.create("/t2/kid", b"", &anyone()).await.expect("child");
    a.create("/t3", b"", &ttl(4000)).await.expect("createTTL");
    // The same nodes through Baton's port.
    let native = c.client().await;
    let (_, s) = native.get("/q").await.expect("native get");
    assert!(s.container && s.ttl_ms == 0);
    let (_, s) = native.get("/t1").await.expect("native get");
    assert_eq!((s.container, s.ttl_ms), (false, 1000));

    // The container's last child goes: it is reaped, its delete watched.
    let (_, w) = b.check_and_watch_stat("/q").await.expect("exists + watch");
    a.delete("/q/item", None).await.expect("delete the child");
    let e = tokio::time::timeout(Duration::from_secs(20), w.changed()).await.expect("the container was reaped");
    assert_eq!((e.event_type, e.path.as_str()), (zk::EventType::NodeDeleted, "/q"));
    // The lone TTL nodes go; the one with a child and the one kept alive stay.
    let start = tokio::time::Instant::now();
    baton_tests::eventually(Duration::from_secs(20), "/t1 and the sequential TTL node reaped", || async {
        let gone1 = a.check_stat("/t1").await.ok()?.is_none();
        let gone2 = a.check_stat(&ts).await.ok()?.is_none();
        (gone1 && gone2).then_some(())
    })
    .await;
    assert!(start.elapsed() < Duration::from_secs(20));
    for i in 0..8u8 {
        a.set_data("/t3", &[i], None).await.expect("set keeps /t3 alive");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(a.check_stat("/t3").await.expect("exists").is_some(), "a TTL node set within its TTL was reaped");
    assert!(a.check_stat("/t2").await.expect("exists").is_some(), "a TTL node with a child was reaped");
    assert!(a.check_stat("/idle").await.expect("exists").is_some(), "a container that never had a child was reaped");
    // Its child gone, /t2 goes too.
    a.delete("/t2/kid", None).await.expect("delete");
    baton_tests::eventually(Duration::from_secs(20), "/t2 reaped", || async {
        a.check_stat("/t2").await.ok()?.is_none().then_some(())
    })
    .await;
    let _ = native.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t13_remove_and_check_watches() {
    use baton_proto::jute::{self, err, Reader, ReplyHeader, Request};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    let other = connect(&eps[..1]).await;
    other.create("/w", b"0", &anyone()).await.expect("create");

    // Through the crate: a one-shot and a persistent watch removed (its
    // `remove` sends removeWatches; dropping a watcher sends nothing).
    let (_, _, w) = other.get_and_watch_data("/w").await.expect("get + watch");
    #[allow(deprecated)]
    w.remove().await.expect("removeWatches of a data watch");
    let p = other.watch("/w", zk::AddWatchMode::Persistent).await.expect("addWatch");
    #[allow(deprecated)]
    p.remove().await.expect("removeWatches of a persistent watch");

    // On the wire: replies in order; a removed watch sends no event.
    let mut s = tokio::net::TcpStream::connect(&eps[0]).await.expect("connect");
    s.write_all(&connect_frame()).await.expect("send connect");
    async fn frame(s: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut len = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut len)).await.expect("a frame").expect("read");
        let mut f = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut f).await.expect("read");
        f
    }
    frame(&mut s).await; // the connect reply
    let call = |xid: i32, req: Request| framed(&req.encode(xid));
    let mut send = Vec::new();
    send.extend(call(1, Request::GetData { path: "/w".into(), watch: true }));
    send.extend(call(2, Request::GetChildren { op: jute::op::GET_CHILDREN, path: "/w".into(), watch: true }));
    send.extend(call(3, Request::CheckWatches { path: "/w".into(), kind: 2 }));
    send.extend(call(4, Request::RemoveWatches { path: "/w".into(), kind: 2 }));
    send.extend(call(5, Request::RemoveWatches { path: "/w".into(), kind: 2 }));
    send.extend(call(6, Request::CheckWatches { path: "/w".into(), kind: 2 }));
    send.extend(call(7, Request::CheckWatches { path: "/w".into(), kind: 1 }));
    send.extend(call(8, Request::RemoveWatches { path: "/elsewhere".into(), kind: 3 }));
    s.write_all(&send).await.expect("send");
    let mut got = Vec::new();
    for _ in 0..8 {
        let f = frame(&mut s).await;
        let h = ReplyHeader::read(&mut Reader::new(&f)).expect("reply header");
        got.push((h.xid, h.err));
    }
    let nw = err::NO_WATCHER;
    assert_eq!(got, vec![(1, 0), (2, 0), (3, 0), (4, 0), (5, nw), (6, nw), (7, 0), (8, nw)]);
    // The data change fires no event here (its watch is gone); the child
    // watch is still there and fires for the new child.
    other.set_data("/w", b"1", None).await.expect("set");
    other.create("/w/kid", b"", &anyone()).await.expect("create child");
    let f = frame(&mut s).await;
    let mut r = Reader::new(&f);
    let h = ReplyHeader::read(&mut r).expect("header");
    assert_eq!(h.xid, -1, "a notification");
    let (kind, _, path) = jute::decode_notification(&mut r).expect("notification");
    assert_eq!((kind, path.as_str()), (jute::event::NODE_CHILDREN_CHANGED, "/w"), "the removed data watch fired");
}

/// ZooKeeper's FIFO client order: a read sent right behind a write (no
/// wait for the write's answer) sees it, as it would on ZooKeeper. The
/// port serves a read from the member's state at once, so it must not
/// send one while a write of the same connection is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t15_a_read_pipelined_behind_a_write_sees_it() {
    let c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    // Through a follower (one more hop for the write): the race is wider.
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let member = if leader == 1 { 2 } else { 1 };
    let a = connect(&eps[member as usize - 1..member as usize]).await;
    let (created, got, stat) =
        tokio::join!(a.create("/fifo", b"0", &anyone()), a.get_data("/fifo"), a.check_stat("/fifo"));
    created.expect("create");
    assert_eq!(got.expect("the read behind the create finds the node").0, b"0");
    assert!(stat.expect("exists").is_some());
    for i in 1..=20u32 {
        let v = i.to_string();
        let (set, got, kids) =
            tokio::join!(a.set_data("/fifo", v.as_bytes(), None), a.get_data("/fifo"), a.list_children("/"));
        assert_eq!(set.expect("set").version, i as i32);
        assert_eq!(got.expect("get").0, v.as_bytes(), "round {i}: the read did not see the write sent before it");
        assert!(kids.expect("children").contains(&"fifo".to_string()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_a_session_resumes_on_another_member_with_its_id_and_password() {
    let mut c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    let a = connect(&eps[..1]).await;
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    a.create("/mine", b"held", &eph).await.expect("ephemeral");
    let sid = a.session_id();
    let info = a.session().clone();
    c.kill(1);
    c.wait_leader(Duration::from_secs(20)).await;
    // The same session through member 2: its id and password resume it.
    let a2 = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(6))
        .with_session(info.clone())
        .connect(&eps[1])
        .await
        .expect("the session resumes on member 2");
    assert_eq!(a2.session_id(), sid);
    let stat = a2.check_stat("/mine").await.expect("exists").expect("the ephemeral outlived its member");
    assert_eq!(stat.ephemeral_owner, sid.0);
    // Writes go on (sequence numbers past the old connection's).
    a2.create("/mine2", b"", &eph).await.expect("create after the resume");
    a2.set_data("/mine", b"again", None).await.expect("set after the resume");
    drop(a);
    drop(a2);
    // Once closed, the session is gone for everyone: a resume is refused
    // as ZooKeeper refuses one (the client reports it expired).
    let b = connect(&eps[1..]).await;
    baton_tests::eventually(Duration::from_secs(15), "the closed session's ephemerals gone", || async {
        b.check_stat("/mine").await.ok()?.is_none().then_some(())
    })
    .await;
    let again = zk::Client::connector().with_session(info).connect(&eps[2]).await;
    assert!(matches!(again, Err(zk::Error::SessionExpired)), "{:?}", again.map(|c| c.session_id()));
}

/// `op` again after a connection loss, as a ZooKeeper application retries
/// a write ("may have happened"): NoNode or NodeExists after a loss is the
/// write having landed.
async fn retried<F, Fut>(what: &str, mut op: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), zk::Error>>,
{
    for attempt in 0..100 {
        match op().await {
            Ok(()) => return,
            Err(zk::Error::NoNode | zk::Error::NodeExists) if attempt > 0 => return,
            Err(zk::Error::ConnectionLoss) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{what}: {e}"),
        }
    }
    panic!("{what}: 100 connection losses in a row");
}

/// The member (1-based) whose `cons` lists session `sid`.
async fn member_serving(eps: &[String], sid: zk::SessionId) -> u64 {
    let needle = format!("sid={:#x},", sid.0);
    for (i, ep) in eps.iter().enumerate() {
        let cons = String::from_utf8(send_and_read_to_close(ep, b"cons").await).unwrap_or_default();
        if cons.contains(&needle) {
            return i as u64 + 1;
        }
    }
    panic!("no member lists session {needle}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t21_watches_follow_a_session_through_its_members_kill() {
    let mut c = Cluster::start_zk(3, &["--zk-4lw-whitelist=cons,srvr,ruok"]).await;
    let eps = c.zk_endpoints();
    // `a` knows every member; it is on the leader, which is killed.
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let mut a = connect(&eps).await;
    for _ in 0..30 {
        if member_serving(&eps, a.session_id()).await == leader {
            break;
        }
        a = connect(&eps).await;
    }
    let m = member_serving(&eps, a.session_id()).await;
    assert_eq!(m, leader, "30 sessions and none on the leader");
    a.create("/w", b"", &anyone()).await.expect("create /w");
    for n in ["gone-early", "gone-late", "data", "kept"] {
        a.create(&format!("/w/{n}"), b"0", &anyone()).await.expect("create");
    }
    // An exists-watch on a node that exists (ZooKeeper's lock recipe waits
    // so on the node ahead), a data watch, a children watch, an
    // exists-watch on a missing node.
    let (_, early) = a.check_and_watch_stat("/w/gone-early").await.expect("exists + watch");
    let (_, late) = a.check_and_watch_stat("/w/gone-late").await.expect("exists + watch");
    let (_, _, data) = a.get_and_watch_data("/w/data").await.expect("get + watch");
    let (_, _, kids) = a.get_and_watch_children("/w/kept").await.expect("children + watch");
    let (none, born) = a.check_and_watch_stat("/w/born").await.expect("exists + watch");
    assert!(none.is_none());
    let other = if m == 1 { 2 } else { 1 };
    let b = connect(&eps[other as usize - 1..other as usize]).await;
    c.kill(m);
    // Changes while `a` is away, and once it is back. Right after the
    // leader's death a write may end in a connection loss (the member
    // closes the connection: "may have happened"); `b` retries as a
    // ZooKeeper application does, taking NoNode / NodeExists after a loss
    // as its own write having landed.
    let b = &b;
    retried("delete", move || b.delete("/w/gone-early", None)).await;
    retried("set", move || async move { b.set_data("/w/data", b"1", None).await.map(|_| ()) }).await;
    baton_tests::eventually(Duration::from_secs(20), "a back on another member", || async {
        a.check_stat("/w").await.ok().map(|_| ())
    })
    .await;
    retried("delete", move || b.delete("/w/gone-late", None)).await;
    retried("create", move || async move { b.create("/w/kept/child", b"", &anyone()).await.map(|_| ()) }).await;
    retried("create", move || async move { b.create("/w/born", b"", &anyone()).await.map(|_| ()) }).await;
    let within = |w: zk::OneshotWatcher| async move {
        tokio::time::timeout(Duration::from_secs(10), w.changed()).await.expect("the event within 10 s")
    };
    let e = within(early).await;
    assert_eq!((e.event_type, e.path.as_str()), (zk::EventType::NodeDeleted, "/w/gone-early"));
    let e = within(data).await;
    assert_eq!((e.event_type, e.path.as_str()), (zk::EventType::NodeDataChanged, "/w/data"));
    let e = within(late).await;
    assert_eq!((e.event_type, e.path.as_str()), (zk::EventType::NodeDeleted, "/w/gone-late"));
    let e = within(kids).await;
    assert_eq!((e.event_type, e.path.as_str()), (zk::EventType::NodeChildrenChanged, "/w/kept"));
    let e = within(born).await;
    assert_eq!((e.event_type, e.path.as_str()), (zk::EventType::NodeCreated, "/w/born"));
}

/// A ZooKeeper connection spoken by hand (jute), for steps a client
/// library hides: resuming a session by id and password, a request sent
/// to a paused member and the connection dropped.
struct RawZk {
    s: tokio::net::TcpStream,
    xid: i32,
}

impl RawZk {
    /// Connects (session 0: a new one) and returns the session's id and
    /// password; None if the member did not answer or refused.
    async fn connect(addr: &str, session: i64, passwd: &[u8]) -> Option<(RawZk, i64, Vec<u8>)> {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let c = baton_proto::jute::ConnectRequest {
            protocol_version: 0,
            last_zxid_seen: 0,
            timeout_ms: 10_000,
            session_id: session,
            passwd: passwd.to_vec(),
            read_only: false,
        };
        s.write_all(&framed(&c.encode())).await.ok()?;
        let mut raw = RawZk { s, xid: 0 };
        let frame = raw.frame(Duration::from_secs(15)).await?;
        let r = baton_proto::jute::ConnectResponse::decode(&frame).ok()?;
        (r.session_id != 0).then_some((raw, r.session_id, r.passwd))
    }

    async fn frame(&mut self, limit: Duration) -> Option<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let read = async {
            let mut len = [0u8; 4];
            self.s.read_exact(&mut len).await.ok()?;
            let mut f = vec![0u8; u32::from_be_bytes(len) as usize];
            self.s.read_exact(&mut f).await.ok()?;
            Some(f)
        };
        tokio::time::timeout(limit, read).await.ok().flatten()
    }

    async fn send_create(&mut self, path: &str) {
        use baton_proto::jute;
        use tokio::io::AsyncWriteExt;
        self.xid += 1;
        let acl = vec![jute::Acl { perms: 31, scheme: "world".into(), id: "anyone".into() }];
        let c =
            jute::Create { path: path.into(), data: vec![], acl, flags: jute::create_mode::PERSISTENT, ttl_ms: None };
        let req = jute::Request::Create { op: jute::op::CREATE, c };
        self.s.write_all(&framed(&req.encode(self.xid))).await.expect("send create");
    }

    /// Sends `req` with the next xid.
    async fn send(&mut self, req: baton_proto::jute::Request) {
        use tokio::io::AsyncWriteExt;
        self.xid += 1;
        self.s.write_all(&framed(&req.encode(self.xid))).await.expect("send");
    }

    /// Sends `reqs` in one write (numbered on from the last xid).
    async fn send_all(&mut self, reqs: Vec<baton_proto::jute::Request>) {
        use tokio::io::AsyncWriteExt;
        let mut bytes = Vec::new();
        for r in reqs {
            self.xid += 1;
            bytes.extend(framed(&r.encode(self.xid)));
        }
        self.s.write_all(&bytes).await.expect("send");
    }

    /// The error code of the reply to the last request sent.
    async fn reply_err(&mut self) -> i32 {
        self.reply_to(self.xid).await.err
    }

    /// The header of the reply to request `xid` (skipping notifications,
    /// ping answers and earlier replies).
    async fn reply_to(&mut self, xid: i32) -> baton_proto::jute::ReplyHeader {
        self.reply_noting(xid).await.0
    }

    /// The header of the reply to request `xid`, and the notifications
    /// that came before it, as (type, path).
    async fn reply_noting(&mut self, xid: i32) -> (baton_proto::jute::ReplyHeader, Vec<(i32, String)>) {
        use baton_proto::jute;
        let mut notes = Vec::new();
        loop {
            let f = self.frame(Duration::from_secs(20)).await.expect("a reply");
            let mut r = jute::Reader::new(&f);
            let h = jute::ReplyHeader::read(&mut r).expect("reply header");
            if h.xid == -1 {
                let (kind, _, path) = jute::decode_notification(&mut r).expect("notification");
                notes.push((kind, path));
            }
            if h.xid == xid {
                return (h, notes);
            }
        }
    }

    /// The notifications (xid -1) that come within `limit`, as (type, path).
    async fn notifications(&mut self, limit: Duration) -> Vec<(i32, String)> {
        use baton_proto::jute;
        let deadline = tokio::time::Instant::now() + limit;
        let mut out = Vec::new();
        while let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) {
            let Some(f) = self.frame(left).await else { break };
            let mut r = jute::Reader::new(&f);
            let h = jute::ReplyHeader::read(&mut r).expect("header");
            if h.xid == -1 {
                let (kind, _, path) = jute::decode_notification(&mut r).expect("notification");
                out.push((kind, path));
            }
        }
        out
    }

    /// The reply to the last create: (error code, path if OK).
    async fn create_reply(&mut self) -> (i32, Option<String>) {
        use baton_proto::jute;
        loop {
            let f = self.frame(Duration::from_secs(20)).await.expect("a reply to the create");
            let mut r = jute::Reader::new(&f);
            let h = jute::ReplyHeader::read(&mut r).expect("reply header");
            if h.xid != self.xid {
                continue; // a ping's answer or a notification
            }
            if h.err != 0 {
                return (h.err, None);
            }
            match jute::Response::decode_body(jute::op::CREATE, &mut r).expect("create reply") {
                jute::Response::Path(p) => return (0, Some(p)),
                other => panic!("create answered {other:?}"),
            }
        }
    }
}

/// Finding Z2's steps; returns the new connection's create reply and
/// whether `/w2` exists afterwards.
async fn resumed_connections_race(c: &mut Cluster) -> ((i32, Option<String>), bool) {
    let eps = c.zk_endpoints();
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let f = if leader == 1 { 2 } else { 1 };
    let (first, sid, pw) = RawZk::connect(&eps[leader as usize - 1], 0, &[0; 16]).await.expect("a new session");
    drop(first);
    // The session resumed on follower F, F paused, a create sent on F's
    // connection and the connection dropped (the client gave up on F).
    let (mut on_f, _, _) = RawZk::connect(&eps[f as usize - 1], sid, &pw).await.expect("resumed on F");
    c.pause(f, true);
    on_f.send_create("/w1").await;
    drop(on_f);
    // Resumed on the leader while F sleeps; then F wakes and sends /w1.
    let (mut on_l, _, _) = RawZk::connect(&eps[leader as usize - 1], sid, &pw).await.expect("resumed on the leader");
    c.pause(f, false);
    let status = c.status(leader).await.expect("leader status");
    c.wait_applied(f, status.applied_index, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    on_l.send_create("/w2").await;
    let reply = on_l.create_reply().await;
    let z = connect(&eps).await;
    let w2 = z.check_stat("/w2").await.expect("exists /w2").is_some();
    (reply, w2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t22_a_resumed_session_never_answers_a_write_with_another_writes_reply() {
    // Planted: the old numbering. The new connection's create is answered
    // with the old one's reply (or refused), and /w2 is not made.
    let mut bad = Cluster::start_zk_faulty(3, "zk-resume-without-claim,reply-without-digest", &[]).await;
    let ((code, path), w2) = resumed_connections_race(&mut bad).await;
    eprintln!("planted, both guards off: /w2 answered {code} {path:?}, made: {w2}");
    assert_eq!((code, path.as_deref(), w2), (0, Some("/w1"), false), "the planted bug (finding Z2) did not show");
    drop(bad);
    // Either guard alone turns it into a definite error: with the digest
    // on, the old numbering's clash is refused, not answered as /w1.
    let mut half = Cluster::start_zk_faulty(3, "zk-resume-without-claim", &[]).await;
    let ((code, path), w2) = resumed_connections_race(&mut half).await;
    assert!(code != 0 && path.is_none() && !w2, "a clash under the old numbering: {code} {path:?} {w2}");
    drop(half);
    let mut c = Cluster::start_zk(3, &[]).await;
    let ((code, path), w2) = resumed_connections_race(&mut c).await;
    assert_eq!((code, path.as_deref()), (0, Some("/w2")), "the new connection's create answered as its own");
    assert!(w2, "/w2 was made");
    // The old connection's create came after the claim: SESSION_MOVED,
    // never run.
    let z = connect(&c.zk_endpoints()).await;
    assert!(z.check_stat("/w1").await.expect("exists /w1").is_none(), "/w1 ran after its connection was moved from");
}

/// What a ZooKeeper client on a cut-off member saw, against the instant
/// another session saw its ephemeral node gone.
struct CutOff {
    /// Reads answered OK after the takeover.
    reads_after: usize,
    /// The client's state at the takeover.
    state_then: zk::SessionState,
}

/// Finding Z1's steps: client A (4 s session) only on follower X holds an
/// ephemeral node and reads every 300 ms; X's peer links are cut; client B
/// on the others waits for the node to go; then 3 s more of A's reads.
async fn cut_off_member(c: &Cluster) -> CutOff {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    let eps = c.zk_endpoints();
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let x = if leader == 1 { 2 } else { 1 };
    let a = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(4))
        .connect(&eps[x as usize - 1])
        .await
        .expect("A connects to X");
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    a.create("/holder", b"", &eph).await.expect("A's ephemeral");
    a.create("/data", b"", &anyone()).await.expect("/data");
    let reads: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let states: Arc<Mutex<Vec<(Instant, zk::SessionState)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (a, reads, stop) = (a.clone(), reads.clone(), stop.clone());
        tokio::spawn(async move {
            for _ in 0..400 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let r = tokio::time::timeout(Duration::from_secs(1), a.get_data("/data")).await;
                if matches!(r, Ok(Ok(_))) {
                    reads.lock().unwrap().push(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let watcher = {
        let (mut w, states, stop) = (a.state_watcher(), states.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(s) = tokio::time::timeout(Duration::from_millis(200), w.changed()).await {
                    states.lock().unwrap().push((Instant::now(), s));
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!reads.lock().unwrap().is_empty(), "A reads before the cut");
    c.proxies().isolate_peers(x);
    let others: Vec<String> =
        eps.iter().enumerate().filter(|(i, _)| *i as u64 + 1 != x).map(|(_, e)| e.clone()).collect();
    let b = connect(&others).await;
    let takeover = baton_tests::eventually(Duration::from_secs(30), "A's ephemeral gone for B", || async {
        b.check_stat("/holder").await.ok()?.is_none().then(Instant::now)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = reader.await;
    let _ = watcher.await;
    c.proxies().heal();
    let reads_after = reads.lock().unwrap().iter().filter(|t| **t > takeover).count();
    let state_then = states
        .lock()
        .unwrap()
        .iter()
        .rfind(|(t, _)| *t <= takeover)
        .map(|(_, s)| *s)
        .unwrap_or(zk::SessionState::SyncConnected);
    eprintln!("A: {reads_after} reads after the takeover; state then {state_then:?}");
    CutOff { reads_after, state_then }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t23_a_cut_off_member_never_keeps_a_zookeeper_client_connected_past_its_expiry() {
    let bad = Cluster::start_proxied_zk(3, Some("zk-speak-unvouched"), &[]).await;
    let seen = cut_off_member(&bad).await;
    assert!(
        seen.reads_after > 0 && seen.state_then == zk::SessionState::SyncConnected,
        "the planted fault (finding Z1) did not show: {} reads after, {:?}",
        seen.reads_after,
        seen.state_then
    );
    drop(bad);
    let c = Cluster::start_proxied_zk(3, None, &[]).await;
    let seen = cut_off_member(&c).await;
    assert_eq!(seen.reads_after, 0, "A read from the cut-off member after its session's node was gone");
    assert_ne!(seen.state_then, zk::SessionState::SyncConnected, "A was connected when B took over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t24_replies_past_the_queue_limit_in_total_keep_flowing() {
    let c = Cluster::start_zk(3, &["--max-queued-bytes=65536"]).await;
    let a = connect(&c.zk_endpoints()[..1]).await;
    a.create("/big", &[7u8; 20_000], &anyone()).await.expect("create /big");
    // 60 reads of 20 kB: 1.2 MB through a 64 kB queue, one at a time.
    for i in 0..60 {
        let r = tokio::time::timeout(Duration::from_secs(5), a.get_data("/big")).await;
        let (data, _) = r.unwrap_or_else(|_| panic!("read {i} unanswered")).expect("get /big");
        assert_eq!(data.len(), 20_000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t25_multi_read_keeps_to_the_op_and_reply_caps() {
    let c = Cluster::start_zk(3, &["--max-multi-ops=8", "--max-reply-bytes=100000"]).await;
    let a = connect(&c.zk_endpoints()[..1]).await;
    a.create("/big", &[7u8; 30_000], &anyone()).await.expect("create /big");
    let reads = |n: usize| {
        let mut r = a.new_multi_reader();
        for _ in 0..n {
            r.add_get_data("/big").expect("add");
        }
        async move { r.commit().await }
    };
    // Three reads of 30 kB: 90 kB, under the cap.
    assert_eq!(reads(3).await.expect("three reads").len(), 3);
    // Four: 120 kB, over it; refused whole.
    assert!(matches!(reads(4).await, Err(zk::Error::BadArguments(_))), "a reply over --max-reply-bytes");
    // Nine ops: over --max-multi-ops (of a small node too).
    a.create("/small", b"x", &anyone()).await.expect("create /small");
    let mut r = a.new_multi_reader();
    for _ in 0..9 {
        r.add_get_data("/small").expect("add");
    }
    assert!(matches!(r.commit().await, Err(zk::Error::BadArguments(_))), "more ops than --max-multi-ops");
    // The connection and the member go on.
    assert_eq!(a.get_data("/small").await.expect("get").0, b"x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t26_refused_watches_are_not_kept() {
    use baton_proto::jute::{err, Request};
    let c = Cluster::start_zk(3, &["--max-watches=3"]).await;
    let (mut z, _, _) = RawZk::connect(&c.zk_endpoints()[0], 0, &[0; 16]).await.expect("a session");
    let mut codes = Vec::new();
    for i in 0..6 {
        z.send(Request::Exists { path: format!("/w{i}"), watch: true }).await;
        codes.push(z.reply_err().await);
    }
    assert_eq!(codes[..3], [err::NO_NODE; 3], "three watches fit");
    assert!(codes[3..].iter().all(|c| *c == err::THROTTLED_OP), "past --max-watches: {codes:?}");
    // A data watch (ZooKeeper's type 2 covers exists) on /w0 is there; on
    // /w5 it was refused, so there is none.
    z.send(Request::CheckWatches { path: "/w0".into(), kind: 2 }).await;
    assert_eq!(z.reply_err().await, err::OK);
    z.send(Request::CheckWatches { path: "/w5".into(), kind: 2 }).await;
    assert_eq!(z.reply_err().await, err::NO_WATCHER, "a refused watch was kept");
    // An addWatch on an invalid path: refused, nothing kept.
    z.send(Request::AddWatch { path: "/bad/".into(), mode: baton_proto::jute::watch_mode::PERSISTENT }).await;
    assert_eq!(z.reply_err().await, err::BAD_ARGUMENTS);
    z.send(Request::CheckWatches { path: "/bad/".into(), kind: 3 }).await;
    assert_eq!(z.reply_err().await, err::NO_WATCHER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t27_one_notification_per_connection_per_change() {
    use baton_proto::jute::{err, event, watch_mode, Request};
    let c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    let other = connect(&eps).await;
    other.create("/n", b"0", &anyone()).await.expect("create /n");
    let (mut z, _, _) = RawZk::connect(&eps[0], 0, &[0; 16]).await.expect("a session");
    // An exists and a data watch on /n: one change, one notification.
    z.send(Request::Exists { path: "/n".into(), watch: true }).await;
    assert_eq!(z.reply_err().await, err::OK);
    z.send(Request::GetData { path: "/n".into(), watch: true }).await;
    assert_eq!(z.reply_err().await, err::OK);
    other.set_data("/n", b"1", None).await.expect("set");
    let seen = z.notifications(Duration::from_millis(1500)).await;
    assert_eq!(seen, vec![(event::NODE_DATA_CHANGED, "/n".to_string())], "one change, one notification");
    // A persistent recursive watch on / and an exists watch on /n: again one.
    z.send(Request::AddWatch { path: "/".into(), mode: watch_mode::PERSISTENT_RECURSIVE }).await;
    assert_eq!(z.reply_err().await, err::OK);
    z.send(Request::Exists { path: "/n".into(), watch: true }).await;
    assert_eq!(z.reply_err().await, err::OK);
    other.set_data("/n", b"2", None).await.expect("set");
    let seen = z.notifications(Duration::from_millis(1500)).await;
    assert_eq!(seen, vec![(event::NODE_DATA_CHANGED, "/n".to_string())], "recursive and exists: one notification");
    // The one-shot watch was used up: the next change comes once, through
    // the recursive watch.
    other.set_data("/n", b"3", None).await.expect("set");
    let seen = z.notifications(Duration::from_millis(1500)).await;
    assert_eq!(seen, vec![(event::NODE_DATA_CHANGED, "/n".to_string())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t28_replies_the_port_answers_itself_keep_the_sessions_order() {
    use baton_proto::jute::Request;
    let c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    connect(&eps[..1]).await.create("/load", b"", &anyone()).await.expect("create /load");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Eight writers on the same member keep its driver applying while the
    // reads below wait in its queue.
    let mut load = Vec::new();
    for w in 0..8 {
        let (stop, writer) = (stop.clone(), connect(&eps[..1]).await);
        load.push(tokio::spawn(async move {
            for i in 0..5_000 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let _ = writer.create(&format!("/load/w{w}-{i}"), b"", &anyone()).await;
            }
        }));
    }
    let (mut z, _, _) = RawZk::connect(&eps[0], 0, &[0; 16]).await.expect("a session");
    let mut behind = 0;
    for i in 0..300 {
        // A read the member serves, then one the port answers itself,
        // pipelined: the second reflects at least what the first did.
        let second = match i % 3 {
            0 => Request::GetAllChildrenNumber { path: "/load".into() },
            1 => Request::GetEphemerals { prefix: "/".into() },
            _ => Request::CheckWatches { path: "/load".into(), kind: 3 },
        };
        z.send_all(vec![Request::Exists { path: "/load".into(), watch: false }, second]).await;
        let (a, b) = (z.reply_to(z.xid - 1).await, z.reply_to(z.xid).await);
        if b.zxid < a.zxid {
            behind += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for l in load {
        let _ = l.await;
    }
    eprintln!("{behind} of 300 behind");
    assert_eq!(behind, 0, "{behind} of 300 self-answered replies showed an older state than the read before them");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t29_watches_show_only_what_their_connection_may_read() {
    use baton_proto::jute::{err, op, watch_mode, Request};
    let c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    let alice = connect(&eps).await;
    alice.auth("digest", b"alice:pw").await.expect("auth");
    // base64(SHA-1("alice:pw")), as zookeeper_acl.rs.
    let only_alice = zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", "alice:V55/p2T0OpjQ+low3NVAH4aLvm0="));
    let secret = zk::CreateMode::Persistent.with_acls(zk::Acls::new(std::slice::from_ref(&only_alice)));
    alice.create("/open", b"", &anyone()).await.expect("create /open");
    alice.create("/secret", b"", &secret).await.expect("create /secret");
    alice.create("/secret/plans", b"", &secret).await.expect("create /secret/plans");
    let (mut z, _, _) = RawZk::connect(&eps[0], 0, &[0; 16]).await.expect("a session");
    z.send(Request::GetChildren { op: op::GET_CHILDREN, path: "/secret".into(), watch: false }).await;
    assert_eq!(z.reply_err().await, err::NO_AUTH, "the guest may not list /secret");
    // A reconnect's watches from relativeZxid 0: recursive on /secret and
    // on /, a child watch on /secret.
    z.send(Request::SetWatches {
        op: op::SET_WATCHES2,
        relative_zxid: 0,
        data: vec![],
        exist: vec![],
        child: vec!["/secret".into()],
        persistent: vec![],
        persistent_recursive: vec!["/secret".into(), "/".into()],
    })
    .await;
    let (_, replayed) = z.reply_noting(z.xid).await;
    assert!(
        replayed.iter().all(|(_, p)| !p.starts_with("/secret")),
        "setWatches2 replayed names under /secret to the guest: {replayed:?}"
    );
    // Live changes: under /secret (hidden), under /open (seen).
    alice.create("/secret/more", b"", &secret).await.expect("create /secret/more");
    alice.set_data("/secret/plans", b"x", None).await.expect("set /secret/plans");
    alice.create("/open/news", b"", &anyone()).await.expect("create /open/news");
    let seen = z.notifications(Duration::from_millis(1500)).await;
    let leaked: Vec<&(i32, String)> = seen.iter().filter(|(_, p)| p.starts_with("/secret")).collect();
    assert!(leaked.is_empty(), "the guest saw names under /secret: {leaked:?} (all: {seen:?})");
    assert!(seen.iter().any(|(_, p)| p == "/open/news"), "the recursive watch on / still sees what it may: {seen:?}");
    // addWatch on /secret is refused, as getChildren was.
    z.send(Request::AddWatch { path: "/secret".into(), mode: watch_mode::PERSISTENT_RECURSIVE }).await;
    assert_eq!(z.reply_err().await, err::NO_AUTH);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_zkcli_scripted_session() {
    let c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    let script = "\
create /zk30 hello
create -e -s /zk30/lock- x
ls -s /zk30
get -w /zk30
set /zk30 world
set -v 0 /zk30 stale
get -s /zk30
addWatch -m PERSISTENT_RECURSIVE /zk30
create /zk30/r one
delete /zk30/none
sync /zk30
getAllChildrenNumber /zk30
quit
";
    let server = eps[2].clone();
    let out = baton_tests::zkcli(&server, script).await;
    let has = |s: &str| assert!(out.contains(s), "zkCli output lacks {s:?}:\n{out}");
    has("Created /zk30\n");
    let seq = out.lines().find_map(|l| l.strip_prefix("Created /zk30/lock-")).unwrap_or_else(|| panic!("{out}"));
    assert!(seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()), "a 10-digit suffix: {seq:?}");
    has(&format!("[lock-{seq}]"));
    has("numChildren = 1");
    has("WatchedEvent state:SyncConnected type:NodeDataChanged path:/zk30");
    has("version No is not valid : /zk30");
    has("dataVersion = 1");
    has("WatchedEvent state:SyncConnected type:NodeCreated path:/zk30/r");
    has("Node does not exist: /zk30/none");
    has("Sync is OK");
    assert!(out.lines().any(|l| l.trim() == "2"), "getAllChildrenNumber: 2\n{out}");
    assert!(!out.contains("ConnectionLoss"), "the session never lost its connection:\n{out}");
    // What zkCli wrote, Baton's own client reads.
    let native = c.client().await;
    let (data, _) = native.get("/zk30").await.expect("native get");
    assert_eq!(&data[..], b"world");
    let _ = native.close().await;
}

/// Sends `bytes` on a fresh connection to `addr` and reads until the
/// member closes it (bounded: a connection still open after 5 s fails).
async fn send_and_read_to_close(addr: &str, bytes: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let _ = s.write_all(bytes).await;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("the member closed the connection")
        .ok();
    out
}

fn connect_frame() -> Vec<u8> {
    let c = baton_proto::jute::ConnectRequest {
        protocol_version: 0,
        last_zxid_seen: 0,
        timeout_ms: 6000,
        session_id: 0,
        passwd: vec![0; 16],
        read_only: false,
    };
    framed(&c.encode())
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_bad_input_closes_one_connection_and_four_letter_words_follow_the_whitelist() {
    let c = Cluster::start_zk(3, &["--zk-4lw-whitelist=srvr,ruok,stat,cons"]).await;
    let eps = c.zk_endpoints();
    let a = connect(&eps[..1]).await;
    a.create("/kept", b"safe", &anyone()).await.expect("create");
    let ep = &eps[0];

    // Garbage as the first frame (a negative length), an oversized one, a
    // connect request cut short: closed, nothing answered.
    assert!(send_and_read_to_close(ep, &[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]).await.is_empty());
    assert!(send_and_read_to_close(ep, &(200u32 << 20).to_be_bytes()).await.is_empty());
    assert!(send_and_read_to_close(ep, &framed(&[0, 0, 0, 0, 0, 0])).await.is_empty());
    // After the handshake: an unknown opcode, a truncated create, garbage.
    for bad in [
        framed(&[0, 0, 0, 1, 0, 0, 2, 0x2b]),
        framed(&[0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 9, b'/', b'x']),
        framed(&[0xff; 40]),
    ] {
        let mut bytes = connect_frame();
        bytes.extend_from_slice(&bad);
        let got = send_and_read_to_close(ep, &bytes).await;
        // The connect reply (a 4-byte length, then 4+4+8+4+16+1 bytes) and nothing after it.
        assert_eq!(got.len(), 4 + 37, "only the connect reply before the close: {got:?}");
    }

    // Four-letter words: whitelisted ones answer, the others are refused
    // with ZooKeeper's text, an unknown word is just closed.
    let srvr = String::from_utf8(send_and_read_to_close(ep, b"srvr").await).expect("text");
    assert!(srvr.contains("Zookeeper version: 3.8.0-baton") && srvr.contains("Mode: "), "{srvr}");
    // The counters are real: a's connection is open and has been served.
    let field = |text: &str, name: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {text}"));
        line[name.len()..].trim().parse().unwrap_or_else(|_| panic!("{name} is not a number: {line}"))
    };
    assert!(field(&srvr, "Connections:") >= 1 && field(&srvr, "Received:") >= 2, "{srvr}");
    assert!(field(&srvr, "Sent:") >= 2, "{srvr}");
    let sid = format!("sid={:#x},", a.session_id().0);
    let cons = String::from_utf8(send_and_read_to_close(ep, b"cons").await).expect("text");
    let line = cons.lines().find(|l| l.contains(&sid)).unwrap_or_else(|| panic!("cons lists no {sid}: {cons}"));
    assert!(line.starts_with(" /127.0.0.1:") && line.contains("lop=CREA") && line.contains("queued=0"), "{line}");
    let stat = String::from_utf8(send_and_read_to_close(ep, b"stat").await).expect("text");
    assert!(stat.contains("Clients:\n /127.0.0.1:") && stat.contains("Outstanding: 0"), "{stat}");
    assert_eq!(send_and_read_to_close(ep, b"ruok").await, b"imok");
    let mntr = String::from_utf8(send_and_read_to_close(ep, b"mntr").await).expect("text");
    assert_eq!(mntr, "mntr is not executed because it is not in the whitelist.\n");
    assert!(send_and_read_to_close(ep, b"zzzz").await.is_empty());

    // The member kept serving, and the session that was open meanwhile too.
    let (data, _) = a.get_data("/kept").await.expect("the old session still works");
    assert_eq!(data, b"safe");
    let b = connect(&eps[..1]).await;
    b.create("/after", b"", &anyone()).await.expect("a new session works");
    let st = c.status(1).await.expect("member 1 answers its status");
    assert!(st.applied_index > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t41_one_connection_cap_for_both_client_ports() {
    use baton_tests::raw::RawConn;
    let c = Cluster::start_zk(3, &["--max-connections=3"]).await;
    let zk_ep = &c.zk_endpoints()[0];
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(RawZk::connect(zk_ep, 0, &[0; 16]).await.expect("a ZooKeeper session").0);
    }
    let mut native = RawConn::connect(&c.endpoint(1)).await;
    let r = native.recv().await.expect("an answer to the fourth connection");
    assert_eq!(r.error, baton_proto::ErrorCode::Busy as i32, "{r:?}");
    drop(held.pop());
    let status = baton_proto::Request {
        id: 1,
        body: Some(baton_proto::request::Body::Status(baton_proto::StatusReq {})),
        ..Default::default()
    };
    let answered = baton_tests::eventually(Duration::from_secs(10), "a native connection once a slot is free", || {
        let ep = c.endpoint(1);
        let status = status.clone();
        async move {
            let mut n = RawConn::connect(&ep).await;
            let r = n.call(status).await;
            (r.error == 0).then_some(r)
        }
    })
    .await;
    assert_eq!(answered.error, 0);
}
