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
//! Everything that decides lives in `driver/` and takes `now` as an
//! argument; this file only reads the clock and moves messages.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::driver::{Driver, SharedState, WallClock, MAX_INPUTS_PER_TURN};
use crate::kv::Kv;
use crate::message::{Input, PeerSink};
use crate::syncer::{SyncReports, Syncer};

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

    /// Runs until `Input::Shutdown` or the input channel closes.
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
                    self.driver.shutdown();
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
            // 2. Inputs.
            for input in inputs {
                if matches!(input, Input::Shutdown) {
                    self.driver.shutdown();
                    return Ok(());
                }
                self.driver.handle(input, now);
            }
            // 3. Finished writes.
            while let Some(done) = self.reports.poll()? {
                self.driver.on_persisted(done);
            }
            // 4. Tick.
            if now >= next_tick {
                self.driver.tick(now, drained);
                next_tick += self.tick;
                if next_tick < now {
                    next_tick = now + self.tick;
                }
            }
            // 5. Ready, reads, rounds.
            self.driver.end_turn(now)?;
        }
    }
}
