//! The runtime around the driver: one task on the member's tokio runtime
//! runs the loop, with the wall clock, the input channel the listeners and
//! the transport feed, and the syncer thread that does the fsyncs
//! (raft-rs's async-ready mode).
//!
//! One turn of the loop (the driver's docs say what each step does):
//! 1. yield once, so the I/O tasks on this worker run between turns; wait
//!    for input or the next tick; take what is queued (at most
//!    [`MAX_INPUTS_PER_TURN`]);
//! 2. `handle` each input; a `Shutdown` fails pending writes and stops;
//! 3. `on_persisted` for each write the syncer finished;
//! 4. `tick` when due (with whether this turn drained the queue);
//! 5. `end_turn`: ReadIndex, Ready, reads, session rounds.
//!
//! A turn over [`LONG_TURN`] is logged at warn with the milliseconds of
//! each step ("a driver turn took long").
//!
//! Everything that decides lives in `driver/` and takes `now` as an
//! argument; this file only reads the clock and moves messages.
//!
//! # A member's threads
//! - **A tokio runtime with half the cores as workers** (1 to 8, or
//!   `--io-threads`; main.rs `io_threads`). Its tasks:
//!   - **the driver** ([`Node::run`], spawned by `Member::run`, member.rs),
//!     which returns only at shutdown. It owns the raft-rs `RawNode`, the
//!     state machine, the watch table, the session layer and every pending
//!     request. The state machine is shared behind an `RwLock`
//!     (`SharedState`): only the driver writes it, and the listener tasks
//!     read it to answer stale reads without a watch (`view::fast_read`)
//!     without waiting for a driver turn. The driver holds the write lock
//!     while it applies an entry and queues the entry's events and reply,
//!     so a local read that sees the entry is answered after them on the
//!     same connection;
//!   - all network I/O: the client accept loop (`listener::serve`) and, per
//!     connection, a reader task (`listener::handle`) and a writer task
//!     (`listener::write_loop`, over the shared `batch::write_batch`); the
//!     peer accept loop (`transport::serve`) and one task per inbound peer
//!     connection (`transport::admit`, then `transport::frames`); one
//!     `transport::sender` task per other member (with a small reader that
//!     logs the acceptor's refusal); the HTTP listener when `--http-addr`
//!     is set (http.rs); and a task that turns SIGTERM or SIGINT into
//!     `Input::Shutdown`.
//! - **The syncer thread** (syncer.rs): every RocksDB write, in the order
//!   the driver made it, several Readies per fsync (group commit). The
//!   driver keeps stepping messages, committing, applying and answering
//!   while an fsync runs (raft-rs's async-ready mode).
//! - **The snapshot thread** (syncer.rs): snapshots and backups, encoded
//!   from a RocksDB view of a checkpoint the syncer wrote.
//! - RocksDB's own background threads (flushes, compactions).
//!
//! Why the driver is a task, not a thread of its own (issue 26, R3;
//! docs/perf/per-op.md): every input the driver takes comes from an I/O
//! task (a peer's frame, a client's request) and nearly every output goes
//! to one (a peer's sender, a connection's writer). On a thread of its own
//! each of those was a wake-up of another thread, and a contended lock's
//! grant crosses the three members' drivers several times; as a task the
//! I/O task's send makes the driver the next task on the same worker, and
//! the driver's sends do the same for the writers. Only the fsync leaves
//! the worker (the syncer thread), so the driver never blocks on the disk.
//! The price: a long driver turn (a snapshot of a million nodes installed)
//! holds up the I/O tasks on its worker (with one worker, all of them)
//! until it ends; a turn over [`LONG_TURN`] is logged. The driver never
//! blocks on anything but its input: it does no disk I/O and waits for no
//! other thread, except for the syncer's last writes at shutdown.
//!
//! Shutdown: `Input::Shutdown` (or the input channel closing) makes the
//! driver answer every pending write `TIMEOUT` (ambiguous: its entry may
//! still commit) and stop the syncer after its queued writes; `run`
//! returns. The rest is shutdown.rs's order: every task is told, each
//! connection writes out what is queued for it and closes, and main.rs
//! waits for them (2 s at most) before it stops the runtime. A request
//! that reaches a listener after the driver stopped is answered
//! `SHUTTING_DOWN` and its connection closed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::config::Config;
use crate::driver::{Driver, WallClock, MAX_INPUTS_PER_TURN};
use crate::kv::Kv;
use crate::message::{Input, InputRx, InputTx, PeerSink};
use crate::syncer::{SyncReports, Syncer};
use crate::view::SharedState;

/// A turn longer than this is logged with where its time went (a warning):
/// ticks and heartbeats wait for it, and a leader's turn near half an
/// election timeout is how a member loses its followers.
const LONG_TURN: Duration = Duration::from_millis(200);

/// What a member that applied its own removal stops with.
pub const REMOVED: &str = "this member was removed from the cluster: it stops and serves no one (add the machine \
                           back with a new id: docs/operations.md)";

/// A member's driver and its syncer, ready to run.
pub struct Node {
    driver: Driver,
    reports: SyncReports,
    tick: Duration,
}

impl Node {
    /// Loads the member from `kv` and starts its syncer; `input` is the
    /// channel `run` will read (the syncer wakes it through it).
    pub fn new(cfg: Config, kv: Arc<dyn Kv>, peers: Box<dyn PeerSink>, input: InputTx) -> anyhow::Result<Self> {
        let now = Instant::now();
        let (syncer, reports) = Syncer::start(kv.clone(), input);
        let tick = Duration::from_millis(cfg.tick_ms);
        let seed: u64 = rand::random();
        let driver = Driver::new(cfg, kv.as_ref(), peers, Box::new(syncer), seed, now, WallClock::system(now))?;
        Ok(Node { driver, reports, tick })
    }

    /// Publish the status (and metrics) to `board` every tick (http.rs).
    pub fn set_board(&mut self, board: crate::http::Board) {
        self.driver.set_board(board);
    }

    /// The state machine, for the listeners' local reads.
    pub fn shared_state(&self) -> SharedState {
        self.driver.shared_state()
    }

    /// Runs until `Input::Shutdown`, the input channel closes, or this
    /// member applies its own removal (an error saying [`REMOVED`]).
    pub async fn run(mut self, mut rx: InputRx) -> anyhow::Result<()> {
        let mut next_tick = Instant::now() + self.tick;
        let sleep = tokio::time::sleep_until(next_tick.into());
        tokio::pin!(sleep);
        loop {
            // The I/O tasks on this worker run between two turns (a turn
            // that always found input waiting would otherwise go on until
            // tokio's budget ran out).
            tokio::task::yield_now().await;
            // 1. Wait for input or the next tick, then take what is queued.
            let mut inputs = Vec::new();
            tokio::select! {
                biased;
                i = rx.recv() => match i {
                    Some(i) => inputs.push(i),
                    None => {
                        self.driver.shutdown(Instant::now());
                        return Ok(());
                    }
                },
                () = &mut sleep => {}
            }
            while inputs.len() < MAX_INPUTS_PER_TURN {
                match rx.try_recv() {
                    Ok(i) => inputs.push(i),
                    Err(_) => break,
                }
            }
            let drained = inputs.len() < MAX_INPUTS_PER_TURN;
            let now = Instant::now();
            let n_inputs = inputs.len();
            // 2. Inputs.
            for input in inputs {
                if matches!(input, Input::Shutdown) {
                    self.driver.shutdown(now);
                    return Ok(());
                }
                self.driver.handle(input, now);
            }
            let handled = Instant::now();
            // 3. Finished writes.
            while let Some(done) = self.reports.poll()? {
                self.driver.on_persisted(done);
            }
            let persisted = Instant::now();
            // 4. Tick.
            if now >= next_tick {
                self.driver.tick(now, drained);
                next_tick += self.tick;
                if next_tick < now {
                    next_tick = now + self.tick;
                }
                sleep.as_mut().reset(next_tick.into());
            }
            let ticked = Instant::now();
            // 5. Ready, reads, rounds.
            self.driver.end_turn(now)?;
            let done = Instant::now();
            if done.duration_since(now) > LONG_TURN {
                let ms = |a: Instant, b: Instant| b.duration_since(a).as_millis() as u64;
                warn!(
                    inputs = n_inputs,
                    inputs_ms = ms(now, handled),
                    persisted_ms = ms(handled, persisted),
                    tick_ms = ms(persisted, ticked),
                    ready_ms = ms(ticked, done),
                    "a driver turn took long (ticks and heartbeats waited)"
                );
            }
            // A member that applied its own removal serves no one: what it
            // wrote is flushed, then `batond` exits 2 (main.rs).
            if self.driver.removed() {
                self.driver.shutdown(now);
                anyhow::bail!("{REMOVED}");
            }
        }
    }
}
