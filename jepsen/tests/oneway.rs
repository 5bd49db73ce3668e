//! A follower whose messages no longer reach the leader (a one-way
//! partition) must not keep vouching for its clients' sessions: either the
//! client learns its session is in doubt, or the session survives. Before
//! keepalives were acknowledged through the leader, the client stayed
//! `Connected` while the leader expired its session under it.

use std::time::{Duration, Instant};

use baton_client::{Client, ClientConfig, CreateOptions, SessionState};
use baton_jepsen::db::{locate_bin, Db, DbOpts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_one_way_partition_never_leaves_a_client_connected_to_a_dead_session() {
    let dir = tempfile::Builder::new().prefix("baton-oneway-").tempdir().expect("tempdir");
    let db = Db::start(DbOpts {
        nodes: 3,
        slots: 3,
        bin: locate_bin(false).expect("batond built"),
        dir: dir.path().to_path_buf(),
        server_faults: vec![],
        direct: false,
        session_ms: None,
        tls: false,
    })
    .await
    .expect("cluster");
    let leader = db.wait_leader(Duration::from_secs(20)).await.expect("leader");
    let follower = if leader == 1 { 2 } else { 1 };
    // Slot `follower - 1` lives next to `follower`; only let it reach it.
    let eps = db.slot_endpoints((follower - 1) as usize);
    let c = Client::connect_with(ClientConfig::new(vec![eps[0].clone()]).session_timeout(Duration::from_secs(2)))
        .await
        .expect("connect");
    c.create("/mine", "", CreateOptions::ephemeral()).await.expect("create");
    // The observer talks to the leader directly (not through the cut link).
    let direct = db.direct_endpoints()[(leader - 1) as usize].clone();
    let observer = Client::connect_with(ClientConfig::new(vec![direct])).await.expect("observer");
    // Record every state the client goes through.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let (mut st, seen) = (c.state(), seen.clone());
        tokio::spawn(async move {
            while st.changed().await.is_ok() {
                let s = *st.borrow_and_update();
                seen.lock().unwrap().push(s);
            }
        });
    }
    // The follower can hear the leader, but cannot send to it.
    db.proxies.apply(|a, b| a == follower && b == leader);
    let cut = Instant::now();
    let deadline = cut + Duration::from_secs(8);
    let mut gone_after = None;
    while Instant::now() < deadline {
        if let Ok(stat) = observer.exists("/mine").await {
            if stat.is_none() {
                gone_after = Some(cut.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let states = seen.lock().unwrap().clone();
    if let Some(after) = gone_after {
        assert!(
            states.iter().any(|s| *s != SessionState::Connected),
            "session expired {after:?} after the cut while its client never left Connected: {states:?}"
        );
    }
    db.proxies.heal();
}
