//! The election workload: campaign, lead a while (half the time 2-4
//! session timeouts, until `is_leader()` turns false), resign; one slot
//! observes and records every leader change. Checked by
//! `baton_checker::election`.
//!
//! History: `campaign` (invoke `{"value": process}`, ok `{"token"}`),
//! `resign` (ok `{"token", "lost"}`: whether it had stopped leading
//! first), `observe` (ok `{"token"}` of the leader seen, or null).

use std::sync::Arc;
use std::time::Duration;

use baton_checker::history::role::{MAIN, OBSERVER};
use baton_checker::history::{FaultWindow, History};
use baton_checker::CheckResult;
use baton_client::SessionState;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{new_process, next_process};
use crate::door::{DoorClient, DoorLeadership};
use crate::record::{retire, Call, OpError, Run};

const NAME: &str = "jepsen";
/// Chance that a leader leads for 2-4 session timeouts (ending early once
/// its session is not `Connected`). Lock holds stay short: a long one
/// stalls every waiter (the lock's throughput fell 7x with 1 in 5).
const LONG_HOLD: f64 = 0.5;
/// How long a worker campaigns before it gives up ("timeout").
const CAMPAIGN_WAIT: Duration = Duration::from_secs(4);

/// The election checker; `t` is the session timeout.
pub fn check(h: &History, faults: &[FaultWindow], t: Duration) -> CheckResult {
    baton_checker::election::check(h, NAME, faults, t)
}

/// One client slot: campaign, [`lead_a_while`], and a fresh process after an
/// error or once its session expired.
pub(super) async fn worker(run: Arc<Run>, slot: usize, mut rng: StdRng) {
    let Some((mut c, mut p)) = new_process(&run, slot, MAIN).await else { return };
    while !run.stopped() {
        run.checkpoint(slot).await;
        let campaign = async {
            let lead = c.campaign(NAME, p.to_string(), CAMPAIGN_WAIT).await?;
            let token = lead.token();
            Ok((lead, json!({"token": token})))
        };
        let call = Call::new("campaign", NAME).args(json!({"value": p})).definite();
        run.set_waiting(slot, true);
        let campaigned = run.op(p, call, campaign).await;
        run.set_waiting(slot, false);
        let fresh = match campaigned {
            Ok(lead) => !lead_a_while(&run, slot, p, &c, lead, &mut rng).await,
            Err(OpError::TimedOut) => false,
            Err(_) => true,
        };
        let Some(next) = next_process(&run, slot, (c, p), fresh).await else { return };
        (c, p) = next;
    }
    run.set_holder(slot, false);
    retire(c);
}

/// Leads a while, then resigns; false if the resign failed.
async fn lead_a_while(
    run: &Arc<Run>,
    slot: usize,
    p: u64,
    c: &DoorClient,
    lead: DoorLeadership,
    rng: &mut StdRng,
) -> bool {
    let t = lead.token();
    run.became_holder(slot, c);
    if rng.gen_bool(LONG_HOLD) {
        run.set_holder_long(slot);
        // A long-lived leader: leads until done or until `is_leader()`
        // turns false (session not Connected).
        linger(run, c, rng, 2.0..4.0).await;
    } else {
        run.sleep(Duration::from_millis(rng.gen_range(100..800))).await;
    }
    run.checkpoint(slot).await;
    let lost = !lead.is_leader();
    let resign = async {
        run.set_holder(slot, false);
        lead.resign().await?;
        Ok(((), json!({"token": t, "lost": lost})))
    };
    let args = json!({"token": t});
    run.op(p, Call::new("resign", NAME).args(args.clone()).error_value(args).definite(), resign).await.is_ok()
}

/// Holds on for `timeouts` session timeouts (a random number in the
/// range), or until `c`'s session is no longer `Connected` (a holder must
/// then assume it lost what it held), or the run stops.
pub(super) async fn linger(run: &Run, c: &DoorClient, rng: &mut StdRng, timeouts: std::ops::Range<f64>) {
    let until = std::time::Instant::now() + run.session.mul_f64(rng.gen_range(timeouts));
    let st = c.state();
    while std::time::Instant::now() < until && !run.stopped() {
        if *st.borrow() != SessionState::Connected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The observer slot: every leader change its client sees, through a
/// fresh client whenever the observation ends.
pub(super) async fn observer(run: Arc<Run>, slot: usize) {
    while !run.stopped() {
        let Some((c, p)) = new_process(&run, slot, OBSERVER).await else { return };
        let Ok(mut obs) = c.observe(NAME).await else {
            retire(c);
            continue;
        };
        loop {
            let next = tokio::select! {
                n = obs.next() => n,
                _ = run.sleep(Duration::from_secs(3600)) => None,
            };
            let Some(l) = next else { break };
            run.event(p, "observe", NAME, json!({"token": l}));
        }
        retire(c);
    }
}
