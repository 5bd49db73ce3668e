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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_client::{Client, CreateOptions, Error, ErrorCode, Op, SessionState, WatchKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::record::{classify, retire, Run};
use baton_checker::history::{FaultWindow, History, OpType};
use baton_checker::CheckResult;

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

use baton_checker::history::role::{MAIN, OBSERVER, STORAGE};
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

/// The register checker: keys start as "0" at version 0, as [`setup`]
/// creates them.
pub fn check_register(h: &History) -> CheckResult {
    baton_checker::register::check(h, baton_checker::register::RegisterState { value: Some(0), version: 0 })
}

pub fn check_lock(h: &History, faults: &[FaultWindow], final_counter: Option<i64>, t: Duration) -> CheckResult {
    baton_checker::lock::check(h, LOCK, faults, final_counter, t)
}

pub fn check_election(h: &History, faults: &[FaultWindow], t: Duration) -> CheckResult {
    baton_checker::election::check(h, ELECTION, faults, t)
}

pub fn check_session(h: &History, leftover: Option<Vec<String>>) -> CheckResult {
    baton_checker::session::check(h, leftover)
}
