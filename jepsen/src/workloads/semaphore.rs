//! The semaphore workload: take a permit of one semaphore of
//! [`PERMITS`], hold it 10-40 ms, release; the workload's first slot
//! holds every other permit for 2-4 session timeouts instead (ending early
//! once its session is not `Connected`): a holder a targeted fault can cut
//! off while the others go on with the other permit; a fresh process
//! after an error or once its session expired (holding.rs). Checked by
//! `baton_checker::semaphore`:
//! more than [`PERMITS`] holds at once outside faults, or, when a permit
//! is granted over the limit, more than `PERMITS - 1` earlier holders still
//! `Connected`, fails it.
//!
//! History: `sem-acquire` (ok `{"token"}`), `sem-release` (ok `{"token",
//! "lost"}`: whether the client had left `Connected` first).

use std::sync::Arc;
use std::time::Duration;

use baton_checker::history::{FaultWindow, History};
use baton_checker::CheckResult;
use rand::rngs::StdRng;
use rand::Rng;

use super::holding::{Ask, Holding};
use crate::record::Run;

const NAME: &str = "jepsen-sem";
/// The semaphore's size: five slots share two permits.
pub const PERMITS: usize = 2;
/// Chance that a hold of the long-holding slot is long (module doc).
const LONG_HOLD: f64 = 0.5;

/// The semaphore checker; `t` is the session timeout.
pub fn check(h: &History, faults: &[FaultWindow], t: Duration) -> CheckResult {
    baton_checker::semaphore::check(h, NAME, PERMITS, faults, t)
}

/// One client slot: acquire, hold, release; `long`: the slot that
/// sometimes holds long.
pub(super) async fn worker(run: Arc<Run>, slot: usize, long: bool, rng: StdRng) {
    let w = Holding { name: NAME, acquire: "sem-acquire", release: "sem-release" };
    super::holding::worker(run, slot, rng, &w, |_| Ask::Permit(PERMITS), |r| long && r.gen_bool(LONG_HOLD)).await;
}
