//! Baton's wire types, generated from `proto/baton.proto` by prost.
//!
//! One file defines every message on both ports (client and peer), the Raft
//! log's `Command`, and the state machine's snapshot. Framing (a 4-byte
//! big-endian length before each message) lives with the code that reads
//! sockets; this crate only knows messages.
#![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]

include!(concat!(env!("OUT_DIR"), "/baton.rs"));

/// Applied entries a healthy member may be behind its commit index.
pub const HEALTHY_APPLY_LAG: u64 = 1000;

/// The health rule (`GET /health` on a member, `baton health`): a member is
/// healthy when it is the leader or has heard from one within an election
/// timeout, and has applied within [`HEALTHY_APPLY_LAG`] entries of its
/// commit index. `Err` says why not.
pub fn health(s: &StatusResp) -> Result<(), String> {
    if s.leader_id == 0 || !s.leader_contact {
        return Err(format!("member {} has no contact with a leader (role {}, term {})", s.id, s.role, s.term));
    }
    let lag = s.commit_index.saturating_sub(s.applied_index);
    if lag > HEALTHY_APPLY_LAG {
        return Err(format!(
            "member {} has applied {} of {} committed entries ({lag} behind, at most {HEALTHY_APPLY_LAG})",
            s.id, s.applied_index, s.commit_index
        ));
    }
    Ok(())
}

pub mod acl;
pub mod auth;
pub mod jute;
pub mod net;
pub mod tls;

/// The framing used on both ports: a 4-byte big-endian length, then the
/// message. Frames over `max_frame` bytes are refused by the reader.
pub fn codec(max_frame: usize) -> tokio_util::codec::LengthDelimitedCodec {
    tokio_util::codec::LengthDelimitedCodec::builder().length_field_length(4).max_frame_length(max_frame).new_codec()
}

/// `ClientFrame { request: Some(req.clone()) }` encoded, without the
/// clone: a `ClientFrame` is its one field, so its bytes are the request's
/// field 1 (key, length, the request).
pub fn client_frame_bytes(req: &Request) -> bytes::Bytes {
    let mut buf = Vec::with_capacity(prost::encoding::message::encoded_len(1, req));
    prost::encoding::message::encode(1, req, &mut buf);
    buf.into()
}

/// What a port that is not a client port answers a Baton client that
/// dialled it by mistake: if `frame` (the first frame read, without its
/// length) is a client request, a whole `ServerFrame` (with its 4-byte
/// length) answering it `BAD_REQUEST` with [`NOT_A_CLIENT_PORT`] and what
/// the port is (`this`: "a ZooKeeper port"). None for anything else:
/// ZooKeeper's connect request starts with a zero byte, which no protobuf
/// message does, and a peer hello has no field above 7 (a request's body
/// is field 10 and up).
pub fn not_a_client_port(frame: &[u8], this: &str) -> Option<bytes::Bytes> {
    use prost::Message;
    let req = ClientFrame::decode(frame).ok()?.request?;
    req.body.as_ref()?;
    let resp = Response {
        id: req.id,
        error: ErrorCode::BadRequest as i32,
        message: format!("{NOT_A_CLIENT_PORT}: this is {this}"),
        ..Default::default()
    };
    let body = ServerFrame { frame: Some(server_frame::Frame::Response(resp)) }.encode_to_vec();
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Some(out.into())
}

/// The words of [`not_a_client_port`]'s answer (the client looks for them).
pub const NOT_A_CLIENT_PORT: &str = "not a Baton client port";

/// A `PeerFrame` holding a raft message of `raft_len` bytes that `write`
/// appends: field `raft`'s key and length, then the message written
/// straight after them (one buffer, not a message buffer copied into a
/// frame's).
pub fn peer_frame_raft_bytes(raft_len: usize, write: impl FnOnce(&mut Vec<u8>)) -> bytes::Bytes {
    let key = u64::from(PEER_FRAME_RAFT_FIELD) << 3 | 2;
    let mut buf = Vec::with_capacity(prost::encoding::encoded_len_varint(key) + 10 + raft_len);
    prost::encoding::encode_varint(key, &mut buf);
    prost::encoding::encode_varint(raft_len as u64, &mut buf);
    let start = buf.len();
    write(&mut buf);
    debug_assert_eq!(buf.len() - start, raft_len, "the raft message's size changed while written");
    buf.into()
}

/// Field number of `PeerFrame.raft` (proto/baton.proto).
const PEER_FRAME_RAFT_FIELD: u32 = 2;

/// Largest peer frame (a snapshot of the whole tree travels in one).
pub const MAX_PEER_FRAME: usize = 1024 * 1024 * 1024;

/// Largest client frame a server accepts by default (4 MiB).
pub const DEFAULT_MAX_FRAME: usize = 4 * 1024 * 1024;
/// Largest node data (1 MiB), as ZooKeeper's jute.maxbuffer default.
pub const MAX_DATA: usize = 1024 * 1024;
/// Longest path in bytes.
pub const MAX_PATH: usize = 4096;

impl ErrorCode {
    /// True when a request that failed with this code may nevertheless have
    /// been applied (the request was sent and its outcome is unknown).
    pub fn is_ambiguous(self) -> bool {
        matches!(self, ErrorCode::Timeout | ErrorCode::LeaderChanged | ErrorCode::Internal)
    }
}

/// Checks a node path: absolute, no empty segment, no trailing slash, no
/// `.` or `..` segment, no NUL, at most [`MAX_PATH`] bytes. `/` is valid.
pub fn validate_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("path is empty".into());
    }
    if path.len() > MAX_PATH {
        return Err(format!("path is {} bytes, over {MAX_PATH}", path.len()));
    }
    if !path.starts_with('/') {
        return Err(format!("path {path:?} is not absolute"));
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(format!("path {path:?} ends with '/'"));
    }
    for seg in path[1..].split('/') {
        if seg.is_empty() {
            return Err(format!("path {path:?} has an empty segment"));
        }
        if seg == "." || seg == ".." {
            return Err(format!("path {path:?} has a relative segment"));
        }
        if seg.chars().any(|c| c == '\0' || c.is_control()) {
            return Err(format!("path {path:?} has a control character"));
        }
    }
    Ok(())
}

/// A queue node's place in its queue: the sequence number in the last 10
/// characters of its name (u64::MAX when they are not digits), then the
/// name. Recipes sort a queue by it; a FIRST watch (watches.rs) is due when
/// its node has the lowest key among its siblings.
pub fn queue_key(name: &str) -> (u64, &str) {
    let seq = name
        .len()
        .checked_sub(10)
        .and_then(|at| name.get(at..))
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse().ok())
        .unwrap_or(u64::MAX);
    (seq, name)
}

/// The parent of a valid path other than `/`.
pub fn parent_of(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// A client request that reached a peer or ZooKeeper port is answered
    /// "not a Baton client port"; a peer hello (fields 1-7) and a
    /// ZooKeeper connect request (its first byte is zero) never are.
    #[test]
    fn only_a_client_request_is_told_it_reached_the_wrong_port() {
        let req = Request {
            id: 2,
            body: Some(request::Body::CreateSession(CreateSessionReq { timeout_ms: 10_000 })),
            ..Default::default()
        };
        let frame = client_frame_bytes(&req);
        let reply = not_a_client_port(&frame, "a ZooKeeper port").expect("a client request is answered");
        assert_eq!(u32::from_be_bytes(reply[..4].try_into().expect("4 bytes")) as usize, reply.len() - 4);
        let Some(server_frame::Frame::Response(r)) = ServerFrame::decode(&reply[4..]).expect("a server frame").frame
        else {
            panic!("a response")
        };
        assert_eq!((r.id, r.error), (2, ErrorCode::BadRequest as i32));
        assert_eq!(r.message, "not a Baton client port: this is a ZooKeeper port");
        let hello = PeerHello {
            from: 2,
            cluster_version: 9,
            cluster_id: "c".into(),
            to: 1,
            to_joined: true,
            incarnation: 77,
            to_incarnation: 78,
        };
        let hello = PeerFrame { frame: Some(peer_frame::Frame::Hello(hello)) }.encode_to_vec();
        assert!(not_a_client_port(&hello, "a Baton peer port").is_none(), "a real hello is left alone");
        let zk_connect = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x75, 0x30];
        assert!(not_a_client_port(&zk_connect, "a ZooKeeper port").is_none());
        assert!(not_a_client_port(b"garbage", "a ZooKeeper port").is_none());
    }

    /// The clone-free encoders write the bytes prost's own would.
    #[test]
    fn frames_encoded_without_a_copy_are_the_same_bytes() {
        let req = Request {
            id: 7,
            seq: 3,
            first_watch_id: 9,
            body: Some(request::Body::Create(CreateOp {
                path: "/q/n-".into(),
                data: bytes::Bytes::from(vec![5u8; 300]),
                ..Default::default()
            })),
            ..Default::default()
        };
        let plain = ClientFrame { request: Some(req.clone()) }.encode_to_vec();
        assert_eq!(client_frame_bytes(&req)[..], plain[..]);
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let raft = vec![0xabu8; len];
            let plain = PeerFrame { frame: Some(peer_frame::Frame::Raft(raft.clone().into())) }.encode_to_vec();
            let direct = peer_frame_raft_bytes(len, |b| b.extend_from_slice(&raft));
            assert_eq!(direct[..], plain[..], "raft message of {len} bytes");
        }
    }

    #[test]
    fn paths() {
        for ok in ["/", "/a", "/a/b", "/a-1/b_2/c.d"] {
            assert!(validate_path(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a", "/a/", "//a", "/a//b", "/./a", "/a/..", "/a\0b"] {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
        assert!(validate_path(&format!("/{}", "x".repeat(MAX_PATH))).is_err());
        assert_eq!(parent_of("/a"), Some("/"));
        assert_eq!(parent_of("/a/b"), Some("/a"));
        assert_eq!(parent_of("/"), None);
    }
}
