//! The cluster kit: one way to start `batond` members, shared by the
//! integration tests (`baton-tests`), the Jepsen harness (`baton-jepsen`)
//! and `batond cluster`.
//!
//! # Layout
//! - [`ports`]: free loopback ports, distinct within a cluster.
//! - [`bins`]: where `batond`, `baton` and `batond-faulty` are.
//! - [`member`]: a member's spec (its `batond` command line) and its
//!   process (start, SIGTERM stop with a bound, kill -9, pause, exit code,
//!   one log file).
//! - [`status`]: a sessionless status request, and [`status::wait_leader`].
//! - [`proxy`]: a fault-injecting TCP proxy, for links the harness cuts.
//! - [`cluster`]: members on free ports, links direct or through proxies,
//!   restarted on other ports when a port was taken meanwhile.
//! - [`stores`]: the stores a lock protects and the lock services
//!   compared (a private PostgreSQL, Redis, MariaDB), for the fence tests
//!   and the lock comparison.
//! - [`supervise`]: `batond cluster`'s watch over its members (a start
//!   that fails says so; a member that dies is started again).
//!
//! Invariants: everything listens and connects on 127.0.0.1 only; every
//! wait is bounded; a process the kit started is killed when its owner is
//! dropped.
//!
//! Deliberately not here: certificates (the caller makes them, with
//! `baton_server::certs::Authority`, and hands the kit each member's TLS
//! flags and a client TLS configuration) and sessions (the kit depends on
//! neither the server nor the client library, so `batond` can use it).

pub mod bins;
pub mod cluster;
pub mod member;
pub mod ports;
pub mod proxy;
pub mod status;
pub mod stores;
pub mod supervise;

pub use bins::{locate, Bin};
pub use cluster::{Cluster, ClusterSpec, Links, Member, Tls};
pub use member::{stop_all, Join, MemberSpec, Process};
pub use ports::{distinct_ports, free_port, Ports};
pub use status::{status, wait_leader};
