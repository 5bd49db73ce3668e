//! baton-jepsen: Jepsen's method, in Rust, for Baton.
//!
//! # Layout
//! - [`history`]: operations as recorded (invoke / ok / fail / info).
//! - [`linearizability`]: a WGL-style checker with P-compositionality.
//! - [`report`]: latency and rate plots, timeline.html.
//! - [`db`]: batond processes; [`proxy`]: a fault-injecting proxy on every
//!   link; [`nemesis`]: the fault schedule.
//! - [`record`]: shared run state; [`workloads`]: clients and checkers;
//!   [`runner`]: one test run end to end.

pub mod bench;
pub mod compare;
pub mod db;
pub mod nemesis;
pub mod peer_lock;
pub mod proxy;
pub mod record;
pub mod report;
pub mod runner;
pub mod targets;
pub mod workloads;
