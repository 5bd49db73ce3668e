//! Deterministic tests of the session layer: findings S1-S7 and L1 of the
//! "Sessions you can bet a lock on" review, each as a script on the
//! simulator (`sim/mod.rs`: real drivers, a manual clock, a seeded
//! network), most with a twin that plants the bug and proves the check
//! catches it. Then a randomized run over many seeds.
//!
//! The planted twins need the deliberate bugs compiled in, so this file
//! builds only with the `fault-injection` feature: `make test` runs it as
//! `cargo test -p baton-server --features fault-injection --test sessions`.
//!
//! Replay one seed of the randomized test: `BATON_SIM_SEED=<n> cargo test
//! -p baton-server --features fault-injection --test sessions t90 --
//! --nocapture`.
#![cfg(feature = "fault-injection")]

mod sim;

use std::time::Duration;

use baton_server::faults::Faults;
use sim::{ContactRule, Opts, Sim};

const T: Duration = Duration::from_millis(1000);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A 3-member cluster with a leader, and a follower id.
fn cluster(seed: u64, opts: Opts) -> (Sim, u64, u64) {
    let mut s = Sim::new(seed, opts);
    let leader = s.await_leader(ms(5000)).expect("a leader within 5 s");
    let follower = (1..=3).find(|m| *m != leader).expect("3 members");
    (s, leader, follower)
}

fn assert_clean(s: &Sim) {
    assert!(s.violations.is_empty(), "guarantee violated:\n{}", s.report());
}

// ---------------------------------------------------------------- S1

/// A client polling stale reads on a member cut off from the leader.
fn s1_run(rule: ContactRule) -> Sim {
    let (mut s, leader, follower) = cluster(1, Opts::default());
    let c = s.add_client("a", vec![follower]);
    s.clients[c].stale_poll = true;
    s.clients[c].rule = rule;
    assert!(s.await_connected(c, ms(3000)), "client connects\n{}", s.report());
    s.isolate_peers(follower);
    s.run_for(T * 4);
    let sid = s.clients[c].session;
    assert!(!s.session_exists(leader, sid) || s.leader() != Some(leader), "the majority expired the session\n{}", s.report());
    s
}

#[test]
fn t10_s1_stale_reads_on_a_cut_off_member_do_not_keep_a_client_connected() {
    let s = s1_run(ContactRule::Keepalives);
    assert_clean(&s);
    assert_ne!(s.client_state(0), "Connected");
}

#[test]
fn t11_s1_planted_contact_from_any_answer_is_caught() {
    let s = s1_run(ContactRule::AnyAnswer);
    assert!(!s.violations.is_empty(), "the planted S1 rule went unnoticed:\n{}", s.report());
}

#[test]
fn t12_s1_planted_server_vouching_from_local_state_is_caught() {
    let opts = Opts { faults: Faults { contact_from_local_answers: true, ..Default::default() }, ..Opts::default() };
    let (mut s, _leader, follower) = cluster(2, opts);
    let c = s.add_client("a", vec![follower]);
    assert!(s.await_connected(c, ms(3000)));
    s.isolate_peers(follower);
    s.run_for(T * 4);
    assert!(!s.violations.is_empty(), "the planted server fault went unnoticed:\n{}", s.report());
}
