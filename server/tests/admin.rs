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

mod sim;

use std::time::Duration;

use baton_proto::{request, ErrorCode, ListUsersReq, SnapshotReq};
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
