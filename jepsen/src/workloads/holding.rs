//! What the read-write lock and semaphore workloads share: a slot that
//! asks for a hold, keeps it a while, releases it, and takes a fresh
//! process after an error or once its session expired. Each workload says
//! what it asks for ([`Ask`]) and how its operations are named
//! ([`Holding`]).

use std::sync::Arc;
use std::time::Duration;

use baton_checker::history::role::MAIN;
use baton_client::SessionState;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

use super::{new_process, next_process};
use crate::door::{DoorClient, DoorLock};
use crate::record::{retire, Call, OpError, Run};

/// How long a worker waits for its hold before it gives up ("timeout").
const ACQUIRE_WAIT: Duration = Duration::from_secs(4);

/// One workload's names.
pub(super) struct Holding {
    /// The lock's or semaphore's name.
    pub name: &'static str,
    /// `f` of the acquire and of the release in the history.
    pub acquire: &'static str,
    pub release: &'static str,
}

/// What one acquire asks for.
pub(super) enum Ask {
    /// A read hold (`write` false) or the write hold of a read-write lock.
    Rw { write: bool },
    /// One permit of a semaphore of this size.
    Permit(usize),
}

impl Ask {
    /// The acquire's invocation value.
    fn args(&self) -> Value {
        match self {
            Ask::Rw { write } => json!({"write": write}),
            Ask::Permit(n) => json!({"permits": n}),
        }
    }

    /// Its `ok` value for a grant with `token`.
    fn granted(&self, token: u64) -> Value {
        match self {
            Ask::Rw { write } => json!({"token": token, "write": write}),
            Ask::Permit(_) => json!({"token": token}),
        }
    }

    async fn take(&self, c: &DoorClient, name: &str) -> Result<DoorLock, OpError> {
        match self {
            Ask::Rw { write } => c.rw_lock(name, *write, ACQUIRE_WAIT).await,
            Ask::Permit(n) => c.semaphore(name, *n, ACQUIRE_WAIT).await,
        }
    }
}

/// One client slot until the run stops: `ask` draws each acquire, `long`
/// whether its hold lasts 2-4 session timeouts (until the session leaves
/// `Connected`) instead of 10-40 ms.
pub(super) async fn worker(
    run: Arc<Run>,
    slot: usize,
    mut rng: StdRng,
    w: &Holding,
    mut ask: impl FnMut(&mut StdRng) -> Ask,
    mut long: impl FnMut(&mut StdRng) -> bool,
) {
    let Some((mut c, mut p)) = new_process(&run, slot, MAIN).await else { return };
    while !run.stopped() {
        run.checkpoint(slot).await;
        let a = ask(&mut rng);
        let acquire = async {
            let g = a.take(&c, w.name).await?;
            let granted = a.granted(g.token());
            Ok((g, granted))
        };
        let call = Call::new(w.acquire, w.name).args(a.args()).definite();
        run.set_waiting(slot, true);
        let acquired = run.op(p, call, acquire).await;
        run.set_waiting(slot, false);
        let fresh = match acquired {
            Ok(g) => {
                run.became_holder(slot, &c);
                let long = long(&mut rng);
                !hold(&run, slot, p, &c, g, w, long, &mut rng).await
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

/// Holds `g` (long or 10-40 ms), then releases it; false if the release
/// failed.
#[allow(clippy::too_many_arguments)]
async fn hold(
    run: &Arc<Run>,
    slot: usize,
    p: u64,
    c: &DoorClient,
    g: DoorLock,
    w: &Holding,
    long: bool,
    rng: &mut StdRng,
) -> bool {
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
    let call = Call::new(w.release, w.name).args(json!({"token": t})).error_value(done.clone()).definite();
    let release = async {
        run.set_holder(slot, false);
        g.release().await?;
        Ok(((), done))
    };
    run.op(p, call, release).await.is_ok()
}
