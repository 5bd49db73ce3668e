//! The read-write lock workload: take a read hold (seven times in ten) or
//! the write hold of one read-write lock, hold it 10-40 ms, release; a
//! fresh process after an error or once its session expired. Checked by
//! `baton_checker::rwlock`: a write hold beside any other hold outside
//! faults, or a holder still `Connected` after a conflicting hold went to
//! another session, fails it; read holds may share.
//!
//! History: `rw-acquire` (invoke `{"write"}`, ok `{"token", "write"}`),
//! `rw-release` (ok `{"token", "lost"}`: whether the client had left
//! `Connected` first).

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
use crate::door::DoorLock;
use crate::record::{retire, Call, OpError, Run};

const NAME: &str = "jepsen-rw";
/// Chance that a hold is the write hold.
const WRITE: f64 = 0.3;
/// How long a worker waits for its hold before it gives up ("timeout").
const ACQUIRE_WAIT: Duration = Duration::from_secs(4);

/// The read-write lock checker; `t` is the session timeout.
pub fn check(h: &History, faults: &[FaultWindow], t: Duration) -> CheckResult {
    baton_checker::rwlock::check(h, NAME, faults, t)
}

/// One client slot: acquire, hold, release.
pub(super) async fn worker(run: Arc<Run>, slot: usize, mut rng: StdRng) {
    let Some((mut c, mut p)) = new_process(&run, slot, MAIN).await else { return };
    while !run.stopped() {
        run.checkpoint(slot).await;
        let write = rng.gen_bool(WRITE);
        let acquire = async {
            let g = c.rw_lock(NAME, write, ACQUIRE_WAIT).await?;
            let token = g.token();
            Ok((g, json!({"token": token, "write": write})))
        };
        let call = Call::new("rw-acquire", NAME).args(json!({"write": write})).definite();
        run.set_waiting(slot, true);
        let acquired = run.op(p, call, acquire).await;
        run.set_waiting(slot, false);
        let fresh = match acquired {
            Ok(g) => {
                run.became_holder(slot, &c);
                !hold(&run, slot, p, &c, g, &mut rng).await
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

/// Holds `g` 10-40 ms, then releases it; false if the release failed.
async fn hold(run: &Arc<Run>, slot: usize, p: u64, c: &crate::door::DoorClient, g: DoorLock, rng: &mut StdRng) -> bool {
    let t = g.token();
    run.sleep(Duration::from_millis(rng.gen_range(10..40))).await;
    // A pause point while it believes it holds.
    run.checkpoint(slot).await;
    let lost = *c.state().borrow() != SessionState::Connected;
    let done = json!({"token": t, "lost": lost});
    let call = Call::new("rw-release", NAME).args(json!({"token": t})).error_value(done.clone()).definite();
    let release = async {
        run.set_holder(slot, false);
        g.release().await?;
        Ok(((), done))
    };
    run.op(p, call, release).await.is_ok()
}
