//! Workloads: what each client slot does, and the checkers for what they
//! record.
//!
//! - `register`: read / write / compare-and-set (by version) on a few keys;
//!   checked for linearizability per key ([`crate::linearizability`]).
//! - `lock`: take the lock, read a counter, write it +1 guarded by
//!   `check_fence` with the lock's token (through a separate "storage"
//!   session, as an external resource would be), release.
//! - `election`: campaign, lead a while (half the time 2-4 session timeouts,
//!   until `is_leader()` turns false), resign; observers record every
//!   leader change.
//! - `session`: ephemeral nodes must live exactly as long as their session;
//!   one-shot watches fire once, in order. Half the slots also run a side
//!   task of stale reads (`get_opts`/`children_opts` with `stale`) and
//!   watch churn (stale exists-watches and persistent watches, registered
//!   and dropped), answers a cut-off member gives from its own state, which
//!   must never count as contact.
//!
//! Every client's session state changes are recorded as history notes
//! (`Run::watch_state`). The lock and election checkers judge grants
//! against them: `holder-connected-after-expiry` when an earlier holder,
//! before invoking its release / resign, was still recorded `Connected`
//! more than [`state_slack`] (min(50 ms, T/20)) after another session was
//! granted the same lock / leadership (the session guarantee: the new
//! grant needs the old session expired, and a correct client leaves
//! `Connected` at least T/3 before that can commit).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_client::{Client, CreateOptions, Error, ErrorCode, Op, SessionState, WatchKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::history::{FaultWindow, History, OpType, Pair};
use crate::record::{classify, retire, Run};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Lock,
    Register,
    Election,
    Session,
    All,
}

impl Workload {
    pub fn expand(self) -> Vec<Workload> {
        match self {
            Workload::All => vec![Workload::Register, Workload::Lock, Workload::Election, Workload::Session],
            w => vec![w],
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lock => "lock",
            Workload::Register => "register",
            Workload::Election => "election",
            Workload::Session => "session",
            Workload::All => "all",
        }
    }
}

/// A checker's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Validity {
    True,
    False,
    Unknown,
}

impl Validity {
    pub fn and(self, o: Validity) -> Validity {
        match (self, o) {
            (Validity::False, _) | (_, Validity::False) => Validity::False,
            (Validity::Unknown, _) | (_, Validity::Unknown) => Validity::Unknown,
            _ => Validity::True,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Validity::True => "true",
            Validity::False => "false",
            Validity::Unknown => "unknown",
        }
    }
}

/// One checker's result for results.json.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckResult {
    pub checker: String,
    pub valid: Validity,
    /// Named anomalies with the operations involved.
    pub anomalies: Vec<Value>,
    /// Figures worth reporting (counts, rates).
    pub stats: Value,
}

pub const REGISTER_KEYS: usize = 5;
const ROOT: &str = "/jepsen";

fn key_path(k: &str) -> String {
    format!("{ROOT}/registers/{k}")
}
const COUNTER: &str = "/jepsen/counter";
const LOCK: &str = "jepsen";
const FENCE: &str = "jepsen-counter";
const ELECTION: &str = "jepsen";
const SESSIONS: &str = "/jepsen/sessions";

/// Roles of the clients whose session states are recorded (history notes).
pub const MAIN: &str = "main";
const STORAGE: &str = "storage";
const OBSERVER: &str = "observer";
/// Chance that a leader leads for 2-4 session timeouts (ending early once
/// its session is not `Connected`). Lock holds stay short: a long one
/// stalls every waiter (the lock's throughput fell 7x with 1 in 5).
const LONG_HOLD_ELECTION: f64 = 0.5;
/// Rounds of one session's stale poller at most.
const STALE_POLLS: usize = 5000;

/// Holds on for `timeouts` session timeouts (a random number in the
/// range), or until `c`'s session is no longer `Connected` (a holder must
/// then assume it lost what it held), or the run stops.
async fn linger(run: &Run, c: &Client, rng: &mut StdRng, timeouts: std::ops::Range<f64>) {
    let until = std::time::Instant::now() + run.session.mul_f64(rng.gen_range(timeouts));
    let st = c.state();
    while std::time::Instant::now() < until && !run.stopped() {
        if *st.borrow() != SessionState::Connected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Creates what the workloads need, through a direct client.
pub async fn setup(c: &Client, w: Workload) -> anyhow::Result<()> {
    let mk = |p: String, d: &'static str| async move {
        match c.create(&p, d, CreateOptions::persistent().with_parents()).await {
            Ok(_) | Err(Error::Server { code: ErrorCode::NodeExists, .. }) => Ok(()),
            Err(e) => Err(anyhow::anyhow!("setup {p}: {e}")),
        }
    };
    match w {
        Workload::Register => {
            for k in 0..REGISTER_KEYS {
                mk(key_path(&format!("k{k}")), "0").await?;
            }
        }
        Workload::Lock => mk(COUNTER.into(), "0").await?,
        Workload::Session => mk(SESSIONS.into(), "").await?,
        Workload::Election | Workload::All => {}
    }
    Ok(())
}

/// Runs one client slot of workload `w` until the run stops.
pub async fn worker(run: Arc<Run>, w: Workload, slot: usize, idx: usize, conc: usize, seed: u64) {
    let rng = StdRng::seed_from_u64(seed ^ (slot as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    match w {
        // Half the slots mostly read: a reader next to a cut-off member is
        // what exposes stale reads (a writer there just waits for commits).
        Workload::Register => register_worker(run, slot, idx >= conc / 2, rng).await,
        Workload::Lock => lock_worker(run, slot, rng).await,
        Workload::Election if idx == 0 => observer_worker(run, slot).await,
        Workload::Election => election_worker(run, slot, rng).await,
        // Half the slots also poll stale reads and churn watches on the side.
        Workload::Session => session_worker(run, slot, idx % 2 == 1, rng).await,
        Workload::All => {}
    }
}

static NEXT_VALUE: AtomicI64 = AtomicI64::new(1);

// ---------------------------------------------------------------- register

async fn register_worker(run: Arc<Run>, slot: usize, reader: bool, mut rng: StdRng) {
    let Some(mut c) = run.connect_slot(slot).await else { return };
    let mut p = run.new_process();
    run.watch_state(&c, p, MAIN, slot);
    let mut versions: HashMap<String, i32> = HashMap::new();
    while !run.stopped() {
        run.checkpoint(slot).await;
        let k = format!("k{}", rng.gen_range(0..REGISTER_KEYS));
        let path = key_path(&k);
        let roll = if reader && rng.gen_bool(0.9) { 0 } else { rng.gen_range(0..10) };
        let info = if roll < 5 {
            run.invoke(p, "read", Some(&k), Value::Null);
            match c.get(&path).await {
                Ok((d, s)) => {
                    let v: Option<i64> = std::str::from_utf8(&d).ok().and_then(|t| t.parse().ok());
                    versions.insert(k.clone(), s.version);
                    run.complete(p, OpType::Ok, "read", Some(&k), json!({"value": v, "version": s.version}), None);
                }
                Err(e) => run.complete(p, OpType::Fail, "read", Some(&k), Value::Null, Some(e.to_string())),
            }
            false
        } else {
            let v = NEXT_VALUE.fetch_add(1, Ordering::SeqCst);
            let (f, expected) =
                if roll < 8 { ("write", None) } else { ("cas", Some(versions.get(&k).copied().unwrap_or(0))) };
            let arg = match expected {
                None => json!({"value": v}),
                Some(ev) => json!({"expected_version": ev, "value": v}),
            };
            run.invoke(p, f, Some(&k), arg);
            match c.set(&path, v.to_string(), expected).await {
                Ok(s) => {
                    versions.insert(k.clone(), s.version);
                    run.complete(p, OpType::Ok, f, Some(&k), json!({"version": s.version}), None);
                    false
                }
                Err(e) => {
                    let ty = classify(&e, true);
                    run.complete(p, ty, f, Some(&k), Value::Null, Some(e.to_string()));
                    ty == OpType::Info || matches!(e, Error::SessionExpired)
                }
            }
        };
        if info {
            // Jepsen's rule: a process with an unfinished op is retired.
            retire(c);
            let Some(nc) = run.connect_slot(slot).await else { return };
            c = nc;
            p = run.new_process();
            run.watch_state(&c, p, MAIN, slot);
        }
        run.sleep(Duration::from_millis(rng.gen_range(2..15))).await;
    }
    retire(c);
}

// ---------------------------------------------------------------- lock

async fn lock_worker(run: Arc<Run>, slot: usize, mut rng: StdRng) {
    let Some(mut lc) = run.connect_slot(slot).await else { return };
    let Some(mut sc) = run.connect_storage(slot).await else { return };
    let mut p = run.new_process();
    run.watch_state(&lc, p, MAIN, slot);
    run.watch_state(&sc, p, STORAGE, slot);
    while !run.stopped() {
        run.checkpoint(slot).await;
        let mut fresh = false;
        run.invoke(p, "acquire", Some(LOCK), Value::Null);
        match lc.lock_with_timeout(LOCK, Duration::from_secs(4)).await {
            Ok(Some(g)) => {
                let t = g.fencing_token();
                run.complete(p, OpType::Ok, "acquire", Some(LOCK), json!({"token": t}), None);
                run.became_holder(slot, &lc);
                // Pause points sit between the steps, where a real process
                // could be stopped while it believes it holds the lock.
                run.checkpoint(slot).await;
                run.invoke(p, "read-counter", Some("counter"), json!({"token": t}));
                let n = match sc.get(COUNTER).await {
                    Ok((d, _)) => {
                        let n: i64 = std::str::from_utf8(&d).ok().and_then(|s| s.parse().ok()).unwrap_or(-1);
                        run.complete(
                            p,
                            OpType::Ok,
                            "read-counter",
                            Some("counter"),
                            json!({"token": t, "value": n}),
                            None,
                        );
                        Some(n)
                    }
                    Err(e) => {
                        run.complete(
                            p,
                            OpType::Fail,
                            "read-counter",
                            Some("counter"),
                            json!({"token": t}),
                            Some(e.to_string()),
                        );
                        None
                    }
                };
                // "Work" while holding: most of a hold lies before the next
                // pause point, so a paused holder is usually mid-hold.
                run.sleep(Duration::from_millis(rng.gen_range(10..40))).await;
                run.checkpoint(slot).await;
                if let Some(n) = n {
                    run.invoke(p, "incr", Some("counter"), json!({"token": t, "from": n}));
                    let ops = [
                        Op::CheckFence { resource: FENCE.into(), token: t },
                        Op::Set { path: COUNTER.into(), data: (n + 1).to_string().into(), version: None },
                    ];
                    match sc.multi(&ops).await {
                        Ok(r) => {
                            let mzxid = r.get(1).and_then(|x| x.stat.as_ref()).map(|s| s.mzxid).unwrap_or(0);
                            let v = json!({"token": t, "from": n, "value": n + 1, "mzxid": mzxid});
                            run.complete(p, OpType::Ok, "incr", Some("counter"), v, None);
                        }
                        Err(e) => {
                            let ty = classify(&e, true);
                            run.complete(
                                p,
                                ty,
                                "incr",
                                Some("counter"),
                                json!({"token": t, "from": n}),
                                Some(e.to_string()),
                            );
                            if ty == OpType::Info {
                                retire(sc);
                                let Some(n2) = run.connect_storage(slot).await else { return };
                                sc = n2;
                                run.watch_state(&sc, p, STORAGE, slot);
                                fresh = true;
                            }
                        }
                    }
                }
                // The storage session can expire on its own (its member was
                // paused): replace it, as a real client would reconnect.
                if *sc.state().borrow() == SessionState::Expired {
                    retire(sc);
                    let Some(n2) = run.connect_storage(slot).await else { return };
                    sc = n2;
                    run.watch_state(&sc, p, STORAGE, slot);
                }
                let lost = *lc.state().borrow() != SessionState::Connected;
                run.invoke(p, "release", Some(LOCK), json!({"token": t}));
                run.set_holder(slot, false);
                match g.release().await {
                    Ok(()) => {
                        run.complete(p, OpType::Ok, "release", Some(LOCK), json!({"token": t, "lost": lost}), None)
                    }
                    Err(e) => {
                        run.complete(
                            p,
                            OpType::Fail,
                            "release",
                            Some(LOCK),
                            json!({"token": t, "lost": lost}),
                            Some(e.to_string()),
                        );
                        fresh = true;
                    }
                }
            }
            Ok(None) => run.complete(p, OpType::Fail, "acquire", Some(LOCK), Value::Null, Some("timeout".into())),
            Err(e) => {
                run.complete(p, OpType::Fail, "acquire", Some(LOCK), Value::Null, Some(e.to_string()));
                fresh = true;
            }
        }
        if fresh || *lc.state().borrow() == SessionState::Expired {
            retire(lc);
            let Some(n2) = run.connect_slot(slot).await else { return };
            lc = n2;
            p = run.new_process();
            run.watch_state(&lc, p, MAIN, slot);
        }
        run.sleep(Duration::from_millis(rng.gen_range(0..20))).await;
    }
    run.set_holder(slot, false);
    retire(lc);
    retire(sc);
}

// ---------------------------------------------------------------- election

async fn election_worker(run: Arc<Run>, slot: usize, mut rng: StdRng) {
    let Some(mut c) = run.connect_slot(slot).await else { return };
    let mut p = run.new_process();
    run.watch_state(&c, p, MAIN, slot);
    while !run.stopped() {
        run.checkpoint(slot).await;
        run.invoke(p, "campaign", Some(ELECTION), json!({"value": p}));
        let mut fresh = false;
        match tokio::time::timeout(Duration::from_secs(4), c.campaign(ELECTION, p.to_string())).await {
            Ok(Ok(lead)) => {
                let t = lead.token();
                run.complete(p, OpType::Ok, "campaign", Some(ELECTION), json!({"token": t}), None);
                run.became_holder(slot, &c);
                if rng.gen_bool(LONG_HOLD_ELECTION) {
                    run.set_holder_long(slot);
                    // A long-lived leader: leads until done or until
                    // `is_leader()` turns false (session not Connected).
                    linger(&run, &c, &mut rng, 2.0..4.0).await;
                } else {
                    run.sleep(Duration::from_millis(rng.gen_range(100..800))).await;
                }
                run.checkpoint(slot).await;
                let lost = !lead.is_leader();
                run.invoke(p, "resign", Some(ELECTION), json!({"token": t}));
                run.set_holder(slot, false);
                match lead.resign().await {
                    Ok(()) => {
                        run.complete(p, OpType::Ok, "resign", Some(ELECTION), json!({"token": t, "lost": lost}), None)
                    }
                    Err(e) => {
                        run.complete(
                            p,
                            OpType::Fail,
                            "resign",
                            Some(ELECTION),
                            json!({"token": t}),
                            Some(e.to_string()),
                        );
                        fresh = true;
                    }
                }
            }
            Ok(Err(e)) => {
                run.complete(p, OpType::Fail, "campaign", Some(ELECTION), Value::Null, Some(e.to_string()));
                fresh = true;
            }
            Err(_) => run.complete(p, OpType::Fail, "campaign", Some(ELECTION), Value::Null, Some("timeout".into())),
        }
        if fresh || *c.state().borrow() == SessionState::Expired {
            retire(c);
            let Some(n) = run.connect_slot(slot).await else { return };
            c = n;
            p = run.new_process();
            run.watch_state(&c, p, MAIN, slot);
        }
    }
    run.set_holder(slot, false);
    retire(c);
}

async fn observer_worker(run: Arc<Run>, slot: usize) {
    while !run.stopped() {
        let Some(c) = run.connect_slot(slot).await else { return };
        let p = run.new_process();
        run.watch_state(&c, p, OBSERVER, slot);
        let Ok(mut obs) = c.observe(ELECTION).await else {
            retire(c);
            continue;
        };
        loop {
            let next = tokio::select! {
                n = obs.next() => n,
                _ = run.sleep(Duration::from_secs(3600)) => None,
            };
            let Some(l) = next else { break };
            let t = l.as_ref().map(|l| l.token);
            run.invoke(p, "observe", Some(ELECTION), Value::Null);
            run.complete(p, OpType::Ok, "observe", Some(ELECTION), json!({"token": t}), None);
        }
        retire(c);
    }
}

// ---------------------------------------------------------------- session

async fn session_worker(run: Arc<Run>, slot: usize, poller: bool, mut rng: StdRng) {
    while !run.stopped() {
        let Some(c) = run.connect_slot(slot).await else { return };
        let p = run.new_process();
        run.watch_state(&c, p, MAIN, slot);
        // Was the session ever in doubt? Then losing its node is allowed.
        let disturbed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        {
            let (mut st, d) = (c.state(), disturbed.clone());
            tokio::spawn(async move {
                loop {
                    if *st.borrow_and_update() != SessionState::Connected {
                        d.store(true, Ordering::SeqCst);
                        return;
                    }
                    if st.changed().await.is_err() {
                        d.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            });
        }
        let path = format!("{SESSIONS}/p{p}");
        run.invoke(p, "create", Some(&path), Value::Null);
        match c.create(&path, "", CreateOptions::ephemeral()).await {
            Ok((_, s)) => run.complete(p, OpType::Ok, "create", Some(&path), json!({"czxid": s.czxid}), None),
            Err(e) => {
                run.complete(p, classify(&e, true), "create", Some(&path), Value::Null, Some(e.to_string()));
                retire(c);
                continue;
            }
        }
        // The side task: stale reads and watch churn, under its own
        // process id, until this session's checks are done.
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let side = poller.then(|| {
            let seed = rng.gen::<u64>();
            tokio::spawn(stale_poller(run.clone(), c.clone(), p, path.clone(), done.clone(), seed))
        });
        // A one-shot watch on a sibling, re-armed after each event.
        let mut watch: Option<baton_client::Watcher> = None;
        let mut checks = 0;
        while !run.stopped() && checks < 40 {
            run.checkpoint(slot).await;
            run.sleep(Duration::from_millis(rng.gen_range(50..250))).await;
            checks += 1;
            run.invoke(p, "check", Some(&path), Value::Null);
            match c.exists(&path).await {
                Ok(s) => {
                    // Sampled when the answer is in: a read that waited out a
                    // partition may return after the session was (rightly)
                    // expired, and the client was Suspended meanwhile.
                    let was_disturbed = disturbed.load(Ordering::SeqCst);
                    let v = json!({"exists": s.is_some(), "disturbed": was_disturbed});
                    run.complete(p, OpType::Ok, "check", Some(&path), v, None);
                }
                Err(e) => run.complete(p, OpType::Fail, "check", Some(&path), Value::Null, Some(e.to_string())),
            }
            if *c.state().borrow() == SessionState::Expired {
                break;
            }
            if let Some(w) = watch.as_mut() {
                if let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(1), w.next()).await {
                    run.invoke(p, "watch-event", Some(&ev.path), Value::Null);
                    let v = json!({"zxid": ev.zxid, "type": ev.r#type});
                    run.complete(p, OpType::Ok, "watch-event", Some(&ev.path), v, None);
                    watch = None;
                }
            }
            if watch.is_none() {
                let target = format!("{SESSIONS}/p{}", p.saturating_sub(1 + rng.gen_range(0..3)));
                if let Ok((_, w)) = c.exists_watch(&target).await {
                    watch = Some(w);
                }
            }
        }
        done.store(true, Ordering::SeqCst);
        if let Some(side) = side {
            let _ = tokio::time::timeout(Duration::from_secs(6), side).await;
        }
        // End the session voluntarily; its node must go with it.
        run.invoke(p, "close", Some(&path), Value::Null);
        match tokio::time::timeout(Duration::from_secs(3), c.close()).await {
            Ok(Ok(())) => run.complete(p, OpType::Ok, "close", Some(&path), Value::Null, None),
            _ => run.complete(p, OpType::Info, "close", Some(&path), Value::Null, Some("close not confirmed".into())),
        }
    }
}

/// Stale reads and watch churn on session `c` (worker process `of`):
/// answers a member gives from its own state, also while it is cut off from
/// the leader, which must never count as contact with the cluster (a client
/// or server that counted them would keep the session `Connected` while
/// the majority expires it: finding S1's class). Ends when `done` is set,
/// the session is expired or the run stops; at most `STALE_POLLS` rounds.
async fn stale_poller(run: Arc<Run>, c: Client, of: u64, path: String, done: Arc<AtomicBool>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let p = run.new_process();
    // Watches kept a little while, then dropped (which removes them).
    let mut held: Vec<baton_client::Watcher> = Vec::new();
    for _ in 0..STALE_POLLS {
        if done.load(Ordering::SeqCst) || run.stopped() || *c.state().borrow() == SessionState::Expired {
            break;
        }
        let sibling = format!("{SESSIONS}/p{}", of.saturating_sub(rng.gen_range(0..4)));
        let (f, key, r) = match rng.gen_range(0..4) {
            0 => {
                run.invoke(p, "stale-read", Some(&path), Value::Null);
                let r = c.get_opts(&path, true).await.map(|(_, s)| json!({"version": s.version, "mzxid": s.mzxid}));
                ("stale-read", path.as_str(), r)
            }
            1 => {
                run.invoke(p, "stale-children", Some(SESSIONS), Value::Null);
                let r = c.children_opts(SESSIONS, true).await.map(|(k, _)| json!({"children": k.len()}));
                ("stale-children", SESSIONS, r)
            }
            2 => {
                run.invoke(p, "watch-churn", Some(&sibling), json!({"stale": true}));
                let r = c.exists_watch_opts(&sibling, true).await.map(|(s, w)| {
                    held.push(w);
                    json!({"exists": s.is_some()})
                });
                ("watch-churn", sibling.as_str(), r)
            }
            _ => {
                let kind = if rng.gen_bool(0.5) { WatchKind::Data } else { WatchKind::Children };
                run.invoke(p, "watch-churn", Some(&sibling), json!({"persistent": true}));
                let r = c.watch(&sibling, kind, true).await.map(|w| {
                    held.push(w);
                    json!({"registered": true})
                });
                ("watch-churn", sibling.as_str(), r)
            }
        };
        match r {
            Ok(v) => run.complete(p, OpType::Ok, f, Some(key), v, None),
            Err(e) => run.complete(p, OpType::Fail, f, Some(key), Value::Null, Some(e.to_string())),
        }
        while held.len() > 3 {
            let i = rng.gen_range(0..held.len());
            drop(held.swap_remove(i));
        }
        if rng.gen_bool(0.3) {
            held.clear();
        }
        run.sleep(Duration::from_millis(rng.gen_range(20..80))).await;
    }
}

// ---------------------------------------------------------------- checkers

fn val_u64(v: &Value, k: &str) -> Option<u64> {
    v.get(k).and_then(Value::as_u64)
}

fn op_json(p: &Pair<'_>) -> Value {
    json!({
        "process": p.invoke.process, "f": p.invoke.f, "key": p.invoke.key,
        "invoke": p.invoke.value, "outcome": p.outcome(),
        "result": p.complete.map(|c| c.value.clone()), "error": p.complete.and_then(|c| c.error.clone()),
        "time_s": p.invoke.time as f64 / 1e9, "index": p.invoke.index,
    })
}

/// True if time `t` (ns) is within a fault window or `grace` after it.
fn near_fault(faults: &[FaultWindow], t: u64, grace: u64) -> bool {
    faults.iter().any(|f| t + 1 >= f.start && t <= f.end.saturating_add(grace))
}

/// Grace after a fault during which overlapping holders are explained by
/// it: two session timeouts `t`, an election and a keepalive period.
pub fn fault_grace(t: Duration) -> u64 {
    (t.as_millis() as u64 * 2 + 3000) * 1_000_000
}

/// Slack for recording lag in `holder-connected-after-expiry` (ns):
/// min(50 ms, T/20). A state note is written when the watcher task *saw*
/// the change: after the client actor noticed its proof ran out (it looks
/// every 20 ms) and the task was scheduled. The slack is a cushion on top
/// of the real margin: a correct client leaves `Connected` at least T/3
/// before any leader can commit its session's expiry, and a grant is
/// recorded when the new holder's call returned (after that commit), so a
/// false positive needs more than T/3 + slack of recording lag (383 ms at
/// T = 1 s). Measured on correct runs (client freezes, T = 1 s and 2 s),
/// the closest any holder's recorded `Connected` came to another's grant
/// was T/3 + 22-36 ms, i.e. no lag showed at all; the stats report that
/// figure (`closest_ms`) on every run. A larger slack hides real
/// violations: the planted `keepalive-without-quorum` typically keeps a
/// holder `Connected` only 0-150 ms past the grant, because the cut-off
/// leader steps down (check-quorum) within 0.5-1 s.
pub fn state_slack(t: Duration) -> u64 {
    (t.as_nanos() as u64 / 20).min(50_000_000)
}

/// A hold: (process, token, granted, release invoked), times in ns.
type Hold = (u64, u64, u64, u64);

/// Hold intervals [granted, release invoked] per process.
fn holds(h: &History, grant: &str, release: &str) -> Vec<Hold> {
    // (process, token, start, end)
    let pairs = h.pairs();
    let mut open: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut out = Vec::new();
    let end_of_run = h.ops.last().map(|o| o.time).unwrap_or(0);
    for p in &pairs {
        let Some(c) = p.complete else { continue };
        if p.invoke.f == grant && c.ty == OpType::Ok {
            if let Some(t) = val_u64(&c.value, "token") {
                open.insert(p.invoke.process, (t, c.time));
            }
        } else if p.invoke.f == release {
            if let Some((t, s)) = open.remove(&p.invoke.process) {
                out.push((p.invoke.process, t, s, p.invoke.time));
            }
        }
    }
    for (proc_, (t, s)) in open {
        out.push((proc_, t, s, end_of_run));
    }
    out.sort_by_key(|x| x.2);
    out
}

/// Pairs of overlapping holds; those outside fault windows violate mutual
/// exclusion.
fn overlaps(hs: &[Hold], faults: &[FaultWindow], grace: u64) -> (usize, Vec<Value>) {
    let mut total = 0;
    let mut bad = Vec::new();
    for (i, a) in hs.iter().enumerate() {
        for b in &hs[i + 1..] {
            if b.2 >= a.3 {
                continue;
            }
            if a.0 == b.0 {
                continue;
            }
            total += 1;
            if !near_fault(faults, b.2, grace) && bad.len() < 20 {
                bad.push(json!({
                    "anomaly": "concurrent-holders",
                    "explain": "two processes held it at once with no fault active",
                    "first": {"process": a.0, "token": a.1, "from_s": a.2 as f64 / 1e9, "to_s": a.3 as f64 / 1e9},
                    "second": {"process": b.0, "token": b.1, "from_s": b.2 as f64 / 1e9, "to_s": b.3 as f64 / 1e9},
                }));
            }
        }
    }
    (total, bad)
}

/// `holder-connected-after-expiry`: when a process is granted `name` (a
/// lock, or leadership) while an earlier holder has not yet invoked its
/// release / resign, that holder's client must already have left
/// `Connected`: the cluster can only have handed it on after expiring the
/// holder's session, and a correct client is `Suspended` at least T/3
/// before that expiry can commit. Judged from the session-state notes
/// (`crate::history`): a violation is a `Connected` state recorded at any
/// time in [grant + slack, the holder's release invocation), i.e. the last
/// note at grant + slack, or a later one before the release, says
/// `Connected`. `slack` is [`state_slack`]. Returns (grants judged,
/// violations); a holder with no notes is not judged. Also reports, in
/// `closest`, the smallest margin seen (grant time minus the end of the
/// holder's last `Connected` stretch; negative: still `Connected` after
/// the grant): how near the run came to a violation.
fn holder_connected(h: &History, hs: &[Hold], name: &str, what: &str, t: Duration) -> (Judged, Vec<Value>) {
    let states = h.session_states(MAIN);
    let slack = state_slack(t);
    let mut judged = Judged { slack_ms: slack as f64 / 1e6, ..Judged::default() };
    let mut bad = Vec::new();
    for (i, a) in hs.iter().enumerate() {
        let Some(log) = states.get(&a.0) else { continue };
        // Holds are sorted by grant time: every later grant inside a's hold.
        // One anomaly per hold: its first offending grant, and a count.
        let mut first: Option<(&Hold, u64)> = None;
        let mut offending = 0;
        for b in hs[i + 1..].iter().take_while(|b| b.2 < a.3) {
            if b.0 == a.0 {
                continue;
            }
            judged.grants += 1;
            if let Some(end) = log.connected_end(b.2, a.3) {
                let margin = (b.2 as f64 - end as f64) / 1e6;
                if judged.closest_ms.is_none_or(|c| margin < c) {
                    judged.closest_ms = Some(margin);
                }
            }
            if let Some(at) = log.connected_within(b.2 + slack, a.3) {
                offending += 1;
                first = first.or(Some((b, at)));
            }
        }
        if let Some((b, at)) = first.filter(|_| bad.len() < 20) {
            let new_session = states.get(&b.0).map(|l| l.session);
            // The holder's notes from its grant, or two timeouts before the
            // other grant if later, to its release.
            let since = b.2.saturating_sub(2 * t.as_nanos() as u64).max(a.2);
            bad.push(json!({
                "anomaly": "holder-connected-after-expiry",
                "explain": format!(
                    "{what} {name:?} was granted to another session while its earlier holder had not invoked its \
                     release and its client was still recorded Connected after the grant (+{} ms slack): the \
                     holder's session can only have been expired before the grant, so its client stayed \
                     Connected past its session's expiry",
                    slack / 1_000_000
                ),
                "name": name,
                "holder": {
                    "process": a.0, "session": log.session, "token": a.1,
                    "granted_s": a.2 as f64 / 1e9, "release_invoked_s": a.3 as f64 / 1e9,
                },
                "granted": {"process": b.0, "session": new_session, "token": b.1, "granted_s": b.2 as f64 / 1e9},
                "holder_connected_at_s": at as f64 / 1e9,
                "grants_while_holder_connected": offending,
                "slack_ms": slack as f64 / 1e6,
                "holder_states_from_s": since as f64 / 1e9,
                "holder_state_then": log.state_at(since),
                "holder_states": log
                    .between(since, a.3)
                    .into_iter()
                    .map(|(at, s)| json!({"at_s": at as f64 / 1e9, "state": s}))
                    .collect::<Vec<_>>(),
            }));
        }
    }
    (judged, bad)
}

/// What `holder_connected` judged (for the stats).
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Judged {
    /// Grants made while an earlier holder had not invoked its release.
    grants: usize,
    /// Smallest margin (ms) between such a grant and the end of the
    /// holder's last `Connected` stretch (negative: Connected after it).
    closest_ms: Option<f64>,
    slack_ms: f64,
}

/// Lock: tokens unique; the fence never accepted a lower token after a
/// higher one; no acknowledged increment lost; mutual exclusion outside
/// faults; no holder still `Connected` after the lock went to another
/// session (`holder_connected`). `final_counter` is the counter read after the run.
pub fn check_lock(h: &History, faults: &[FaultWindow], final_counter: Option<i64>, t: Duration) -> CheckResult {
    let pairs = h.pairs();
    let mut anomalies = Vec::new();
    let mut tokens: HashMap<u64, u64> = HashMap::new();
    for p in pairs.iter().filter(|p| p.invoke.f == "acquire" && p.outcome() == OpType::Ok) {
        if let Some(t) = p.complete.and_then(|c| val_u64(&c.value, "token")) {
            if let Some(other) = tokens.insert(t, p.invoke.process) {
                anomalies
                    .push(json!({"anomaly": "duplicate-token", "token": t, "processes": [other, p.invoke.process]}));
            }
        }
    }
    let mut incr_ok: Vec<&Pair<'_>> =
        pairs.iter().filter(|p| p.invoke.f == "incr" && p.outcome() == OpType::Ok).collect();
    let incr_info = pairs.iter().filter(|p| p.invoke.f == "incr" && p.outcome() == OpType::Info).count();
    let fence_rejected = pairs
        .iter()
        .filter(|p| {
            p.invoke.f == "incr"
                && p.complete.and_then(|c| c.error.as_deref()).is_some_and(|e| e.contains("FenceRejected"))
        })
        .count();
    incr_ok.sort_by_key(|p| p.complete.map(|c| val_u64(&c.value, "mzxid").unwrap_or(0)).unwrap_or(0));
    let (mut max_token, mut last_value): (u64, i64) = (0, 0);
    let mut prev: Option<&Pair<'_>> = None;
    for p in &incr_ok {
        let Some(c) = p.complete else { continue };
        let t = val_u64(&c.value, "token").unwrap_or(0);
        let v = c.value.get("value").and_then(Value::as_i64).unwrap_or(0);
        if t < max_token && anomalies.len() < 50 {
            anomalies.push(json!({
                "anomaly": "fence-regression",
                "explain": "the counter accepted a write with a lower token after a higher one",
                "ops": [prev.map(op_json), Some(op_json(p))],
            }));
        }
        if v <= last_value && anomalies.len() < 50 {
            anomalies.push(json!({
                "anomaly": "lost-update",
                "explain": "an accepted increment did not build on the previous accepted one",
                "ops": [prev.map(op_json), Some(op_json(p))],
            }));
        }
        max_token = max_token.max(t);
        last_value = last_value.max(v);
        prev = Some(p);
    }
    let acked = incr_ok.len() as i64;
    if let Some(f) = final_counter {
        if f < acked || f > acked + incr_info as i64 {
            anomalies.push(json!({
                "anomaly": "lost-update",
                "explain": "final counter does not match acknowledged increments",
                "final": f, "acknowledged": acked, "indeterminate": incr_info,
            }));
        }
    }
    let hs = holds(h, "acquire", "release");
    let (overlapping, bad) = overlaps(&hs, faults, fault_grace(t));
    anomalies.extend(bad);
    let (judged, late) = holder_connected(h, &hs, LOCK, "lock", t);
    anomalies.extend(late);
    let valid = if anomalies.is_empty() {
        if final_counter.is_none() {
            Validity::Unknown
        } else {
            Validity::True
        }
    } else {
        Validity::False
    };
    CheckResult {
        checker: "lock".into(),
        valid,
        anomalies,
        stats: json!({
            "grants": tokens.len(), "increments_acknowledged": acked, "increments_indeterminate": incr_info,
            "writes_rejected_by_fence": fence_rejected, "final_counter": final_counter,
            "believed_held_at_once": overlapping, "holder_states": judged,
        }),
    }
}

/// Election: one leader per token, tokens grow in real time, observers
/// never go backwards, one leader at a time outside faults, no leader still
/// `Connected` (`is_leader()`) after another was elected
/// (`holder_connected`).
pub fn check_election(h: &History, faults: &[FaultWindow], t: Duration) -> CheckResult {
    let pairs = h.pairs();
    let mut anomalies = Vec::new();
    let won: Vec<&Pair<'_>> = pairs.iter().filter(|p| p.invoke.f == "campaign" && p.outcome() == OpType::Ok).collect();
    let mut by_token: HashMap<u64, u64> = HashMap::new();
    for p in &won {
        let t = p.complete.and_then(|c| val_u64(&c.value, "token")).unwrap_or(0);
        if let Some(o) = by_token.insert(t, p.invoke.process) {
            anomalies.push(json!({"anomaly": "two-leaders-one-token", "token": t, "processes": [o, p.invoke.process]}));
        }
    }
    // Real-time order: if A was elected before B campaigned, A's token < B's.
    for a in &won {
        for b in &won {
            let (Some(ac), Some(_)) = (a.complete, b.complete) else { continue };
            if ac.time < b.invoke.time {
                let ta = val_u64(&ac.value, "token").unwrap_or(0);
                let tb = b.complete.and_then(|c| val_u64(&c.value, "token")).unwrap_or(0);
                if ta >= tb && anomalies.len() < 50 {
                    anomalies
                        .push(json!({"anomaly": "token-went-backwards", "earlier": op_json(a), "later": op_json(b)}));
                }
            }
        }
    }
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    let mut observed = 0;
    for p in pairs.iter().filter(|p| p.invoke.f == "observe" && p.outcome() == OpType::Ok) {
        observed += 1;
        if let Some(t) = p.complete.and_then(|c| val_u64(&c.value, "token")) {
            let last = seen.entry(p.invoke.process).or_insert(0);
            if t < *last && anomalies.len() < 50 {
                anomalies.push(
                    json!({"anomaly": "observer-went-backwards", "process": p.invoke.process, "from": *last, "to": t}),
                );
            }
            *last = t;
        }
    }
    let hs = holds(h, "campaign", "resign");
    let (overlapping, bad) = overlaps(&hs, faults, fault_grace(t));
    anomalies.extend(bad);
    let (judged, late) = holder_connected(h, &hs, ELECTION, "election", t);
    anomalies.extend(late);
    CheckResult {
        checker: "election".into(),
        valid: if anomalies.is_empty() { Validity::True } else { Validity::False },
        anomalies,
        stats: json!({
            "elections": won.len(), "observed_changes": observed, "believed_leader_at_once": overlapping,
            "holder_states": judged,
        }),
    }
}

/// Session: an ephemeral node never vanishes while its session was never
/// in doubt; every ephemeral is gone once its session ended (`leftover`:
/// nodes found after the run); watches fire once, in zxid order.
pub fn check_session(h: &History, leftover: Option<Vec<String>>) -> CheckResult {
    let pairs = h.pairs();
    let mut anomalies = Vec::new();
    let mut checks = 0;
    for p in pairs.iter().filter(|p| p.invoke.f == "check" && p.outcome() == OpType::Ok) {
        checks += 1;
        let Some(c) = p.complete else { continue };
        let exists = c.value.get("exists").and_then(Value::as_bool).unwrap_or(true);
        let disturbed = c.value.get("disturbed").and_then(Value::as_bool).unwrap_or(true);
        if !exists && !disturbed && anomalies.len() < 50 {
            anomalies.push(json!({
                "anomaly": "ephemeral-vanished-while-session-alive",
                "explain": "the node was gone although its session never left Connected",
                "op": op_json(p),
            }));
        }
    }
    let mut last_zxid: HashMap<u64, u64> = HashMap::new();
    let mut events = 0;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    for p in pairs.iter().filter(|p| p.invoke.f == "watch-event") {
        events += 1;
        let z = p.complete.and_then(|c| val_u64(&c.value, "zxid")).unwrap_or(0);
        let last = last_zxid.entry(p.invoke.process).or_insert(0);
        if z < *last {
            anomalies.push(json!({"anomaly": "watch-events-out-of-order", "op": op_json(p), "after_zxid": *last}));
        }
        if !seen.insert((p.invoke.process, z)) {
            anomalies.push(json!({"anomaly": "watch-fired-twice", "op": op_json(p)}));
        }
        *last = z;
    }
    let mut valid = Validity::True;
    match &leftover {
        Some(l) if !l.is_empty() => anomalies.push(json!({
            "anomaly": "ephemeral-outlived-session",
            "explain": "nodes still present after every session ended and its timeout passed",
            "nodes": l,
        })),
        Some(_) => {}
        None => valid = Validity::Unknown,
    }
    if !anomalies.is_empty() {
        valid = Validity::False;
    }
    CheckResult {
        checker: "session".into(),
        valid,
        anomalies,
        stats: json!({"checks": checks, "watch_events": events}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Op as HOp, SESSION_STATE};

    const MS: u64 = 1_000_000;

    fn op(h: &mut History, process: u64, ty: OpType, f: &str, value: Value, ms: u64) {
        let key = if f == SESSION_STATE { None } else { Some(ELECTION.to_string()) };
        h.push(HOp { index: 0, process, ty, f: f.into(), key, value, time: ms * MS, error: None });
    }

    fn state(h: &mut History, of: u64, session: u64, s: &str, ms: u64) {
        let v = json!({"of": of, "role": MAIN, "slot": 0, "session": session, "state": s});
        op(h, 100 + of, OpType::Info, SESSION_STATE, v, ms);
    }

    /// Process 1 leads from 100 ms and resigns at `resign` ms; its client
    /// goes Suspended at `suspended` ms; process 2 is elected at 1,000 ms.
    fn history(suspended: u64, resign: u64) -> History {
        let mut h = History::default();
        state(&mut h, 1, 11, "connected", 0);
        state(&mut h, 2, 22, "connected", 0);
        op(&mut h, 1, OpType::Invoke, "campaign", Value::Null, 50);
        op(&mut h, 1, OpType::Ok, "campaign", json!({"token": 5}), 100);
        op(&mut h, 2, OpType::Invoke, "campaign", Value::Null, 200);
        let mut rest = vec![
            (1, OpType::Invoke, "resign", json!({"token": 5}), resign),
            (2, OpType::Ok, "campaign", json!({"token": 9}), 1000),
            (1, OpType::Ok, "resign", json!({"token": 5}), resign + 5),
        ];
        rest.sort_by_key(|x| x.4);
        let mut noted = false;
        for (p, ty, f, v, ms) in rest {
            if !noted && suspended <= ms {
                state(&mut h, 1, 11, "suspended", suspended);
                noted = true;
            }
            op(&mut h, p, ty, f, v, ms);
        }
        if !noted {
            state(&mut h, 1, 11, "suspended", suspended);
        }
        h
    }

    /// A fault over the whole test history, so overlapping holds are not
    /// `concurrent-holders`.
    fn fault() -> Vec<FaultWindow> {
        vec![FaultWindow { kind: "test".into(), detail: String::new(), start: 0, end: 2000 * MS }]
    }

    fn named(r: &CheckResult) -> Vec<&str> {
        r.anomalies.iter().filter_map(|a| a.get("anomaly").and_then(Value::as_str)).collect()
    }

    #[test]
    fn a_holder_connected_after_the_next_grant_is_caught() {
        let t = Duration::from_secs(1);
        // Suspended 200 ms after the other's grant, resign later still.
        let r = check_election(&history(1200, 1500), &fault(), t);
        assert_eq!(r.valid, Validity::False);
        assert_eq!(named(&r), ["holder-connected-after-expiry"]);
        let a = &r.anomalies[0];
        assert_eq!(a["holder"]["session"], 11);
        assert_eq!(a["granted"]["session"], 22);
        assert_eq!(a["name"], ELECTION);
        assert_eq!(r.stats["holder_states"]["closest_ms"], -200.0);
    }

    #[test]
    fn a_holder_suspended_before_the_grant_or_within_the_slack_is_not() {
        let t = Duration::from_secs(1);
        for suspended in [600, 999, 1000, 1049] {
            let r = check_election(&history(suspended, 1500), &fault(), t);
            assert_eq!(r.valid, Validity::True, "suspended at {suspended} ms: {:?}", r.anomalies);
        }
    }

    #[test]
    fn a_holder_that_already_invoked_its_resign_is_not_judged() {
        let t = Duration::from_secs(1);
        let r = check_election(&history(1300, 990), &fault(), t);
        assert_eq!(r.valid, Validity::True, "{:?}", r.anomalies);
    }

    #[test]
    fn the_slack_is_min_50_ms_and_t_over_20() {
        assert_eq!(state_slack(Duration::from_millis(1000)), 50 * MS);
        assert_eq!(state_slack(Duration::from_millis(600)), 30 * MS);
        assert_eq!(state_slack(Duration::from_millis(5000)), 50 * MS);
    }
}
