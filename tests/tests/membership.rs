//! Membership changes through the CLI, against real processes: replacing a
//! dead machine while locks and writes go on (docs/operations.md, "Replace
//! a member"), and the refusals that keep an old identity out.

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_client::{Client, CreateOptions, Error};
use baton_tests::{baton_bin, eventually, Cluster};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// Runs `baton ARGS` against the cluster (through `endpoint` only: the CLI
/// discovers the other members).
fn baton(endpoint: &str, args: &[&str]) -> Output {
    Command::new(baton_bin()).arg(format!("--endpoints={endpoint}")).args(args).output().expect("run baton")
}

fn ok(out: Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "baton failed: {}{text}", String::from_utf8_lossy(&out.stderr));
    text
}

/// `baton member list --json`: (id, role, lag) per member.
fn members(endpoint: &str) -> Vec<(u64, String, Option<u64>)> {
    let out = baton(endpoint, &["--json", "member", "list"]);
    if !out.status.success() {
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| (v["id"].as_u64().unwrap_or(0), v["role"].as_str().unwrap_or("").to_string(), v["lag"].as_u64()))
        .collect()
}

fn voters(endpoint: &str) -> BTreeSet<u64> {
    members(endpoint).into_iter().filter(|m| m.1 == "voter").map(|m| m.0).collect()
}

/// Writes `/acked/w-N` one after another and keeps the names acknowledged.
async fn writer(c: Client, stop: Arc<AtomicBool>, acked: Arc<Mutex<Vec<String>>>) {
    let _ = c.create("/acked", Vec::new(), CreateOptions::persistent()).await;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let path = format!("/acked/w-{n}");
        match c.create(&path, Vec::new(), CreateOptions::persistent()).await {
            Ok(_) => acked.lock().unwrap().push(path),
            Err(Error::SessionExpired) | Err(Error::Closed) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Takes and releases lock `jobs`; counts grants and checks that fencing
/// tokens only grow.
async fn locker(c: Client, stop: Arc<AtomicBool>, grants: Arc<AtomicU64>, last: Arc<Mutex<u64>>) {
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(SECS(5), c.lock("jobs")).await {
            Ok(Ok(g)) => {
                {
                    let mut l = last.lock().unwrap();
                    assert!(g.fencing_token() > *l, "token {} after {}", g.fencing_token(), *l);
                    *l = g.fencing_token();
                }
                grants.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = g.release().await;
            }
            Ok(Err(Error::SessionExpired)) | Ok(Err(Error::Closed)) => return,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m10_replace_a_dead_member_while_locks_and_writes_go_on() {
    let mut c = Cluster::start(3, &[]).await;
    let ep = c.endpoint(2);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let grants = Arc::new(AtomicU64::new(0));
    let last = Arc::new(Mutex::new(0));
    let mut tasks = Vec::new();
    // Clients reach members 1 and 2 only (3 dies, 1 dies later: they move).
    let cfg = || c.config().session_timeout(SECS(10));
    tasks.push(tokio::spawn(writer(c.client_with(cfg()).await, stop.clone(), acked.clone())));
    for _ in 0..2 {
        tasks.push(tokio::spawn(locker(c.client_with(cfg()).await, stop.clone(), grants.clone(), last.clone())));
    }
    let grants_now = || grants.load(Ordering::Relaxed);
    eventually(SECS(10), "first grants", || async { (grants_now() > 3).then_some(()) }).await;

    // 1. The machine of member 3 dies for good.
    c.kill(3);
    std::fs::remove_dir_all(c.data_dir(3)).expect("wipe member 3");
    // 2. member remove.
    ok(baton(&ep, &["member", "remove", "3"]));
    assert_eq!(voters(&ep), [1, 2].into());
    // 3. A fresh machine with a new id: member add, then batond --join.
    let id = c.new_member();
    assert_eq!(id, 4);
    let (peer, client) = (c.peer_addr(4), c.endpoint(4));
    ok(baton(&ep, &["member", "add", "4", "--peer-addr", &peer, "--client-addr", &client]));
    let m = members(&ep);
    assert!(m.contains(&(4, "learner".into(), m.iter().find(|x| x.0 == 4).and_then(|x| x.2))), "{m:?}");
    c.start_member(4);
    // 4. It catches up (snapshot + log) and the leader promotes it.
    eventually(SECS(30), "member 4 promoted and caught up", || async {
        members(&ep)
            .iter()
            .any(|(i, role, lag)| *i == 4 && role == "voter" && lag.is_some_and(|l| l < 100))
            .then_some(())
    })
    .await;
    let before = grants_now();
    eventually(SECS(10), "grants after the replacement", || async { (grants_now() > before + 3).then_some(()) }).await;
    // 5. It votes: with member 1 down, {2, 4} is the quorum of {1, 2, 4}.
    c.kill(1);
    let n = acked.lock().unwrap().len();
    eventually(SECS(20), "writes commit with member 1 down", || async {
        (acked.lock().unwrap().len() > n + 5).then_some(())
    })
    .await;
    let out = baton(&ep, &["status"]);
    assert!(!out.status.success(), "status exits non-zero with member 1 down");
    assert!(String::from_utf8_lossy(&out.stdout).contains("unreachable"));
    ok(baton(&ep, &["status", "--partial"]));
    c.start_member(1);

    // 6. The old member 3 comes back with a new data dir: refused by all
    //    as removed, and it stops (exit 2).
    c.start_member(3);
    assert_eq!(c.wait_exit(3, SECS(20)).await, Some(2), "{}", c.log(3));
    assert!(c.log(3).contains("member 3 was removed"), "{}", c.log(3));
    assert_eq!(voters(&ep), [1, 2, 4].into());

    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(SECS(20), t).await;
    }
    // 7. No acknowledged write is lost.
    let reader = c.client().await;
    let have: BTreeSet<String> =
        reader.children("/acked").await.expect("children").into_iter().map(|n| format!("/acked/{n}")).collect();
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 20, "only {} writes acknowledged", acked.len());
    for a in &acked {
        assert!(have.contains(a), "acknowledged {a} is missing");
    }
    eprintln!("{} writes acknowledged, {} lock grants", acked.len(), grants_now());
    // Every member agrees and is healthy.
    eventually(SECS(20), "all members healthy", || async { baton(&ep, &["health"]).status.success().then_some(()) })
        .await;
    ok(baton(&ep, &["status"]));

    // 8. A voter whose data dir is wiped must not come back with its id,
    //    not even with --join: its peers know it joined.
    c.kill(4);
    std::fs::remove_dir_all(c.data_dir(4)).expect("wipe member 4");
    c.start_member(4);
    assert_eq!(c.wait_exit(4, SECS(20)).await, Some(2), "{}", c.log(4));
    assert!(c.log(4).contains("remove it and add it back"), "{}", c.log(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m20_member_changes_are_checked_and_the_leader_hands_over_first() {
    let c = Cluster::start(3, &[]).await;
    let ep = c.endpoint(1);
    let leader = c.wait_leader(SECS(10)).await;
    // Bad requests change nothing and say why.
    let out = baton(&ep, &["member", "add", "2", "--peer-addr", "127.0.0.1:1", "--client-addr", "127.0.0.1:2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already in the configuration"));
    let out = baton(&ep, &["member", "add", "9", "--peer-addr", "no port", "--client-addr", "127.0.0.1:2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--peer-addr"));
    let out = baton(&ep, &["member", "promote", "2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("voter already"));
    // A learner that never starts is never promoted, and promote says so.
    ok(baton(&ep, &["member", "add", "7", "--learner", "--peer-addr", "127.0.0.1:9", "--client-addr", "127.0.0.1:9"]));
    let out = baton(&ep, &["member", "promote", "7"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("behind the leader"), "{out:?}");
    ok(baton(&ep, &["member", "remove", "7"]));
    // Ids are never reused.
    let out = baton(&ep, &["member", "add", "7", "--peer-addr", "127.0.0.1:9", "--client-addr", "127.0.0.1:9"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("never reused"));
    // move-leader hands leadership over and waits until it has moved.
    let target = if leader == 3 { 2 } else { 3 };
    ok(baton(&ep, &["member", "move-leader", &target.to_string()]));
    assert_eq!(c.wait_leader(SECS(10)).await, target);
    let out = baton(&ep, &["member", "move-leader", "7"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a voter"), "{out:?}");
    let leader = target;
    // Removing the leader: leadership moves first, then it goes.
    let other = c.endpoint(if leader == 1 { 2 } else { 1 });
    // Watch its /health and /ready from before the removal: between
    // applying it and exiting, both must say "removed" (finding Z1).
    let http = c.kit.member(leader).spec.http_addr.expect("http addr").to_string();
    let watcher = tokio::spawn(async move {
        let (mut health, mut ready) = (false, false);
        for _ in 0..600 {
            for (path, seen) in [("/health", &mut health), ("/ready", &mut ready)] {
                if let Some((503, body)) = baton_tests::http_get(&http, path).await {
                    *seen |= body.contains("\"removed\":true") && body.contains("\"reason\":\"removed");
                }
            }
            if health && ready {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        (health, ready)
    });
    ok(baton(&other, &["member", "remove", &leader.to_string()]));
    let rest: BTreeSet<u64> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();
    assert_eq!(voters(&other), rest);
    let st = c.status(*rest.iter().next().unwrap()).await.expect("status");
    assert!(rest.contains(&st.leader_id), "leader {} after removing {leader}", st.leader_id);
    let w = Client::connect(c.endpoints_from(*rest.iter().next().unwrap())).await.expect("client");
    w.create("/after", Vec::new(), CreateOptions::persistent()).await.expect("writes go on with two voters");
    // The removed member stops serving: it exits 2 with the reason, as a
    // wiped one does, and does so again if restarted (finding Z1: it
    // served its clients leaderless forever).
    let mut c = c;
    assert_eq!(c.wait_exit(leader, SECS(20)).await, Some(2), "the removed member did not exit 2");
    assert!(c.log(leader).contains("removed from the cluster"), "{}", c.log(leader));
    assert_eq!(watcher.await.expect("watcher"), (true, true), "/health and /ready did not say removed");
    c.start_member(leader);
    assert_eq!(c.wait_exit(leader, SECS(20)).await, Some(2), "a removed member restarted and served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m30_replace_swaps_a_voter_for_a_learner_in_one_joint_change() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.wait_leader(SECS(10)).await;
    let ep = c.endpoint(leader);
    let id = c.new_member();
    let (peer, client) = (c.peer_addr(id), c.endpoint(id));
    ok(baton(&ep, &["member", "add", &id.to_string(), "--learner", "--peer-addr", &peer, "--client-addr", &client]));
    c.start_member(id);
    // Member 4 stays a learner (--learner) until the replace.
    let victim = if leader == 3 { 2 } else { 3 };
    eventually(SECS(20), "the learner caught up and replaced a voter", || async {
        baton(&ep, &["member", "replace", &victim.to_string(), &id.to_string()]).status.success().then_some(())
    })
    .await;
    let expect: BTreeSet<u64> = [1, 2, 3, id].into_iter().filter(|&i| i != victim).collect();
    assert_eq!(voters(&ep), expect);
    // The joint configuration was entered and left on its own.
    let log = c.log(leader);
    assert!(log.contains("joint=true"), "no joint configuration:\n{log}");
    eventually(SECS(10), "joint configuration left", || async {
        c.status(leader).await.is_some_and(|s| s.voters.len() == 3).then_some(())
    })
    .await;
    // The new voter counts: with the replaced member gone and one more
    // original down, the leader and the new voter are a quorum.
    c.kill(victim);
    let w = c.client().await;
    w.create("/replaced", Vec::new(), CreateOptions::persistent()).await.expect("writes with the new voter");
    let other = [1, 2, 3].into_iter().find(|&i| i != victim && i != leader).expect("a third member");
    c.kill(other);
    let r = tokio::time::timeout(SECS(10), w.create("/with-4", Vec::new(), CreateOptions::persistent())).await;
    assert!(matches!(r, Ok(Ok(_))), "the leader and member {id} are a quorum of the new voters: {r:?}");
}
