//! Bounded resources (server/src/config.rs `Limits`): each cap is hit and
//! answered with its typed error, or the connection is closed with a
//! logged reason, while the member keeps serving everyone else.

use std::time::Duration;

use baton_client::CreateOptions;
use baton_proto::ErrorCode;
use baton_proto::{request, MultiOp, Op, ReadReq, Request, WatchKind, WatchSpec};
use baton_tests::raw::RawConn;
use baton_tests::Cluster;
use futures::SinkExt;
use prost::Message as _;

fn req(id: u64, body: request::Body) -> Request {
    Request { id, body: Some(body), ..Default::default() }
}

fn get(id: u64, path: &str) -> Request {
    req(id, request::Body::Get(ReadReq { path: path.into(), stale: true, watch: None }))
}

fn watch(id: u64, watch_id: u64) -> Request {
    let spec = WatchSpec { watch_id, path: "/".into(), kind: WatchKind::Data as i32, ..Default::default() };
    req(id, request::Body::AddWatch(baton_proto::AddWatchReq { watch: Some(spec) }))
}

#[tokio::test]
async fn l10_every_cap_answers_with_its_typed_error_and_the_member_serves_on() {
    let flags = [
        "--max-connections=6",
        "--max-watches=3",
        "--max-sessions=3",
        "--max-multi-ops=5",
        "--max-reply-bytes=65536",
        "--max-queued-bytes=1048576",
    ];
    let c = Cluster::start(3, &flags).await;
    let client = c.client().await; // session 1 (of 3)
    let big = vec![7u8; 200_000];
    client.create("/big", big, CreateOptions::persistent()).await.expect("create");
    let addr = c.endpoint(1);

    // Watches per connection.
    let mut w = RawConn::connect(&addr).await;
    for i in 1..=3 {
        assert_eq!(w.call(watch(i, i)).await.error, 0);
    }
    let r = w.call(watch(4, 4)).await;
    assert_eq!(r.error, ErrorCode::Busy as i32, "{} {}", r.error, r.message);
    assert!(r.message.contains("--max-watches"), "{}", r.message);

    // Sessions: two more fit, the next one is BUSY.
    let mut s2 = RawConn::connect(&addr).await;
    s2.create_session(1, 10_000).await;
    let mut s3 = RawConn::connect(&addr).await;
    s3.create_session(1, 10_000).await;
    let mut s4 = RawConn::connect(&addr).await;
    let body = request::Body::CreateSession(baton_proto::CreateSessionReq { timeout_ms: 10_000 });
    let r = s4.call(req(1, body)).await;
    assert_eq!(r.error, ErrorCode::Busy as i32, "{} {}", r.error, r.message);

    // Multi size.
    let ops = (0..6)
        .map(|i| Op {
            op: Some(baton_proto::op::Op::Create(baton_proto::CreateOp {
                path: format!("/m{i}"),
                ..Default::default()
            })),
        })
        .collect();
    let r = s2.call(Request { id: 2, seq: 1, body: Some(request::Body::Multi(MultiOp { ops })), ..Default::default() });
    let r = r.await;
    assert_eq!(r.error, ErrorCode::TooLarge as i32, "{} {}", r.error, r.message);

    // Reply size: a 200 kB node over a 64 KiB reply cap.
    let r = w.call(get(5, "/big")).await;
    assert_eq!(r.error, ErrorCode::TooLarge as i32, "{} {}", r.error, r.message);
    assert!(r.message.contains("--max-reply-bytes"), "{}", r.message);

    // Connections: six are open on member 1 (w, s2, s3, s4, and the
    // client's if it chose member 1: fill up to the cap, then one more).
    let mut extra = Vec::new();
    let mut refused = None;
    for _ in 0..6 {
        let mut conn = RawConn::connect(&addr).await;
        let r = conn.call(req(1, request::Body::Status(Default::default()))).await;
        if r.error == ErrorCode::Busy as i32 {
            refused = Some(r);
            break;
        }
        extra.push(conn);
    }
    let r = refused.expect("a connection over --max-connections is refused");
    assert!(r.message.contains("connections open"), "{}", r.message);
    drop(extra);

    // A client that stops reading: its queue passes 1 MiB and it is cut off.
    let small = vec![1u8; 60_000];
    client.create("/mid", small, CreateOptions::persistent()).await.expect("create");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut lazy = RawConn::connect(&addr).await;
    for i in 1..=1000 {
        let frame = baton_proto::ClientFrame { request: Some(get(i, "/mid")) }.encode_to_vec();
        if lazy.f.send(bytes::Bytes::from(frame)).await.is_err() {
            break; // already cut off
        }
    }
    let mut answered = 0;
    while lazy.recv().await.is_some() {
        answered += 1;
        assert!(answered < 1000, "every response was queued: the cap did not close the connection");
    }
    assert!(c.log(1).contains("not reading its responses"), "the reason is logged");

    // Everyone else is served.
    assert_eq!(w.call(req(9, request::Body::Status(Default::default()))).await.error, 0);
    client.create("/after", "ok", CreateOptions::persistent()).await.expect("write after the caps");
    client.close().await.expect("close");
}

#[tokio::test]
async fn l20_two_election_ticks_elect_and_fail_over() {
    let mut c = Cluster::start(3, &["--election-ticks=2", "--heartbeat-ticks=1"]).await;
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    c.kill(leader);
    let next = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(next, leader);
    for id in (1..=3).filter(|&i| i != leader) {
        assert_eq!(c.exit_code(id), None, "member {id} died\n{}", c.log_tails(20));
    }
    let client = c.client().await;
    client.create("/x", "y", CreateOptions::persistent()).await.expect("write");
    client.close().await.expect("close");
}
