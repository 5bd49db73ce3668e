//! Admin power on a member that has not yet applied the cluster's settings
//! (settings.rs, "checked again"), played by the simulator (`sim/mod.rs`:
//! real drivers, a manual clock, a seeded network).
//!
//! Until a member has applied the settings record it follows its own
//! flags. A member whose flags name a superuser the record does not (a
//! misconfigured member, or one restarted from a checkpoint older than the
//! record) could therefore pass an admin request that the cluster refuses.
//! Backups and `list_users` wait for a ReadIndex, so by the time they are
//! served the member has applied the record: they are checked again then.
//! A membership change goes to the leader, which takes one only once it
//! has applied every entry before its term (the record among them).

mod sim;

use std::time::Duration;

use baton_proto::{member_change_req::Kind, request, ErrorCode, ListUsersReq, MemberChangeReq, SnapshotReq};
use baton_server::config::Config;
use raft::StateRole;
use sim::{Opts, Sim};

const T: Duration = Duration::from_millis(1000);

/// Members 1 and 2 name `user:root` the superuser (so the first leader,
/// one of them, records that); member 3's flags name `user:mallory`.
fn flags(id: u64, cfg: &mut Config) {
    cfg.open_admin = false;
    cfg.superusers = vec![if id == 3 { "user:mallory" } else { "user:root" }.to_string()];
}

/// A cluster whose leader has recorded the settings while member 3 was cut
/// off from the start; then the cut heals and the sim runs until member 3
/// follows the leader but has applied nothing (None if this seed's network
/// gave it the entries first).
fn member_3_behind(seed: u64) -> Option<Sim> {
    let mut s = Sim::new(seed, Opts { config_of: Some(flags), ..Opts::default() });
    s.isolate_peers(3);
    let leader = s.await_leader(T * 5).expect("a leader within 5 s");
    assert_ne!(leader, 3, "member 3 is cut off");
    s.run_for(T);
    let (_, term, applied) = s.member_role(leader).expect("the leader runs");
    // What member 3 applied alone (its bootstrap configuration).
    let alone = s.member_role(3).expect("member 3 runs").2;
    assert!(applied > alone, "the leader applied the cluster record: {applied} against {alone}\n{}", s.report());
    // The settings are seeded in the entry that sets the cluster id.
    let dumps = s.dumps();
    assert!(dumps[&leader].1.contains("\ncluster "), "the leader has the record\n{}", dumps[&leader].1);
    assert!(!dumps[&3].1.contains("\ncluster "), "member 3 has none\n{}", dumps[&3].1);
    s.heal();
    for _ in 0..2000 {
        s.run_for(Duration::from_millis(1));
        match s.member_role(3) {
            Some((StateRole::Follower, t, a)) if t == term && a == alone => return Some(s),
            Some((_, _, a)) if a > alone => return None,
            _ => {}
        }
    }
    panic!("member 3 did not follow the leader within 2 s of the heal\n{}", s.report());
}

/// mallory, a superuser by member 3's flags alone, asks member 3 for a
/// backup and for the user list while member 3 has not applied the
/// settings: both are refused `NO_AUTH` once they are served. Before the
/// second check, member 3 built and handed out the backup.
#[test]
fn a_member_behind_the_settings_grants_no_power_by_its_own_flags() {
    let mut played = 0;
    for seed in 1..=20u64 {
        let Some(mut s) = member_3_behind(seed) else { continue };
        played += 1;
        let mut rc = s.raw_conn_as(3, &["user:mallory"]);
        let backup = s.raw_send(&mut rc, request::Body::Snapshot(SnapshotReq { backup_id: 0, offset: 0 }));
        let users = s.raw_send(&mut rc, request::Body::ListUsers(ListUsersReq {}));
        for (what, id) in [("backup", backup), ("list_users", users)] {
            let r = s.raw_wait(&mut rc, id, T * 5);
            let r = r.unwrap_or_else(|| panic!("seed {seed}: no answer to the {what}\n{}", s.report()));
            assert_eq!(
                ErrorCode::try_from(r.error).ok(),
                Some(ErrorCode::NoAuth),
                "seed {seed}: mallory's {what} on member 3 was answered {r:?}\n{}",
                s.report()
            );
        }
        // Once caught up, member 3 follows the record: root may, mallory
        // may not, asked afresh.
        let mut root = s.raw_conn_as(3, &["user:root"]);
        let r = s.raw_call(&mut root, request::Body::ListUsers(ListUsersReq {}), T * 5);
        assert!(r.as_ref().is_some_and(|r| r.error == 0), "seed {seed}: root's list on member 3: {r:?}");
        let r = s.raw_call(&mut rc, request::Body::ListUsers(ListUsersReq {}), T * 5);
        assert_eq!(r.and_then(|r| ErrorCode::try_from(r.error).ok()), Some(ErrorCode::NoAuth), "seed {seed}");
        if played == 5 {
            break;
        }
    }
    assert!(played >= 3, "only {played} of 20 seeds left member 3 behind when asked");
}

/// Steps of the simulated clock fine enough to act between a leader's
/// election and its term's first commit.
const STEP: Duration = Duration::from_micros(100);

/// Member 1's flags name `user:mallory`, 2's and 3's `user:root`.
fn flags_1(id: u64, cfg: &mut Config) {
    flags(4 - id, cfg)
}

/// Member 1 leads with the settings record in its log but not applied:
/// the first leader (2 or 3, flags `root`) proposes the record while the
/// answers to it are held, so it is appended on both followers but
/// committed nowhere; the first leader is killed; member 1 wins the next
/// election (the lowest id campaigns first: driver/mod.rs), and the
/// answers to its term's first entry are held, so it cannot apply the
/// entries before its term. Returns the sim and the other member (None:
/// this seed elected another member).
fn member_1_leads_unapplied(seed: u64) -> Option<(Sim, u64)> {
    let mut s = Sim::new(seed, Opts { config_of: Some(flags_1), ..Opts::default() });
    // The first leader, and the last index of its log when elected (its
    // term's first entry).
    let mut first = None;
    for _ in 0..50_000 {
        s.run_for(STEP);
        first = (1..=3).find(|&m| s.member_role(m).is_some_and(|r| r.0 == StateRole::Leader));
        if first.is_some() {
            break;
        }
    }
    let leader = first.expect("a leader within 5 s");
    if leader == 1 {
        return None;
    }
    let other = 5 - leader;
    let term_start = s.member_last_index(leader).expect("the leader runs");
    // Once it has applied its term's first entry and both followers have
    // answered for it (their disk write and the way back: at most 5 ms
    // here), and before its next tick proposes the record, hold every
    // answer to it.
    let mut since = None;
    for _ in 0..10_000 {
        let applied = s.member_role(leader).expect("the leader runs").2;
        let both = [other, 1].iter().all(|&m| s.member_last_index(m).is_some_and(|i| i >= term_start));
        if applied >= term_start && both {
            since.get_or_insert(s.elapsed());
        }
        if since.is_some_and(|t| s.elapsed() >= t + Duration::from_millis(6)) {
            break;
        }
        s.run_for(STEP);
    }
    assert!(since.is_some(), "seed {seed}: the leader's first entry reached all within 1 s\n{}", s.report());
    if s.member_last_index(leader) != Some(term_start) {
        return None; // the record went out meanwhile
    }
    s.hold(other, leader);
    s.hold(1, leader);
    // The record is proposed and reaches both followers.
    for _ in 0..10_000 {
        let last = s.member_last_index(leader).expect("the leader runs");
        if last > term_start && s.member_last_index(other) == Some(last) && s.member_last_index(1) == Some(last) {
            break;
        }
        s.run_for(STEP);
    }
    let last = s.member_last_index(leader).expect("the leader runs");
    assert!(last > term_start, "seed {seed}: the leader proposed the record\n{}", s.report());
    assert_eq!(s.member_last_index(1), Some(last), "seed {seed}: member 1 has the record\n{}", s.report());
    for (m, (_, dump)) in s.dumps() {
        assert!(!dump.contains("\ncluster "), "seed {seed}: member {m} applied the record: it was never committed");
    }
    s.crash(leader);
    for _ in 0..100_000 {
        s.run_for(STEP);
        match (s.member_role(1), s.member_role(other)) {
            (_, Some((StateRole::Leader, _, _))) => return None,
            (Some((StateRole::Leader, _, applied)), _) => {
                s.hold(other, 1);
                let behind = applied < s.member_last_index(1).expect("member 1 runs");
                let unapplied = !s.dumps()[&1].1.contains("\ncluster ");
                return (behind && unapplied).then_some((s, other));
            }
            _ => {}
        }
    }
    panic!("seed {seed}: no leader within 10 s of the kill\n{}", s.report());
}

/// mallory, a superuser by member 1's flags alone, asks member 1, just
/// elected and not yet caught up, to move leadership: refused (retry), and
/// refused `NO_AUTH` once member 1 has applied the record, which root may.
/// Without that wait only raft-rs's own rule stood in the way (a new
/// leader refuses configuration changes until it has applied its log as
/// of its election: `BUSY`); with both off (planted, 2026-12-07), member 1
/// moved leadership for mallory at once.
#[test]
fn a_new_leader_takes_no_membership_change_before_it_has_applied_its_log() {
    let mut played = 0;
    for seed in 1..=40u64 {
        let Some((mut s, other)) = member_1_leads_unapplied(seed) else { continue };
        played += 1;
        let move_to = |id| {
            request::Body::MemberChange(MemberChangeReq {
                kind: Kind::MoveLeader as i32,
                member_id: id,
                ..Default::default()
            })
        };
        let mut rc = s.raw_conn_as(1, &["user:mallory"]);
        let r = s.raw_call(&mut rc, move_to(other), T / 4);
        let r = r.unwrap_or_else(|| panic!("seed {seed}: no answer to mallory's change\n{}", s.report()));
        assert_eq!(
            ErrorCode::try_from(r.error).ok(),
            Some(ErrorCode::NoLeader),
            "seed {seed}: mallory's change on member 1 before it caught up was answered {r:?}\n{}",
            s.report()
        );
        assert_eq!(s.member_role(1).map(|r| r.0), Some(StateRole::Leader), "seed {seed}: leadership stayed");
        // Member 1 catches up: it follows the record.
        s.release(other, 1);
        for _ in 0..20_000 {
            if s.dumps()[&1].1.contains("\ncluster ") {
                break;
            }
            s.run_for(STEP);
        }
        assert!(s.dumps()[&1].1.contains("\ncluster "), "seed {seed}: member 1 applied the record\n{}", s.report());
        if s.member_role(1).map(|r| r.0) != Some(StateRole::Leader) {
            continue; // it lost leadership while held; the refusal above is what this test is for
        }
        let r = s.raw_call(&mut rc, move_to(other), T);
        assert_eq!(r.and_then(|r| ErrorCode::try_from(r.error).ok()), Some(ErrorCode::NoAuth), "seed {seed}");
        let mut root = s.raw_conn_as(1, &["user:root"]);
        let r = s.raw_call(&mut root, move_to(other), T);
        assert!(r.as_ref().is_some_and(|r| r.error == 0), "seed {seed}: root's change on member 1: {r:?}");
        if played == 5 {
            break;
        }
    }
    assert!(played >= 3, "only {played} of 40 seeds elected member 1 before it applied the record");
}
