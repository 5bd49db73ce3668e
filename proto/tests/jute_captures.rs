//! `baton_proto::jute` against bytes the real ZooKeeper sent.
//!
//! The fixtures under `tests/captures/` were recorded by
//! `scripts/zk-capture.py` (a recording TCP proxy) between a standalone
//! ZooKeeper 3.8.0 server (Debian 12's package) and ZooKeeper's own 3.8.0
//! Java client: `zk38-zkcli.txt` is `zkCli.sh` running `zk38-zkcli.cmds`
//! (with a dropped connection midway, so the client reconnects and re-sets
//! its watches), `zk38-java.txt` is `Zk38Client.java` (what zkCli cannot
//! send: create2, multi with creates/setData/check and a failing one,
//! multiRead, checkWatches). Each line is one frame without its length
//! prefix: `<conn> <C|S> <label> <hex>`.
//!
//! What is checked: every client frame decodes (`ConnectRequest` first,
//! then `Request`) to exactly what the commands asked for, xids count up,
//! and encoding the decoded request gives the captured bytes back; every
//! server frame decodes (`ConnectResponse`, `ReplyHeader` and the body for
//! the request's opcode, or a notification), nothing is left over, and
//! Baton's encoder (`Response::encode`, `jute::notification`,
//! `ConnectResponse::encode`) builds the same bytes for the same reply.
//!
//! Two known differences, asserted so they cannot spread: ZooKeeper keeps a
//! null buffer (length -1, zkCli's `create -c /cap/box` without data, and
//! the `getData` reply for that node) apart from an empty one, and jute here
//! reads both as empty and writes empty (length 0); and the body of
//! `reconfig`, an opcode Baton does not serve, is not kept.

use std::collections::{BTreeSet, HashMap};

use baton_proto::jute::{
    self, create_mode, err, event, op, perms, watch_mode, xid, Acl, ConnectRequest, ConnectResponse, Create, OpResult,
    Reader, ReplyHeader, Request, Response,
};

const ZKCLI: &str = include_str!("captures/zk38-zkcli.txt");
const JAVA: &str = include_str!("captures/zk38-java.txt");

/// ZooKeeper's `ReconfigDisabled` (not a code Baton's port sends).
const RECONFIG_DISABLED: i32 = -123;
/// The `removeWatches` type `WatcherType.Any`; `checkWatches` with `Data`.
const WATCHER_ANY: i32 = 3;
const WATCHER_DATA: i32 = 2;

struct Frame {
    line: usize,
    conn: u32,
    from_client: bool,
    label: String,
    bytes: Vec<u8>,
}

fn unhex(s: &str, line: usize) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "line {line}: odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|e| panic!("line {line}: bad hex: {e}")))
        .collect()
}

fn frames(text: &str) -> Vec<Frame> {
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let line = i + 1;
        if l.starts_with('#') || l.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f.len(), 4, "line {line}: want `<conn> <C|S> <label> <hex>`");
        assert!(f[1] == "C" || f[1] == "S", "line {line}: direction {:?}", f[1]);
        out.push(Frame {
            line,
            conn: f[0].parse().unwrap_or_else(|e| panic!("line {line}: conn: {e}")),
            from_client: f[1] == "C",
            label: f[2].to_string(),
            bytes: unhex(f[3], line),
        });
    }
    out
}

/// A request as decoded, with the reply that answered it.
#[derive(Debug)]
struct Exchange {
    conn: u32,
    xid: i32,
    op: i32,
    req: Request,
    req_line: usize,
    header: ReplyHeader,
    body: Response,
}

/// One connection's handshake.
struct Handshake {
    conn: u32,
    req: ConnectRequest,
    resp: ConnectResponse,
}

/// A notification: (header, event type, state, path).
type Notification = (ReplyHeader, i32, i32, String);

struct Capture {
    handshakes: Vec<Handshake>,
    /// In the order the requests were sent.
    exchanges: Vec<Exchange>,
    notifications: Vec<Notification>,
    /// Frames whose re-encoding differs from the capture only in a null
    /// buffer written as empty: (line, label).
    null_buffers: Vec<(usize, String)>,
}

/// `ours` must equal `theirs`, or differ only where `theirs` has a null
/// buffer's length (-1) and `ours` an empty one's (0). Returns whether it
/// differed.
fn same_but_null_buffers(theirs: &[u8], ours: &[u8], what: &str) -> bool {
    if theirs == ours {
        return false;
    }
    assert_eq!(theirs.len(), ours.len(), "{what}: re-encoded to a different length");
    let mut i = 0;
    while i < theirs.len() {
        if theirs[i] != ours[i] {
            let at = i - i.min(3);
            let start =
                (at..=i).find(|&s| theirs.get(s..s + 4) == Some(&[0xff; 4]) && ours.get(s..s + 4) == Some(&[0; 4]));
            let s = start.unwrap_or_else(|| panic!("{what}: re-encoded bytes differ at {i} (not a null buffer)"));
            i = s + 4;
        } else {
            i += 1;
        }
    }
    true
}

fn decode(text: &str) -> Capture {
    let mut cap =
        Capture { handshakes: Vec::new(), exchanges: Vec::new(), notifications: Vec::new(), null_buffers: Vec::new() };
    let mut connect_req: HashMap<u32, ConnectRequest> = HashMap::new();
    // (conn, xid) -> index into exchanges (waiting for its reply); pings and
    // auth packets are kept apart since they share their xids.
    let mut waiting: HashMap<(u32, i32), usize> = HashMap::new();
    let mut pending: Vec<(u32, i32, i32, Request, usize)> = Vec::new();
    let mut replies: Vec<Option<(ReplyHeader, Response)>> = Vec::new();
    let mut special: HashMap<(u32, i32), Vec<usize>> = HashMap::new();
    for f in frames(text) {
        let what = format!("line {} ({} {})", f.line, if f.from_client { "C" } else { "S" }, f.label);
        if f.label == "connect" {
            if f.from_client {
                let req = ConnectRequest::decode(&f.bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(req.encode(), f.bytes, "{what}: ConnectRequest re-encodes to the captured bytes");
                connect_req.insert(f.conn, req);
            } else {
                let resp = ConnectResponse::decode(&f.bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(resp.encode(), f.bytes, "{what}: ConnectResponse re-encodes to the captured bytes");
                let req = connect_req.remove(&f.conn).unwrap_or_else(|| panic!("{what}: no connect request before"));
                cap.handshakes.push(Handshake { conn: f.conn, req, resp });
            }
            continue;
        }
        if f.from_client {
            let (x, o, req) = Request::decode(&f.bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(jute_name(o), f.label, "{what}: opcode");
            if !matches!(req, Request::Unsupported { .. }) {
                let again = req.encode(x);
                if same_but_null_buffers(&f.bytes, &again, &what) {
                    cap.null_buffers.push((f.line, f.label.clone()));
                }
            }
            let i = pending.len();
            pending.push((f.conn, x, o, req, f.line));
            replies.push(None);
            if x == xid::PING || x == xid::AUTH {
                special.entry((f.conn, x)).or_default().push(i);
            } else {
                assert!(waiting.insert((f.conn, x), i).is_none(), "{what}: xid {x} used twice");
            }
            continue;
        }
        let mut r = Reader::new(&f.bytes);
        let header = ReplyHeader::read(&mut r).unwrap_or_else(|e| panic!("{what}: {e}"));
        if header.xid == xid::NOTIFICATION {
            let (kind, state, path) = jute::decode_notification(&mut r).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(r.left(), 0, "{what}: bytes after the notification");
            assert_eq!(
                jute::notification(header.zxid, kind, &path),
                f.bytes,
                "{what}: jute::notification builds the captured bytes"
            );
            cap.notifications.push((header, kind, state, path));
            continue;
        }
        let i = if header.xid == xid::PING || header.xid == xid::AUTH {
            let q = special.get_mut(&(f.conn, header.xid)).unwrap_or_else(|| panic!("{what}: unasked reply"));
            assert!(!q.is_empty(), "{what}: unasked reply");
            q.remove(0)
        } else {
            waiting
                .remove(&(f.conn, header.xid))
                .unwrap_or_else(|| panic!("{what}: no request with xid {}", header.xid))
        };
        let o = pending[i].2;
        assert_eq!(jute_name(o), f.label, "{what}: the label names the request's opcode");
        let body = if header.err == err::OK {
            Response::decode_body(o, &mut r).unwrap_or_else(|e| panic!("{what}: {e}"))
        } else {
            Response::Empty
        };
        assert_eq!(r.left(), 0, "{what}: {} bytes after the reply body", r.left());
        let again = Response::encode(header, &body);
        if same_but_null_buffers(&f.bytes, &again, &what) {
            cap.null_buffers.push((f.line, f.label.clone()));
        }
        replies[i] = Some((header, body));
    }
    assert!(connect_req.is_empty(), "a connect request without a response");
    for ((conn, x, o, req, line), reply) in pending.into_iter().zip(replies) {
        let (header, body) = reply.unwrap_or_else(|| panic!("line {line}: request xid {x} has no reply"));
        cap.exchanges.push(Exchange { conn, xid: x, op: o, req, req_line: line, header, body });
    }
    cap
}

/// The proxy's label for an opcode (scripts/zk-capture.py's OPS).
fn jute_name(o: i32) -> &'static str {
    match o {
        op::CREATE => "create",
        op::DELETE => "delete",
        op::EXISTS => "exists",
        op::GET_DATA => "getData",
        op::SET_DATA => "setData",
        op::GET_ACL => "getACL",
        op::SET_ACL => "setACL",
        op::GET_CHILDREN => "getChildren",
        op::SYNC => "sync",
        op::PING => "ping",
        op::GET_CHILDREN2 => "getChildren2",
        op::CHECK => "check",
        op::MULTI => "multi",
        op::CREATE2 => "create2",
        op::RECONFIG => "reconfig",
        op::CHECK_WATCHES => "checkWatches",
        op::REMOVE_WATCHES => "removeWatches",
        op::CREATE_CONTAINER => "createContainer",
        op::CREATE_TTL => "createTTL",
        op::MULTI_READ => "multiRead",
        op::AUTH => "auth",
        op::SET_WATCHES2 => "setWatches2",
        op::GET_EPHEMERALS => "getEphemerals",
        op::GET_ALL_CHILDREN_NUMBER => "getAllChildrenNumber",
        op::ADD_WATCH => "addWatch",
        op::WHO_AM_I => "whoAmI",
        op::CLOSE_SESSION => "closeSession",
        _ => "?",
    }
}

fn open_acl() -> Vec<Acl> {
    vec![Acl { perms: perms::ALL, scheme: "world".into(), id: "anyone".into() }]
}

fn create(o: i32, path: &str, data: &str, acl: Vec<Acl>, flags: i32, ttl_ms: Option<i64>) -> Request {
    Request::Create { op: o, c: Create { path: path.into(), data: data.as_bytes().to_vec(), acl, flags, ttl_ms } }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Ordinary xids count up from 1 across the whole session (reconnects
/// included); pings are -2 and auth packets -4.
fn assert_xids(cap: &Capture) {
    let mut next = 1;
    for e in &cap.exchanges {
        match e.op {
            op::PING => assert_eq!(e.xid, xid::PING, "line {}: ping xid", e.req_line),
            op::AUTH => assert_eq!(e.xid, xid::AUTH, "line {}: auth xid", e.req_line),
            _ => {
                assert_eq!(e.xid, next, "line {}: xids count up by one", e.req_line);
                next += 1;
            }
        }
        assert_eq!(e.header.xid, e.xid, "line {}: the reply carries the request's xid", e.req_line);
    }
}

/// The reply zxids never go back within a connection (auth replies carry 0).
fn assert_zxids(cap: &Capture) {
    let mut last: HashMap<u32, i64> = HashMap::new();
    for e in cap.exchanges.iter().filter(|e| e.op != op::AUTH) {
        let l = last.entry(e.conn).or_insert(0);
        assert!(e.header.zxid >= *l, "line {}: zxid {} after {}", e.req_line, e.header.zxid, l);
        *l = e.header.zxid;
    }
}

fn by_xid(cap: &Capture, x: i32) -> &Exchange {
    cap.exchanges.iter().find(|e| e.xid == x).unwrap_or_else(|| panic!("no request with xid {x}"))
}

#[test]
fn zkcli_handshakes_a_new_session_then_resumes_it() {
    let cap = decode(ZKCLI);
    assert_eq!(cap.handshakes.len(), 2, "one connect, one reconnect after #drop");
    let (first, second) = (&cap.handshakes[0], &cap.handshakes[1]);
    assert_eq!(first.conn, 1);
    assert_eq!(
        first.req,
        ConnectRequest {
            protocol_version: 0,
            last_zxid_seen: 0,
            timeout_ms: 4000,
            session_id: 0,
            passwd: vec![0; 16],
            read_only: false,
        }
    );
    assert_eq!((first.resp.protocol_version, first.resp.timeout_ms, first.resp.read_only), (0, 4000, false));
    assert_ne!(first.resp.session_id, 0);
    assert_eq!(first.resp.passwd.len(), 16);

    // The reconnect presents the session and its password, and the last
    // zxid the client saw on the first connection.
    let last_seen = cap.exchanges.iter().filter(|e| e.conn == 1).map(|e| e.header.zxid).max().expect("replies");
    assert_eq!(second.conn, 2);
    assert_eq!(
        second.req,
        ConnectRequest {
            protocol_version: 0,
            last_zxid_seen: last_seen,
            timeout_ms: 4000,
            session_id: first.resp.session_id,
            passwd: first.resp.passwd.clone(),
            read_only: false,
        }
    );
    assert_eq!(second.resp, first.resp, "the same session is resumed");
}

#[test]
fn zkcli_requests_decode_to_what_the_commands_sent() {
    let cap = decode(ZKCLI);
    assert_xids(&cap);
    assert_zxids(&cap);
    let ip_acl = vec![
        Acl { perms: perms::READ, scheme: "world".into(), id: "anyone".into() },
        Acl { perms: perms::ALL, scheme: "ip".into(), id: "127.0.0.1".into() },
    ];
    let get = |path: &str, watch| Request::GetData { path: path.into(), watch };
    let ls2 = |path: &str, watch| Request::GetChildren { op: op::GET_CHILDREN2, path: path.into(), watch };
    let ls = |path: &str| Request::GetChildren { op: op::GET_CHILDREN, path: path.into(), watch: false };
    let del = |path: &str, version| Request::Delete { path: path.into(), version };
    let auth = Request::Auth { kind: 0, scheme: "digest".into(), auth: b"user:secret".to_vec() };
    let want: Vec<(u32, Request)> = vec![
        // create /cap root; create -e -s; create with two ACL entries
        (1, create(op::CREATE, "/cap", "root", open_acl(), create_mode::PERSISTENT, None)),
        (1, create(op::CREATE, "/cap/eph-", "e1", open_acl(), create_mode::EPHEMERAL_SEQUENTIAL, None)),
        (1, create(op::CREATE, "/cap/acl", "secret", ip_acl, create_mode::PERSISTENT, None)),
        // create -c /cap/box (no data: a null buffer, read as empty)
        (1, create(op::CREATE_CONTAINER, "/cap/box", "", open_acl(), create_mode::CONTAINER, None)),
        (1, create(op::CREATE, "/cap/box/item", "i", open_acl(), create_mode::PERSISTENT, None)),
        // create -t 60000, create -s -t 60000
        (1, create(op::CREATE_TTL, "/cap/ttl", "t", open_acl(), create_mode::PERSISTENT_WITH_TTL, Some(60000))),
        (
            1,
            create(
                op::CREATE_TTL,
                "/cap/ttlseq-",
                "ts",
                open_acl(),
                create_mode::PERSISTENT_SEQUENTIAL_WITH_TTL,
                Some(60000),
            ),
        ),
        // ls -s /cap; ls -w /cap (zkCli's ls always asks for the stat)
        (1, ls2("/cap", false)),
        (1, ls2("/cap", true)),
        // ls -R /cap/box: the node, then a breadth-first walk
        (1, get("/cap/box", false)),
        (1, ls2("/cap/box", false)),
        (1, ls2("/cap/box/item", false)),
        // stat -w /cap/none; stat /cap; get -w /cap
        (1, Request::Exists { path: "/cap/none".into(), watch: true }),
        (1, Request::Exists { path: "/cap".into(), watch: false }),
        (1, get("/cap", true)),
        // set -v 0; set -s (any version); set -v 99 (fails)
        (1, Request::SetData { path: "/cap".into(), data: b"v2".to_vec(), version: 0 }),
        (1, Request::SetData { path: "/cap".into(), data: b"v3".to_vec(), version: -1 }),
        (1, Request::SetData { path: "/cap".into(), data: b"bad".to_vec(), version: 99 }),
        (1, get("/cap/acl", false)),
        (1, Request::AddWatch { path: "/cap".into(), mode: watch_mode::PERSISTENT_RECURSIVE }),
        (1, Request::AddWatch { path: "/cap/box".into(), mode: watch_mode::PERSISTENT }),
        (1, create(op::CREATE, "/cap/w", "w", open_acl(), create_mode::PERSISTENT, None)),
        // addauth digest user:secret (xid -4, answered before the getAcl)
        (1, auth.clone()),
        (1, Request::GetAcl { path: "/cap/acl".into() }),
        (
            1,
            Request::SetAcl {
                path: "/cap/acl".into(),
                acl: vec![Acl { perms: perms::ALL, scheme: "auth".into(), id: "user:secret".into() }],
                version: 0,
            },
        ),
        (1, Request::GetAcl { path: "/cap/acl".into() }),
        (1, Request::Sync { path: "/cap".into() }),
        (1, Request::RemoveWatches { path: "/cap/box".into(), kind: WATCHER_ANY }),
        (1, Request::WhoAmI),
        (1, Request::GetEphemerals { prefix: "/cap".into() }),
        (1, Request::GetAllChildrenNumber { path: "/cap".into() }),
        // config: the dynamic configuration node
        (1, get("/zookeeper/config", false)),
        // reconfig -remove 9: decoded by opcode only
        (1, Request::Unsupported { op: op::RECONFIG }),
        (1, get("/cap/acl", true)),
        (1, Request::Exists { path: "/cap/none".into(), watch: true }),
        // #drop: the client reconnects, sends its auth again, then its
        // watches (setWatches2, as one is persistent recursive)
        (2, auth),
        (
            2,
            Request::SetWatches {
                op: op::SET_WATCHES2,
                relative_zxid: 14,
                data: strings(&["/cap/acl"]),
                exist: strings(&["/cap/none"]),
                child: strings(&["/cap"]),
                persistent: vec![],
                persistent_recursive: strings(&["/cap"]),
            },
        ),
        (2, create(op::CREATE, "/cap/after", "a", open_acl(), create_mode::PERSISTENT, None)),
        (2, del("/cap/after", 0)),
        (2, del("/cap/none", -1)),
        // deleteall /cap -b 3: the tree, breadth first, then multis of
        // deletes, deepest first
        (2, ls("/cap")),
        (2, ls("/cap/eph-0000000000")),
        (2, ls("/cap/w")),
        (2, ls("/cap/box")),
        (2, ls("/cap/acl")),
        (2, ls("/cap/ttl")),
        (2, ls("/cap/ttlseq-0000000004")),
        (2, ls("/cap/box/item")),
        (2, Request::Multi(vec![del("/cap/box/item", -1), del("/cap/ttlseq-0000000004", -1), del("/cap/ttl", -1)])),
        (2, Request::Multi(vec![del("/cap/acl", -1), del("/cap/box", -1), del("/cap/w", -1)])),
        (2, Request::Multi(vec![del("/cap/eph-0000000000", -1), del("/cap", -1)])),
        // close
        (2, Request::CloseSession),
    ];
    // Pings come when the link is idle (how many depends on timing):
    // checked apart.
    let sent: Vec<&Exchange> = cap.exchanges.iter().filter(|e| e.op != op::PING).collect();
    assert_eq!(sent.len(), want.len(), "number of requests other than pings");
    for (i, (g, w)) in sent.iter().zip(&want).enumerate() {
        assert_eq!(&(g.conn, g.req.clone()), w, "request {i} (line {})", g.req_line);
    }
    // #sleep 3 with a 4 s session: the client pings.
    let pings = cap.exchanges.iter().filter(|e| e.req == Request::Ping && e.conn == 1).count();
    assert!(pings >= 1, "no ping during #sleep 3");
    for e in &cap.exchanges {
        assert_eq!(e.req.op(), e.op, "line {}: Request::op", e.req_line);
    }
    // setWatches2's relative zxid is the last zxid seen, as in the reconnect.
    assert_eq!(cap.handshakes[1].req.last_zxid_seen, 14);
}

#[test]
fn zkcli_requests_and_replies_reencode_to_the_captured_bytes() {
    // decode() asserts every re-encoding; only the null buffers differ.
    let cap = decode(ZKCLI);
    let labels: Vec<&str> = cap.null_buffers.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(labels, ["createContainer", "getData"], "null buffers: {:?}", cap.null_buffers);
    // The getData with a null buffer is the one for the container.
    let null_get = cap.exchanges.iter().find(|e| e.req_line + 1 == cap.null_buffers[1].0).expect("its request");
    assert_eq!(null_get.req, Request::GetData { path: "/cap/box".into(), watch: false });
}

#[test]
fn zkcli_replies_decode_as_the_server_meant_them() {
    let cap = decode(ZKCLI);
    let session = cap.handshakes[0].resp.session_id;
    let body = |x| &by_xid(&cap, x).body;
    let errc = |x| by_xid(&cap, x).header.err;
    assert_eq!(body(1), &Response::Path("/cap".into()));
    assert_eq!(body(2), &Response::Path("/cap/eph-0000000000".into()));
    // createContainer and createTTL answer with the path and the stat.
    let Response::PathStat(p, s) = body(4) else { panic!("createContainer reply: {:?}", body(4)) };
    assert_eq!((p.as_str(), s.czxid, s.data_length), ("/cap/box", by_xid(&cap, 4).header.zxid, 0));
    let Response::PathStat(p, s) = body(7) else { panic!("createTTL reply: {:?}", body(7)) };
    assert_eq!((p.as_str(), s.data_length, s.ephemeral_owner), ("/cap/ttlseq-0000000004", 2, 0));
    let Response::Children2 { children, stat } = body(8) else { panic!("getChildren2 reply: {:?}", body(8)) };
    assert_eq!(children, &strings(&["box", "eph-0000000000", "acl", "ttl", "ttlseq-0000000004"]));
    assert_eq!((stat.num_children, stat.cversion, stat.data_length), (5, 5, 4));
    assert_eq!(errc(13), err::NO_NODE, "stat -w /cap/none");
    let Response::Stat(s) = body(14) else { panic!("exists reply: {:?}", body(14)) };
    assert_eq!((s.version, s.num_children, s.data_length), (0, 5, 4));
    let Response::GetData { data, stat } = body(15) else { panic!("getData reply: {:?}", body(15)) };
    assert_eq!((data.as_slice(), stat.version), (&b"root"[..], 0));
    let Response::Stat(s) = body(16) else { panic!("setData reply: {:?}", body(16)) };
    assert_eq!((s.version, s.data_length), (1, 2));
    let Response::Stat(s) = body(17) else { panic!("setData reply: {:?}", body(17)) };
    assert_eq!(s.version, 2);
    assert_eq!(errc(18), err::BAD_VERSION, "set -v 99");
    assert_eq!(body(20), &Response::Code(0), "addWatch answers with an ErrorResponse 0");
    assert_eq!(body(21), &Response::Code(0));
    let auth = cap.exchanges.iter().find(|e| e.op == op::AUTH).expect("auth");
    assert_eq!((auth.header, &auth.body), (ReplyHeader { xid: xid::AUTH, zxid: 0, err: err::OK }, &Response::Empty));
    let Response::GetAcl { acl, .. } = body(23) else { panic!("getACL reply: {:?}", body(23)) };
    assert_eq!(acl[1], Acl { perms: perms::ALL, scheme: "ip".into(), id: "127.0.0.1".into() });
    let Response::Stat(s) = body(24) else { panic!("setACL reply: {:?}", body(24)) };
    assert_eq!(s.aversion, 1);
    let Response::GetAcl { acl, stat } = body(25) else { panic!("getACL reply: {:?}", body(25)) };
    assert_eq!(acl.len(), 1);
    assert_eq!((acl[0].perms, acl[0].scheme.as_str()), (perms::ALL, "digest"));
    assert!(acl[0].id.starts_with("user:") && acl[0].id.len() > 5, "the server hashes auth ids: {}", acl[0].id);
    assert_eq!(stat.aversion, 1);
    assert_eq!(body(26), &Response::Path("/cap".into()), "sync answers with the path");
    assert_eq!((errc(27), body(27)), (err::OK, &Response::Empty), "removeWatches");
    assert_eq!(body(28), &Response::WhoAmI(vec![("ip".into(), "127.0.0.1".into()), ("digest".into(), "user".into())]));
    assert_eq!(body(29), &Response::Children(strings(&["/cap/eph-0000000000"])), "getEphemerals: full paths");
    assert_eq!(body(30), &Response::Number(7), "getAllChildrenNumber counts all descendants");
    assert_eq!(errc(32), RECONFIG_DISABLED, "reconfig on a standalone server");
    for e in cap.exchanges.iter().filter(|e| e.op == op::PING) {
        assert_eq!((e.header.xid, e.header.err, &e.body), (xid::PING, err::OK, &Response::Empty));
    }
    let sw = cap.exchanges.iter().find(|e| e.op == op::SET_WATCHES2).expect("setWatches2");
    assert_eq!((sw.header.err, &sw.body), (err::OK, &Response::Empty), "setWatches2 answers with its own xid");
    assert_eq!(errc(38), err::NO_NODE, "delete /cap/none");
    assert_eq!(
        body(39),
        &Response::Children(strings(&["eph-0000000000", "w", "box", "acl", "ttl", "ttlseq-0000000004"]))
    );
    for x in 47..=49 {
        let Response::Multi(results) = body(x) else { panic!("multi reply: {:?}", body(x)) };
        assert!(results.iter().all(|r| *r == OpResult::Delete), "{results:?}");
    }
    let close = cap.exchanges.last().expect("close");
    assert_eq!((close.op, close.header.err, &close.body), (op::CLOSE_SESSION, err::OK, &Response::Empty));
    assert_ne!(session, 0);
}

#[test]
fn zkcli_notifications_have_xid_minus_one_and_the_event() {
    let cap = decode(ZKCLI);
    let got: Vec<(i32, &str)> = cap.notifications.iter().map(|(_, k, _, p)| (*k, p.as_str())).collect();
    let d = event::NODE_DELETED;
    assert_eq!(
        got,
        [
            (event::NODE_DATA_CHANGED, "/cap"),  // get -w /cap, then set
            (event::NODE_CREATED, "/cap/w"),     // the persistent recursive watch on /cap
            (event::NODE_CREATED, "/cap/after"), // ... re-set by setWatches2 after the reconnect
            (d, "/cap/after"),
            (d, "/cap/box/item"),
            (d, "/cap/ttlseq-0000000004"),
            (d, "/cap/ttl"),
            (d, "/cap/acl"),
            (d, "/cap/box"),
            (d, "/cap/w"),
            (d, "/cap/eph-0000000000"),
            (d, "/cap"),
        ]
    );
    for (h, _, state, _) in &cap.notifications {
        // ZooKeeper 3.8 sends notifications with zxid -1 (Baton sends the
        // zxid of the change; the Java client does not read it).
        assert_eq!(*h, ReplyHeader { xid: xid::NOTIFICATION, zxid: -1, err: err::OK });
        assert_eq!(*state, event::SYNC_CONNECTED);
    }
}

#[test]
fn java_client_requests_decode_to_what_it_sent() {
    let cap = decode(JAVA);
    assert_xids(&cap);
    assert_zxids(&cap);
    assert!(cap.null_buffers.is_empty(), "{:?}", cap.null_buffers);
    assert_eq!(cap.handshakes.len(), 1);
    let h = &cap.handshakes[0];
    assert_eq!((h.req.timeout_ms, h.req.session_id, h.req.last_zxid_seen), (10000, 0, 0));
    assert_eq!((h.resp.timeout_ms, h.resp.passwd.len()), (10000, 16));
    let get = |path: &str| Request::GetData { path: path.into(), watch: false };
    let want = vec![
        create(op::CREATE2, "/j", "j0", open_acl(), create_mode::PERSISTENT, None),
        create(op::CREATE2, "/j/e-", "", open_acl(), create_mode::EPHEMERAL_SEQUENTIAL, None),
        Request::Exists { path: "/j".into(), watch: true },
        Request::SetData { path: "/j".into(), data: b"j1".to_vec(), version: 0 },
        Request::GetChildren { op: op::GET_CHILDREN2, path: "/j".into(), watch: false },
        Request::GetChildren { op: op::GET_CHILDREN, path: "/j".into(), watch: false },
        Request::Multi(vec![
            create(op::CREATE, "/j/m", "m", open_acl(), create_mode::PERSISTENT, None),
            create(op::CREATE_TTL, "/j/t", "t", open_acl(), create_mode::PERSISTENT_WITH_TTL, Some(60000)),
            Request::SetData { path: "/j".into(), data: b"j2".to_vec(), version: 1 },
            Request::Check { path: "/j".into(), version: 2 },
            Request::Delete { path: "/j/m".into(), version: 0 },
        ]),
        Request::Multi(vec![
            create(op::CREATE, "/j/n", "n", open_acl(), create_mode::PERSISTENT, None),
            Request::Check { path: "/j".into(), version: 7 },
            Request::Delete { path: "/j/t".into(), version: -1 },
        ]),
        Request::MultiRead(vec![
            Request::GetChildren { op: op::GET_CHILDREN, path: "/j".into(), watch: false },
            get("/j"),
            get("/j/none"),
        ]),
        Request::Exists { path: "/j/none".into(), watch: true },
        Request::CheckWatches { path: "/j/none".into(), kind: WATCHER_DATA },
        Request::Delete { path: "/j/t".into(), version: -1 },
        Request::CloseSession,
    ];
    let got: Vec<Request> = cap.exchanges.iter().map(|e| e.req.clone()).collect();
    assert_eq!(got, want);
}

#[test]
fn java_client_replies_decode_as_the_server_meant_them() {
    let cap = decode(JAVA);
    let session = cap.handshakes[0].resp.session_id;
    let body = |x| &by_xid(&cap, x).body;
    let Response::PathStat(p, s) = body(1) else { panic!("create2 reply: {:?}", body(1)) };
    assert_eq!((p.as_str(), s.czxid, s.mzxid, s.data_length), ("/j", by_xid(&cap, 1).header.zxid, s.czxid, 2));
    let Response::PathStat(p, s) = body(2) else { panic!("create2 reply: {:?}", body(2)) };
    assert_eq!((p.as_str(), s.ephemeral_owner), ("/j/e-0000000000", session), "an ephemeral's owner is the session");
    let Response::Stat(s) = body(3) else { panic!("exists reply: {:?}", body(3)) };
    assert_eq!((s.version, s.num_children, s.cversion, s.data_length), (0, 1, 1, 2));
    let Response::Stat(s) = body(4) else { panic!("setData reply: {:?}", body(4)) };
    assert_eq!(s.version, 1);
    assert!(matches!(body(5), Response::Children2 { children, .. } if *children == strings(&["e-0000000000"])));
    assert_eq!(body(6), &Response::Children(strings(&["e-0000000000"])));

    // A multi: create answers with a path, createTTL with path and stat
    // (sent as a create2 result), setData with a stat, check and delete
    // with nothing.
    let Response::Multi(r) = body(7) else { panic!("multi reply: {:?}", body(7)) };
    assert_eq!(r.len(), 5);
    assert_eq!(r[0], OpResult::Create { path: "/j/m".into() });
    assert!(matches!(&r[1], OpResult::Create2 { path, stat } if path == "/j/t" && stat.data_length == 1));
    assert!(matches!(&r[2], OpResult::SetData { stat } if stat.version == 2));
    assert_eq!((&r[3], &r[4]), (&OpResult::Check, &OpResult::Delete));

    // A multi that fails: the header says OK, each result says what
    // happened (0 before the failed op, RUNTIME_INCONSISTENCY after).
    let failed = by_xid(&cap, 8);
    assert_eq!(failed.header.err, err::OK);
    assert_eq!(
        failed.body,
        Response::Multi(vec![
            OpResult::Error { err: err::OK },
            OpResult::Error { err: err::BAD_VERSION },
            OpResult::Error { err: err::RUNTIME_INCONSISTENCY },
        ])
    );

    // multiRead: a missing node is an error result, not a failed reply.
    let Response::Multi(r) = body(9) else { panic!("multiRead reply: {:?}", body(9)) };
    assert_eq!(r.len(), 3);
    assert_eq!(r[0], OpResult::GetChildren { children: strings(&["e-0000000000", "t"]) });
    assert!(matches!(&r[1], OpResult::GetData { data, stat } if data == b"j2" && stat.version == 2));
    assert_eq!(r[2], OpResult::Error { err: err::NO_NODE });

    assert_eq!(by_xid(&cap, 10).header.err, err::NO_NODE);
    assert_eq!((by_xid(&cap, 11).header.err, body(11)), (err::OK, &Response::Empty), "checkWatches");

    let got: Vec<(i32, &str)> = cap.notifications.iter().map(|(_, k, _, p)| (*k, p.as_str())).collect();
    assert_eq!(got, [(event::NODE_DATA_CHANGED, "/j")]);
}

/// Baton's encoder, given the logical reply (not the decoded bytes), builds
/// the frames ZooKeeper sent: a create2 reply, an exists stat, a failed
/// multi, a notification, the connect response.
#[test]
fn batons_encoder_builds_the_captured_layouts() {
    let text_frames = frames(JAVA);
    let server = |label: &str, nth: usize| -> &[u8] {
        &text_frames
            .iter()
            .filter(|f| !f.from_client && f.label == label)
            .nth(nth)
            .unwrap_or_else(|| panic!("no server frame {label} #{nth}"))
            .bytes
    };
    let cap = decode(JAVA);
    let create2 = by_xid(&cap, 1);
    let Response::PathStat(_, stat) = &create2.body else { panic!("create2") };
    // The stat of a fresh node: everything from its creation.
    let mut want = *stat;
    want.mzxid = want.czxid;
    want.pzxid = want.czxid;
    (want.version, want.cversion, want.aversion, want.ephemeral_owner, want.num_children) = (0, 0, 0, 0, 0);
    want.data_length = 2;
    want.mtime = want.ctime;
    let ours = Response::encode(
        ReplyHeader { xid: 1, zxid: create2.header.zxid, err: err::OK },
        &Response::PathStat("/j".into(), want),
    );
    assert_eq!(ours, server("create2", 0));

    let exists = by_xid(&cap, 3);
    let Response::Stat(s) = exists.body else { panic!("exists") };
    let ours = Response::encode(exists.header, &Response::Stat(s));
    assert_eq!(ours.len(), 16 + 68, "header + Stat");
    assert_eq!(ours, server("exists", 0));

    let ours = Response::encode(
        ReplyHeader { xid: 8, zxid: by_xid(&cap, 8).header.zxid, err: err::OK },
        &Response::Multi(vec![
            OpResult::Error { err: err::OK },
            OpResult::Error { err: err::BAD_VERSION },
            OpResult::Error { err: err::RUNTIME_INCONSISTENCY },
        ]),
    );
    assert_eq!(ours, server("multi", 1));

    assert_eq!(jute::notification(-1, event::NODE_DATA_CHANGED, "/j"), server("notification", 0));

    let h = &cap.handshakes[0].resp;
    let ours = ConnectResponse {
        protocol_version: 0,
        timeout_ms: 10000,
        session_id: h.session_id,
        passwd: h.passwd.clone(),
        read_only: false,
    }
    .encode();
    assert_eq!(ours, server("connect", 0));
}

/// What the two captures exercise, so a re-recorded fixture that lost an
/// opcode fails here.
#[test]
fn the_captures_cover_these_opcodes() {
    let mut seen = BTreeSet::new();
    for text in [ZKCLI, JAVA] {
        for e in decode(text).exchanges {
            seen.insert(e.op);
            if let Request::Multi(ops) | Request::MultiRead(ops) = &e.req {
                seen.extend(ops.iter().map(Request::op));
            }
        }
    }
    let want: BTreeSet<i32> = [
        op::CREATE,
        op::DELETE,
        op::EXISTS,
        op::GET_DATA,
        op::SET_DATA,
        op::GET_ACL,
        op::SET_ACL,
        op::GET_CHILDREN,
        op::SYNC,
        op::PING,
        op::GET_CHILDREN2,
        op::CHECK,
        op::MULTI,
        op::CREATE2,
        op::RECONFIG,
        op::CHECK_WATCHES,
        op::REMOVE_WATCHES,
        op::CREATE_CONTAINER,
        op::CREATE_TTL,
        op::MULTI_READ,
        op::AUTH,
        op::SET_WATCHES2,
        op::GET_EPHEMERALS,
        op::GET_ALL_CHILDREN_NUMBER,
        op::ADD_WATCH,
        op::WHO_AM_I,
        op::CLOSE_SESSION,
    ]
    .into_iter()
    .collect();
    assert_eq!(seen, want);
}
