//! baton-jepsen: Jepsen's method, in Rust, for Baton. What a history
//! means is decided by the checkers in the `baton-checker` crate
//! (`checker/`); this crate runs the processes, the faults and the clients
//! that record it. The benchmark against Baton's rivals, etcd and
//! ZooKeeper, is another product: the `baton-bench` crate (`bench/`),
//! which uses this one ([`db`], [`nemesis`], [`record`], [`door`]'s
//! ZooKeeper helpers, the plots); this crate never uses it.
//!
//! # Layout
//! - The harness (`baton-jepsen test`):
//!   - [`db`]: batond processes; [`proxy`]: a fault-injecting proxy on
//!     every link; [`nemesis`]: the fault schedule.
//!   - [`record`]: shared run state and the recorder ([`record::Run::op`]).
//!   - [`door`]: the door the workload clients come through (`--door`):
//!     the native client, a ZooKeeper client through the ZooKeeper port
//!     with ZooKeeper's recipes, or ([`cli_door`]) `baton lock` and
//!     `baton elect` processes.
//!   - [`workloads`]: one file per workload (`workloads/register.rs`,
//!     `lock.rs`, `election.rs`, `session.rs`, `rwlock.rs`, `semaphore.rs`), its client
//!     loop beside the call into its checker.
//!   - [`runner`]: one test run end to end; [`report`]: latency and rate
//!     plots, and the timeline page (`report/timeline.rs`).
//! - Shared with the benchmark (`baton-bench`): [`plot`] (the font and
//!   drawing a PNG into place, for the harness's plots and the benchmark's
//!   compare.png and scale-<dim>.png); [`cli`].
//! - `main.rs`: the command line; [`cli`]: what it shares with
//!   `baton-bench`'s (the runtime, Ctrl-C, the verdict's exit code).

pub mod cli;
pub mod cli_door;
pub mod db;
pub mod door;
pub mod nemesis;
pub mod plot;
pub use baton_kit::proxy;
pub mod record;
pub mod report;
pub mod runner;
pub mod workloads;
