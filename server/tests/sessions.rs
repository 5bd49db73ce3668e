//! Deterministic tests of the session layer: findings S1-S7 and L1 of the
//! "Sessions you can bet a lock on" review, and S8 (found in CI), each as a script on the
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
    assert!(
        !s.session_exists(leader, sid) || s.leader() != Some(leader),
        "the majority expired the session\n{}",
        s.report()
    );
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

fn faulty(f: impl FnOnce(&mut Faults)) -> Opts {
    let mut faults = Faults::default();
    f(&mut faults);
    Opts { faults, ..Opts::default() }
}

// ---------------------------------------------------------------- S2

/// The leader is paused for 2.5 T right after the client's keepalive went
/// out (so no touch of its session waits in the leader's queue); a new
/// leader takes over and vouches for the client through a follower; the
/// old leader resumes with stale deadlines, working through its queue a
/// few inputs per turn.
fn s2_run(opts: Opts) -> Sim {
    // Long enough to outlast an election plus the failed leader's last
    // keepalive period.
    let opts = Opts { session_ms: 6000, max_inputs_per_turn: 4, ..opts };
    let t = ms(6000);
    let (mut s, leader, follower) = cluster(3, opts);
    let c = s.add_client("a", vec![follower]);
    assert!(s.await_connected(c, ms(3000)), "client connects\n{}", s.report());
    s.run_for(t / 2);
    let sent = s.clients[c].last_keepalive_sent;
    while s.clients[c].last_keepalive_sent == sent {
        s.run_for(ms(1));
    }
    s.run_for(ms(60));
    s.pause(leader, t * 5 / 2);
    s.run_for(t * 4);
    s
}

#[test]
fn t20_s2_a_leader_resuming_from_a_long_pause_expires_nothing() {
    let s = s2_run(Opts::default());
    assert_clean(&s);
    let sid = s.clients[0].session;
    for m in 1..=3 {
        assert!(s.session_exists(m, sid), "member {m} lost the live session\n{}", s.report());
    }
    assert_eq!(s.client_state(0), "Connected", "{}", s.report());
}

#[test]
fn t21_s2_planted_expiry_from_the_stale_role_is_caught() {
    let s = s2_run(faulty(|f| f.expire_from_stale_role = true));
    assert!(!s.violations.is_empty(), "the planted S2 fault went unnoticed:\n{}", s.report());
}

/// Liveness: the clients of a leader that hangs (paused for 2 T) find the
/// new leader and keep their sessions (a new leader keeps every session at
/// least T/2 after its election; a client leaves a member that leaves a
/// keepalive unanswered for T/3).
#[test]
fn t22_the_clients_of_a_hung_leader_keep_their_sessions() {
    for (seed, session_ms) in [(30, 1000), (31, 1000), (35, 1000), (36, 2000), (32, 3000), (33, 3000), (34, 5000)] {
        let t = ms(session_ms);
        let (mut s, leader, _) = cluster(seed, Opts { session_ms: session_ms as u32, ..Opts::default() });
        let mut eps = vec![1, 2, 3];
        eps.retain(|m| *m != leader);
        eps.insert(0, leader);
        let c = s.add_client("a", eps);
        assert!(s.await_connected(c, ms(3000)));
        s.run_for(t);
        s.pause(leader, t * 2);
        s.run_for(t * 3);
        assert_clean(&s);
        let sid = s.clients[c].session;
        let alive = (1..=3).filter(|m| s.session_exists(*m, sid)).count();
        assert_eq!(alive, 3, "seed {seed}, T = {session_ms} ms: the session was lost\n{}", s.report());
        assert_eq!(s.client_state(c), "Connected", "seed {seed}\n{}", s.report());
    }
}

/// Liveness, as the harness found it at T = 1 s: the leader's peer links
/// are cut; clients of the two healthy members (one of them tries the
/// cut-off member next) keep their sessions through the election.
#[test]
fn t23_clients_of_the_majority_keep_their_sessions_when_the_leader_is_cut_off() {
    for seed in 40..46 {
        let (mut s, leader, _) = cluster(seed, Opts::default());
        let others: Vec<u64> = (1..=3).filter(|m| *m != leader).collect();
        let mut clients = Vec::new();
        for (i, home) in others.iter().enumerate() {
            // Next in line after the home member: the cut-off leader.
            let c = s.add_client(&format!("c{i}"), vec![*home, leader, others[1 - i]]);
            clients.push(c);
        }
        for c in &clients {
            assert!(s.await_connected(*c, ms(3000)));
        }
        s.run_for(T);
        s.isolate_peers(leader);
        s.run_for(T * 4);
        assert_clean(&s);
        for c in clients {
            let sid = s.clients[c].session;
            assert!(s.session_exists(others[0], sid), "seed {seed}: client {c} lost its session\n{}", s.report());
            assert_eq!(s.client_state(c), "Connected", "seed {seed}\n{}", s.report());
        }
    }
}

// ---------------------------------------------------------------- S3

/// A session expires on the majority while member `cut` is cut off and
/// still has it; then an attach to `cut` with the right secret.
fn s3_run(opts: Opts) -> (Sim, Option<baton_proto::Response>) {
    let (mut s, leader, follower) = cluster(4, opts);
    let c = s.add_client("a", vec![leader]);
    assert!(s.await_connected(c, ms(3000)), "client connects\n{}", s.report());
    let (sid, secret) = s.client_session(c);
    s.run_for(ms(200));
    s.isolate_peers(follower);
    s.clients[c].alive = false;
    s.run_for(T * 3);
    assert!(!s.session_exists(leader, sid), "the majority expired the session\n{}", s.report());
    assert!(s.session_exists(follower, sid), "the cut-off member still has it");
    let mut rc = s.raw_conn(follower);
    let attach = baton_proto::AttachReq { session_id: sid, secret, last_zxid: 0, watches: vec![] };
    let r = s.raw_call(&mut rc, baton_proto::request::Body::Attach(attach), T * 2);
    (s, r)
}

#[test]
fn t30_s3_a_cut_off_member_does_not_resume_an_expired_session() {
    let (s, r) = s3_run(Opts::default());
    let r = r.expect("an answer");
    assert_ne!(r.error, 0, "attach on a cut-off member succeeded\n{}", s.report());
}

#[test]
fn t31_s3_planted_attach_from_local_state_succeeds_there() {
    let (_, r) = s3_run(faulty(|f| f.attach_from_local_state = true));
    assert_eq!(r.expect("an answer").error, 0, "the planted S3 fault did not show");
}

// ---------------------------------------------------------------- S4

/// The client talks only to the leader, whose peer links are then cut: it
/// is deposed but does not know yet.
fn s4_run(seed: u64, opts: Opts) -> Sim {
    let (mut s, leader, _) = cluster(seed, opts);
    let c = s.add_client("a", vec![leader]);
    assert!(s.await_connected(c, ms(3000)), "client connects\n{}", s.report());
    s.run_for(T);
    s.isolate_peers(leader);
    s.run_for(T * 4);
    let sid = s.clients[c].session;
    let other = (1..=3).find(|m| *m != leader).expect("3 members");
    assert!(!s.session_exists(other, sid), "the majority expired the session\n{}", s.report());
    s
}

/// The seeds S4 runs on. Whether the planted twin shows depends on the
/// schedule (where the deposed leader's last keepalive round falls): it
/// showed in 9 of seeds 1-12 once election countdowns got one draw per
/// restart (t85), and in fewer with raft-rs's appends batched. Every seed
/// must be clean on the real server, and the twin must be caught in one.
const S4_SEEDS: [u64; 6] = [1, 2, 3, 7, 8, 9];

#[test]
fn t40_s4_a_deposed_leader_does_not_keep_its_clients_connected() {
    for seed in S4_SEEDS {
        assert_clean(&s4_run(seed, Opts::default()));
    }
}

#[test]
fn t41_s4_planted_keepalives_without_a_quorum_are_caught() {
    let runs: Vec<Sim> =
        S4_SEEDS.iter().map(|&seed| s4_run(seed, faulty(|f| f.keepalive_without_quorum = true))).collect();
    let caught = runs.iter().filter(|s| !s.violations.is_empty()).count();
    assert!(caught > 0, "the planted S4 fault went unnoticed in every seed:\n{}", runs[0].report());
}

// ---------------------------------------------------------------- S7

/// The ReadIndex contexts a follower sends before and after a restart.
/// raft-rs answers a ReadIndex by its context, and an answer sent to the
/// old process can reach the new one (the leader's queue reconnects): a
/// context reused after a restart can serve a new read at an index taken
/// before it arrived.
fn s7_contexts(opts: Opts) -> (Vec<u8>, Vec<u8>) {
    use baton_proto::request::Body as B;
    let (mut s, _leader, follower) = cluster(6, opts);
    let get = || B::Get(baton_proto::ReadReq { path: "/".into(), stale: false, watch: None });
    let mut r1 = s.raw_conn(follower);
    assert!(s.raw_call(&mut r1, get(), T).is_some_and(|r| r.error == 0));
    s.crash(follower);
    s.restart(follower);
    s.run_for(T);
    let mut r2 = s.raw_conn(follower);
    assert!(s.raw_call(&mut r2, get(), T * 2).is_some_and(|r| r.error == 0), "{}", s.report());
    let mine: Vec<Vec<u8>> = s.read_contexts.iter().filter(|(m, _)| *m == follower).map(|(_, c)| c.clone()).collect();
    assert!(mine.len() >= 2, "two reads, two contexts: {mine:?}");
    (mine[0].clone(), mine[mine.len() - 1].clone())
}

#[test]
fn t70_s7_read_index_contexts_differ_across_a_restart() {
    let (before, after) = s7_contexts(Opts::default());
    assert_ne!(before, after);
}

#[test]
fn t71_s7_planted_context_counter_restarting_at_one_repeats_a_context() {
    let (before, after) = s7_contexts(faulty(|f| f.read_ctx_restarts = true));
    assert_eq!(before, after, "the planted S7 fault did not show");
}

// ---------------------------------------------------------------- S8

/// A client creates its session through a follower while the leader's disk
/// is slow (600 ms a write): the followers' acks commit the `NewSession`
/// entry, the follower applies it and answers, and the client's first
/// keepalives reach the leader before the leader has applied the session
/// itself (found by tests/zookeeper_acl in CI: a ZooKeeper client's
/// first connect failed with SESSION_EXPIRED). The leader must answer BUSY
/// until it applies it, never SESSION_EXPIRED.
fn s8_run(opts: Opts) -> Sim {
    let (mut s, leader, follower) = cluster(8, opts);
    s.opts.disk_delay_of.insert(leader, (600_000, 600_000));
    let c = s.add_client("a", vec![follower]);
    assert!(s.await_connected(c, ms(3000)), "client connects\n{}", s.report());
    s.run_for(T * 3);
    assert_eq!(s.leader(), Some(leader), "the slow leader kept leading\n{}", s.report());
    s
}

#[test]
fn t50_s8_a_session_the_leader_has_not_applied_yet_is_not_expired() {
    let s = s8_run(Opts::default());
    assert_clean(&s);
    assert!(!s.clients[0].expired, "a live session answered SESSION_EXPIRED\n{}", s.report());
    assert_eq!(s.client_state(0), "Connected", "{}", s.report());
}

#[test]
fn t51_s8_planted_not_yet_applied_expired_ends_the_new_session() {
    let s = s8_run(faulty(|f| f.not_yet_applied_expired = true));
    assert!(s.clients[0].expired, "the planted fault did not show\n{}", s.report());
}

// ---------------------------------------------------------------- L2

/// Elections after a leader crash when every member ticks in step (members
/// started together) and the election timeout is two ticks: the survivors
/// must not split their votes forever. Found by tests/limits.rs l20 in CI:
/// the driver randomized an election countdown only when a tick restarted
/// it, not when a message did (a rejected vote, a new term), so two
/// candidates whose ticks were in step timed out together every time.
/// Returns the seeds whose survivors elected no leader within 5 s.
fn l2_stalled_seeds() -> Vec<u64> {
    let opts = Opts {
        election_ticks: 2,
        heartbeat_ticks: 1,
        aligned_ticks: true,
        net_delay_us: (100, 300),
        ..Opts::default()
    };
    let mut stalled = Vec::new();
    for seed in 0..20 {
        let (mut s, leader, _) = cluster(seed, opts.clone());
        s.crash(leader);
        if s.await_leader(ms(5000)).is_none() {
            if std::env::var_os("BATON_SIM_REPORT").is_some() {
                let roles: Vec<String> = s
                    .members
                    .values()
                    .map(|m| format!("{}: {:?}", m.id, m.driver.as_ref().map(|d| d.raft_role())))
                    .collect();
                eprintln!("seed {seed}: {roles:?}\n{}", s.report());
            }
            stalled.push(seed);
        }
    }
    stalled
}

#[test]
fn t85_l2_members_ticking_in_step_elect_a_new_leader() {
    let stalled = l2_stalled_seeds();
    assert!(stalled.is_empty(), "no leader within 5 s after the leader crashed, seeds {stalled:?}");
}

// ---------------------------------------------------------------- L1

/// A client dies; then the leader crashes and restarts every 0.6 T, so no
/// leadership lasts a whole session timeout. Returns whether the session
/// expired within 6 T, and how many leader changes there were.
fn l1_run(opts: Opts) -> (Sim, bool, usize) {
    let (mut s, leader, _) = cluster(7, opts);
    let c = s.add_client("a", vec![leader]);
    assert!(s.await_connected(c, ms(3000)), "client connects\n{}", s.report());
    s.run_for(T);
    let sid = s.clients[c].session;
    s.clients[c].alive = false;
    let mut changes = 0;
    let mut expired = false;
    for _ in 0..10 {
        if let Some(l) = s.leader() {
            s.crash(l);
            s.run_for(ms(100));
            s.restart(l);
            changes += 1;
        }
        s.run_for(T * 6 / 10 - ms(100));
        if (1..=3).all(|m| !s.session_exists(m, sid)) {
            expired = true;
            break;
        }
    }
    (s, expired, changes)
}

#[test]
fn t80_l1_a_dead_clients_session_expires_under_constant_leader_changes() {
    let (s, expired, changes) = l1_run(Opts::default());
    assert!(expired, "not expired after {changes} leader changes\n{}", s.report());
    assert_clean(&s);
}

#[test]
fn t81_l1_planted_fresh_deadlines_only_never_expire_it() {
    let (_, expired, changes) = l1_run(faulty(|f| f.no_deadline_rebuild = true));
    assert!(!expired && changes >= 8, "the planted L1 fault did not show ({changes} changes)");
}

// ---------------------------------------------------------------- randomized

/// One randomized run: 3 members, 3 clients (one polling stale reads),
/// 30 simulated seconds of faults (peer isolation, partitions, one-way
/// cuts, pauses of any member or the leader for up to 3 T, crashes and
/// restarts, frozen clients), then 10 s healed. Checks the session
/// guarantee all along, and that the replicas agree at the end.
fn random_run(seed: u64, faults: Faults) -> Result<(), String> {
    let s = random_sim(seed, faults);
    if !s.violations.is_empty() {
        return Err(s.report());
    }
    let dumps = s.dumps();
    let top = dumps.values().map(|(a, _)| *a).max().unwrap_or(0);
    let at_top: Vec<&String> = dumps.values().filter(|(a, _)| *a == top).map(|(_, d)| d).collect();
    if at_top.len() < 2 || at_top.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!("replicas disagree or lag at the end: {:?}\n{}", dumps.keys(), s.report()));
    }
    if s.leader().is_none() {
        return Err(format!("no leader 10 s after healing\n{}", s.report()));
    }
    Ok(())
}

fn random_sim(seed: u64, faults: Faults) -> Sim {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    let session_ms = [1000u32, 2000, 3000][rng.gen_range(0..3)];
    let t = ms(session_ms as u64);
    let opts = Opts { session_ms, max_inputs_per_turn: rng.gen_range(2..64), faults, ..Opts::default() };
    let mut s = Sim::new(seed, opts);
    for i in 0..3 {
        let mut eps = vec![1, 2, 3];
        eps.rotate_left(i);
        let c = s.add_client(&format!("c{i}"), eps);
        s.clients[c].stale_poll = i == 0;
    }
    let end = s.now + ms(30_000);
    let mut crashed: Vec<u64> = Vec::new();
    while s.now < end {
        s.run_for(ms(rng.gen_range(500..2500)));
        match rng.gen_range(0..7) {
            0 => s.isolate_peers(rng.gen_range(1..=3)),
            1 => {
                let a = rng.gen_range(1..=3);
                let b = a % 3 + 1;
                s.cut(a, b);
            }
            2 => {
                let a = rng.gen_range(1..=3);
                let b = a % 3 + 1;
                s.cut_oneway(a, b);
            }
            3 => {
                let m = if rng.gen_bool(0.5) { s.leader().unwrap_or(1) } else { rng.gen_range(1..=3) };
                let d = t * rng.gen_range(3..30) / 10;
                s.pause(m, d);
            }
            4 => {
                let m = rng.gen_range(1..=3);
                s.crash(m);
                crashed.push(m);
            }
            5 => {
                let c = rng.gen_range(0..3);
                s.clients[c].alive = false;
            }
            _ => s.cut_client(rng.gen_range(0..3)),
        }
        s.run_for(ms(rng.gen_range(300..4000)));
        s.heal();
        for m in crashed.drain(..) {
            s.restart(m);
        }
        for c in 0..3 {
            s.clients[c].alive = true;
        }
    }
    s.run_for(ms(10_000));
    s
}

/// A seed is the whole run: the same seed twice gives the same trace, the
/// same client states and the same replicas, byte for byte.
#[test]
fn t92_a_seed_replays_exactly() {
    for seed in [3, 17] {
        let a = random_sim(seed, Faults::default());
        let b = random_sim(seed, Faults::default());
        assert!(a.trace.len() > 10, "a run does something");
        assert_eq!(a.trace, b.trace, "seed {seed}: traces differ");
        assert_eq!(a.dumps(), b.dumps(), "seed {seed}: states differ");
        let states = |s: &Sim| s.clients.iter().map(|c| c.states.clone()).collect::<Vec<_>>();
        assert_eq!(states(&a), states(&b));
    }
}

#[test]
fn t90_randomized_seeds_keep_the_session_guarantee() {
    if let Ok(seed) = std::env::var("BATON_SIM_SEED") {
        let seed: u64 = seed.parse().expect("BATON_SIM_SEED is a number");
        if let Err(e) = random_run(seed, Faults::default()) {
            panic!("seed {seed} failed:\n{e}");
        }
        return;
    }
    let seeds: u64 = std::env::var("BATON_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let started = std::time::Instant::now();
    let failed: Vec<(u64, String)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2u64)
            .map(|w| {
                scope.spawn(move || {
                    (0..seeds)
                        .filter(|s| s % 2 == w)
                        .filter_map(|s| random_run(s, Faults::default()).err().map(|e| (s, e)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|h| h.join().expect("worker finishes")).collect()
    });
    println!("{seeds} seeds, 40 simulated seconds each, in {:.1?}; {} failed", started.elapsed(), failed.len());
    if let Some((seed, e)) = failed.first() {
        let seeds: Vec<u64> = failed.iter().map(|(s, _)| *s).collect();
        panic!("seeds {seeds:?} failed; replay one with BATON_SIM_SEED={seed}:\n{e}");
    }
}

/// The randomized run is only worth its seeds if it catches the planted
/// session bugs on its own, without a script.
#[test]
fn t91_randomized_runs_catch_the_planted_session_faults() {
    type Plant = (&'static str, fn(&mut Faults));
    let planted: [Plant; 4] = [
        ("contact-from-local-answers", |f| f.contact_from_local_answers = true),
        ("keepalive-without-quorum", |f| f.keepalive_without_quorum = true),
        ("expire-from-stale-role", |f| f.expire_from_stale_role = true),
        ("expire-without-grace", |f| f.expire_without_grace = true),
    ];
    for (name, set) in planted {
        let mut faults = Faults::default();
        set(&mut faults);
        let caught = (0..200).find(|seed| random_run(*seed, faults).is_err());
        println!("{name}: caught by seed {caught:?}");
        assert!(caught.is_some(), "{name} went unnoticed in 200 seeds");
    }
}
