//! Fuzz target `zk_frame`: arbitrary bytes as one frame on the
//! ZooKeeper-compatible port (`baton_proto::jute`).
//!
//! The first frame of a connection is a `ConnectRequest`; every later one
//! is a request header and body. The input is tried as both.
//!
//! Invariants: no panic, whatever the bytes; and whatever decodes encodes
//! to bytes that decode to the same request (the codec has one meaning for
//! each value, so the server and the fuzz-found inputs agree on it).
#![no_main]

use baton_proto::jute::{ConnectRequest, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = ConnectRequest::decode(data) {
        assert_eq!(ConnectRequest::decode(&c.encode()).ok(), Some(c));
    }
    if let Ok((xid, op, req)) = Request::decode(data) {
        assert_eq!(req.op(), op);
        let again = Request::decode(&req.encode(xid)).expect("a decoded request encodes to a decodable one");
        assert_eq!(again, (xid, op, req));
    }
});
