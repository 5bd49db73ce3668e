//! The nemesis: faults on a schedule (a few seconds healthy, then 4-8 s of
//! one fault, then heal), each recorded as a fault window for the checkers
//! and the plots.
//!
//! - `kill`: kill -9 a minority of members, restart them at the heal.
//! - `pause`: SIGSTOP a member, or freeze a client process (its task stops
//!   and its links stall, so its session expires while it still believes it
//!   holds what it held): long enough to outlive session timeouts.
//! - `partition`: isolate one member, split majority/minority, a majorities
//!   ring (every member sees a majority, no two the same), or one-way drops.
//! - `leader`: kill, pause or isolate the current leader.
//! - `all`: a random mix of the above.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use tokio::sync::Mutex;

use crate::db::Db;
use crate::history::FaultWindow;
use crate::record::Run;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NemesisKind {
    None,
    Kill,
    Pause,
    Partition,
    Leader,
    All,
}

/// One fault, as applied.
enum Fault {
    Killed(Vec<u64>),
    Paused(u64),
    ClientPaused(usize),
    Partitioned,
}

/// Runs until `run.stop`; heals everything before returning.
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
            NemesisKind::All => *[NemesisKind::Kill, NemesisKind::Pause, NemesisKind::Partition, NemesisKind::Leader]
                .choose(&mut rng)
                .unwrap_or(&NemesisKind::Partition),
            k => k,
        };
        let start = run.now();
        let (fault, label, detail) = {
            let mut db = db.lock().await;
            match apply(&mut db, &run, k, nodes, &mut rng, &client_slots).await {
                Some(x) => x,
                None => continue,
            }
        };
        println!("[{:>5.1}s] nemesis: {label} {detail}", start as f64 / 1e9);
        run.sleep(Duration::from_millis(rng.gen_range(4000..8000))).await;
        {
            let mut db = db.lock().await;
            heal(&mut db, &run, fault);
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
    for s in &client_slots {
        run.set_paused(*s, false);
    }
}

async fn apply(
    db: &mut Db,
    run: &Run,
    k: NemesisKind,
    nodes: u64,
    rng: &mut StdRng,
    client_slots: &[usize],
) -> Option<(Fault, &'static str, String)> {
    let members: Vec<u64> = (1..=nodes).collect();
    let minority = ((nodes - 1) / 2).max(1) as usize;
    match k {
        NemesisKind::Kill => {
            let victims: Vec<u64> = members.choose_multiple(rng, minority).copied().collect();
            for v in &victims {
                db.kill(*v);
            }
            Some((Fault::Killed(victims.clone()), "kill", format!("members {victims:?}")))
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
            if !targets.is_empty() && rng.gen_bool(0.5) {
                let slot = *targets.choose(rng)?;
                run.set_paused(slot, true);
                db.proxies.stall_slot(slot, true);
                Some((
                    Fault::ClientPaused(slot),
                    "pause",
                    format!("client slot {slot} (process frozen, links stalled)"),
                ))
            } else {
                let v = *members.choose(rng)?;
                db.pause(v);
                Some((Fault::Paused(v), "pause", format!("member {v} (SIGSTOP)")))
            }
        }
        NemesisKind::Partition => {
            let mut order = members.clone();
            order.shuffle(rng);
            let (label, detail) = match rng.gen_range(0..4) {
                0 => {
                    let x = order[0];
                    db.proxies.apply(|a, b| (a == x) != (b == x));
                    ("partition", format!("isolate member {x}"))
                }
                1 => {
                    let small: Vec<u64> = order[..minority].to_vec();
                    let s2 = small.clone();
                    db.proxies.apply(move |a, b| s2.contains(&a) != s2.contains(&b));
                    ("partition", format!("minority {small:?} | majority"))
                }
                2 => {
                    // Member order[i] hears from the next `majority - 1`
                    // members around the ring only.
                    let n = order.len();
                    let maj = n / 2 + 1;
                    let pos: std::collections::HashMap<u64, usize> =
                        order.iter().enumerate().map(|(i, m)| (*m, i)).collect();
                    db.proxies.apply(move |a, b| {
                        let (pa, pb) = (pos[&a], pos[&b]);
                        (pa + n - pb) % n >= maj
                    });
                    ("partition", format!("majorities ring {order:?}"))
                }
                _ => {
                    let (x, y) = (order[0], order[1]);
                    db.proxies.apply(move |a, b| a == x && b == y);
                    ("partition", format!("one-way: {x} cannot send to {y}"))
                }
            };
            Some((Fault::Partitioned, label, detail))
        }
        NemesisKind::Leader => {
            let leader = db.leader().await?;
            match rng.gen_range(0..3) {
                0 => {
                    db.kill(leader);
                    Some((Fault::Killed(vec![leader]), "leader", format!("kill -9 leader {leader}")))
                }
                1 => {
                    db.pause(leader);
                    Some((Fault::Paused(leader), "leader", format!("SIGSTOP leader {leader}")))
                }
                _ => {
                    db.proxies.apply(|a, b| (a == leader) != (b == leader));
                    Some((Fault::Partitioned, "leader", format!("isolate leader {leader}")))
                }
            }
        }
        NemesisKind::None | NemesisKind::All => None,
    }
}

fn heal(db: &mut Db, run: &Run, fault: Fault) {
    match fault {
        Fault::Killed(v) => {
            for id in v {
                let _ = db.restart(id);
            }
        }
        Fault::Paused(id) => db.resume(id),
        Fault::ClientPaused(slot) => {
            db.proxies.stall_slot(slot, false);
            run.set_paused(slot, false);
        }
        Fault::Partitioned => db.proxies.heal(),
    }
}
