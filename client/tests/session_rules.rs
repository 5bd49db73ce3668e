//! The client's session rules against a scripted fake member (a TCP
//! listener in this test that speaks just enough of the protocol), so the
//! exact bytes the client sends can be counted and the answers chosen.
//!
//! - Finding S5: a write holds its slot until the session actor is done
//!   with it, even when the caller stopped waiting: the server never sees
//!   more than `MAX_WRITES_IN_FLIGHT` unanswered writes of one session.
//! - Finding R7: `last_zxid` starts at the index that created the session.
//! - Finding S1: only keepalives answered OK make the client `Connected`;
//!   a member that answers everything else (stale reads, status) but not
//!   keepalives leaves it `Suspended`.
//! - The actor reads its own socket (no reader task): it keeps reading
//!   while a write of its own waits, or a member that writes before it
//!   reads again would wait on it as it waits on the member.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_client::{Client, ClientConfig, SessionState, MAX_WRITES_IN_FLIGHT};
use baton_proto::{
    request, response, ClientFrame, CreateSessionResp, Empty, ErrorCode, Response, ServerFrame, SetResp, Stat,
};
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::net::TcpListener;

/// What the fake member does with keepalives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keepalives {
    Ok,
    NoLeader,
}

#[derive(Default)]
struct Seen {
    write_seqs: BTreeSet<u64>,
    closes: u32,
}

/// Serves one client connection: creates the session (index 42), answers
/// keepalives as told, reads and status at once, never answers a write, and
/// answers a close_session LEADER_CHANGED the first time and SESSION_EXPIRED
/// after (what a real member says to a resent close: it keeps no reply).
async fn fake_member(keepalives: Keepalives) -> (String, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().expect("bound").to_string();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let mut f = tokio_util::codec::Framed::new(sock, baton_proto::codec(1 << 24));
                while let Some(Ok(frame)) = f.next().await {
                    let Ok(ClientFrame { request: Some(req) }) = ClientFrame::decode(frame) else { return };
                    use request::Body as B;
                    let ok = |body| Response { id: req.id, zxid: 42, body: Some(body), ..Default::default() };
                    let resp = match &req.body {
                        Some(B::CreateSession(c)) => ok(response::Body::CreateSession(CreateSessionResp {
                            session_id: 42,
                            secret: bytes::Bytes::from_static(b"secret"),
                            timeout_ms: c.timeout_ms,
                        })),
                        Some(B::Keepalive(_)) if keepalives == Keepalives::Ok => ok(response::Body::Empty(Empty {})),
                        Some(B::Keepalive(_)) => Response {
                            id: req.id,
                            error: ErrorCode::NoLeader as i32,
                            message: "cut off".into(),
                            ..Default::default()
                        },
                        Some(B::CloseSession(_)) => {
                            let first = {
                                let mut seen = s.lock().unwrap();
                                seen.closes += 1;
                                seen.closes == 1
                            };
                            let code = if first { ErrorCode::LeaderChanged } else { ErrorCode::SessionExpired };
                            Response { id: req.id, error: code as i32, ..Default::default() }
                        }
                        Some(B::Create(_)) | Some(B::Set(_)) => {
                            s.lock().unwrap().write_seqs.insert(req.seq);
                            continue;
                        }
                        _ => ok(response::Body::Empty(Empty {})),
                    };
                    let out = ServerFrame { frame: Some(baton_proto::server_frame::Frame::Response(resp)) };
                    if f.send(bytes::Bytes::from(out.encode_to_vec())).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn abandoned_writes_keep_their_slots_until_the_actor_gives_up() {
    let (addr, seen) = fake_member(Keepalives::Ok).await;
    let cfg = ClientConfig::new([addr]).session_timeout(Duration::from_secs(30)).op_timeout(Duration::from_secs(20));
    let c = Client::connect_with(cfg).await.expect("session");
    // 3,000 writes whose callers give up after 5 ms.
    let mut tasks = Vec::new();
    for i in 0..3000 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_millis(5), c.set(&format!("/k{i}"), "v", None)).await;
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = seen.lock().unwrap().write_seqs.len();
    assert!(n > 0, "no write reached the member");
    assert!(n <= MAX_WRITES_IN_FLIGHT, "{n} unanswered writes in flight, over {MAX_WRITES_IN_FLIGHT}");
}

#[tokio::test]
async fn last_zxid_starts_at_the_sessions_creation() {
    let (addr, _) = fake_member(Keepalives::Ok).await;
    let c = Client::connect(vec![addr]).await.expect("session");
    assert_eq!(c.last_zxid().await, 42);
}

#[tokio::test]
async fn only_vouched_keepalives_keep_a_client_connected() {
    let (addr, _) = fake_member(Keepalives::NoLeader).await;
    let cfg = ClientConfig::new([addr]).session_timeout(Duration::from_millis(1500));
    let c = Client::connect_with(cfg).await.expect("session");
    assert_eq!(*c.state().borrow(), SessionState::Connected);
    // Stale reads and status are answered all along; keepalives are not.
    let poll = {
        let c = c.clone();
        tokio::spawn(async move {
            loop {
                let _ = c.get_opts("/", true).await;
                let _ = c.status().await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // Suspended no later than 2/3 of the timeout after the create was sent.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(*c.state().borrow(), SessionState::Suspended);
    poll.abort();
}

/// `may_be_lost_at` (what `LockGuard::may_be_taken` and `baton lock
/// --on-suspend wait` wait for) is the end of `Connected`, 2/3 of the
/// timeout after the last vouched send: a whole timeout on the client's
/// clock can end after the cluster's expiry when clock rates differ
/// (docs/guarantees.md, "The margin"). Here nothing is vouched after the
/// create, so it is 2/3 of the timeout after the create's send.
#[tokio::test]
async fn another_holder_may_be_granted_from_two_thirds_of_the_timeout() {
    let (addr, _) = fake_member(Keepalives::NoLeader).await;
    let t = Duration::from_millis(3000);
    let before = std::time::Instant::now();
    let c = Client::connect_with(ClientConfig::new([addr]).session_timeout(t)).await.expect("session");
    let after = std::time::Instant::now();
    let at = c.may_be_lost_at().await;
    assert!(at >= before + t * 2 / 3, "{:?} after the connect began: before 2T/3", at - before);
    assert!(at <= after + t * 2 / 3, "{:?} after the connect ended: after 2T/3", at - after);
}

#[tokio::test]
async fn vouched_keepalives_keep_it_connected() {
    let (addr, _) = fake_member(Keepalives::Ok).await;
    let cfg = ClientConfig::new([addr]).session_timeout(Duration::from_millis(1500));
    let c = Client::connect_with(cfg).await.expect("session");
    let mut st = c.state();
    let stayed = tokio::time::timeout(Duration::from_millis(3000), async {
        loop {
            if st.changed().await.is_err() || *st.borrow() != SessionState::Connected {
                return false;
            }
        }
    })
    .await;
    assert!(stayed.is_err(), "left Connected although every keepalive was answered");
}

/// Review finding (2026-12-02): a close_session that had to be resent and was
/// then answered SESSION_EXPIRED reported `Ambiguous`. The session is gone,
/// which is what a close asks for: it succeeds.
#[tokio::test]
async fn a_resent_close_answered_session_expired_succeeds() {
    let (addr, seen) = fake_member(Keepalives::Ok).await;
    let c = Client::connect(vec![addr]).await.expect("session");
    let r = c.close().await;
    assert!(r.is_ok(), "close said {r:?}");
    assert_eq!(seen.lock().unwrap().closes, 2, "the close was not resent once");
}

/// A member that writes before it reads again (a real one stops reading a
/// connection at its in-flight cap until its answers are read): it reads
/// the first write, then sends 32 MB of answers nobody waits for, and only
/// then reads and answers the writes. A client that stopped reading while
/// its own 24 MB of writes wait would wait on the member as the member
/// waits on it, and every write would time out.
async fn member_that_writes_first() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().expect("bound").to_string();
    tokio::spawn(async move {
        let Ok((sock, _)) = listener.accept().await else { return };
        let mut f = tokio_util::codec::Framed::new(sock, baton_proto::codec(1 << 24));
        let mut flooded = false;
        while let Some(Ok(frame)) = f.next().await {
            let Ok(ClientFrame { request: Some(req) }) = ClientFrame::decode(frame) else { return };
            let body = match &req.body {
                Some(request::Body::CreateSession(c)) => response::Body::CreateSession(CreateSessionResp {
                    session_id: 42,
                    secret: bytes::Bytes::from_static(b"secret"),
                    timeout_ms: c.timeout_ms,
                }),
                Some(request::Body::Set(_)) => response::Body::Set(SetResp { stat: Some(Stat::default()) }),
                _ => response::Body::Empty(Empty {}),
            };
            if matches!(req.body, Some(request::Body::Set(_))) && !flooded {
                flooded = true;
                for _ in 0..64 {
                    let noise = Response { id: u64::MAX, message: "x".repeat(512 << 10), ..Default::default() };
                    let out = ServerFrame { frame: Some(baton_proto::server_frame::Frame::Response(noise)) };
                    if f.send(bytes::Bytes::from(out.encode_to_vec())).await.is_err() {
                        return;
                    }
                }
            }
            let resp = Response { id: req.id, zxid: 42, body: Some(body), ..Default::default() };
            let out = ServerFrame { frame: Some(baton_proto::server_frame::Frame::Response(resp)) };
            if f.send(bytes::Bytes::from(out.encode_to_vec())).await.is_err() {
                return;
            }
        }
    });
    addr
}

#[tokio::test]
async fn a_client_reads_while_its_writes_wait() {
    let addr = member_that_writes_first().await;
    let cfg = ClientConfig::new([addr]).session_timeout(Duration::from_secs(30)).op_timeout(Duration::from_secs(10));
    let c = Client::connect_with(cfg).await.expect("session");
    let value = vec![b'v'; 512 << 10];
    let mut tasks = Vec::new();
    for i in 0..48 {
        let (c, value) = (c.clone(), value.clone());
        tasks.push(tokio::spawn(async move { c.set(&format!("/k{i}"), value, None).await.map(|_| ()) }));
    }
    // Bounded: a deadlocked actor never times its callers out.
    let all = tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(tasks)).await;
    let all = all.expect("writes still waiting after 30 s: client and member each wait for the other to read");
    for (i, r) in all.into_iter().enumerate() {
        let r = r.expect("task");
        assert!(r.is_ok(), "write {i}: {r:?}");
    }
}
