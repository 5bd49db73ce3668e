//! The lock workload: take the lock, read a counter, write it +1 guarded by
//! `check_fence` with the lock's token (through a separate "storage"
//! session, as an external resource would be), release. Checked by
//! `baton_checker::lock`. One acquire in four gives up after 5-60 ms
//! ([`IMPATIENT`]), so waiters leave from the middle of the queue while
//! another client holds the lock.
//!
//! History: `acquire` (ok `{"token"}`), `read-counter` (ok `{"token",
//! "value"}`), `incr` (invoke `{"token", "from"}`, ok also `{"value",
//! "mzxid"}`: the value written and its commit position), `release` (ok
//! `{"token", "lost"}`: whether the client had left `Connected` first).

use std::sync::Arc;
use std::time::Duration;

use baton_checker::history::role::{MAIN, STORAGE};
use baton_checker::history::{FaultWindow, History};
use baton_checker::CheckResult;
use baton_client::{Client, SessionState};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{create, new_process, next_process};
use crate::door::{DoorClient, DoorLock};
use crate::record::{retire, Call, OpError, Run};

const COUNTER: &str = "/jepsen/counter";
const LOCK: &str = "jepsen";
/// The fence's resource name (the counter it guards).
const FENCE: &str = "jepsen-counter";
/// How long a worker waits for the lock before it gives up ("timeout").
const ACQUIRE_WAIT: Duration = Duration::from_secs(4);
/// Chance that a worker is impatient: it waits [`SHORT_WAIT`] only, so
/// waiters leave from the middle of the queue while the holder holds (the
/// grant must go to the first waiter, never to the one behind a leaver:
/// the deliberate bug `first-to-successor` is caught by that).
const IMPATIENT: f64 = 0.25;
/// An impatient worker's wait, in ms (a hold is ~15-50 ms).
const SHORT_WAIT: std::ops::Range<u64> = 5..60;

pub(super) async fn setup(c: &Client) -> anyhow::Result<()> {
    create(c, COUNTER, "0").await
}

/// The counter after the run (None: no answer in 5 s).
pub(super) async fn read_counter(c: &Client) -> Option<i64> {
    for _ in 0..20 {
        if let Ok((d, _)) = c.get(COUNTER).await {
            return std::str::from_utf8(&d).ok().and_then(|s| s.parse().ok());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// The lock checker; `final_counter` from `read_counter`, `t` the
/// session timeout.
pub fn check(h: &History, faults: &[FaultWindow], final_counter: Option<i64>, t: Duration) -> CheckResult {
    baton_checker::lock::check(h, LOCK, faults, final_counter, t)
}

/// One client slot: acquire, [`hold`], and a fresh process after an error
/// or once the lock client's session expired.
pub(super) async fn worker(run: Arc<Run>, slot: usize, mut rng: StdRng) {
    let Some((mut lc, mut p)) = new_process(&run, slot, MAIN).await else { return };
    let Some(mut sc) = storage_client(&run, slot, p).await else { return };
    while !run.stopped() {
        run.checkpoint(slot).await;
        let wait =
            if rng.gen_bool(IMPATIENT) { Duration::from_millis(rng.gen_range(SHORT_WAIT)) } else { ACQUIRE_WAIT };
        let acquire = async {
            let g = lc.lock(LOCK, wait).await?;
            let token = g.token();
            Ok((g, json!({"token": token})))
        };
        run.set_waiting(slot, true);
        let acquired = run.op(p, Call::new("acquire", LOCK).definite(), acquire).await;
        run.set_waiting(slot, false);
        let fresh = match acquired {
            Ok(g) => {
                run.became_holder(slot, &lc);
                let Some((storage, fresh)) = hold(&run, slot, p, &lc, sc, g, &mut rng).await else { return };
                sc = storage;
                fresh
            }
            Err(OpError::TimedOut) => false,
            Err(_) => true,
        };
        let Some(next) = next_process(&run, slot, (lc, p), fresh).await else { return };
        (lc, p) = next;
        run.sleep(Duration::from_millis(rng.gen_range(0..20))).await;
    }
    run.set_holder(slot, false);
    retire(lc);
    retire(sc);
}

/// One hold of lock guard `g` by process `p`: read the counter through the
/// storage client `sc`, "work", write it +1 through the fence, release.
/// Returns the storage client (a new one if the old was retired) and
/// whether the lock client must be replaced; None once the run stops.
async fn hold(
    run: &Arc<Run>,
    slot: usize,
    p: u64,
    lc: &DoorClient,
    mut sc: DoorClient,
    g: DoorLock,
    rng: &mut StdRng,
) -> Option<(DoorClient, bool)> {
    let t = g.token();
    let fence = g.fence();
    let mut fresh = false;
    // Pause points sit between the steps, where a real process could be
    // stopped while it believes it holds the lock.
    run.checkpoint(slot).await;
    let read = async {
        let (d, _) = sc.get(COUNTER).await?;
        let n: i64 = std::str::from_utf8(&d).ok().and_then(|s| s.parse().ok()).unwrap_or(-1);
        Ok((n, json!({"token": t, "value": n})))
    };
    let args = json!({"token": t});
    let n = run.op(p, Call::new("read-counter", "counter").args(args.clone()).error_value(args), read).await;
    // "Work" while holding: most of a hold lies before the next pause
    // point, so a paused holder is usually mid-hold.
    run.sleep(Duration::from_millis(rng.gen_range(10..40))).await;
    run.checkpoint(slot).await;
    if let Ok(n) = n {
        let incr = async {
            let mzxid = sc.fenced_set(&fence, FENCE, COUNTER, (n + 1).to_string().as_bytes()).await?;
            Ok(((), json!({"token": t, "from": n, "value": n + 1, "mzxid": mzxid})))
        };
        let args = json!({"token": t, "from": n});
        let r = run.op(p, Call::new("incr", "counter").args(args.clone()).error_value(args), incr).await;
        if r.is_err_and(|e| e.may_have_happened()) {
            sc = renew_storage(run, sc, slot, p).await?;
            fresh = true;
        }
    }
    // The storage session can expire on its own (its member was paused):
    // replace it, as a real client would reconnect.
    if sc.is_expired() {
        sc = renew_storage(run, sc, slot, p).await?;
    }
    let lost = *lc.state().borrow() != SessionState::Connected;
    let done = json!({"token": t, "lost": lost});
    let call = Call::new("release", LOCK).args(json!({"token": t})).error_value(done.clone()).definite();
    let release = async {
        run.set_holder(slot, false);
        g.release().await?;
        Ok(((), done))
    };
    let released = run.op(p, call, release).await;
    Some((sc, fresh || released.is_err()))
}

/// A storage client for `slot`'s process `p` (None once the run stops).
async fn storage_client(run: &Arc<Run>, slot: usize, p: u64) -> Option<DoorClient> {
    let sc = run.connect_storage(slot).await?;
    run.watch_state(&sc, p, STORAGE, slot);
    Some(sc)
}

/// Retires storage client `old` and connects a new one.
async fn renew_storage(run: &Arc<Run>, old: DoorClient, slot: usize, p: u64) -> Option<DoorClient> {
    retire(old);
    storage_client(run, slot, p).await
}
