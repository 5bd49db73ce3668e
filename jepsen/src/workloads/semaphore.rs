//! The semaphore workload: take a permit of one semaphore of
//! [`PERMITS`], hold it 10-40 ms, release; the workload's first slot
//! holds every other permit for 2-4 session timeouts instead (ending early
//! once its session is not `Connected`): a holder a targeted fault can cut
//! off while the others go on with the other permit; a fresh process after an error or once its session expired. Checked by `baton_checker::semaphore`:
//! more than [`PERMITS`] holds at once outside faults, or, when a permit
//! is granted over the limit, more than `PERMITS - 1` earlier holders still
//! `Connected`, fails it.
//!
//! History: `sem-acquire` (ok `{"token"}`), `sem-release` (ok `{"token",
//! "lost"}`: whether the client had left `Connected` first).

use std::sync::Arc;
use std::time::Duration;

use baton_checker::history::role::MAIN;
use baton_checker::history::{FaultWindow, History};
use baton_checker::CheckResult;
use baton_client::SessionState;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{new_process, next_process};
use crate::door::{DoorClient, DoorLock};
use crate::record::{retire, Call, OpError, Run};

const NAME: &str = "jepsen-sem";
/// The semaphore's size: five slots share two permits.
pub const PERMITS: usize = 2;
/// Chance that a hold of the long-holding slot is long (module doc).
const LONG_HOLD: f64 = 0.5;
/// How long a worker waits for a permit before it gives up ("timeout").
const ACQUIRE_WAIT: Duration = Duration::from_secs(4);

/// The semaphore checker; `t` is the session timeout.
pub fn check(h: &History, faults: &[FaultWindow], t: Duration) -> CheckResult {
    baton_checker::semaphore::check(h, NAME, PERMITS, faults, t)
}

/// One client slot: acquire, hold, release; `long`: the slot that
/// sometimes holds long.
pub(super) async fn worker(run: Arc<Run>, slot: usize, long: bool, mut rng: StdRng) {
    let Some((mut c, mut p)) = new_process(&run, slot, MAIN).await else { return };
    while !run.stopped() {
        run.checkpoint(slot).await;
        let acquire = async {
            let g = c.semaphore(NAME, PERMITS, ACQUIRE_WAIT).await?;
            let token = g.token();
            Ok((g, json!({"token": token})))
        };
        let call = Call::new("sem-acquire", NAME).args(json!({"permits": PERMITS})).definite();
        run.set_waiting(slot, true);
        let acquired = run.op(p, call, acquire).await;
        run.set_waiting(slot, false);
        let fresh = match acquired {
            Ok(g) => {
                run.became_holder(slot, &c);
                let long = long && rng.gen_bool(LONG_HOLD);
                !hold(&run, slot, p, &c, g, long, &mut rng).await
            }
            Err(OpError::TimedOut) => false,
            Err(_) => true,
        };
        let Some(next) = next_process(&run, slot, (c, p), fresh).await else { return };
        (c, p) = next;
        run.sleep(Duration::from_millis(rng.gen_range(0..20))).await;
    }
    run.set_holder(slot, false);
    retire(c);
}

/// Holds `g` (module doc), then releases it; false if the release failed.
async fn hold(run: &Arc<Run>, slot: usize, p: u64, c: &DoorClient, g: DoorLock, long: bool, rng: &mut StdRng) -> bool {
    let t = g.token();
    if long {
        run.set_holder_long(slot);
        super::election::linger(run, c, rng, 2.0..4.0).await;
    } else {
        run.sleep(Duration::from_millis(rng.gen_range(10..40))).await;
    }
    // A pause point while it believes it holds.
    run.checkpoint(slot).await;
    let lost = *c.state().borrow() != SessionState::Connected;
    let done = json!({"token": t, "lost": lost});
    let call = Call::new("sem-release", NAME).args(json!({"token": t})).error_value(done.clone()).definite();
    let release = async {
        run.set_holder(slot, false);
        g.release().await?;
        Ok(((), done))
    };
    run.op(p, call, release).await.is_ok()
}
