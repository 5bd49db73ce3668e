//! The side-by-side: Baton next to etcd 3.4 and ZooKeeper 3.8, the same
//! workloads through one interface, one cluster at a time. It measures,
//! and it shows what a peer's lock allows; Baton's own safety is the
//! harness's, except through the ZooKeeper port, which [`peer_lock`] and
//! [`peer_register`] check with the peers' lock test and the harness's
//! register checker.
//!
//! - [`targets`]: the [`targets::Target`] / [`targets::TargetClient`]
//!   interface and its three adapters; etcd's and ZooKeeper's clusters
//!   come from the scripts in `jepsen/peers/`, Baton's from [`crate::db`].
//! - [`bench`](mod@bench): the benchmark workloads, one run, medians of runs.
//! - [`compare`]: `baton-jepsen compare` (every workload on every target:
//!   compare.json, compare.md, compare.png) and `baton-jepsen bench` (one
//!   workload on one target).
//! - [`peer_lock`]: the lock-safety test against etcd (`baton-jepsen test
//!   --target etcd --workload lock`).
//! - [`peer_register`]: linearizability of reads and writes through
//!   Baton's ZooKeeper port under member faults (`baton-jepsen test
//!   --target baton-zk --workload register`).
//! - [`scale`]: `baton-jepsen scale`, how far one cluster goes, one
//!   dimension (nodes, sessions, watches, fan-out, lock queue, clients) at
//!   a time (scale.json, scale.md, scale-<dim>.png).

pub mod bench;
pub mod compare;
pub mod peer_lock;
pub mod peer_register;
pub mod scale;
pub mod targets;
