//! baton-jepsen: Jepsen's method, in Rust, for Baton, and the
//! side-by-side with etcd and ZooKeeper. What a history means is decided
//! by the checkers in the `baton-checker` crate (`checker/`); this crate
//! runs the processes, the faults and the clients that record it.
//!
//! # Layout
//! - The harness (`baton-jepsen test`):
//!   - [`db`]: batond processes; [`proxy`]: a fault-injecting proxy on
//!     every link; [`nemesis`]: the fault schedule.
//!   - [`record`]: shared run state and the recorder ([`record::Run::op`]).
//!   - [`door`]: the door the workload clients come through (`--door`):
//!     the native client, or a ZooKeeper client through the ZooKeeper
//!     port with ZooKeeper's recipes.
//!   - [`workloads`]: one file per workload (`workloads/register.rs`,
//!     `lock.rs`, `election.rs`, `session.rs`), its client loop beside the
//!     call into its checker.
//!   - [`runner`]: one test run end to end; [`report`]: latency and rate
//!     plots, timeline.html.
//! - [`side_by_side`]: the benchmark and comparison against etcd and
//!   ZooKeeper (`baton-jepsen bench`, `compare`), the adapters
//!   (`side_by_side/targets/`) and etcd's lock-safety test
//!   (`baton-jepsen test --target etcd`); the peers' scripts are in
//!   `jepsen/peers/`.
//! - `main.rs`: the command line, one function per subcommand.

pub mod db;
pub mod door;
pub mod nemesis;
pub use baton_kit::proxy;
pub mod record;
pub mod report;
pub mod runner;
pub mod side_by_side;
pub mod workloads;
