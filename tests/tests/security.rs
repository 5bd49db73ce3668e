//! Who may talk to a member (docs/security.md): the peer hello rule
//! (server/src/cluster.rs), TLS on both ports, a wiped member. Real
//! `batond` processes on loopback; strangers are raw sockets in this test.

use std::time::Duration;

use baton_client::MemberStatus;
use baton_client::{Client, ClientConfig, ClientTls, Error};
use baton_proto::{peer_frame, PeerFrame, PeerHello, SessionTouch};
use baton_server::certs::Authority;
use baton_tests::{eventually, Cluster};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::Framed;

fn hello(from: u64, to: u64, cluster_id: &str) -> PeerFrame {
    let h = PeerHello { from, to, cluster_version: 1, cluster_id: cluster_id.into(), ..Default::default() };
    PeerFrame { frame: Some(peer_frame::Frame::Hello(h)) }
}

/// The forged heartbeat of the review: raft-rs's `commit_to` is fatal when
/// the commit index is past the log.
fn deadly_heartbeat(from: u64, to: u64, term: u64) -> PeerFrame {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgHeartbeat);
    m.from = from;
    m.to = to;
    m.term = term;
    m.commit = 1 << 40;
    let b = m.write_to_bytes().expect("encode");
    PeerFrame { frame: Some(peer_frame::Frame::Raft(b.into())) }
}

/// A forged proposal: an entry that would expire sessions 1..=100 if it
/// reached raft-rs (a follower forwards proposals to its leader).
fn forged_propose(from: u64, to: u64) -> PeerFrame {
    let cmd = baton_proto::Command {
        origin: from,
        body: Some(baton_proto::command::Body::Expire(baton_proto::ExpireSessions {
            session_ids: (1..=100).collect(),
        })),
        ..Default::default()
    };
    let e = raft::prelude::Entry { data: cmd.encode_to_vec().into(), ..Default::default() };
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgPropose);
    m.from = from;
    m.to = to;
    m.set_entries(vec![e].into());
    let b = m.write_to_bytes().expect("encode");
    PeerFrame { frame: Some(peer_frame::Frame::Raft(b.into())) }
}

fn touch(ids: Vec<u64>) -> PeerFrame {
    PeerFrame { frame: Some(peer_frame::Frame::Touch(SessionTouch { session_ids: ids, batch: 1 })) }
}

/// Sends `frames` on `stream` and returns the acceptor's refusal, if it
/// sent one before closing (None: closed or silent for 2 s).
async fn speak<S: AsyncRead + AsyncWrite + Unpin>(stream: S, frames: Vec<PeerFrame>) -> Option<String> {
    let mut f = Framed::new(stream, baton_proto::codec(1 << 20));
    for fr in frames {
        if f.send(Bytes::from(fr.encode_to_vec())).await.is_err() {
            break;
        }
    }
    let frame = tokio::time::timeout(Duration::from_secs(2), f.next()).await.ok()??.ok()?;
    match PeerFrame::decode(frame).ok()?.frame? {
        peer_frame::Frame::Refused(r) => Some(r.reason),
        _ => None,
    }
}

async fn plain(addr: &str) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(addr).await.expect("connect to the peer port")
}

/// Waits until every member has the cluster id and all have joined.
async fn joined(c: &Cluster) -> MemberStatus {
    eventually(Duration::from_secs(15), "every member joined the cluster", || async {
        let mut first: Option<MemberStatus> = None;
        for id in 1..=3 {
            let s = c.status(id).await?;
            if s.cluster_id.is_empty() || s.joined != vec![1, 2, 3] {
                return None;
            }
            if first.as_ref().is_some_and(|f| f.cluster_id != s.cluster_id) {
                panic!("members disagree on the cluster id");
            }
            first.get_or_insert(s);
        }
        first
    })
    .await
}

/// A running cluster whose members all joined: its leader and term, the
/// cluster id, a follower to attack (`victim`) and the third member.
struct Scene {
    leader: u64,
    term: u64,
    cluster_id: String,
    victim: u64,
    other: u64,
}

async fn scene(c: &Cluster) -> Scene {
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let cluster_id = joined(c).await.cluster_id;
    let term = c.status(leader).await.expect("status").term;
    let victim = if leader == 1 { 2 } else { 1 };
    let other = 6 - leader - victim;
    Scene { leader, term, cluster_id, victim, other }
}

/// Nothing moved: every member runs, the same leader in the same term, and
/// a write through a client commits.
async fn unharmed(c: &mut Cluster, leader: u64, term: u64) {
    for id in 1..=3 {
        assert_eq!(c.exit_code(id), None, "member {id} exited\n{}", c.log_tails(20));
    }
    let s = c.status(leader).await.expect("leader answers");
    assert_eq!((s.role.as_str(), s.term), ("leader", term), "the leader or term changed\n{}", c.log_tails(20));
    let client = c.client().await;
    client.create("/still-serving", Bytes::from_static(b"ok"), Default::default()).await.expect("write");
    client.close().await.expect("close");
}

#[tokio::test]
async fn s10_strangers_on_the_peer_port_are_refused_and_change_nothing() {
    let mut c = Cluster::start(3, &[]).await;
    let Scene { leader, term, cluster_id: id, victim, other } = scene(&c).await;
    // A session the forged proposal would expire (its id, a log index, is
    // well under 100).
    let keeper = c.client().await;
    assert!(keeper.session_id() <= 100);
    let addr = c.peer_addr(victim);
    let attacks = [
        ("another cluster", hello(other, victim, "0123456789abcdef0123456789abcdef"), "belongs to cluster"),
        ("a non-member id", hello(9, victim, &id), "is not another member"),
        ("the wrong member", hello(other, other, &id), "but reached member"),
        ("itself", hello(victim, victim, &id), "is not another member"),
    ];
    for (what, h, expect) in attacks {
        let frames =
            vec![h, deadly_heartbeat(other, victim, term), forged_propose(other, victim), touch(vec![1, 2, 3])];
        let why = speak(plain(&addr).await, frames).await;
        assert!(why.as_deref().is_some_and(|w| w.contains(expect)), "{what}: refusal {why:?}, expected {expect:?}");
    }
    // Not a hello first; a frame over the hello limit; garbage.
    assert_eq!(speak(plain(&addr).await, vec![deadly_heartbeat(other, victim, term)]).await, None);
    let big = PeerFrame { frame: Some(peer_frame::Frame::Raft(vec![0u8; 1 << 17].into())) };
    assert_eq!(speak(plain(&addr).await, vec![big]).await, None);
    {
        use tokio::io::AsyncWriteExt;
        let mut s = plain(&addr).await;
        let _ = s.write_all(&[0xff; 4096]).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(c.log(victim).contains("refusing a peer"), "the refusals are logged");
    keeper.create("/keeper", "alive", Default::default()).await.expect("the session was not expired");
    unharmed(&mut c, leader, term).await;
}

#[tokio::test]
async fn s20_with_tls_only_members_and_clients_with_certificates_get_in() {
    let mut c = Cluster::start_tls(3, &[]).await;
    let Scene { leader, term, cluster_id, victim, other } = scene(&c).await;
    let addr = c.peer_addr(victim);
    let tls = c.tls.as_ref().expect("tls");

    // A plaintext stranger never gets past the handshake.
    let frames =
        vec![hello(other, victim, &cluster_id), deadly_heartbeat(other, victim, term), forged_propose(other, victim)];
    assert_eq!(speak(plain(&addr).await, frames).await, None);

    // A certificate from the cluster's own CA that names a client, not the
    // member the hello claims to be: refused after the handshake.
    let client_cert = tls.ca.client("mallory").expect("cert");
    let cfg = baton_proto::tls::client_config(&tls.ca.ca, Some((&client_cert.cert, &client_cert.key))).expect("cfg");
    let name = rustls_pki_types::ServerName::try_from(baton_proto::tls::member_name(victim)).expect("name");
    let stream = baton_proto::tls::connect(cfg, name.clone(), plain(&addr).await).await.expect("handshake");
    let frames = vec![hello(other, victim, &cluster_id), deadly_heartbeat(other, victim, term)];
    let why = speak(stream, frames).await;
    assert!(why.as_deref().is_some_and(|w| w.contains("does not name member-")), "refusal: {why:?}");

    // A member certificate from another CA: the handshake fails.
    let rogue = Authority::create(&c.dir.path().join("rogue"), "rogue CA").expect("rogue CA");
    let forged = rogue.member(other).expect("cert");
    let cfg = baton_proto::tls::client_config(&tls.ca.ca, Some((&forged.cert, &forged.key))).expect("cfg");
    if let Ok(stream) = baton_proto::tls::connect(cfg, name, plain(&addr).await).await {
        let frames = vec![hello(other, victim, &cluster_id), deadly_heartbeat(other, victim, term)];
        assert_eq!(speak(stream, frames).await, None, "a rogue certificate got an answer");
    }

    // Clients: the cluster's certificate works; none, plaintext, or
    // another CA's get a typed NoAuth at once.
    let ok = c.client().await;
    ok.create("/tls", Bytes::from_static(b"yes"), Default::default()).await.expect("write over TLS");
    let (data, _) = ok.get("/tls").await.expect("read over TLS");
    assert_eq!(&data[..], b"yes");
    let no_cert = ClientTls::load(&tls.ca.ca, None).expect("tls");
    let rogue_client = rogue.client("admin").expect("cert");
    let rogue_tls = ClientTls::load(&tls.ca.ca, Some((&rogue_client.cert, &rogue_client.key))).expect("tls");
    let wrong_ca = ClientTls::load(&rogue.ca, Some((&rogue_client.cert, &rogue_client.key))).expect("tls");
    let refused = [
        ("plaintext", ClientConfig::new(c.endpoints())),
        ("no certificate", ClientConfig::new(c.endpoints()).tls(no_cert)),
        ("another CA's certificate", ClientConfig::new(c.endpoints()).tls(rogue_tls)),
        ("a server it does not trust", ClientConfig::new(c.endpoints()).tls(wrong_ca)),
    ];
    for (what, cfg) in refused {
        let started = std::time::Instant::now();
        match Client::connect_with(cfg.op_timeout(Duration::from_secs(10))).await {
            Err(Error::NoAuth(msg)) => assert!(started.elapsed() < Duration::from_secs(5), "{what}: slow ({msg})"),
            Err(e) => panic!("{what}: expected NoAuth, got {e}"),
            Ok(_) => panic!("{what}: connected"),
        }
    }
    ok.close().await.expect("close");
    unharmed(&mut c, leader, term).await;
}

/// Finding A6: a founding member wiped before any leader recorded it as
/// joined (no cluster id exists yet: elections take a minute here) is
/// refused by the peers that admitted it, and stops when one dials it.
/// Before incarnations (cluster.rs, rule 6) it came back as a member
/// starting for the first time and could vote again in a term it had
/// voted in.
#[tokio::test]
async fn s31_a_founding_member_wiped_before_any_leader_is_refused() {
    let slow = [
        "--tick-ms=100",
        "--election-ticks=600",
        "--heartbeat-ticks=10",
        "--min-session-ms=130000",
        "--max-session-ms=200000",
    ];
    let mut c = Cluster::launch(3, &slow).await;
    let victim = 1;
    let admitted = |id: u64| c.log(id).lines().any(|l| l.contains("peer admitted") && l.contains("peer=1"));
    eventually(Duration::from_secs(15), "members 2 and 3 admitted member 1", || {
        let done = admitted(2) && admitted(3);
        async move { done.then_some(()) }
    })
    .await;
    c.kill(victim);
    std::fs::remove_dir_all(c.data_dir(victim)).expect("wipe");
    c.start_member(victim);
    let code = c.wait_exit(victim, Duration::from_secs(15)).await;
    assert_eq!(code, Some(2), "the wiped member did not stop\n{}", c.log_tails(30));
    let log = c.log(victim);
    assert!(log.contains("wiped or replaced") && log.contains("add it back"), "it says what to do:\n{log}");
    let others: String = [2, 3].iter().map(|&i| c.log(i)).collect();
    assert!(others.contains("member 1 came back with another data dir"), "the others log why they refuse it");
    assert!(!others.contains("cluster record"), "no leader recorded anything: the window A6 is about");
}

#[tokio::test]
async fn s30_a_wiped_member_is_refused_and_says_how_to_come_back() {
    let mut c = Cluster::start(3, &[]).await;
    let Scene { leader, term, cluster_id, victim, .. } = scene(&c).await;
    c.kill(victim);
    std::fs::remove_dir_all(c.data_dir(victim)).expect("wipe");
    c.start_member(victim);
    let code = eventually(Duration::from_secs(15), "the wiped member stops", || {
        let code = c.exit_code(victim);
        async move { code }
    })
    .await;
    assert_eq!(code, 2, "exit code\n{}", c.log_tails(20));
    let log = c.log(victim);
    assert!(log.contains("remove it and add it back"), "the wiped member says what to do:\n{log}");
    assert!(log.contains(&cluster_id), "and names the cluster");
    let others: String = (1..=3).filter(|&i| i != victim).map(|i| c.log(i)).collect();
    assert!(others.contains(&format!("member {victim} joined cluster")), "the others log why they refuse it");
    // It never voted: same leader, same term; the cluster serves.
    let s = c.status(leader).await.expect("status");
    assert_eq!((s.role.as_str(), s.term), ("leader", term));
    let client = c.client().await;
    client.create("/after-wipe", Bytes::new(), Default::default()).await.expect("write");
    client.close().await.expect("close");
}
