//! A follower whose messages no longer reach the leader (a one-way
//! partition) must not keep vouching for its clients' sessions. Before
//! keepalives were acknowledged through the leader, the client stayed
//! `Connected` while the leader expired its session under it.
//!
//! Either outcome is allowed, and each is checked for its own facts:
//! - expired: when the leader's side no longer has the session's ephemeral
//!   node, the client is not `Connected` (it learned the session is in
//!   doubt first), and after the heal it reaches `Expired`;
//! - survived: until the deadline the leader's side still shows the node,
//!   owned by this session, and after the heal the client is `Connected`
//!   with the same session and the node still there.
//!
//! The test fails if the observer could establish neither.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{Client, ClientConfig, CreateOptions, SessionState};
use baton_tests::{eventually, Cluster};

/// The session timeout the client asks for.
const SESSION: Duration = Duration::from_secs(2);
/// How long the cut lasts at most: four session timeouts.
const CUT_FOR: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_one_way_partition_never_leaves_a_client_connected_to_a_dead_session() {
    let c = Cluster::start_proxied(3, 3, &[]).await;
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let follower = if leader == 1 { 2 } else { 1 };
    // Slot `follower - 1` lives next to `follower`; its first endpoint is
    // its link to `follower` itself, which no grudge between members cuts.
    let slot =
        c.proxies().addr(baton_tests::LinkId::Client { slot: (follower - 1) as usize, home: follower, to: follower });
    let ep = slot.expect("slot link").to_string();
    let client = Client::connect_with(ClientConfig::new(vec![ep]).session_timeout(SESSION)).await.expect("connect");
    let sid = client.session_id();
    client.create("/mine", "", CreateOptions::ephemeral()).await.expect("create");
    // The observer talks to the leader directly (not through a proxy).
    let observer = Client::connect_with(ClientConfig::new(vec![c.endpoint(leader)])).await.expect("observer");
    let seen = Arc::new(Mutex::new(Vec::new()));
    {
        let (mut st, seen) = (client.state(), seen.clone());
        tokio::spawn(async move {
            while st.changed().await.is_ok() {
                let s = *st.borrow_and_update();
                seen.lock().unwrap().push(s);
            }
        });
    }

    // The follower hears the leader, but cannot send to it.
    c.proxies().apply(|a, b| a == follower && b == leader);
    let cut = Instant::now();
    let mut gone = None;
    let mut last_owner = None;
    while cut.elapsed() < CUT_FOR {
        match observer.exists("/mine").await {
            Ok(None) => {
                gone = Some((cut.elapsed(), *client.state().borrow()));
                break;
            }
            Ok(Some(stat)) => last_owner = Some((cut.elapsed(), stat.ephemeral_owner)),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.proxies().heal();
    let states = seen.lock().unwrap().clone();

    match (gone, last_owner) {
        (Some((after, state_then)), _) => {
            eprintln!("outcome: expired {after:?} after the cut; client was {state_then:?}; states {states:?}");
            assert_ne!(
                state_then,
                SessionState::Connected,
                "session expired {after:?} after the cut while its client was Connected: {states:?}"
            );
            assert!(
                states.contains(&SessionState::Suspended) || states.contains(&SessionState::Expired),
                "expired without the client leaving Connected: {states:?}"
            );
            reaches(&client, SessionState::Expired).await;
        }
        (None, Some((at, owner))) => {
            eprintln!("outcome: survived (last seen {at:?} after the cut); states {states:?}");
            assert_eq!(owner, sid, "/mine owned by another session");
            assert!(
                at + SESSION >= CUT_FOR,
                "the observer last saw /mine {at:?} after the cut: survival not established to the end"
            );
            reaches(&client, SessionState::Connected).await;
            assert_eq!(client.session_id(), sid);
            let stat = observer.exists("/mine").await.expect("exists").expect("/mine after the heal");
            assert_eq!(stat.ephemeral_owner, sid);
        }
        (None, None) => panic!("the observer could not read /mine during the cut: {states:?}\n{}", c.log_tails(10)),
    }
}

/// Waits (after the heal, up to 15 s) until `client`'s session is `want`.
async fn reaches(client: &Client, want: SessionState) {
    let st = client.state();
    eventually(Duration::from_secs(15), &format!("the client's session is {want:?}"), || {
        let s = *st.borrow();
        async move { (s == want).then_some(()) }
    })
    .await;
}
