//! Fuzz target `peer_frame`: arbitrary bytes as one peer frame.
//!
//! `server/src/transport.rs` decodes each frame of a peer connection as a
//! `PeerFrame` (prost); a `raft` payload is then decoded by raft-rs's
//! protobuf 2.28 (`Message::merge_from_bytes`). The input is tried both
//! ways: as a `PeerFrame` (and its raft payload, if any), and as a bare raft
//! message, so that the fuzzer reaches the protobuf 2 decoder without having
//! to learn the prost envelope first.
//!
//! In a member, these decoders run only on connections from peers: after
//! the hello (and, with the transport work landing in parallel, after mutual
//! TLS). protobuf 2.28 is known to recurse without bound on nested unknown
//! groups (RUSTSEC-2024-0437, see docs/advisories.md): a crash found there
//! is that advisory, not a new bug.
//!
//! Invariant: no panic, whatever the bytes.
#![no_main]

use baton_proto::{peer_frame, PeerFrame};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::Message;

/// What the transport does with a raft payload: decode, then read the
/// fields it checks (`from`, `to`), and re-encode as the sender would.
fn raft_message(bytes: &[u8]) {
    let mut m = Message::default();
    if m.merge_from_bytes(bytes).is_ok() {
        let _ = (m.from, m.to, m.get_msg_type(), m.get_entries().len(), m.get_snapshot().get_data().len());
        let _ = m.write_to_bytes();
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = PeerFrame::decode(data) {
        match frame.frame {
            Some(peer_frame::Frame::Raft(b)) => raft_message(&b),
            Some(other) => {
                // Session frames go to the driver as they are; re-encoding
                // touches every field.
                let _ = PeerFrame { frame: Some(other) }.encode_to_vec();
            }
            None => {}
        }
    }
    raft_message(data);
});
