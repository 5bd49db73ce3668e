//! Linearizability of reads and writes through Baton's ZooKeeper port
//! under member faults (`baton-bench zk-register --nemesis
//! none|pause|kill|partition|leader|all [--zk-reads
//! sync|linearizable|local]`). Baton is the system under test; the
//! rivals play no part, but the test sits beside the rival lock test
//! whose clients and fault turns it shares.
//!
//! Cluster: 3 `batond` members with their ZooKeeper ports, peer links
//! through the kit's proxies (so a member can be cut off) and the
//! harness's test timing (`baton_jepsen::db`). `--zk-reads linearizable` starts
//! them with `--zk-linearizable-reads`; `--server-fault` runs
//! `batond-faulty` with that deliberate bug.
//!
//! Clients: `concurrency` (at least 3) sessions of the `zookeeper-client`
//! crate, each homed on one member (slot i talks to member i mod 3 only, as
//! the native harness's slots are homed, so a member cut off keeps its
//! clients), session timeout 4 s. The second half are readers (9 reads in
//! 10), the first half read half the time. Each op picks one of
//! [`KEYS`] keys `/jepsen-zk/k<n>`, created as "0" (version 0) before the
//! run:
//! - `read`: `--zk-reads sync`: `sync` then `getData` (ZooKeeper's
//!   linearizable read, docs/zookeeper.md); `linearizable`: plain
//!   `getData` on members started with `--zk-linearizable-reads`; `local`:
//!   plain `getData` on default members, ZooKeeper's own reads, which are
//!   only sequentially consistent (a member cut off from the leader serves
//!   its own state): a control, expected to fail under `partition`.
//!   Ok `{"value", "version"}` (the Stat's version).
//! - `write` (3 in 10 of a non-reader's ops): `setData` with version -1,
//!   invoke `{"value"}` (unique across the run), ok `{"version"}`.
//! - `cas` (2 in 10): `setData` with the version this session last saw
//!   on the key (0 if none), invoke `{"expected_version", "value"}`;
//!   `BADVERSION` is `fail`.
//!
//! Outcomes, as the native register workload records them
//! (`baton_jepsen::record::Run::op`): a read that errs or gets no answer in 5 s
//! is `fail` (it had no effect). A write is `fail` only on an answer that
//! says it was not applied (`BADVERSION`, `NONODE`, `NODEEXISTS`,
//! `NOAUTH`, `BADARGUMENTS`, `INVALIDACL`, `UNIMPLEMENTED`, ...: the list
//! is `targets::zookeeper::write_surely_failed`, which the lock test's
//! client shares); anything else (`CONNECTIONLOSS`, which the client
//! reports when the port closes the connection on an ambiguous Baton
//! error or no leader; `SESSIONEXPIRED`, which the client gives every
//! pending request when the session ends, answered or not; no answer in
//! 5 s) is `info`:
//! the process is retired (a new process id), and that client only reads
//! for the next second, which keeps a cut-off member's clients reading
//! without piling up indeterminate writes. A session that ended is
//! replaced by a new one.
//!
//! Nemesis, one fault at a time on a random member, held 3-6 s, then
//! healed and 2-4 s of quiet (the rival lock test's turns,
//! `rival_lock::member_fault`): `kill` kills -9 a member and starts it
//! again, `pause` SIGSTOPs and SIGCONTs it, `partition` cuts every peer
//! link of it (its clients still reach it), `all` takes turns: kill,
//! SIGSTOP, cut; `leader` takes the same turns on the current leader.
//!
//! Checkers:
//! - `register`: `baton_checker::register` (per key, WGL search) from "0"
//!   at version 0, exactly as for the native register workload.
//! - `protocol`: no op ended in an error code no ZooKeeper server sends
//!   (the crate's "unexpected error code", e.g. a CONNECTION_LOSS reply:
//!   ZooKeeper's clients make that one up when a connection drops, and
//!   `zookeeper-client` does not expect it on the wire). The port once
//!   replied -4 to writes and syncs with no leader; the planted
//!   `zk-loss-reply` fault brings that back and `leader` catches it
//!   (rivals.rs t46).
//!
//! `results.json` has both results, the ops by kind and outcome and the
//! faults; `history.jsonl` the history. The run is valid when both are.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_checker::history::{History, OpType};
use baton_checker::Validity;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use zookeeper_client::{Client, Error};

use super::rival_lock::{fault_target, member_fault, MemberFault};
use super::targets::baton::BatonOpts;
use super::targets::baton_zk::BatonZkTarget;
use super::targets::zookeeper::{ensure_path, off_protocol_text, persistent, write_surely_failed};
use super::targets::{Kind, Target};
use baton_jepsen::door::ZkReads;
use baton_jepsen::nemesis::NemesisKind;
use baton_jepsen::record::{Call, OpError, Run};
use baton_jepsen::workloads::register::{check, KEYS};

const ROOT: &str = "/jepsen-zk";
/// Session timeout of the clients.
const SESSION: Duration = Duration::from_secs(4);
/// An op with no answer by then is given up.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// After an indeterminate write, a client only reads for this long.
const READS_ONLY: Duration = Duration::from_secs(1);

pub struct ZkPortRegisterOpts {
    /// baton-zk.
    pub target: Kind,
    pub nemesis: NemesisKind,
    pub time_limit: Duration,
    pub concurrency: usize,
    pub seed: u64,
    pub out: PathBuf,
    pub reads: ZkReads,
    /// Deliberate bugs (`batond-faulty`), e.g. `stale-reads`.
    pub server_faults: Vec<String>,
}

/// The fault turn `n` of `nemesis`.
fn turn(nemesis: NemesisKind, n: usize) -> MemberFault {
    match nemesis {
        NemesisKind::Kill => MemberFault::Kill,
        NemesisKind::Pause => MemberFault::Stop,
        NemesisKind::Partition => MemberFault::Isolate,
        _ => [MemberFault::Kill, MemberFault::Stop, MemberFault::Isolate][n % 3],
    }
}

/// Whether a write that failed with `e` may still have been applied (see
/// the module doc: only an answer that says otherwise is definite).
fn write_may_have_happened(e: &Error) -> bool {
    !write_surely_failed(e)
}

fn key_path(k: &str) -> String {
    format!("{ROOT}/{k}")
}

async fn read(c: &Client, path: &str, reads: ZkReads) -> Result<(i32, Value), OpError> {
    let body = async {
        if reads == ZkReads::Sync {
            c.sync(path).await?;
        }
        c.get_data(path).await
    };
    match tokio::time::timeout(OP_TIMEOUT, body).await {
        Err(_) => Err(OpError::TimedOut),
        Ok(Err(e)) => Err(OpError::Zk { error: e.to_string(), ambiguous: false }),
        Ok(Ok((data, stat))) => {
            let v: Option<i64> = std::str::from_utf8(&data).ok().and_then(|t| t.parse().ok());
            Ok((stat.version, json!({"value": v, "version": stat.version})))
        }
    }
}

async fn write(c: &Client, path: &str, value: i64, expected: Option<i32>) -> Result<(i32, Value), OpError> {
    let data = value.to_string();
    match tokio::time::timeout(OP_TIMEOUT, c.set_data(path, data.as_bytes(), expected)).await {
        Err(_) => Err(OpError::Unconfirmed("no answer in 5 s")),
        Ok(Err(e)) => Err(OpError::Zk { ambiguous: write_may_have_happened(&e), error: e.to_string() }),
        Ok(Ok(stat)) => Ok((stat.version, json!({"version": stat.version}))),
    }
}

async fn connect(endpoint: &str) -> Option<Client> {
    let c = Client::connector().with_session_timeout(SESSION).connect(endpoint);
    tokio::time::timeout(Duration::from_secs(10), c).await.ok()?.ok()
}

/// One client slot, homed on `endpoint` (module doc).
async fn worker(run: Arc<Run>, endpoint: String, reads: ZkReads, reader: bool, next: Arc<AtomicI64>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !run.stopped() {
        let Some(c) = connect(&endpoint).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut p = run.new_process();
        let mut versions: HashMap<String, i32> = HashMap::new();
        let mut reads_only_until = Instant::now();
        while !run.stopped() && !c.state().is_terminated() {
            let k = format!("k{}", rng.gen_range(0..KEYS));
            let path = key_path(&k);
            let roll = if reader && rng.gen_bool(0.9) { 0 } else { rng.gen_range(0..10) };
            if roll < 5 || Instant::now() < reads_only_until {
                if let Ok(v) = run.op(p, Call::new("read", &k), read(&c, &path, reads)).await {
                    versions.insert(k, v);
                }
            } else {
                let v = next.fetch_add(1, Ordering::SeqCst);
                let (f, expected) =
                    if roll < 8 { ("write", None) } else { ("cas", Some(versions.get(&k).copied().unwrap_or(0))) };
                let args = match expected {
                    None => json!({"value": v}),
                    Some(ev) => json!({"expected_version": ev, "value": v}),
                };
                match run.op(p, Call::new(f, &k).args(args), write(&c, &path, v, expected)).await {
                    Ok(version) => {
                        versions.insert(k, version);
                    }
                    Err(e) if e.may_have_happened() => {
                        // Jepsen's rule: a process with an unfinished op
                        // is retired.
                        p = run.new_process();
                        reads_only_until = Instant::now() + READS_ONLY;
                    }
                    Err(_) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(2..15))).await;
        }
    }
}

/// Creates the keys as "0" (version 0).
async fn setup(endpoints: &[String]) -> anyhow::Result<()> {
    let c = Client::connector().with_session_timeout(Duration::from_secs(10)).connect(&endpoints.join(",")).await?;
    ensure_path(&c, ROOT).await?;
    for k in 0..KEYS {
        c.create(&key_path(&format!("k{k}")), b"0", &persistent()).await?;
    }
    Ok(())
}

/// Ops by function and outcome (`{"read": {"ok": n, "fail": n}, ...}`).
pub fn tally(h: &History) -> BTreeMap<String, BTreeMap<&'static str, u64>> {
    let mut out: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    for p in h.pairs() {
        let o = match p.outcome() {
            OpType::Ok => "ok",
            OpType::Fail => "fail",
            _ => "info",
        };
        *out.entry(p.invoke.f.clone()).or_default().entry(o).or_default() += 1;
    }
    out
}

pub async fn run(o: ZkPortRegisterOpts) -> anyhow::Result<(Validity, Value)> {
    if o.target != Kind::BatonZk {
        anyhow::bail!("the register test runs against baton-zk, not {}", o.target.name());
    }
    if !matches!(
        o.nemesis,
        NemesisKind::None
            | NemesisKind::Pause
            | NemesisKind::Kill
            | NemesisKind::Partition
            | NemesisKind::Leader
            | NemesisKind::All
    ) {
        anyhow::bail!("against baton-zk's register the nemesis is none, pause, kill, partition, leader or all");
    }
    std::fs::create_dir_all(&o.out)?;
    let extra_flags =
        if o.reads == ZkReads::Linearizable { vec!["--zk-linearizable-reads".to_string()] } else { Vec::new() };
    println!(
        "[phase] setup: 3 batond members with their ZooKeeper ports (reads: {}{})",
        o.reads.name(),
        if o.server_faults.is_empty() {
            String::new()
        } else {
            format!("; server faults ON: {}", o.server_faults.join(","))
        }
    );
    let opts = BatonOpts { proxied: true, server_faults: o.server_faults.clone(), extra_flags, ..BatonOpts::default() };
    let target = Arc::new(BatonZkTarget::start_opts(&o.out.join("cluster"), opts).await?);
    let r = run_on(target.clone(), &o).await;
    target.stop();
    r
}

async fn run_on(target: Arc<BatonZkTarget>, o: &ZkPortRegisterOpts) -> anyhow::Result<(Validity, Value)> {
    let endpoints = target.endpoints();
    tokio::time::timeout(Duration::from_secs(30), setup(&endpoints))
        .await
        .map_err(|_| anyhow::anyhow!("setup timed out"))??;
    println!(
        "baton-bench: target baton-zk workload register reads {} nemesis {:?} time {}s concurrency {} seed {} out {}",
        o.reads.name(),
        o.nemesis,
        o.time_limit.as_secs(),
        o.concurrency,
        o.seed,
        o.out.display()
    );
    let slots = o.concurrency.max(3);
    let run = Run::new(vec![Vec::new(); slots], Vec::new(), SESSION, None, baton_jepsen::door::Door::Zookeeper, true);
    let next = Arc::new(AtomicI64::new(1));
    let tasks: Vec<_> = (0..slots)
        .map(|i| {
            let ep = endpoints[i % endpoints.len()].clone();
            let reader = i >= slots / 2;
            tokio::spawn(worker(run.clone(), ep, o.reads, reader, next.clone(), o.seed.wrapping_add(i as u64 + 1)))
        })
        .collect();
    println!("[phase] running {} s", o.time_limit.as_secs());
    let mut rng = StdRng::seed_from_u64(o.seed);
    let start = Instant::now();
    let end = start + o.time_limit;
    let mut faults: Vec<String> = Vec::new();
    tokio::time::sleep(Duration::from_secs(2).min(o.time_limit)).await;
    while Instant::now() + Duration::from_secs(8) < end && o.nemesis != NemesisKind::None {
        let hold = Duration::from_millis(rng.gen_range(3000..6000));
        let m = fault_target(&target, o.nemesis, &mut rng).await;
        let at = start.elapsed().as_secs_f64();
        let (what, heal) = member_fault(&target, m, turn(o.nemesis, faults.len()), hold)?;
        println!("[nemesis] {at:6.1}s {what}");
        faults.push(format!("{at:.1}s {what}"));
        tokio::time::sleep(hold).await;
        heal();
        tokio::time::sleep(Duration::from_millis(rng.gen_range(2000..4000))).await;
    }
    if let Some(rest) = end.checked_duration_since(Instant::now()) {
        tokio::time::sleep(rest).await;
    }
    run.stop.store(true, Ordering::SeqCst);
    println!("[phase] stopping clients");
    let aborts: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
    for t in tasks {
        let _ = tokio::time::timeout(OP_TIMEOUT + Duration::from_secs(5), t).await;
    }
    // A client still connecting (up to 10 s) is not waited for.
    for a in aborts {
        a.abort();
    }
    let h = run.take_history();
    h.write_jsonl(&o.out.join("history.jsonl"))?;
    println!("[phase] checking {} history entries", h.ops.len());
    let result = check(&h);
    let ops = tally(&h);
    let off: Vec<&str> = h.ops.iter().filter_map(|op| op.error.as_deref()).filter(|e| off_protocol_text(e)).collect();
    let valid = if off.is_empty() { result.valid } else { Validity::Invalid };
    let results = json!({
        "target": "baton-zk",
        "workload": "register",
        "reads": o.reads.name(),
        "server_faults": o.server_faults,
        "nemesis": format!("{:?}", o.nemesis).to_lowercase(),
        "seed": o.seed,
        "faults": faults,
        "ops": ops,
        "register": result,
        "protocol": {
            "off_protocol_errors": off.len(),
            "examples": off.iter().take(3).collect::<Vec<_>>(),
            "valid": off.is_empty(),
        },
        "valid": valid.as_str(),
    });
    std::fs::write(o.out.join("results.json"), serde_json::to_string_pretty(&results)?)?;
    println!("ops: {}", serde_json::to_string(&ops)?);
    for a in &result.anomalies {
        println!("anomaly: {}", a.get("explain").and_then(Value::as_str).unwrap_or("?"));
    }
    if let Some(e) = off.first() {
        println!("protocol checker: {} errors no ZooKeeper server sends (first: {e})", off.len());
    }
    println!("register checker: {} ({} faults); verdict {}", result.valid.as_str(), faults.len(), valid.as_str());
    Ok((valid, results))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_outcomes() {
        // Definite: the answer says it was not applied.
        assert!(!write_may_have_happened(&Error::BadVersion));
        assert!(!write_may_have_happened(&Error::NoNode));
        // Anything else may have happened.
        assert!(write_may_have_happened(&Error::ConnectionLoss));
        assert!(write_may_have_happened(&Error::SessionExpired));
        assert!(write_may_have_happened(&Error::Timeout));
    }

    #[test]
    fn turns() {
        assert_eq!(turn(NemesisKind::All, 0), MemberFault::Kill);
        assert_eq!(turn(NemesisKind::All, 1), MemberFault::Stop);
        assert_eq!(turn(NemesisKind::All, 2), MemberFault::Isolate);
        assert_eq!(turn(NemesisKind::Partition, 5), MemberFault::Isolate);
    }
}
