//! The client library as a user meets it, against a real 3-member cluster:
//! error matching, watchers as streams (bounded, recursive), a namespace,
//! the transaction builder, connection edges, the tree cache and the
//! leader selector.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{
    CacheEvent, Client, ConnectionEvent, CreateOptions, ErrorKind, EventType, LeaderSelector, TreeCache, WatchEnd,
    WatchKind, WatchMode,
};
use baton_client::{ClientConfig, Error, Op, SessionState};
use baton_tests::{eventually, Cluster, LinkId};
use futures::StreamExt;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The next event within 10 s, or a panic naming `what`.
async fn next_event<S: futures::Stream + Unpin>(s: &mut S, what: &str) -> Option<S::Item> {
    tokio::time::timeout(SECS(10), s.next()).await.unwrap_or_else(|_| panic!("no event in 10 s: {what}"))
}

#[tokio::test]
async fn c10_errors_match_by_kind_and_watchers_are_bounded_streams() {
    let c = Cluster::start(3, &[]).await;
    let client = c.client().await;

    // Errors: one flat kind each, and helpers for the common ones.
    let missing = client.get("/nope").await.expect_err("read of a missing node");
    assert!(missing.is_no_node() && missing.kind() == ErrorKind::NoNode && !missing.is_ambiguous(), "{missing:?}");
    client.create("/a", "1", CreateOptions::persistent()).await.expect("create /a");
    let dup = client.create("/a", "", CreateOptions::persistent()).await.expect_err("second create");
    assert!(dup.is_node_exists(), "{dup:?}");
    let stale = client.set("/a", "x", Some(9)).await.expect_err("set at a wrong version");
    assert!(stale.is_bad_version(), "{stale:?}");
    client.create("/a/kid", "", CreateOptions::persistent()).await.expect("create /a/kid");
    assert!(client.delete("/a", None).await.expect_err("delete with a child").is_not_empty());
    let bad = client.create("a", "", CreateOptions::persistent()).await.expect_err("relative path");
    assert_eq!(bad.kind(), ErrorKind::InvalidPath, "{bad:?}");

    // A recursive watch is a stream naming each node below that changed.
    let mut tree = client.watch("/a", WatchKind::Recursive, WatchMode::Persistent).await.expect("recursive watch");
    client.create("/a/kid/deep", "", CreateOptions::persistent()).await.expect("create deep");
    client.set("/a", "2", None).await.expect("set /a");
    client.delete("/a/kid/deep", None).await.expect("delete deep");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let ev = next_event(&mut tree, "recursive").await.expect("the watch ended early");
        seen.push((ev.event_type, ev.path));
    }
    assert_eq!(
        seen,
        vec![
            (EventType::NodeCreated, "/a/kid/deep".to_string()),
            (EventType::NodeDataChanged, "/a".to_string()),
            (EventType::NodeDeleted, "/a/kid/deep".to_string()),
        ]
    );

    // A one-shot watch ends after its event, and says so.
    let (_, _, mut once) = client.get_watch("/a").await.expect("get_watch");
    client.set("/a", "3", None).await.expect("set");
    assert_eq!(next_event(&mut once, "one-shot").await.map(|e| e.event_type), Some(EventType::NodeDataChanged));
    assert!(next_event(&mut once, "one-shot end").await.is_none());
    assert_eq!(once.end_reason(), Some(WatchEnd::Fired));

    // A reader that falls `watch_buffer` behind is ended, not waited for.
    let small = c.client_with(c.config().watch_buffer(2)).await;
    let mut slow = small.watch("/a", WatchKind::Data, WatchMode::Persistent).await.expect("persistent watch");
    for i in 0..6 {
        client.set("/a", format!("v{i}"), None).await.expect("set");
    }
    let got: Vec<_> = tokio::time::timeout(SECS(10), (&mut slow).collect::<Vec<_>>()).await.expect("stream end");
    assert_eq!(got.len(), 2, "kept {got:?}");
    assert_eq!(slow.end_reason(), Some(WatchEnd::Overflow));
    // The session itself is fine.
    assert!(small.get("/a").await.is_ok());
}

#[tokio::test]
async fn c20_namespace_txn_and_connection_edges() {
    let mut c = Cluster::start(3, &[]).await;
    let root = c.client().await;
    root.create("/tenant", "", CreateOptions::persistent()).await.expect("create the namespace node");

    // Everything under /tenant, and no path the caller sees mentions it.
    let ns = c.client_with(c.config().namespace("/tenant")).await;
    let (p, _) = ns.create("/job-", "x", CreateOptions::persistent().sequential()).await.expect("create");
    assert_eq!(p, "/job-0000000000");
    assert!(root.exists("/tenant/job-0000000000").await.expect("exists").is_some());
    assert_eq!(ns.children("/").await.expect("ls /"), vec!["job-0000000000"]);
    let mut w = ns.watch("/", WatchKind::Recursive, WatchMode::Persistent).await.expect("watch");
    root.set("/tenant/job-0000000000", "y", None).await.expect("set from outside");
    let ev = next_event(&mut w, "namespaced event").await.expect("event");
    assert_eq!((ev.event_type, ev.path.as_str()), (EventType::NodeDataChanged, "/job-0000000000"));
    let lock = ns.lock("l").await.expect("a recipe under the namespace");
    assert!(root.children("/tenant/_baton/locks/l").await.is_ok_and(|k| k.len() == 1));

    // The transaction builder: all or nothing, the failing op named.
    let (_, s) = ns.get("/job-0000000000").await.expect("get");
    let r = ns
        .txn()
        .check_fence("res", lock.fencing_token())
        .check("/job-0000000000", Some(s.version))
        .set("/job-0000000000", "z", Some(s.version))
        .create("/done", "", CreateOptions::persistent())
        .commit()
        .await
        .expect("commit");
    assert_eq!(r.len(), 4);
    assert_eq!(r[3].path, "/done");
    let failed = ns
        .txn()
        .create("/never", "", CreateOptions::persistent())
        .check("/job-0000000000", Some(s.version))
        .commit()
        .await
        .expect_err("a stale check");
    assert!(failed.is_bad_version(), "{failed:?}");
    assert!(ns.exists("/never").await.expect("exists").is_none(), "a failed txn applied an op");
    lock.release().await.expect("release");

    // Edges: pause the member this client uses; Suspended, then Reconnected
    // with the same session once it is back.
    let leader = c.wait_leader(SECS(10)).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let cfg = baton_client::ClientConfig::new([c.endpoint(follower)]).session_timeout(SECS(10));
    let one = c.client_with(cfg).await;
    let mut edges = one.connection_events();
    c.pause(follower, true);
    let suspended = tokio::time::timeout(SECS(12), edges.next()).await;
    c.pause(follower, false);
    assert_eq!(suspended.expect("no edge in 12 s"), Some(ConnectionEvent::Suspended));
    let back = tokio::time::timeout(SECS(12), edges.next()).await.expect("no second edge in 12 s");
    assert_eq!(back, Some(ConnectionEvent::Reconnected));
    one.create("/after", "", CreateOptions::ephemeral()).await.expect("the same session works");
    one.close().await.expect("close");
    assert_eq!(tokio::time::timeout(SECS(5), edges.next()).await.expect("edge"), Some(ConnectionEvent::Lost));
}

#[tokio::test]
async fn c30_tree_cache_follows_a_subtree() {
    let c = Cluster::start(3, &[]).await;
    let writer = c.client().await;
    writer.create("/cfg/a", "1", CreateOptions::persistent().with_parents()).await.expect("create");
    writer.create("/cfg/b", "2", CreateOptions::persistent()).await.expect("create");
    let reader = c.client().await;
    let mut cache = TreeCache::start(&reader, "/cfg").await.expect("cache");
    assert_eq!(cache.children("/cfg"), vec!["a", "b"]);
    assert_eq!(cache.get("/cfg/a").map(|n| n.data), Some("1".into()));
    // The first read reports each node, then Initialized.
    let mut first = Vec::new();
    while let Some(e) = tokio::time::timeout(SECS(5), cache.next_event()).await.expect("initial events") {
        if e == CacheEvent::Initialized {
            break;
        }
        first.push(e);
    }
    assert_eq!(first.len(), 3, "{first:?}");

    writer.set("/cfg/a", "10", None).await.expect("set");
    writer.create("/cfg/c/d", "4", CreateOptions::persistent().with_parents()).await.expect("create");
    writer.delete("/cfg/b", None).await.expect("delete");
    eventually(SECS(10), "the cache to follow", || async {
        let ok = cache.get("/cfg/a").is_some_and(|n| n.data == "10")
            && cache.get("/cfg/c/d").is_some_and(|n| n.data == "4")
            && cache.get("/cfg/b").is_none();
        ok.then_some(())
    })
    .await;
    assert_eq!(cache.children("/cfg"), vec!["a", "c"]);
    let mut events = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(300), cache.next_event()).await {
        events.push(e);
    }
    for want in [
        CacheEvent::Changed("/cfg/a".into()),
        CacheEvent::Created("/cfg/c/d".into()),
        CacheEvent::Deleted("/cfg/b".into()),
    ] {
        assert!(events.contains(&want), "{want:?} not in {events:?}");
    }
    // The whole copy equals a fresh read.
    let snap = cache.snapshot();
    for (path, node) in &snap {
        let (data, stat) = writer.get(path).await.expect("get");
        assert_eq!((&node.data, node.stat.mzxid), (&data, stat.mzxid), "{path}");
    }
    assert_eq!(snap.len(), 4, "{:?}", snap.keys().collect::<Vec<_>>());

    // The session ends: the cache stops and says so.
    reader.close().await.expect("close");
    let stopped = tokio::time::timeout(SECS(10), cache.next_event()).await.expect("stop event");
    assert_eq!(stopped, Some(CacheEvent::Stopped(Some(WatchEnd::SessionEnded))));
    assert!(!cache.is_running() || cache.next_event().await.is_none());
}

/// A cache that falls behind its watch (a buffer of 1 event, 300 writes
/// at once) watches again and reads again instead of stopping, and ends
/// equal to the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c31_a_tree_cache_that_falls_behind_resumes() {
    let c = Cluster::start(3, &[]).await;
    let writer = c.client().await;
    writer.create("/busy/k", "0", CreateOptions::persistent().with_parents()).await.expect("create");
    let cfg = ClientConfig::new(c.endpoints()).watch_buffer(1);
    let reader = Client::connect_with(cfg).await.expect("connect");
    let mut cache = TreeCache::start(&reader, "/busy").await.expect("cache");
    let writes: Vec<_> = (0..300)
        .map(|i| {
            let w = writer.clone();
            tokio::spawn(async move { w.create(&format!("/busy/n{i}"), "v", CreateOptions::persistent()).await })
        })
        .collect();
    for w in writes {
        w.await.expect("task").expect("create");
    }
    writer.set("/busy/k", "last", None).await.expect("set");
    eventually(SECS(20), "the cache to hold all 302 nodes", || async {
        (cache.is_current() && cache.len() == 302 && cache.get("/busy/k").is_some_and(|n| n.data == "last"))
            .then_some(())
    })
    .await;
    let mut events = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(300), cache.next_event()).await {
        events.push(e);
    }
    assert!(!events.iter().any(|e| matches!(e, CacheEvent::Stopped(_))), "the cache stopped");
    reader.close().await.expect("close");
}

/// A semaphore at a path (Curator's InterProcessSemaphoreV2 protocol):
/// two holders of 2, a third that times out leaves no lease behind and
/// frees the mutex, and is admitted once a holder leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c45_a_semaphore_at_a_path_admits_its_size() {
    let c = Cluster::start(3, &[]).await;
    let (a, b, third) = (c.client().await, c.client().await, c.client().await);
    let at = |cl: &Client| cl.semaphore_at("/pool", 2).expect("semaphore");
    let pa = at(&a).acquire().await.expect("a");
    let pb = at(&b).acquire().await.expect("b");
    assert!(at(&third).try_acquire().await.expect("try").is_none(), "a third of 2 admitted");
    let late = at(&third).acquire_with_timeout(Duration::from_millis(300)).await.expect("timed");
    assert!(late.is_none(), "a third of 2 admitted");
    eventually(SECS(5), "no lease or mutex node left by the waiter", || async {
        let leases = a.children("/pool/leases").await.ok()?;
        let locks = a.children("/pool/locks").await.unwrap_or_default();
        (leases.len() == 2 && locks.is_empty()).then_some(())
    })
    .await;
    let waiter = {
        let t = third.clone();
        tokio::spawn(async move { t.semaphore_at("/pool", 2).expect("semaphore").acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "admitted while two hold");
    pa.release().await.expect("release");
    let pc =
        tokio::time::timeout(SECS(10), waiter).await.expect("admitted within 10 s").expect("task").expect("acquire");
    assert!(pc.fencing_token() > pb.fencing_token());
    assert!(a.semaphore_at("/", 2).is_err() && a.semaphore_at("/x", 0).is_err(), "bad path or size accepted");
    pc.release().await.expect("release");
    pb.release().await.expect("release");
}

#[tokio::test]
async fn c40_leader_selector_takes_turns_with_growing_tokens() {
    let c = Cluster::start(3, &[]).await;
    // (candidate, token, start, end) of each term.
    type Terms = Arc<Mutex<Vec<(usize, u64, Instant, Instant)>>>;
    let log: Terms = Default::default();
    let mut selectors = Vec::new();
    for who in 0..2 {
        let client = c.client().await;
        let log = log.clone();
        let s = LeaderSelector::start(&client, "jobs", format!("cand-{who}"), move |term| {
            let log = log.clone();
            async move {
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(300)).await;
                log.lock().expect("log").push((who, term.fencing_token, start, Instant::now()));
            }
        });
        selectors.push((client, s));
    }
    eventually(SECS(20), "four terms", || async { (log.lock().expect("log").len() >= 4).then_some(()) }).await;
    for (_, s) in selectors.drain(..) {
        s.close().await;
    }
    let log = log.lock().expect("log").clone();
    // Terms never overlap, tokens only grow, and both candidates led
    // (each requeues after its term).
    for w in log.windows(2) {
        assert!(w[1].1 > w[0].1, "tokens must grow: {log:?}");
        assert!(w[1].2 >= w[0].3, "terms overlapped: {log:?}");
    }
    assert!(log.iter().any(|t| t.0 == 0) && log.iter().any(|t| t.0 == 1), "{log:?}");
    let client = c.client().await;
    assert_eq!(client.leader("jobs").await.expect("leader"), None, "closed selectors left a leader");

    // A selector closed while it waits in the queue has withdrawn by the
    // time close returns (its node was once deleted in the background,
    // after close, and a read right after still saw it).
    let lead = client.campaign("queued", "holder").await.expect("campaign");
    let waiter = c.client().await;
    let s = LeaderSelector::start(&waiter, "queued", "waiter", |_| async {});
    eventually(SECS(10), "the selector to queue", || async {
        let kids = client.children("/_baton/election/queued").await.expect("children");
        (kids.len() == 2).then_some(())
    })
    .await;
    s.close().await;
    let kids = client.children("/_baton/election/queued").await.expect("children");
    assert_eq!(kids.len(), 1, "a closed selector left its candidacy: {kids:?}");
    // Closed while its create is on the wire: the same holds.
    for _ in 0..5 {
        let s = LeaderSelector::start(&waiter, "queued", "waiter", |_| async {});
        tokio::time::sleep(Duration::from_millis(1)).await;
        s.close().await;
        let kids = client.children("/_baton/election/queued").await.expect("children");
        assert_eq!(kids.len(), 1, "a selector closed during its create left its candidacy: {kids:?}");
    }
    assert_eq!(lead.fencing_token(), client.leader("queued").await.expect("leader").expect("a leader").fencing_token);
    // An invalid name or path ends a selector at once.
    let bad = [
        LeaderSelector::start(&waiter, "a/b", "x", |_| async {}),
        LeaderSelector::start_at(&waiter, "/", "x", |_| async {}),
    ];
    assert!(bad.iter().all(|s| !s.is_running()), "a selector with an invalid name or path runs");
    lead.resign().await.expect("resign");
    let _ = Client::close(&waiter).await;
    let _ = Client::close(&client).await;
}

#[tokio::test]
async fn c50_non_blocking_acquires_leave_nothing_queued() {
    let c = Cluster::start(3, &[]).await;
    let (a, b) = (c.client().await, c.client().await);
    let r1 = a.try_read_lock("doc").await.expect("try_read_lock").expect("a free read lock");
    let r2 = b.try_read_lock("doc").await.expect("try_read_lock").expect("readers share");
    assert!(r1.verify().await.expect("verify") && r2.verify().await.expect("verify"));
    let w = c.client().await;
    assert!(w.try_write_lock("doc").await.expect("try_write_lock").is_none(), "a writer got in past readers");
    assert_eq!(w.children("/_baton/rwlocks/doc").await.expect("ls").len(), 2, "a failed try left its node");
    r1.release().await.expect("release");
    r2.release().await.expect("release");
    let wl = w.try_write_lock("doc").await.expect("try_write_lock").expect("free now");
    assert!(wl.is_write());

    let p = a.semaphore("pool", 1).try_acquire().await.expect("try_acquire").expect("a free permit");
    assert!(b.semaphore("pool", 1).try_acquire().await.expect("try_acquire").is_none());
    assert_eq!(a.children("/_baton/semaphores/pool/leases").await.expect("ls").len(), 1);
    // The size is stored with the semaphore (finding A8): asking for another
    // is refused, and leaves nothing queued.
    assert!(matches!(b.semaphore("pool", 2).try_acquire().await, Err(baton_client::Error::Invalid(_))));
    assert_eq!(a.children("/_baton/semaphores/pool/leases").await.expect("ls").len(), 1);
    let q = a.semaphore("pair", 2).try_acquire().await.expect("try_acquire").expect("a free permit");
    assert!(b.semaphore("pair", 2).try_acquire().await.expect("try_acquire").is_some(), "two permits admit two");
    q.release().await.expect("release");
    p.release().await.expect("release");
}

/// Issue 28, U2: a client built with `renew_session(true)` comes back after
/// a real expiry (its links to every member stalled until the cluster
/// expired it) with a new session and says so (`Lost`, then `NewSession`
/// naming both ids). What the old session held stays bound to it: the old
/// guard reports the loss and its fenced write fails instead of running
/// under the new session; a LeaderSelector campaigns again with a higher
/// token; the same task can lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c60_a_renewing_client_opens_a_new_session_after_expiry() {
    let c = Cluster::start_proxied(3, 1, &[]).await;
    c.wait_leader(SECS(20)).await;
    let eps: Vec<String> = (c.proxies().links.iter())
        .filter(|(id, _)| matches!(id, LinkId::Client { slot: 0, .. }))
        .map(|(_, l)| l.listen.to_string())
        .collect();
    assert_eq!(eps.len(), 3, "slot 0 reaches every member");
    let cfg = ClientConfig::new(eps).session_timeout(SECS(2)).renew_session(true);
    let client = Client::connect_with(cfg).await.expect("connect");
    let other = c.client().await;
    let old = client.session_id();
    let mut events = client.connection_events();
    client.create("/eph", "", CreateOptions::ephemeral()).await.expect("ephemeral");
    let guard = client.lock("renew").await.expect("lock");
    let terms: Arc<Mutex<Vec<(u64, u64)>>> = Default::default();
    let selector = {
        let (terms, cl) = (terms.clone(), client.clone());
        LeaderSelector::start(&client, "renew-sel", "a", move |term| {
            let (terms, cl) = (terms.clone(), cl.clone());
            async move {
                terms.lock().expect("terms").push((cl.session_id(), term.fencing_token));
                std::future::pending::<()>().await
            }
        })
    };
    eventually(SECS(10), "the selector leads", || async { (!terms.lock().expect("terms").is_empty()).then_some(()) })
        .await;
    // An observer of that election on the renewing client.
    let mut observer = client.observe("renew-sel").await.expect("observe");
    let first = tokio::time::timeout(SECS(5), observer.next()).await.expect("the first leader");
    let first = first.expect("the stream").expect("a leader");
    // A tree cache on the renewing client.
    for (path, data) in [("/renewcfg/a", "1"), ("/renewcfg/gone", "x"), ("/renewcfg/same", "s")] {
        other.create(path, data, CreateOptions::persistent().with_parents()).await.expect("create");
    }
    let mut cache = TreeCache::start(&client, "/renewcfg").await.expect("cache");
    while let Some(e) = tokio::time::timeout(SECS(5), cache.next_event()).await.expect("initial events") {
        if e == CacheEvent::Initialized {
            break;
        }
    }

    // Cut off from every member until the cluster expires the session;
    // meanwhile the cached subtree changes.
    c.proxies().stall_slot(0, true);
    other.set("/renewcfg/a", "2", None).await.expect("set");
    other.create("/renewcfg/b", "3", CreateOptions::persistent()).await.expect("create");
    other.delete("/renewcfg/gone", None).await.expect("delete");
    eventually(SECS(15), "the cluster expires the session", || async {
        other.exists("/eph").await.ok()?.is_none().then_some(())
    })
    .await;
    c.proxies().stall_slot(0, false);

    // Lost, then NewSession naming both sessions.
    let mut seen = Vec::new();
    let new = loop {
        match tokio::time::timeout(SECS(20), events.next()).await.expect("Lost, then NewSession, within 20 s") {
            Some(ConnectionEvent::NewSession { expired, session }) => {
                assert_eq!(expired, old);
                break session;
            }
            Some(e) => seen.push(e),
            None => panic!("the events ended: {seen:?}"),
        }
    };
    assert!(seen.contains(&ConnectionEvent::Lost), "Lost before NewSession: {seen:?}");
    assert_ne!(new, old);
    assert_eq!(client.session_id(), new);
    eventually(SECS(5), "the client is Connected", || async {
        (*client.state().borrow() == SessionState::Connected).then_some(())
    })
    .await;

    // The cache resumed under the new session: read again, each
    // difference reported, the copy equal to the cluster's.
    eventually(SECS(15), "the cache resumes", || async {
        let ok = cache.is_current()
            && cache.get("/renewcfg/a").is_some_and(|n| n.data == "2")
            && cache.get("/renewcfg/b").is_some()
            && cache.get("/renewcfg/gone").is_none();
        ok.then_some(())
    })
    .await;
    let mut changes = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(300), cache.next_event()).await {
        changes.push(e);
    }
    for want in [
        CacheEvent::Changed("/renewcfg/a".into()),
        CacheEvent::Created("/renewcfg/b".into()),
        CacheEvent::Deleted("/renewcfg/gone".into()),
    ] {
        assert!(changes.contains(&want), "{want:?} not in {changes:?}");
    }
    assert!(!changes.iter().any(|e| matches!(e, CacheEvent::Stopped(_))), "{changes:?}");
    assert!(!changes.contains(&CacheEvent::Changed("/renewcfg/same".into())), "{changes:?}");
    other.set("/renewcfg/same", "t", None).await.expect("set");
    eventually(SECS(10), "the resumed cache follows", || async {
        cache.get("/renewcfg/same").is_some_and(|n| n.data == "t").then_some(())
    })
    .await;

    // The old guard answers from its own session, which is gone.
    let lost = tokio::time::timeout(SECS(5), guard.lost()).await.expect("lost resolves");
    assert_eq!(lost, SessionState::Expired);
    assert!(!guard.verify().await.expect("verify"), "an expired guard is not held");
    let write = Op::Set { path: "/eph".into(), data: "late".into(), version: None };
    let fenced = guard.fenced("renew-resource", &[write]).await;
    assert!(
        matches!(fenced, Err(Error::SessionExpired)),
        "an old guard's write never rides the new session: {fenced:?}"
    );

    // The client works under its new session, and the same task can take
    // the lock again (the old guard's node is gone, nothing to wait for).
    let (_, stat) = client.create("/eph", "", CreateOptions::ephemeral()).await.expect("create again");
    assert_eq!(stat.ephemeral_owner, new);
    let again = tokio::time::timeout(SECS(10), client.lock("renew")).await.expect("locks again").expect("lock");
    assert!(again.fencing_token() > guard.fencing_token());

    // The selector campaigned again under the new session, higher token.
    eventually(SECS(15), "a second term", || async { (terms.lock().expect("terms").len() >= 2).then_some(()) }).await;
    let t = terms.lock().expect("terms").clone();
    assert_eq!((t[0].0, t[1].0), (old, new), "{t:?}");
    assert!(t[1].1 > t[0].1, "{t:?}");
    let leader = other.leader("renew-sel").await.expect("leader").expect("a leader");
    let owner = other.exists(&leader.path).await.expect("exists").expect("node").ephemeral_owner;
    assert_eq!(owner, new);
    // The observer went on under the new session and saw the new term.
    let seen = tokio::time::timeout(SECS(15), async {
        loop {
            match observer.next().await {
                Some(Some(l)) if l.path == leader.path => return Ok(l),
                Some(_) => {}
                None => return Err("the observer's stream ended"),
            }
        }
    })
    .await;
    let seen = seen.expect("the observer yields the new leader within 15 s").expect("observer");
    assert!(seen.fencing_token > first.fencing_token, "{seen:?} after {first:?}");
    selector.close().await;
    again.release().await.expect("release");
    client.close().await.expect("close");
}
