//! `batond`, a Baton member.
//!
//! # Layout
//! - [`kv`]: the storage seam (RocksDB, or memory in tests).
//! - [`raft_store`]: raft-rs `Storage` over it: log, hard state, snapshots.
//! - [`state`]: the deterministic state machine (node tree, sessions,
//!   exactly-once replies, fences). No I/O, no clock.
//! - [`node`]: the Raft driver thread: Ready loop, proposals, ReadIndex,
//!   watches, session expiry.
//! - [`transport`]: peer TCP links; [`listener`]: client connections.
//! - [`config`], [`logging`].
//!
//! See docs/architecture.md for the write and read paths end to end.

pub mod config;
pub mod faults;
pub mod kv;
pub mod listener;
pub mod logging;
pub mod node;
pub mod raft_store;
pub mod state;
pub mod transport;
