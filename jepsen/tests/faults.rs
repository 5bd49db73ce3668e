//! Proving the checkers: each deliberate server bug must be caught (valid:
//! false, with the anomaly named) on the workload and nemesis that expose
//! it, and the same setups on the real server must be valid.
//!
//! Needs `batond` and `batond-faulty` built (`make build` does both).

use std::time::Duration;

use baton_jepsen::nemesis::NemesisKind;
use baton_jepsen::runner::{run_test, Outcome, TestOpts};
use baton_jepsen::workloads::{Validity, Workload};

async fn run(workload: Workload, nemesis: NemesisKind, secs: u64, fault: Option<&str>, seed: u64) -> Outcome {
    // A harness error (not a verdict) gets one more try, with its reason shown.
    match try_run(workload, nemesis, secs, fault, seed).await {
        Ok(o) => o,
        Err(e) => {
            println!("harness error (retrying once): {e:#}");
            try_run(workload, nemesis, secs, fault, seed + 100).await.unwrap_or_else(|e| panic!("harness error: {e:#}"))
        }
    }
}

async fn try_run(
    workload: Workload,
    nemesis: NemesisKind,
    secs: u64,
    fault: Option<&str>,
    seed: u64,
) -> anyhow::Result<Outcome> {
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

/// Runs with the fault (up to two seeds: the schedule is random) and
/// asserts it is caught with `anomaly` named.
async fn caught(workload: Workload, nemesis: NemesisKind, secs: u64, fault: &str, anomaly: &str) {
    let mut seen = Vec::new();
    for seed in [1, 2] {
        let o = run(workload, nemesis, secs, Some(fault), seed).await;
        let names = anomalies(&o);
        if o.valid == Validity::False && names.iter().any(|n| n == anomaly) {
            return;
        }
        seen.push((seed, o.valid, names));
    }
    panic!("fault {fault} not caught as {anomaly}: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_stale_reads_are_caught_by_the_linearizability_checker() {
    caught(Workload::Register, NemesisKind::Partition, 20, "stale-reads", "not-linearizable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_ack_before_commit_is_caught_by_the_linearizability_checker() {
    caught(Workload::Register, NemesisKind::Leader, 20, "ack-before-commit", "not-linearizable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_no_fence_check_is_caught_by_the_lock_checker() {
    caught(Workload::Lock, NemesisKind::Pause, 20, "no-fence-check", "fence-regression").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_grant_without_predecessor_is_caught_by_the_lock_checker() {
    caught(Workload::Lock, NemesisKind::None, 8, "grant-without-predecessor", "concurrent-holders").await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_the_real_server_is_valid_under_the_same_faults() {
    for (w, n) in [(Workload::Register, NemesisKind::Partition), (Workload::Lock, NemesisKind::Pause)] {
        let o = run(w, n, 20, None, 1).await;
        assert_eq!(o.valid, Validity::True, "{w:?} under {n:?}: {:?}", anomalies(&o));
    }
}
