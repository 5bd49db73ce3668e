//! The queue's cancellation rules (recipes/queue.rs) against a scripted
//! fake member that keeps the session alive (every keepalive answered OK)
//! but cannot serve some requests for a while, as a member cut off from its
//! quorum answers NO_LEADER. A waiter that gives up must still get its node
//! out of the queue once the member can answer again, however long that
//! takes; a node left behind by a live session stalls the queue for good
//! once it is first (the harness found a lock stalled for 197 s this way,
//! and its `lock-stalled` checker flags it; this pins the client's half).
//!
//! - Its delete is retried past one session timeout.
//! - After an ambiguous create, the lookup of its node is retried too, and
//!   the node it finds is deleted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{Client, ClientConfig};
use baton_proto::{
    request, response, ChildrenResp, ClientFrame, CreateResp, CreateSessionResp, Empty, ErrorCode, ExistsResp,
    Response, ServerFrame, Stat,
};
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::net::TcpListener;

const SESSION: u64 = 42;

/// How the fake member answers a queue create.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Create {
    /// Applied, behind another node, FIRST watch registered.
    Behind,
    /// TIMEOUT every time: the client reports it ambiguous. The node was
    /// created all the same (the fake lists it once it answers reads).
    Lost,
}

#[derive(Clone, Copy)]
struct Script {
    create: Create,
    /// Deletes and children reads are answered NO_LEADER for this long
    /// after the first one arrives.
    refuse_for: Duration,
}

#[derive(Default)]
struct Seen {
    /// The queue node the client's create made (full path).
    created: Option<String>,
    refused: u32,
    /// Deletes answered OK: the path, and how long after the first
    /// refused request.
    deleted: Vec<(String, Duration)>,
}

fn fake_member(script: Script) -> (String, Arc<Mutex<Seen>>) {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("bound").to_string();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    tokio::spawn(async move {
        let listener = TcpListener::from_std(std_listener).expect("tokio listener");
        let first_refusal: Arc<Mutex<Option<Instant>>> = Arc::default();
        while let Ok((sock, _)) = listener.accept().await {
            let (s, first_refusal) = (s.clone(), first_refusal.clone());
            tokio::spawn(async move {
                let mut f = tokio_util::codec::Framed::new(sock, baton_proto::codec(1 << 24));
                while let Some(Ok(frame)) = f.next().await {
                    let Ok(ClientFrame { request: Some(req) }) = ClientFrame::decode(frame) else { return };
                    use request::Body as B;
                    let ok = |body| Response { id: req.id, zxid: 43, body: Some(body), ..Default::default() };
                    let refuse = |code: ErrorCode| Response {
                        id: req.id,
                        error: code as i32,
                        message: "scripted".into(),
                        ..Default::default()
                    };
                    // Deletes and children reads: refused until `refuse_for`
                    // has passed since the first of them.
                    let refusing = || {
                        let since = *first_refusal.lock().unwrap().get_or_insert_with(Instant::now);
                        let refusing = since.elapsed() < script.refuse_for;
                        if refusing {
                            s.lock().unwrap().refused += 1;
                        }
                        (refusing, since.elapsed())
                    };
                    let stat = Stat { czxid: 43, ephemeral_owner: SESSION, ..Default::default() };
                    let resp = match &req.body {
                        Some(B::CreateSession(c)) => ok(response::Body::CreateSession(CreateSessionResp {
                            session_id: SESSION,
                            secret: bytes::Bytes::from_static(b"secret"),
                            timeout_ms: c.timeout_ms,
                        })),
                        Some(B::Create(c)) => {
                            let path = format!("{}0000000007", c.path);
                            s.lock().unwrap().created = Some(path.clone());
                            match script.create {
                                Create::Behind => ok(response::Body::Create(CreateResp {
                                    path,
                                    stat: Some(stat),
                                    predecessor: "_c_0-lock-0000000006".into(),
                                    first: false,
                                    first_watch_set: true,
                                })),
                                Create::Lost => refuse(ErrorCode::Timeout),
                            }
                        }
                        Some(B::Delete(d)) => match refusing() {
                            (true, _) => refuse(ErrorCode::NoLeader),
                            (false, after) => {
                                s.lock().unwrap().deleted.push((d.path.clone(), after));
                                ok(response::Body::Empty(Empty {}))
                            }
                        },
                        Some(B::Children(_)) => match refusing() {
                            (true, _) => refuse(ErrorCode::NoLeader),
                            (false, _) => {
                                let created = s.lock().unwrap().created.clone().unwrap_or_default();
                                let name = created.rsplit('/').next().unwrap_or_default().to_string();
                                ok(response::Body::Children(ChildrenResp { children: vec![name], stat: None }))
                            }
                        },
                        Some(B::Exists(r)) => {
                            let mine = s.lock().unwrap().created.as_deref() == Some(r.path.as_str());
                            ok(response::Body::Exists(ExistsResp { stat: mine.then_some(stat) }))
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

/// A 1 s session whose requests give up after 300 ms of refusals, so one
/// delete attempt ends well inside the 3 s the member refuses.
async fn client(addr: String) -> Client {
    let cfg = ClientConfig::new([addr]).session_timeout(Duration::from_secs(1)).op_timeout(Duration::from_millis(300));
    Client::connect_with(cfg).await.expect("session")
}

/// Waits (bounded) for the fake to see a delete answered OK.
async fn deleted_within(seen: &Mutex<Seen>, limit: Duration) -> Option<(String, Duration)> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Some(d) = seen.lock().unwrap().deleted.first().cloned() {
            return Some(d);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test]
async fn a_waiter_that_gave_up_deletes_its_node_however_long_the_member_refuses() {
    let script = Script { create: Create::Behind, refuse_for: Duration::from_secs(3) };
    let (addr, seen) = fake_member(script);
    let c = client(addr).await;
    // Behind another holder: the wait runs out and drops the node.
    let got = c.lock_with_timeout("jobs", Duration::from_millis(100)).await.expect("a timed acquire");
    assert!(got.is_none(), "the fake never grants");
    let created = seen.lock().unwrap().created.clone().expect("the waiter created its node");
    let d = deleted_within(&seen, Duration::from_secs(10)).await;
    let refused = seen.lock().unwrap().refused;
    let (path, after) = d.unwrap_or_else(|| {
        panic!(
            "the waiter's node {created} is still queued 10 s on ({refused} deletes refused): it would stall the lock"
        )
    });
    assert_eq!(path, created);
    // It was refused past the session's timeout, and kept at it.
    assert!(after >= Duration::from_secs(3), "deleted {after:?} after the first refusal");
    assert!(refused >= 3, "only {refused} refusals");
}

#[tokio::test]
async fn an_ambiguous_create_is_looked_up_until_found_and_then_deleted() {
    let script = Script { create: Create::Lost, refuse_for: Duration::from_secs(3) };
    let (addr, seen) = fake_member(script);
    let c = client(addr).await;
    // The caller stops waiting before the create's outcome is known; the
    // create's task goes on, finds the node and removes it.
    let got = c.lock_with_timeout("jobs", Duration::from_millis(100)).await.expect("a timed acquire");
    assert!(got.is_none(), "the fake never grants");
    let d = deleted_within(&seen, Duration::from_secs(10)).await;
    let created = seen.lock().unwrap().created.clone().expect("the create was sent");
    let refused = seen.lock().unwrap().refused;
    let (path, _) = d.unwrap_or_else(|| {
        panic!("the lost create's node {created} was never found and deleted ({refused} lookups refused)")
    });
    assert_eq!(path, created);
    assert!(refused >= 3, "only {refused} refusals");
}
