//! The runtime around the driver: one OS thread runs the loop, with the
//! wall clock, the input channel the listeners and the transport feed, and
//! the syncer thread that does the fsyncs (raft-rs's async-ready mode).
//! Neither thread is a tokio worker.
//!
//! One turn of the loop (the driver's docs say what each step does):
//! 1. wait for input or the next tick; take what is queued (at most
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
//! - **The driver thread**: the process's main thread. After
//!   `member::start` (member.rs) has started the runtime and every task,
//!   `Member::run` calls [`Node::run`], which returns
//!   only at shutdown. The driver owns the raft-rs `RawNode`, the state
//!   machine, the watch table, the session layer and every pending request.
//!   The state machine is shared behind an `RwLock` (`SharedState`): only
//!   the driver writes it, and the listener tasks read it to answer stale
//!   reads without a watch (`view::fast_read`) without waiting for a
//!   driver turn. The driver holds the write lock while it applies an entry
//!   and queues the entry's events and reply, so a local read that sees the
//!   entry is answered after them on the same connection.
//! - **The syncer thread** (syncer.rs): every RocksDB write, in the order
//!   the driver made it, several Readies per fsync (group commit). The
//!   driver keeps stepping messages, committing, applying and answering
//!   while an fsync runs (raft-rs's async-ready mode).
//! - **A tokio runtime with half the cores as workers** (1 to 8, or
//!   `--io-threads`; main.rs `io_threads`): all
//!   network I/O. The client accept loop (`listener::serve`) and, per
//!   connection, a reader task (`listener::handle`) and a writer task
//!   (`listener::write_loop`, over the shared `batch::write_batch`); the peer accept loop (`transport::serve`)
//!   and one task per inbound peer connection (`transport::admit`, then
//!   `transport::frames`); one `transport::sender` task per other member
//!   (with a small reader that logs the acceptor's refusal); the HTTP
//!   listener when `--http-addr` is set (http.rs); and a task that turns
//!   SIGTERM or SIGINT into `Input::Shutdown`.
//! - RocksDB's own background threads (flushes, compactions).
//!
//! The driver and the fsync run on threads of their own, so neither ever
//! blocks a tokio worker. How the threads talk: message.rs.
//!
//! Shutdown: `Input::Shutdown` (or the input channel closing) makes the
//! driver answer every pending write `TIMEOUT` (ambiguous: its entry may
//! still commit) and stop the syncer after its queued writes; `run`
//! returns. The rest is shutdown.rs's order: every task is told, each
//! connection writes out what is queued for it and closes, and main.rs
//! waits for them (2 s at most) before it stops the runtime. A request
//! that reaches a listener after the driver stopped is answered
//! `SHUTTING_DOWN` and its connection closed.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::config::Config;
use crate::driver::{Driver, WallClock, MAX_INPUTS_PER_TURN};
use crate::kv::Kv;
use crate::message::{Input, PeerSink};
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
    pub fn new(cfg: Config, kv: Arc<dyn Kv>, peers: Box<dyn PeerSink>, input: Sender<Input>) -> anyhow::Result<Self> {
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
    pub fn run(mut self, rx: Receiver<Input>) -> anyhow::Result<()> {
        let mut next_tick = Instant::now() + self.tick;
        loop {
            // 1. Wait for input or the next tick, then take what is queued.
            let wait = next_tick.saturating_duration_since(Instant::now());
            let mut inputs = Vec::new();
            match rx.recv_timeout(wait) {
                Ok(i) => inputs.push(i),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.driver.shutdown(Instant::now());
                    return Ok(());
                }
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
