//! Proving the checkers: each deliberate server bug must be caught (valid:
//! false, with the anomaly named) on the workload and nemesis that expose
//! it, and the same setups on the real server must be valid.
//!
//! Needs `batond` and `batond-faulty` built (`make build` does both).
//!
//! The session-contact faults (`contact-from-local-answers`,
//! `keepalive-without-quorum`, `expire-from-stale-role`) are caught by
//! `holder-connected-after-expiry`: a lock holder or leader whose client
//! still reported `Connected` after another session was granted the same
//! lock or leadership. They run with 1-2 s session timeouts, so the faults
//! show within seconds. Their exposure depends on timing (where the
//! holder's keepalives fall against the cut-off leader's step-down, the
//! order a resumed leader handles its tick and its peers' messages), so
//! they get more seeds.

use std::time::Duration;

use baton_checker::Validity;
use baton_jepsen::db::SESSION_MS;
use baton_jepsen::door::Door;
use baton_jepsen::nemesis::NemesisKind;
use baton_jepsen::runner::{run_test, Outcome, TestOpts};
use baton_jepsen::workloads::Workload;

/// One test setup.
#[derive(Clone, Copy, Debug)]
struct Setup {
    workload: Workload,
    nemesis: NemesisKind,
    secs: u64,
    /// Session timeout of the run's clients (ms).
    session_ms: u64,
    /// The door the workload clients come through.
    door: Door,
    /// Through the CLI door, planted: the held command leaves `baton`'s
    /// process group (jepsen/src/cli_door.rs).
    cli_leaves_group: bool,
}

fn setup(workload: Workload, nemesis: NemesisKind, secs: u64) -> Setup {
    Setup { workload, nemesis, secs, session_ms: SESSION_MS, door: Door::Native, cli_leaves_group: false }
}

async fn run(s: Setup, fault: Option<&str>, seed: u64) -> Outcome {
    // A harness error (not a verdict) gets one more try, with its reason shown.
    match try_run(s, fault, seed).await {
        Ok(o) => o,
        Err(e) => {
            println!("harness error (retrying once): {e:#}");
            try_run(s, fault, seed + 100).await.unwrap_or_else(|e| panic!("harness error: {e:#}"))
        }
    }
}

async fn try_run(s: Setup, fault: Option<&str>, seed: u64) -> anyhow::Result<Outcome> {
    let Setup { workload, nemesis, secs, session_ms, door, cli_leaves_group } = s;
    let dir = tempfile::Builder::new().prefix("baton-jepsen-").tempdir().expect("tempdir");
    let opts = TestOpts {
        workload,
        nemesis,
        time_limit: Duration::from_secs(secs),
        nodes: 3,
        concurrency: 5,
        seed,
        out: dir.path().to_path_buf(),
        server_faults: fault.map(|f| vec![f.to_string()]).unwrap_or_default(),
        session_timeout: Duration::from_millis(session_ms),
        tls: false,
        door,
        zk_reads: baton_jepsen::door::ZkReads::Sync,
        cli_leaves_group,
    };
    let o = run_test(opts).await;
    if std::env::var_os("BATON_JEPSEN_KEEP").is_some() {
        let kept = dir.keep();
        println!("kept {}", kept.display());
    }
    o
}

fn anomalies(o: &Outcome) -> Vec<String> {
    o.results
        .iter()
        .flat_map(|r| r.anomalies.iter())
        .filter_map(|a| a.get("anomaly").and_then(|x| x.as_str()).map(String::from))
        .collect()
}

/// Runs with the fault (up to three seeds: the schedule is random, and a
/// loaded machine can stretch one run's timing past the fault's window; a
/// 2026-12-02 CI run missed stale-reads on two seeds while two builds ran
/// beside it) and asserts it is caught with `anomaly` named.
async fn caught(workload: Workload, nemesis: NemesisKind, secs: u64, fault: &str, anomaly: &str) {
    caught_in(setup(workload, nemesis, secs), &[1, 2, 3], fault, &[anomaly]).await
}

/// Runs `s` with the fault on each seed until it is caught with one of
/// `anomalies` named; panics if no seed catches it.
async fn caught_in(s: Setup, seeds: &[u64], fault: &str, wanted: &[&str]) {
    caught_with(s, seeds, Some(fault), wanted).await
}

/// [`caught_in`] for a server fault, or for none (`s` plants its bug
/// elsewhere: the CLI door's `cli_leaves_group`).
async fn caught_with(s: Setup, seeds: &[u64], fault: Option<&str>, wanted: &[&str]) {
    let mut seen = Vec::new();
    for &seed in seeds {
        let o = run(s, fault, seed).await;
        let names = anomalies(&o);
        if o.valid == Validity::Invalid && names.iter().any(|n| wanted.contains(&n.as_str())) {
            println!("caught {fault:?} on seed {seed}: {names:?}");
            return;
        }
        seen.push((seed, o.valid, names));
    }
    panic!("fault {fault:?} ({s:?}) not caught as {wanted:?}: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_stale_reads_are_caught_by_the_linearizability_checker() {
    caught(Workload::Register, NemesisKind::Partition, 20, "stale-reads", "not-linearizable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_ack_before_commit_is_caught_by_the_linearizability_checker() {
    caught(Workload::Register, NemesisKind::Leader, 20, "ack-before-commit", "not-linearizable").await;
}

/// Caught when a frozen holder resumes and writes with its old token
/// after a newer holder wrote. Since the pause nemesis freezes a waiter
/// instead of a holder half of the time (stop 45), fewer runs have one:
/// a CI run of 2026-12-07 missed it on seeds 1-3 (each caught it alone
/// here), so up to six seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_no_fence_check_is_caught_by_the_lock_checker() {
    let s = setup(Workload::Lock, NemesisKind::Pause, 20);
    caught_in(s, &[1, 2, 3, 4, 5, 6], "no-fence-check", &["fence-regression"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_grant_without_predecessor_is_caught_by_the_lock_checker() {
    caught(Workload::Lock, NemesisKind::None, 8, "grant-without-predecessor", "concurrent-holders").await;
}

/// The pushed grant woken by the wrong deletion: a waiter leaving from the
/// middle of the queue (one acquire in four gives up after 5-60 ms) has its
/// successor told it is first while the holder still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t41_first_to_successor_is_caught_by_the_lock_checker() {
    caught(Workload::Lock, NemesisKind::None, 8, "first-to-successor", "concurrent-holders").await;
}

/// The same bug in the election: a candidate leaves the middle of the
/// queue while a leader leads for several session timeouts, because the
/// pause nemesis froze it until its session expired or because it gave
/// up after 4 s; the next candidate is told it leads. Either way alone
/// catches it: with candidates that never give up (planted: a 60 s
/// campaign wait), the waiter freezes caught it on seed 1, and with the
/// waiter freezes removed too it went uncaught on seeds 1-3 (holder
/// freezes do not expose it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t42_first_to_successor_is_caught_by_the_election_checker() {
    let wanted = ["concurrent-holders", "holder-connected-after-expiry"];
    caught_in(setup(Workload::Election, NemesisKind::Pause, 20), &[1, 2, 3], "first-to-successor", &wanted).await;
}

/// The same bug through the read-write lock: a hold that sees no other
/// node is granted at once, so write holds overlap other holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t43_grant_without_predecessor_is_caught_by_the_rwlock_checker() {
    caught(Workload::RwLock, NemesisKind::None, 8, "grant-without-predecessor", "concurrent-holders").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_expire_without_grace_is_caught_by_the_session_checker() {
    caught(
        Workload::Session,
        NemesisKind::Leader,
        20,
        "expire-without-grace",
        "ephemeral-vanished-while-session-alive",
    )
    .await;
}

/// A member cut off from its peers vouches for its clients' sessions from
/// its own state: a lock holder talking to it stays `Connected` while the
/// majority expires its session and grants the lock to another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_contact_from_local_answers_is_caught_by_holder_states() {
    let s = Setup { session_ms: 1000, ..setup(Workload::Lock, NemesisKind::IsolatePeers, 30) };
    caught_in(s, &[1, 2], "contact-from-local-answers", &["holder-connected-after-expiry"]).await;
}

/// The same through a semaphore of two permits: the long holder on the
/// cut-off member stays `Connected` while the majority expires it and
/// grants its permit to a third, beside a second holder that is
/// `Connected` too (`baton_checker::semaphore`: all but one of the earlier
/// holders must have left `Connected`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t57_contact_from_local_answers_is_caught_by_the_semaphore_checker() {
    let s = Setup { session_ms: 1000, ..setup(Workload::Semaphore, NemesisKind::IsolatePeers, 30) };
    caught_in(s, &[1, 2], "contact-from-local-answers", &["holder-connected-after-expiry"]).await;
}

/// A leader cut off from its peers answers keepalives until check-quorum
/// deposes it (0.5-1 s): its leader client stays `Connected` past the
/// expiry the new leader commits. Caught only when the holder's last
/// vouched keepalive falls late enough before the step-down (about one
/// targeted isolation in two), so up to six seeds; even so it misses on
/// all six in a few percent of runs, too flaky for `make test`: run by
/// `make jepsen-faults-long`. The simulator's twin
/// (server/tests/sessions.rs, t41) proves it deterministically in
/// `make test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing-dependent; make jepsen-faults-long"]
async fn t52_keepalive_without_quorum_is_caught_by_holder_states() {
    let s = Setup { session_ms: 1000, ..setup(Workload::Election, NemesisKind::IsolatePeers, 40) };
    caught_in(s, &[1, 2, 3, 4, 5, 6], "keepalive-without-quorum", &["holder-connected-after-expiry"]).await;
}

/// A leader resuming from a pause of 1.5-3 session timeouts proposes
/// expiry from its stale deadlines. Only when it has already stepped its
/// new leader's messages in that turn is the proposal forwarded and
/// committed (about one resume in four at T = 2 s; never seen at T = 1 s,
/// where the tick always came first), expiring sessions whose clients are
/// `Connected` elsewhere. Every workload runs, so a live leader, lock
/// holder or session client is likely among them: caught by
/// `holder-connected-after-expiry` (a leader or holder still `Connected`
/// when the next was granted) or `ephemeral-vanished-while-session-alive`
/// (an undisturbed session read its own node gone). Timing-dependent like
/// t52: run by `make jepsen-faults-long`; the simulator's twin (t21) runs
/// in `make test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing-dependent; make jepsen-faults-long"]
async fn t53_expire_from_stale_role_is_caught_by_holder_states_or_the_session_checker() {
    let s = Setup { session_ms: 2000, ..setup(Workload::All, NemesisKind::PauseLeaderLong, 40) };
    let wanted = ["holder-connected-after-expiry", "ephemeral-vanished-while-session-alive"];
    caught_in(s, &[1, 2, 3, 4, 5, 6], "expire-from-stale-role", &wanted).await;
}

/// A member whose RocksDB recovers its WAL point-in-time (the default) and
/// reads no value checksums does not refuse a damaged data dir: it drops
/// the WAL's damaged tail (acknowledged entries, its vote) and crashes or
/// serves. The `corrupt` nemesis's storage check names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t54_lenient_storage_is_caught_by_the_storage_check() {
    caught(Workload::Register, NemesisKind::Corrupt, 15, "lenient-storage", "damaged-data-not-refused").await;
}

/// Through the ZooKeeper door (a real ZooKeeper client, ZooKeeper's lock
/// and election recipes): a member cut off from its peers that keeps
/// writing to its ZooKeeper clients (finding Z1: replies, events and ping
/// answers without a quorum-vouched keepalive) keeps a lock holder or
/// leader `Connected` while the majority expires its session and grants
/// the lock or leadership to another. Caught by
/// `holder-connected-after-expiry`, judged from the ZooKeeper client's own
/// state events, or by `ephemeral-vanished-while-session-alive` (a session
/// client kept `SyncConnected` by the cut-off member reads its ephemeral
/// gone once the member catches up). A CI run under load caught it on the
/// second seed only, so up to three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t55_zk_speak_unvouched_is_caught_through_the_zookeeper_door() {
    let s = Setup { door: Door::Zookeeper, ..setup(Workload::All, NemesisKind::IsolatePeers, 40) };
    let wanted = ["holder-connected-after-expiry", "ephemeral-vanished-while-session-alive"];
    caught_in(s, &[1, 2, 3], "zk-speak-unvouched", &wanted).await;
}

/// Through the CLI door (`baton lock`, `baton elect`), a held command that
/// leaves `baton`'s process group (planted, as a daemonizing command
/// would; before the keeper, every command did) runs on after
/// `kill-client` kills its `baton`: another leader is elected once the
/// session expires while the first one's command still runs. Caught by
/// `holder-connected-after-expiry` (a long leadership takes the kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t56_a_command_outliving_its_baton_is_caught_through_the_cli_door() {
    let s = Setup { door: Door::Cli, cli_leaves_group: true, ..setup(Workload::All, NemesisKind::KillClient, 30) };
    caught_with(s, &[1, 2, 3], None, &["holder-connected-after-expiry"]).await;
}

/// The CLI door on the real server and the real `baton`, under the client
/// kills and client freezes that target it (the mix of every nemesis runs
/// through it in `make jepsen-smoke`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t64_the_real_cli_is_valid_through_the_cli_door() {
    let cli = |s: Setup| Setup { door: Door::Cli, ..s };
    valid(&[cli(setup(Workload::All, NemesisKind::KillClient, 30)), cli(setup(Workload::All, NemesisKind::Pause, 30))])
        .await;
}

/// Every workload through the ZooKeeper door on the real server, under
/// the targeted faults the native door's t60 runs (the mix of every
/// nemesis runs through it in `make jepsen-smoke`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t61_the_real_server_is_valid_through_the_zookeeper_door() {
    let zk = |s: Setup, ms| Setup { door: Door::Zookeeper, ..short(s, ms) };
    valid(&[
        zk(setup(Workload::All, NemesisKind::IsolatePeers, 30), SESSION_MS),
        zk(setup(Workload::All, NemesisKind::PauseLeaderLong, 30), 2000),
    ])
    .await;
}

/// The real server is valid under the setups that catch the planted
/// faults above; split in three (t60, t62, t63) so that the workspace
/// stage's two test threads share them (one test of eight setups ran alone
/// for ~220 s).
async fn valid(setups: &[Setup]) {
    for &s in setups {
        let o = run(s, None, 1).await;
        assert_eq!(o.valid, Validity::Valid, "{s:?}: {:?}", anomalies(&o));
    }
}

/// With a short session timeout (ms).
fn short(s: Setup, ms: u64) -> Setup {
    Setup { session_ms: ms, ..s }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_the_real_server_is_valid_under_the_same_faults() {
    valid(&[
        setup(Workload::Register, NemesisKind::Partition, 20),
        setup(Workload::Lock, NemesisKind::Pause, 20),
        setup(Workload::Election, NemesisKind::Pause, 20),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t62_the_real_server_is_valid_with_members_cut_off() {
    valid(&[
        short(setup(Workload::Lock, NemesisKind::IsolatePeers, 30), 1000),
        short(setup(Workload::Election, NemesisKind::IsolatePeers, 30), 1000),
        short(setup(Workload::Semaphore, NemesisKind::IsolatePeers, 30), 1000),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t63_the_real_server_is_valid_through_long_pauses_membership_and_damaged_disks() {
    valid(&[
        short(setup(Workload::All, NemesisKind::PauseLeaderLong, 30), 2000),
        setup(Workload::Lock, NemesisKind::Membership, 20),
        setup(Workload::Register, NemesisKind::Corrupt, 15),
    ])
    .await;
}
