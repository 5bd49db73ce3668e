//! The kit against real `batond` processes (built by `cargo build
//! --workspace --bins`): a direct cluster survives its leader's kill -9
//! and a clean stop, and a proxied one elects a new leader when its
//! leader's peer links are cut.

use std::time::Duration;

use baton_kit::{locate, Bin, Cluster, ClusterSpec, Links};

const LEADER: Duration = Duration::from_secs(20);

fn spec(dir: &tempfile::TempDir, links: Links) -> ClusterSpec {
    ClusterSpec { links, http: true, ..ClusterSpec::new(3, dir.path(), locate(Bin::Batond).expect("batond built")) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_direct_cluster_kill_stop_pause_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Cluster::start(spec(&dir, Links::Direct), LEADER).await.expect("cluster");
    let leader = c.wait_leader(LEADER).await.expect("leader");
    c.kill(leader);
    assert!(!c.is_running(leader));
    let next = c.wait_leader(LEADER).await.expect("new leader");
    assert_ne!(next, leader);
    c.start_member(leader).expect("restart");
    let other = (1..=3).find(|id| *id != next && *id != leader).expect("a third member");
    c.pause(other);
    assert!(c.is_running(other) && !c.is_up(other));
    c.resume(other);
    assert!(c.is_up(other));
    c.stop(other);
    assert!(!c.is_running(other));
    assert!(!c.log(other).is_empty(), "member {other} logged nothing");
    assert_eq!(c.wait_leader(LEADER).await.expect("leader"), next);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_proxied_cluster_isolating_the_leader_elects_another() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Cluster::start(spec(&dir, Links::Proxied { slots: 3 }), LEADER).await.expect("cluster");
    // 6 peer links, and per home member a link to every member for its
    // one slot and for storage.
    assert_eq!(c.proxies.links.len(), 6 + 9 + 9);
    let leader = c.wait_leader(LEADER).await.expect("leader");
    c.proxies.isolate_peers(leader);
    let others: Vec<String> =
        (1..=3).filter(|id| *id != leader).map(|id| c.endpoints()[id as usize - 1].clone()).collect();
    let next = baton_kit::wait_leader(&others, 3, LEADER, None).await.expect("leader among the others");
    assert_ne!(next, leader);
    c.proxies.heal();
}
