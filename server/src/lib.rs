//! `batond`, a Baton member.
//!
//! # Layout
//! - [`kv`]: the storage seam (RocksDB, or memory in tests).
//! - [`raft_store`]: raft-rs `Storage` over it: log, hard state, snapshots.
//! - [`state`]: the deterministic state machine (node tree, sessions,
//!   exactly-once replies, fences). No I/O, no clock.
//! - [`driver`]: the Raft driver, deterministic (no I/O, no clock): Ready
//!   handling, proposals, replies; with its pieces [`reads`] (ReadIndex),
//!   [`watches`] and [`sessions`] (liveness, expiry); the parts return
//!   [`effect`]s, which the driver carries out in one place.
//! - [`message`]: what flows between the driver and the I/O around it.
//! - [`node`]: the runtime loop (one thread, the wall clock) and
//!   [`syncer`] (the fsync thread).
//! - [`transport`]: peer TCP links; [`listener`]: client connections;
//!   [`batch`]: the batch-and-flush writer both use.
//! - [`member`]: one member assembled (data dir, ports, tasks, the loop),
//!   shared by `batond` and the tests; [`shutdown`]: the order in which a
//!   member stops.
//! - [`config`], [`logging`].
//!
//! See docs/architecture.md for the write and read paths end to end.

pub mod accept;
pub mod acl;
pub mod backup;
pub mod batch;
pub mod certs;
pub mod cluster;
pub mod config;
pub mod config_file;
pub mod driver;
pub mod effect;
pub mod faults;
pub mod http;
pub mod kv;
pub mod listener;
pub mod logging;
pub mod member;
pub mod membership;
pub mod memory;
pub mod message;
pub mod metrics;
pub mod node;
pub mod raft_store;
pub mod reads;
pub mod sessions;
pub mod settings;
pub mod shutdown;
pub mod state;
pub mod syncer;
pub mod transport;
pub mod view;
pub mod watches;
pub mod zk;
