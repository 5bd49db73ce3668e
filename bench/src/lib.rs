//! baton-bench: Baton next to its rivals, etcd 3.4 and ZooKeeper 3.8, the
//! same workloads through one interface, the targets' runs interleaved. It
//! measures, and it shows what a rival's lock allows; Baton's own safety
//! is the harness's (`baton-jepsen`, `jepsen/`), except through the
//! ZooKeeper port, which [`rival_lock`] and [`zk_port_register`] check
//! with the rivals' lock test and the harness's register checker.
//!
//! "Rival" is etcd or ZooKeeper, the services Baton is measured against;
//! "peer" keeps its one meaning, a Raft member of a cluster.
//!
//! This crate uses the harness (its processes [`baton_jepsen::db`], its
//! nemesis, recorder, ZooKeeper door helpers and plots); the harness never
//! uses this crate.
//!
//! # Layout
//! - [`targets`]: the [`targets::Target`] / [`targets::TargetClient`]
//!   interface and its adapters (Baton, etcd, ZooKeeper, Baton through its
//!   ZooKeeper port); etcd's and ZooKeeper's clusters come from the
//!   scripts in `bench/rivals/`, Baton's from [`baton_jepsen::db`].
//! - [`bench`](mod@bench): the benchmark workloads, one run, medians of runs.
//! - [`compare`]: `baton-bench compare` (every workload on every target:
//!   compare.json, compare.md, compare.png) and `baton-bench bench` (one
//!   workload on one target).
//! - [`cost`]: `baton-bench cost`, what one operation costs a Baton
//!   cluster (CPU, context switches, fsyncs, peer messages per type).
//! - [`rival_lock`]: the lock-safety test of a lock recipe with and
//!   without a fence, etcd's or ZooKeeper's through Baton's ZooKeeper port
//!   (`baton-bench lock-safety --target etcd|baton-zk`).
//! - [`zk_port_register`]: linearizability of reads and writes through
//!   Baton's ZooKeeper port under member faults (`baton-bench
//!   zk-register`).
//! - [`locks`]: `baton-bench locks`, the seeds' comparison: one stock
//!   count in PostgreSQL decremented under every lock kind the seeds name
//!   (PostgreSQL's, Redis's, Redlock, etcd's, ZooKeeper's, Baton's with and
//!   without a fence), under a paused holder (locks.json, locks.md; docs/locks-compared.md).
//! - [`scale`]: `baton-bench scale`, how far one cluster goes, one
//!   dimension (nodes, sessions, watches, fan-out, lock queue, clients) at
//!   a time (scale.json, scale.md, scale-<dim>.png).
//! - `main.rs`: the command line, one function per subcommand.

pub mod bench;
pub mod compare;
pub mod cost;
pub mod locks;
pub mod rival_lock;
pub mod scale;
pub mod targets;
pub mod zk_port_register;
