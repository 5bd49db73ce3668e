//! The lock safety test against a rival's own lock recipe (`baton-bench
//! lock-safety --target etcd|baton-zk --nemesis
//! none|pause|kill|leader|all`). Against etcd it reproduces the finding of
//! Jepsen's etcd 3.4.3 analysis: a lock alone does not make a
//! read-modify-write safe, because a holder that pauses past its lease
//! keeps going after someone else was granted the lock. Against
//! `baton-zk` it runs ZooKeeper's lock recipe and fence (a multi with a
//! check on the lock node) through Baton's ZooKeeper port.
//!
//! Every client loops: lock (etcd's Lock RPC under its lease, TTL 2 s),
//! read two counters, [pause point], write each + 1, unlock. The
//! `unfenced` counter is a plain put; the `fenced` one is a txn that only
//! applies while the lock key still has the holder's create revision (the
//! fencing token). The pause nemesis freezes a client mid-hold for 3-6 s
//! (its keepalives stop too, as a stopped process's would; only a client
//! with a [`TargetClient::freeze_switch`], an etcd one, can be frozen like
//! that: another is only held at the pause point while its session
//! lives), or SIGSTOPs a member (the first fault is always a holder's
//! freeze). Kill kills -9 a member: etcd's once (etcd.sh cannot restart
//! one member), one of a target that can restart its members
//! ([`Target::restart`]) in turns, each started again after its fault.
//! `leader` kills -9 and SIGSTOPs the current leader in turns (the
//! failover the benchmark measures, under the checker). `all` takes
//! turns: a client freeze, a kill, a SIGSTOP.
//!
//! Checker, per counter: every acknowledged write was meant as +1, so with
//! no lost update the final value is at least the acknowledged count (and
//! at most that plus the indeterminate writes), and no two acknowledged
//! writes wrote the same value. The verdict is the fenced counter's, and
//! for `baton-zk` also the `protocol` checker's (no error code a ZooKeeper
//! server never sends, zk_port_register.rs); the unfenced counter's lost
//! updates are reported as what the lock alone allows.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::targets::baton_zk::BatonZkTarget;
use super::targets::etcd::EtcdTarget;
use super::targets::{Kind, OpError, Target, TargetClient};
use baton_checker::Validity;
use baton_jepsen::nemesis::NemesisKind;

/// Lease TTL of the test's clients: pauses of 3-6 s outlive it.
const LEASE: Duration = Duration::from_secs(2);
const LOCK: &str = "safety";

pub struct RivalLockOpts {
    /// etcd or baton-zk.
    pub target: Kind,
    pub nemesis: NemesisKind,
    pub time_limit: Duration,
    pub concurrency: usize,
    pub seed: u64,
    pub out: PathBuf,
}

/// What happened to one counter.
#[derive(Default, Debug, Clone, serde::Serialize)]
pub struct CounterTally {
    /// Acknowledged increments (value written).
    pub acked: Vec<u64>,
    /// Writes with no answer (may have applied).
    pub indeterminate: u64,
    /// Writes the fence refused.
    pub refused: u64,
    pub final_value: u64,
}

impl CounterTally {
    /// Increments lost: acknowledged ones missing from the final value,
    /// or duplicates (two holders wrote the same value).
    pub fn lost(&self) -> u64 {
        let acked = self.acked.len() as u64;
        let mut seen = std::collections::BTreeSet::new();
        let dups = self.acked.iter().filter(|v| !seen.insert(**v)).count() as u64;
        acked.saturating_sub(self.final_value).max(dups)
    }
    pub fn valid(&self) -> bool {
        self.lost() == 0 && self.final_value <= self.acked.len() as u64 + self.indeterminate
    }
}

#[derive(Default)]
struct Tallies {
    unfenced: CounterTally,
    fenced: CounterTally,
    grants: u64,
    pauses: Vec<String>,
    /// Failed writes by error kind (the text before any detail).
    write_errors: std::collections::BTreeMap<String, u64>,
}

struct Slot {
    paused: AtomicBool,
    holding: AtomicBool,
    frozen: Mutex<Option<Arc<AtomicBool>>>,
}

fn parse(v: Option<Vec<u8>>) -> u64 {
    v.and_then(|b| String::from_utf8(b).ok()).and_then(|s| s.parse().ok()).unwrap_or(0)
}

async fn worker<T: Target>(target: Arc<T>, i: usize, slot: Arc<Slot>, t: Arc<Mutex<Tallies>>, stop: Arc<AtomicBool>) {
    let mut client: Option<T::Client> = None;
    while !stop.load(Ordering::SeqCst) {
        let Some(c) = client.as_ref() else {
            match target.connect(i, LEASE).await {
                Ok(c) => {
                    *slot.frozen.lock().unwrap_or_else(|p| p.into_inner()) = c.freeze_switch();
                    client = Some(c);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
            continue;
        };
        let r = round(c, &slot, &t).await;
        slot.holding.store(false, Ordering::SeqCst);
        if let Err(e) = r {
            if e.is_session_lost() {
                if let Some(c) = client.take() {
                    c.close().await;
                }
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    if let Some(c) = client {
        c.close().await;
    }
}

/// A write that failed this way may still have been applied: no answer
/// came, or the session ended while it was on its way (a ZooKeeper client
/// fails every pending request with SESSIONEXPIRED then, answered or not).
/// A baton-zk run under `all` ended its fenced counter one above its
/// acknowledged writes while only `Indeterminate` counted; the failed
/// writes' errors (now in `results.json`, `write_errors`) were not kept.
fn may_have_happened(e: &OpError) -> bool {
    matches!(e, OpError::Indeterminate(_) | OpError::SessionLost(_))
}

/// `indeterminate: connection loss`-like text: the variant and the first
/// words of the cause.
fn error_kind(e: &OpError) -> String {
    e.to_string().chars().take(60).collect()
}

/// One hold: lock, read both counters, pause point, write both, unlock.
async fn round<C: TargetClient>(c: &C, slot: &Slot, t: &Mutex<Tallies>) -> Result<(), OpError> {
    let held = tokio::time::timeout(Duration::from_secs(10), c.lock(LOCK))
        .await
        .map_err(|_| OpError::Failed("lock timed out".into()))??;
    slot.holding.store(true, Ordering::SeqCst);
    t.lock().unwrap_or_else(|p| p.into_inner()).grants += 1;
    // The token is read now, while the lock is surely held.
    c.token(&held).await?;
    let u = parse(c.get("unfenced").await?);
    let f = parse(c.get("fenced").await?);
    tokio::time::sleep(Duration::from_millis(2)).await;
    while slot.paused.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let value = (u + 1).to_string();
    let r = c.put("unfenced", value.as_bytes()).await;
    {
        let mut g = t.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = &r {
            *g.write_errors.entry(error_kind(e)).or_default() += 1;
        }
        match &r {
            Ok(()) => g.unfenced.acked.push(u + 1),
            Err(e) if may_have_happened(e) => g.unfenced.indeterminate += 1,
            Err(_) => {}
        }
    }
    let value = (f + 1).to_string();
    let r2 = c.fenced_put(&held, "fenced", value.as_bytes()).await;
    {
        let mut g = t.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = &r2 {
            *g.write_errors.entry(error_kind(e)).or_default() += 1;
        }
        match &r2 {
            Ok(true) => g.fenced.acked.push(f + 1),
            Ok(false) => g.fenced.refused += 1,
            Err(e) if may_have_happened(e) => g.fenced.indeterminate += 1,
            Err(_) => {}
        }
    }
    let _ = c.unlock(held).await;
    r?;
    r2.map(|_| ())
}

pub async fn run(o: RivalLockOpts) -> anyhow::Result<(Validity, serde_json::Value)> {
    if !matches!(
        o.nemesis,
        NemesisKind::None | NemesisKind::Pause | NemesisKind::Kill | NemesisKind::Leader | NemesisKind::All
    ) {
        anyhow::bail!("against a rival's lock the nemesis is none, pause, kill, leader or all");
    }
    std::fs::create_dir_all(&o.out)?;
    match o.target {
        Kind::Etcd => {
            println!("[phase] setup: etcd 3-member cluster (bench/rivals/etcd.sh)");
            let t = Arc::new(EtcdTarget::start(&o.out.join("cluster")).await?);
            run_on(t, o).await
        }
        Kind::BatonZk => {
            println!("[phase] setup: 3 batond members with their ZooKeeper ports");
            let t = Arc::new(BatonZkTarget::start(&o.out.join("cluster")).await?);
            run_on(t, o).await
        }
        other => anyhow::bail!("the rival lock test runs against etcd or baton-zk, not {}", other.name()),
    }
}

/// A fault on one member of a target (the rival tests' nemesis turns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemberFault {
    /// kill -9, started again at the heal when the target can
    /// ([`Target::restart`]).
    Kill,
    /// SIGSTOP, SIGCONT at the heal.
    Stop,
    /// Every peer link cut, both directions ([`Target::isolate`]); its
    /// clients still reach it. Healed at the heal.
    Isolate,
}

/// Applies `f` to member `m` (for `hold`, as the description says);
/// returns the description and the heal.
pub(crate) fn member_fault<T: Target>(
    target: &Arc<T>,
    m: usize,
    f: MemberFault,
    hold: Duration,
) -> anyhow::Result<(String, Box<dyn FnOnce() + Send>)> {
    let name = target.kind().name();
    let t = target.clone();
    Ok(match f {
        MemberFault::Kill => {
            target.kill(m)?;
            let heal: Box<dyn FnOnce() + Send> = Box::new(move || {
                if let Err(e) = t.restart(m) {
                    eprintln!("[nemesis] starting member {} again: {e:#}", m + 1);
                }
            });
            (format!("kill -9 {name} member {}", m + 1), heal)
        }
        MemberFault::Stop => {
            target.pause(m, true)?;
            let heal: Box<dyn FnOnce() + Send> = Box::new(move || {
                let _ = t.pause(m, false);
            });
            (format!("SIGSTOP {name} member {} for {:.1} s", m + 1, hold.as_secs_f64()), heal)
        }
        MemberFault::Isolate => {
            anyhow::ensure!(target.isolate(m, true)?, "{name}: this cluster's peer links cannot be cut");
            let heal: Box<dyn FnOnce() + Send> = Box::new(move || {
                if let Err(e) = t.isolate(m, false) {
                    eprintln!("[nemesis] healing links: {e:#}");
                }
            });
            (format!("isolate {name} member {} for {:.1} s", m + 1, hold.as_secs_f64()), heal)
        }
    })
}

/// The member a member fault of `nemesis` hits: the current leader for
/// `leader` (a random one if none is known), else a random one.
pub(crate) async fn fault_target<T: Target>(target: &Arc<T>, nemesis: NemesisKind, rng: &mut StdRng) -> usize {
    let any = rng.gen_range(0..target.members());
    if nemesis == NemesisKind::Leader {
        return target.leader().await.unwrap_or(any);
    }
    any
}

/// Whether fault number `n` of `nemesis` kills a member (-9) rather than
/// SIGSTOPping one (`all` takes turns: a client, a kill, a SIGSTOP).
fn member_kill(nemesis: NemesisKind, n: usize) -> bool {
    match nemesis {
        NemesisKind::Kill => true,
        NemesisKind::Leader => n.is_multiple_of(2),
        NemesisKind::All => n % 3 == 1,
        _ => false,
    }
}

async fn run_on<T: Target>(target: Arc<T>, o: RivalLockOpts) -> anyhow::Result<(Validity, serde_json::Value)> {
    let name = target.kind().name();
    println!(
        "baton-bench: target {name} workload lock nemesis {:?} time {}s concurrency {} seed {} out {}",
        o.nemesis,
        o.time_limit.as_secs(),
        o.concurrency,
        o.seed,
        o.out.display()
    );
    let tallies = Arc::new(Mutex::new(Tallies::default()));
    let off_before = super::targets::zookeeper::off_protocol();
    let stop = Arc::new(AtomicBool::new(false));
    let slots: Vec<Arc<Slot>> = (0..o.concurrency.max(2))
        .map(|_| {
            Arc::new(Slot { paused: AtomicBool::new(false), holding: AtomicBool::new(false), frozen: Mutex::new(None) })
        })
        .collect();
    let tasks: Vec<_> = slots
        .iter()
        .enumerate()
        .map(|(i, s)| tokio::spawn(worker(target.clone(), i, s.clone(), tallies.clone(), stop.clone())))
        .collect();
    println!("[phase] running {} s", o.time_limit.as_secs());
    let mut rng = StdRng::seed_from_u64(o.seed);
    let start = Instant::now();
    let end = start + o.time_limit;
    let mut faults = 0;
    let mut killed_for_good = false;
    tokio::time::sleep(Duration::from_secs(2).min(o.time_limit)).await;
    while Instant::now() + Duration::from_secs(8) < end && o.nemesis != NemesisKind::None {
        let hold_for = Duration::from_millis(rng.gen_range(3000..6000));
        let at = start.elapsed().as_secs_f64();
        let what: String;
        let resume: Box<dyn FnOnce() + Send>;
        // The first pause always freezes a holder: that is the case the
        // test is about; later ones may SIGSTOP a member instead.
        let on_member = match o.nemesis {
            NemesisKind::Pause => faults > 0 && rng.gen_bool(0.25),
            NemesisKind::All => faults % 3 != 0,
            _ => true,
        };
        let kill = member_kill(o.nemesis, faults);
        faults += 1;
        if on_member {
            let m = fault_target(&target, o.nemesis, &mut rng).await;
            let f = if kill && !killed_for_good { MemberFault::Kill } else { MemberFault::Stop };
            (what, resume) = member_fault(&target, m, f, hold_for)?;
            // A target that cannot start one member again (etcd.sh) gets
            // one kill per run: a minority fault.
            killed_for_good |= f == MemberFault::Kill && !target.restart_supported();
        } else {
            // Prefer a client that holds the lock now (look for up to 2 s).
            let mut pick = None;
            for _ in 0..200 {
                let holders: Vec<usize> =
                    (0..slots.len()).filter(|i| slots[*i].holding.load(Ordering::SeqCst)).collect();
                if let Some(h) = holders.choose(&mut rng) {
                    pick = Some(*h);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let s = pick.unwrap_or_else(|| rng.gen_range(0..slots.len()));
            let slot = slots[s].clone();
            slot.paused.store(true, Ordering::SeqCst);
            if let Some(f) = slot.frozen.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                f.store(true, Ordering::SeqCst);
            }
            resume = Box::new(move || {
                if let Some(f) = slot.frozen.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    f.store(false, Ordering::SeqCst);
                }
                slot.paused.store(false, Ordering::SeqCst);
            });
            what = format!(
                "client {s} frozen for {:.1} s{}",
                hold_for.as_secs_f64(),
                if pick.is_some() { " (holding the lock)" } else { "" }
            );
        }
        println!("[nemesis] {at:6.1}s {what}");
        tallies.lock().unwrap_or_else(|p| p.into_inner()).pauses.push(format!("{at:.1}s {what}"));
        tokio::time::sleep(hold_for).await;
        resume();
        if o.nemesis == NemesisKind::Kill && killed_for_good {
            break;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(2000..4000))).await;
    }
    if let Some(rest) = end.checked_duration_since(Instant::now()) {
        tokio::time::sleep(rest).await;
    }
    stop.store(true, Ordering::SeqCst);
    println!("[phase] stopping clients");
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    // Final reads through a fresh client.
    let reader = target.connect(0, Duration::from_secs(10)).await?;
    let fu = parse(reader.get("unfenced").await.map_err(|e| anyhow::anyhow!("final read: {e}"))?);
    let ff = parse(reader.get("fenced").await.map_err(|e| anyhow::anyhow!("final read: {e}"))?);
    reader.close().await;
    target.stop();
    let mut t = std::mem::take(&mut *tallies.lock().unwrap_or_else(|p| p.into_inner()));
    t.unfenced.final_value = fu;
    t.fenced.final_value = ff;
    // The protocol checker (ZooKeeper clients): no error code a ZooKeeper
    // server never sends (zk_port_register.rs says why).
    let off = super::targets::zookeeper::off_protocol() - off_before;
    let valid = if t.fenced.valid() && off == 0 { Validity::Valid } else { Validity::Invalid };
    let summary = |c: &CounterTally| {
        json!({
            "acked": c.acked.len(),
            "indeterminate": c.indeterminate,
            "refused_by_fence": c.refused,
            "final": c.final_value,
            "lost_updates": c.lost(),
            "valid": c.valid(),
        })
    };
    let results = json!({
        "target": name,
        "workload": "lock",
        "nemesis": format!("{:?}", o.nemesis).to_lowercase(),
        "seed": o.seed,
        "grants": t.grants,
        "write_errors": t.write_errors,
        "faults": t.pauses,
        "unfenced": summary(&t.unfenced),
        "fenced": summary(&t.fenced),
        "off_protocol_errors": off,
        "valid": valid.as_str(),
        "note": "valid is the fenced counter's verdict and no off-protocol error; the unfenced counter shows what the lock alone allows",
    });
    std::fs::write(o.out.join("results.json"), serde_json::to_string_pretty(&results)?)?;
    println!(
        "unfenced counter (lock only):   {} acked increments, final {}, {} lost updates{}",
        t.unfenced.acked.len(),
        t.unfenced.final_value,
        t.unfenced.lost(),
        if t.unfenced.lost() > 0 { "  <- the lock alone lost updates" } else { "" }
    );
    println!(
        "fenced counter (etcd: a txn on the lock key's create revision; ZooKeeper: a multi checking the lock node): {} acked, {} refused by the fence, final {}, {} lost updates",
        t.fenced.acked.len(),
        t.fenced.refused,
        t.fenced.final_value,
        t.fenced.lost()
    );
    println!("grants {}, faults {}", t.grants, t.pauses.len());
    Ok((valid, results))
}

#[cfg(test)]
mod tests {
    use super::CounterTally;

    fn tally(acked: &[u64], indeterminate: u64, final_value: u64) -> CounterTally {
        CounterTally { acked: acked.to_vec(), indeterminate, refused: 0, final_value }
    }

    #[test]
    fn counter_checker() {
        // Every increment landed.
        assert_eq!(tally(&[1, 2, 3], 0, 3).lost(), 0);
        assert!(tally(&[1, 2, 3], 0, 3).valid());
        // A stale holder wrote 2 again after 3 and 4: two updates lost.
        let t = tally(&[1, 2, 3, 4, 2], 0, 2);
        assert_eq!(t.lost(), 3);
        assert!(!t.valid());
        // Same value acked twice (both read 1): one lost even if the
        // count happens to match later.
        assert_eq!(tally(&[1, 2, 2, 3, 4], 0, 5).lost(), 1);
        // An indeterminate write may have applied: final may exceed acked.
        assert!(tally(&[1, 2], 1, 3).valid());
        // ... but not by more than the indeterminate writes.
        assert!(!tally(&[1, 2], 1, 5).valid());
    }
}
