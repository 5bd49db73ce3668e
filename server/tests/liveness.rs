//! Liveness rules the simulator can play (`sim/mod.rs`: real drivers, a
//! manual clock, a seeded network and disk).
//!
//! - A leader keeps its one live follower while that follower's writes are
//!   slow: the follower answers heartbeats at once, not behind its write
//!   (driver/ready.rs, the rule on messages filed "after persisting"). A
//!   1M-node snapshot stored on a follower held its answers ~600 ms, and
//!   the leader stepped down (docs/scaling.md).

mod sim;

use std::time::Duration;

use raft::StateRole;
use sim::{Opts, Sim};

/// The role and term of member `m`.
fn role(s: &Sim, m: u64) -> (StateRole, u64) {
    s.members[&m].driver.as_ref().expect("member is running").raft_role()
}

#[test]
fn a_slow_disk_on_the_last_live_follower_costs_no_election() {
    for seed in 1..=5u64 {
        let mut s = Sim::new(seed, Opts::default());
        let leader = s.await_leader(Duration::from_secs(5)).expect("a leader within 5 s");
        let (_, term) = role(&s, leader);
        let down = (1..=3).find(|m| *m != leader).expect("3 members");
        let live = (1..=3).find(|m| *m != leader && *m != down).expect("3 members");
        s.crash(down);
        // Every write now takes 1.2 s: over two election timeouts (500 ms).
        s.opts.disk_delay_us = (1_200_000, 1_200_000);
        s.run_for(Duration::from_secs(10));
        assert_eq!(role(&s, leader), (StateRole::Leader, term), "seed {seed}: the leader lost its follower");
        assert_eq!(role(&s, live), (StateRole::Follower, term), "seed {seed}: the follower left the term");
    }
}
