//! The nemesis: faults on a schedule (a few seconds healthy, then 4-8 s of
//! one fault, then heal), each recorded as a fault window for the checkers
//! and the plots.
//!
//! - `kill`: kill -9 a minority of members, restart them at the heal.
//! - `pause`: SIGSTOP a member, or freeze a client process (its task stops
//!   and its links stall, so its session expires while it still believes it
//!   holds what it held): long enough to outlive session timeouts. Half
//!   the client freezes take the longest waiter of a queue that has
//!   a holder and another waiter ([`Run::mid_queue_waiter`]): its node
//!   leaves from the middle of the queue when its session expires, and
//!   the grant must still go only to the first waiter.
//! - `partition`: isolate one member, split majority/minority, a majorities
//!   ring (every member sees a majority, no two the same), or one-way drops.
//! - `leader`: kill, pause or isolate the current leader.
//! - `isolate-peers`: cut every peer link of one member, both directions,
//!   and keep every client link up, so its clients stay connected to a
//!   member cut off from the leader (the session-contact findings: a member
//!   that vouches for a session from its own state, a deposed leader that
//!   still answers keepalives). Half the time the leader, half the time a
//!   follower; either way it prefers the member that a client holding a
//!   lock or leadership talks to (as the holder reported it, else the
//!   holder's home), best one that just started a long hold (waiting up to
//!   4 s), since a holder connected to the cut-off member and still holding
//!   when its session could expire is what exposes those bugs. Held 2-4
//!   session timeouts (the cut-off member's sessions have expired or moved
//!   by then), not 4-8 s, so a run sees more of them.
//! - `pause-leader-long`: SIGSTOP the current leader for 1.5-3 session
//!   timeouts, then SIGCONT (the window is that long, not 4-8 s): a new
//!   leader takes over meanwhile, and the old one resumes with session
//!   deadlines that are long stale and a role it no longer has.
//! - `membership`: add a fresh member with the next unused id (`member
//!   add`, `batond --join`: it catches up by snapshot and log), two times
//!   in three as a voter the leader promotes once caught up (four voters,
//!   quorum three), else as a learner; at the heal remove it again, half
//!   the voters after `member move-leader` made them leader (removing the
//!   leader: leadership moves first). Its links are direct; the other
//!   nemeses act on the founding members only.
//! - `corrupt`: kill -9 a member, flip 1-4 bits of its newest RocksDB file
//!   (WAL or SST) and start it: it must refuse its data dir (exit code 3).
//!   At the heal the file is put back and the member restarted. A member
//!   that starts on damaged data, or crashes on it, is the anomaly
//!   `damaged-data-not-refused` of the `storage` check (runner.rs).
//! - `kill-client` (the CLI door only: cli_door.rs): kill -9 the `baton`
//!   process of a current holder (a long-lived leader first, granted less
//!   than half a session timeout ago, waiting up to 2 s, then any holder),
//!   as the OOM killer would; its command must stop at once, not run on
//!   beside the next holder, who is granted once the session expires. The
//!   window is 1.5-2 session timeouts, so that grant falls inside it.
//! - `all`: a random mix of the above (`kill-client` only through the CLI
//!   door).
//!
//! Every fault is recorded as a [`FaultWindow`] (kind = the label printed,
//! from the moment it is applied to its heal) for the checkers and plots.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use tokio::sync::Mutex;

use crate::db::Db;
use crate::door::Door;
use crate::record::{Holder, Run};
use baton_checker::history::FaultWindow;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NemesisKind {
    None,
    Kill,
    Pause,
    Partition,
    Leader,
    IsolatePeers,
    PauseLeaderLong,
    Membership,
    Corrupt,
    KillClient,
    All,
}

/// One fault, as applied.
enum Fault {
    Killed(Vec<u64>),
    Paused(u64),
    ClientPaused(usize),
    Partitioned,
    /// `kill-client`: a holder's `baton` killed -9.
    ClientKilled,
    /// Members added by `membership`, removed at the heal (after handing
    /// them leadership, when `true`).
    Added(bool),
    /// `corrupt`: the member, the damaged file and its original bytes.
    Damaged(u64, std::path::PathBuf, Vec<u8>),
}

/// In the detail of a `corrupt` window whose member did not refuse its
/// data dir with exit code 3 (it started anyway, or crashed).
pub const DAMAGE_NOT_REFUSED: &str = "NOT REFUSED";

/// The kinds `all` mixes (and [`NemesisKind::KillClient`] through the CLI
/// door).
const MIX: [NemesisKind; 8] = [
    NemesisKind::Kill,
    NemesisKind::Pause,
    NemesisKind::Partition,
    NemesisKind::Leader,
    NemesisKind::IsolatePeers,
    NemesisKind::PauseLeaderLong,
    NemesisKind::Membership,
    NemesisKind::Corrupt,
];

/// Runs until `run.stop`; heals everything before returning. The session
/// timeout (`run.session`) sizes `pause-leader-long`.
pub async fn run(run: Arc<Run>, db: Arc<Mutex<Db>>, kind: NemesisKind, mut rng: StdRng, client_slots: Vec<usize>) {
    if kind == NemesisKind::None {
        return;
    }
    let nodes = db.lock().await.nodes;
    loop {
        run.sleep(Duration::from_millis(rng.gen_range(2500..5000))).await;
        if run.stopped() {
            break;
        }
        let k = match kind {
            NemesisKind::All if run.door == Door::Cli && rng.gen_bool(1.0 / 9.0) => NemesisKind::KillClient,
            NemesisKind::All => *MIX.choose(&mut rng).unwrap_or(&NemesisKind::Partition),
            k => k,
        };
        let (fault, label, detail, hold, start) = {
            let mut db = db.lock().await;
            match apply(&mut db, &run, k, nodes, &mut rng, &client_slots).await {
                Some(x) => x,
                None => continue,
            }
        };
        println!("[{:>5.1}s] nemesis: {label} {detail}", start as f64 / 1e9);
        let hold = hold.unwrap_or_else(|| Duration::from_millis(rng.gen_range(4000..8000)));
        run.sleep(hold).await;
        {
            let mut db = db.lock().await;
            heal(&mut db, &run, fault).await;
        }
        let end = run.now();
        println!("[{:>5.1}s] nemesis: heal {label}", end as f64 / 1e9);
        run.faults.lock().unwrap_or_else(|p| p.into_inner()).push(FaultWindow {
            kind: label.to_string(),
            detail,
            start,
            end,
        });
    }
    let mut db = db.lock().await;
    let _ = db.heal_all();
    if let Err(e) = db.remove_added().await {
        println!("nemesis: removing added members: {e:#}");
    }
    for s in &client_slots {
        run.set_paused(*s, false);
    }
}

/// The home member of client slot `slot` (as `Db::slot_endpoints` has it).
fn home_of(slot: usize, nodes: u64) -> u64 {
    slot as u64 % nodes + 1
}

/// Waits up to 4 s for a holder (lock or leadership) whose member (the one
/// its client reported talking to, else the one its slot's newest open
/// connection leads to (`live`: a ZooKeeper client reports nothing), else
/// its home) `pick` accepts, as [`await_holder`] prefers them. Returns that
/// member and a description of the holder.
async fn holder_member(
    run: &Run,
    nodes: u64,
    live: impl Fn(usize) -> Option<u64>,
    pick: impl Fn(u64) -> bool,
) -> Option<(u64, String)> {
    await_holder(run, |s, h, now| {
        let (m, how) = match (h.member, live(s)) {
            (Some(m), _) => (m, "reported"),
            (None, Some(m)) => (m, "its open connection"),
            (None, None) => (home_of(s, nodes), "home"),
        };
        if !pick(m) {
            return None;
        }
        let long = if h.long { ", long hold" } else { "" };
        let age = now.saturating_sub(h.since) / 1_000_000;
        Some((m, format!("holder slot {s} on it ({how}{long}, granted {age} ms ago)")))
    })
    .await
}

/// Waits up to 4 s for a current holder that `accept` (slot, holder, now)
/// takes: for 2 s only one that means to hold on for long and was granted
/// less than half a session timeout ago (it will still hold when sessions
/// could expire), if the run has such holds (leaderships do, locks not),
/// then any.
async fn await_holder<T>(run: &Run, accept: impl Fn(usize, &Holder, u64) -> Option<T>) -> Option<T> {
    let fresh = run.session.as_nanos() as u64 / 2;
    for i in 0..200 {
        let now = run.now();
        let any = i >= 100 || !run.has_long_holds();
        let found = run
            .holder_list()
            .into_iter()
            .filter(|(_, h)| any || (h.long && now.saturating_sub(h.since) < fresh))
            .find_map(|(s, h)| accept(s, &h, now));
        if found.is_some() || run.stopped() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Applies one fault of kind `k`: (what to heal, label, detail, how long
/// to hold it if not the usual 4-8 s, when it was applied). Some kinds
/// first wait for a holder; the window starts at the action itself.
async fn apply(
    db: &mut Db,
    run: &Run,
    k: NemesisKind,
    nodes: u64,
    rng: &mut StdRng,
    client_slots: &[usize],
) -> Option<(Fault, &'static str, String, Option<Duration>, u64)> {
    let members: Vec<u64> = (1..=nodes).collect();
    let minority = ((nodes - 1) / 2).max(1) as usize;
    match k {
        NemesisKind::Kill => {
            let victims: Vec<u64> = members.choose_multiple(rng, minority).copied().collect();
            let at = run.now();
            for v in &victims {
                db.kill(*v);
            }
            Some((Fault::Killed(victims.clone()), "kill", format!("members {victims:?}"), None, at))
        }
        NemesisKind::Pause => {
            // Prefer a client that holds a lock or leadership right now
            // (handoffs leave short gaps: look for up to 2 s).
            let mut holders = run.holders();
            for _ in 0..200 {
                if !holders.is_empty() || client_slots.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                holders = run.holders();
            }
            let targets: Vec<usize> = if holders.is_empty() { client_slots.to_vec() } else { holders };
            // One client freeze in two takes a waiter from the middle of
            // a queue instead: its session expires while it waits, and its
            // node leaves the queue while another client holds.
            let waiter = if rng.gen_bool(0.5) { run.mid_queue_waiter() } else { None };
            let client = match waiter {
                Some(slot) => Some((slot, ", waiting in a queue")),
                None if !targets.is_empty() && rng.gen_bool(0.5) => Some((*targets.choose(rng)?, "")),
                None => None,
            };
            if let Some((slot, what)) = client {
                let at = run.now();
                run.set_paused(slot, true);
                db.proxies().stall_slot(slot, true);
                let detail = format!("client slot {slot}{what} (process frozen, links stalled)");
                Some((Fault::ClientPaused(slot), "pause", detail, None, at))
            } else {
                let v = *members.choose(rng)?;
                let at = run.now();
                db.pause(v);
                Some((Fault::Paused(v), "pause", format!("member {v} (SIGSTOP)"), None, at))
            }
        }
        NemesisKind::Partition => {
            let mut order = members.clone();
            order.shuffle(rng);
            let at = run.now();
            let (label, detail) = match rng.gen_range(0..4) {
                0 => {
                    let x = order[0];
                    db.proxies().apply(|a, b| (a == x) != (b == x));
                    ("partition", format!("isolate member {x}"))
                }
                1 => {
                    let small: Vec<u64> = order[..minority].to_vec();
                    let s2 = small.clone();
                    db.proxies().apply(move |a, b| s2.contains(&a) != s2.contains(&b));
                    ("partition", format!("minority {small:?} | majority"))
                }
                2 => {
                    // Member order[i] hears from the next `majority - 1`
                    // members around the ring only.
                    let n = order.len();
                    let maj = n / 2 + 1;
                    let pos: std::collections::HashMap<u64, usize> =
                        order.iter().enumerate().map(|(i, m)| (*m, i)).collect();
                    db.proxies().apply(move |a, b| {
                        let (pa, pb) = (pos[&a], pos[&b]);
                        (pa + n - pb) % n >= maj
                    });
                    ("partition", format!("majorities ring {order:?}"))
                }
                _ => {
                    let (x, y) = (order[0], order[1]);
                    db.proxies().apply(move |a, b| a == x && b == y);
                    ("partition", format!("one-way: {x} cannot send to {y}"))
                }
            };
            Some((Fault::Partitioned, label, detail, None, at))
        }
        NemesisKind::Leader => {
            let leader = db.leader().await?;
            let at = run.now();
            match rng.gen_range(0..3) {
                0 => {
                    db.kill(leader);
                    Some((Fault::Killed(vec![leader]), "leader", format!("kill -9 leader {leader}"), None, at))
                }
                1 => {
                    db.pause(leader);
                    Some((Fault::Paused(leader), "leader", format!("SIGSTOP leader {leader}"), None, at))
                }
                _ => {
                    db.proxies().apply(|a, b| (a == leader) != (b == leader));
                    Some((Fault::Partitioned, "leader", format!("isolate leader {leader}"), None, at))
                }
            }
        }
        NemesisKind::IsolatePeers => {
            let leader = db.leader().await;
            let (x, role, holder) = match leader {
                Some(l) if rng.gen_bool(0.5) => {
                    // The leader, once a holder's client talks to it.
                    let h = holder_member(run, nodes, |s| db.proxies().slot_member(s), |m| m == l).await;
                    (l, "leader", h.map(|h| h.1))
                }
                _ => {
                    let followers: Vec<u64> = members.iter().copied().filter(|m| Some(*m) != leader).collect();
                    let live = |s| db.proxies().slot_member(s);
                    let (x, h) = match holder_member(run, nodes, live, |m| Some(m) != leader).await {
                        Some((m, h)) => (m, Some(h)),
                        None => (*followers.choose(rng)?, None),
                    };
                    (x, if leader.is_some() { "follower" } else { "member (no leader known)" }, h)
                }
            };
            // The leader may have changed while we waited.
            let role = match (role, db.leader().await) {
                ("leader", Some(l)) if l != x => "former leader",
                (r, _) => r,
            };
            let holder = holder.unwrap_or_else(|| "no holder on it".into());
            // 2-4 session timeouts: the cut-off member's sessions are expired
            // (or their clients moved) well within that.
            let t = run.session.as_millis() as u64;
            let hold = Duration::from_millis(rng.gen_range(t * 2..=t * 4));
            let at = run.now();
            db.proxies().isolate_peers(x);
            Some((
                Fault::Partitioned,
                "isolate-peers",
                format!(
                    "{role} {x}: every peer link cut both ways, client links up, for {} ms; {holder}",
                    hold.as_millis()
                ),
                Some(hold),
                at,
            ))
        }
        NemesisKind::PauseLeaderLong => {
            let leader = db.leader().await?;
            let t = run.session.as_millis() as u64;
            let hold = Duration::from_millis(rng.gen_range(t * 3 / 2..=t * 3));
            let at = run.now();
            db.pause(leader);
            Some((
                Fault::Paused(leader),
                "pause-leader-long",
                format!(
                    "SIGSTOP leader {leader} for {} ms ({:.1} x the session timeout)",
                    hold.as_millis(),
                    hold.as_secs_f64() / run.session.as_secs_f64()
                ),
                Some(hold),
                at,
            ))
        }
        NemesisKind::Membership => {
            let at = run.now();
            // A voter (promoted once caught up) two times in three, else a
            // learner; half the voters are made leader before removal.
            let voter = rng.gen_bool(2.0 / 3.0);
            let lead = voter && rng.gen_bool(0.5);
            let what = match (voter, lead) {
                (false, _) => "a learner",
                (true, false) => "a learner, promoted once caught up",
                (true, true) => "a learner, promoted, then made leader and removed as leader",
            };
            match db.add_member(voter).await {
                Ok(id) => Some((Fault::Added(lead), "membership", format!("member {id} added: {what}"), None, at)),
                Err(e) => {
                    println!("[{:>5.1}s] nemesis: membership: {e:#}", at as f64 / 1e9);
                    None
                }
            }
        }
        NemesisKind::Corrupt => {
            let victim = *members.choose(rng)?;
            let flips = rng.gen_range(1..=4);
            let at = run.now();
            let (file, original) = db.damage(victim, rng, flips)?;
            let _ = db.restart(victim);
            // The member must refuse its data dir at start (exit 3).
            let mut code = None;
            for _ in 0..100 {
                code = db.exit_code(victim);
                if code.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let name = file.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            let verdict = match code {
                Some(3) => "refused its data dir (exit 3)".to_string(),
                Some(c) => format!("{DAMAGE_NOT_REFUSED}: exited {c}"),
                None => format!("{DAMAGE_NOT_REFUSED}: started on it"),
            };
            let detail = format!("member {victim}: {flips} bits flipped in {name}; {verdict}");
            Some((Fault::Damaged(victim, file, original), "corrupt", detail, None, at))
        }
        NemesisKind::KillClient => {
            let (slot, h) = cli_holder(run).await?;
            let pid = h.pid?;
            let at = run.now();
            crate::cli_door::kill9(pid);
            let t = run.session.as_millis() as u64;
            let hold = Duration::from_millis(rng.gen_range(t * 3 / 2..=t * 2));
            let long = if h.long { ", long hold" } else { "" };
            let age = at.saturating_sub(h.since) / 1_000_000;
            let detail = format!("kill -9 baton (pid {pid}) of holder slot {slot}{long}, granted {age} ms ago");
            Some((Fault::ClientKilled, "kill-client", detail, Some(hold), at))
        }
        NemesisKind::None | NemesisKind::All => None,
    }
}

/// A holder through the CLI door (its `baton`'s pid known), as
/// [`await_holder`] prefers them; None through another door.
async fn cli_holder(run: &Run) -> Option<(usize, Holder)> {
    if run.door != Door::Cli {
        return None;
    }
    await_holder(run, |s, h, _| h.pid.is_some().then_some((s, *h))).await
}

async fn heal(db: &mut Db, run: &Run, fault: Fault) {
    match fault {
        Fault::Killed(v) => {
            for id in v {
                let _ = db.restart(id);
            }
        }
        Fault::Paused(id) => db.resume(id),
        Fault::ClientPaused(slot) => {
            db.proxies().stall_slot(slot, false);
            run.set_paused(slot, false);
        }
        Fault::Partitioned => db.proxies().heal(),
        // Nothing to undo: the worker goes on with a new `baton`.
        Fault::ClientKilled => {}
        Fault::Added(lead) => {
            if lead {
                if let Err(e) = db.lead_added().await {
                    println!("nemesis: moving leadership to the added member: {e:#}");
                }
            }
            // Removal needs a leader: retried at the final heal if it fails.
            if let Err(e) = db.remove_added().await {
                println!("nemesis: removing added members: {e:#}");
            }
        }
        Fault::Damaged(id, file, original) => {
            db.kill(id);
            db.repair(&file, &original);
            let _ = db.restart(id);
        }
    }
}
