//! The session workload: ephemeral nodes must live exactly as long as
//! their session; one-shot watches fire once, in order. Checked by
//! `baton_checker::session`.
//!
//! Each session creates its node, checks it every 50-250 ms (up to
//! `CHECKS` times) while watching a sibling, then closes. Half the slots
//! also run a side task of stale reads (`get_opts`/`children_opts` with
//! `stale`) and watch churn (stale exists-watches and persistent watches,
//! registered and dropped): answers a cut-off member gives from its own
//! state, which must never count as contact.
//!
//! History: `create`, `check` (ok `{"exists", "disturbed"}`: whether the
//! session had left `Connected` by the time the answer came),
//! `watch-event` (ok `{"zxid", "type"}`), `close`; the side task's
//! `stale-read`, `stale-children` and `watch-churn` under a process of its
//! own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_checker::history::role::MAIN;
use baton_checker::history::History;
use baton_checker::CheckResult;
use baton_client::{Client, SessionState, WatchKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::{create, new_process};
use crate::door::{DoorClient, DoorWatcher};
use crate::record::{retire, Call, OpError, Run};

const SESSIONS: &str = "/jepsen/sessions";
/// Checks of its node per session at most.
const CHECKS: usize = 40;
/// Rounds of one session's stale poller at most.
const STALE_POLLS: usize = 5000;

pub(super) async fn setup(c: &Client) -> anyhow::Result<()> {
    create(c, SESSIONS, "").await
}

/// The sessions' nodes left after the run.
pub(super) async fn leftover(c: &Client) -> Option<Vec<String>> {
    c.children(SESSIONS).await.ok()
}

/// The session checker; `leftover` from `leftover()`.
pub fn check(h: &History, leftover: Option<Vec<String>>) -> CheckResult {
    baton_checker::session::check(h, leftover)
}

/// One client slot: one session after another, each with its node, its
/// checks and (for a `poller`) the side task, ended by a close.
pub(super) async fn worker(run: Arc<Run>, slot: usize, poller: bool, mut rng: StdRng) {
    while !run.stopped() {
        let Some((c, p)) = new_process(&run, slot, MAIN).await else { return };
        let disturbed = disturbed(&c);
        let path = format!("{SESSIONS}/p{p}");
        let make = async {
            let czxid = c.create_ephemeral(&path).await?;
            Ok(((), json!({"czxid": czxid})))
        };
        if run.op(p, Call::new("create", &path), make).await.is_err() {
            retire(c);
            continue;
        }
        // The side task: stale reads and watch churn, under its own
        // process id, until this session's checks are done.
        let done = Arc::new(AtomicBool::new(false));
        let side = poller.then(|| {
            let seed = rng.gen::<u64>();
            tokio::spawn(stale_poller(run.clone(), c.clone(), p, path.clone(), done.clone(), seed))
        });
        check_node(&run, slot, &c, p, &path, &disturbed, &mut rng).await;
        done.store(true, Ordering::SeqCst);
        if let Some(side) = side {
            let _ = tokio::time::timeout(Duration::from_secs(6), side).await;
        }
        // End the session voluntarily; its node must go with it.
        let close = async {
            match tokio::time::timeout(Duration::from_secs(3), c.close()).await {
                Ok(Ok(())) => Ok(((), Value::Null)),
                _ => Err(OpError::Unconfirmed("close not confirmed")),
            }
        };
        let _ = run.op(p, Call::new("close", &path), close).await;
    }
}

/// Set once `c`'s session was ever in doubt (not `Connected`): then losing
/// its node is allowed.
fn disturbed(c: &DoorClient) -> Arc<AtomicBool> {
    let disturbed = Arc::new(AtomicBool::new(false));
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
    disturbed
}

/// Checks node `path` every 50-250 ms, at most [`CHECKS`] times or until
/// the session expires, with a one-shot watch on a sibling, re-armed after
/// each event.
async fn check_node(
    run: &Run,
    slot: usize,
    c: &DoorClient,
    p: u64,
    path: &str,
    disturbed: &AtomicBool,
    rng: &mut StdRng,
) {
    let mut watch: Option<DoorWatcher> = None;
    let mut checks = 0;
    while !run.stopped() && checks < CHECKS {
        run.checkpoint(slot).await;
        run.sleep(Duration::from_millis(rng.gen_range(50..250))).await;
        checks += 1;
        let check = async {
            let exists = c.exists(path).await?;
            // Sampled when the answer is in: a read that waited out a
            // partition may return after the session was (rightly)
            // expired, and the client was Suspended meanwhile.
            let was_disturbed = disturbed.load(Ordering::SeqCst);
            Ok(((), json!({"exists": exists, "disturbed": was_disturbed})))
        };
        let _ = run.op(p, Call::new("check", path), check).await;
        if c.is_expired() {
            break;
        }
        if let Some(w) = watch.as_mut() {
            if let Ok(ev) = tokio::time::timeout(Duration::from_millis(1), w.next()).await {
                if let Some(ev) = ev {
                    run.event(p, "watch-event", &ev.path, json!({"zxid": ev.zxid, "type": ev.kind}));
                }
                watch = None;
            }
        }
        if watch.is_none() {
            let target = format!("{SESSIONS}/p{}", p.saturating_sub(1 + rng.gen_range(0..3)));
            if let Ok((_, w)) = c.exists_watch(&target, false).await {
                watch = Some(w);
            }
        }
    }
}

/// Stale reads and watch churn on session `c` (worker process `of`):
/// answers a member gives from its own state, also while it is cut off from
/// the leader, which must never count as contact with the cluster (a client
/// or server that counted them would keep the session `Connected` while
/// the majority expires it: finding S1's class). Ends when `done` is set,
/// the session is expired or the run stops; at most `STALE_POLLS` rounds.
async fn stale_poller(run: Arc<Run>, c: DoorClient, of: u64, path: String, done: Arc<AtomicBool>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let p = run.new_process();
    // Watches kept a little while, then dropped (which removes them).
    let mut held: Vec<DoorWatcher> = Vec::new();
    for _ in 0..STALE_POLLS {
        if done.load(Ordering::SeqCst) || run.stopped() || c.is_expired() {
            break;
        }
        let sibling = format!("{SESSIONS}/p{}", of.saturating_sub(rng.gen_range(0..4)));
        let _ = match rng.gen_range(0..4) {
            0 => {
                let read = async { Ok(((), c.stale_get(&path).await?)) };
                run.op(p, Call::new("stale-read", &path), read).await
            }
            1 => {
                let list = async {
                    let n = c.stale_children(SESSIONS).await?;
                    Ok(((), json!({"children": n})))
                };
                run.op(p, Call::new("stale-children", SESSIONS), list).await
            }
            2 => {
                let watch = async {
                    let (exists, w) = c.exists_watch(&sibling, true).await?;
                    held.push(w);
                    Ok(((), json!({"exists": exists})))
                };
                run.op(p, Call::new("watch-churn", &sibling).args(json!({"stale": true})), watch).await
            }
            _ => {
                let kind = if rng.gen_bool(0.5) { WatchKind::Data } else { WatchKind::Children };
                let watch = async {
                    let w = c.watch_persistent(&sibling, kind).await?;
                    held.push(w);
                    Ok(((), json!({"registered": true})))
                };
                run.op(p, Call::new("watch-churn", &sibling).args(json!({"persistent": true})), watch).await
            }
        };
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
