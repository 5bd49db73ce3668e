//! Shared run state: the history being recorded, process ids, the stop
//! signal, the run's session timeout, and which client slots the nemesis
//! has paused.
//!
//! Workers record an operation with one call, [`Run::op`]: it records the
//! invocation, runs the operation, and records its completion: `ok`, or on
//! an error `fail` when the error says the operation definitely did not
//! happen and `info` when it may have ([`OpError::may_have_happened`]: an
//! ambiguous write). Checkers treat `info` as "took effect at some time
//! after the invocation, or never"; the worker retires the process.
//!
//! Every client a worker uses is handed to [`Run::watch_state`], which
//! records its session state at once and then every change it sees, as
//! session-state notes (`baton_checker::history`, module doc). A watcher ends when
//! its client's actor is gone, after it recorded `Expired`, or when the
//! history has been taken (at the latest 2 minutes after the run stopped);
//! it takes nothing but the state channel, so it never keeps a session
//! alive.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{Client, ClientConfig, Error, SessionState};

use crate::cli_door::{CliClient, CliOpts};
use crate::door::{Door, DoorClient, ZkSession};
use serde_json::Value;

use baton_checker::history::{FaultWindow, History, Op, OpType, SESSION_STATE};

/// How long a state watcher may outlive the stop of the run.
const WATCH_AFTER_STOP: Duration = Duration::from_secs(120);

/// Everything workers and the nemesis share.
pub struct Run {
    start: Instant,
    /// Wall clock at `start` (ms since the Unix epoch), to line the history
    /// up with the members' logs.
    pub start_unix_ms: u64,
    history: Mutex<History>,
    next_process: AtomicU64,
    pub stop: AtomicBool,
    /// Per client slot: frozen by the nemesis (a paused client process).
    paused: Vec<AtomicBool>,
    pub faults: Mutex<Vec<FaultWindow>>,
    pub ops_done: AtomicU64,
    pub slot_endpoints: Vec<Vec<String>>,
    pub storage_endpoints: Vec<Vec<String>>,
    /// Client slots that currently hold a lock or leadership (the pause
    /// and isolate-peers nemeses prefer them).
    holders: Mutex<std::collections::BTreeMap<usize, Holder>>,
    /// Client slots queued for a lock or leadership right now, with when
    /// they began to wait (run time, ns): the pause nemesis freezes one
    /// in the middle of a queue.
    waiters: Mutex<std::collections::BTreeMap<usize, u64>>,
    /// Session timeout every client of the run asks for.
    pub session: Duration,
    /// TLS for every client of the run (None: plaintext).
    pub tls: Option<baton_client::ClientTls>,
    /// The door every workload client comes through.
    pub door: Door,
    /// Through the ZooKeeper door: linearizable reads `sync` first.
    pub zk_sync_reads: bool,
    /// The history was taken: state watchers stop.
    finished: AtomicBool,
    /// Some holder meant to hold on for long (see `Holder::long`).
    long_holds: AtomicBool,
    /// Through the CLI door: how its `baton` processes are run.
    pub cli: std::sync::OnceLock<CliOpts>,
}

/// What the run knows about a current holder (for targeted faults).
#[derive(Debug, Clone, Copy, Default)]
pub struct Holder {
    /// The member its client talked to when granted (from `status`).
    pub member: Option<u64>,
    /// It means to hold on for a while (until its session leaves
    /// `Connected`, or a few session timeouts).
    pub long: bool,
    /// When it was granted (run time, ns).
    pub since: u64,
    /// Through the CLI door: the pid of the `baton` that holds.
    pub pid: Option<u32>,
}

/// Why an operation did not complete `ok`, as the history records it.
#[derive(Debug)]
pub enum OpError {
    /// The client's error: it may have happened iff the client says so
    /// ([`Error::is_ambiguous`]: a write sent and never answered).
    Client(Error),
    /// The worker gave up waiting ("timeout") and dropped the call.
    TimedOut,
    /// No confirmation came: it may have happened.
    Unconfirmed(&'static str),
    /// A ZooKeeper client's error (the ZooKeeper door's, or baton-bench's
    /// zk-register test's): it may have happened iff `ambiguous`.
    Zk { error: String, ambiguous: bool },
    /// The CLI door's: `baton` ended without a hold, or ended a hold
    /// otherwise than by a release (cli_door.rs); definite: each hold is a
    /// session of its own, closed (or expired) when `baton` ends.
    Cli(String),
}

impl OpError {
    /// It may have happened: recorded `info` (else `fail`).
    pub fn may_have_happened(&self) -> bool {
        match self {
            OpError::Client(e) => e.is_ambiguous(),
            OpError::TimedOut => false,
            OpError::Unconfirmed(_) => true,
            OpError::Zk { ambiguous, .. } => *ambiguous,
            OpError::Cli(_) => false,
        }
    }
}

impl From<Error> for OpError {
    fn from(e: Error) -> Self {
        OpError::Client(e)
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Client(e) => e.fmt(f),
            OpError::TimedOut => f.write_str("timeout"),
            OpError::Unconfirmed(why) => f.write_str(why),
            OpError::Zk { error, .. } => f.write_str(error),
            OpError::Cli(e) => f.write_str(e),
        }
    }
}

/// An operation for [`Run::op`]: its function and key, its arguments, and
/// how its errors are recorded.
pub struct Call<'a> {
    f: &'a str,
    key: &'a str,
    /// The invocation's value (null unless set).
    args: Value,
    /// The value of a `fail` or `info` completion (null unless set).
    error_value: Value,
    /// Every error is recorded `fail`.
    definite: bool,
}

impl<'a> Call<'a> {
    pub fn new(f: &'a str, key: &'a str) -> Self {
        Call { f, key, args: Value::Null, error_value: Value::Null, definite: false }
    }

    pub fn args(self, args: Value) -> Self {
        Call { args, ..self }
    }

    pub fn error_value(self, error_value: Value) -> Self {
        Call { error_value, ..self }
    }

    /// Records every error as `fail`, even one that says the operation
    /// may have happened: for the lock and election recipes, whose worker
    /// retires the session after any error, which deletes whatever node
    /// the call may have left.
    pub fn definite(self) -> Self {
        Call { definite: true, ..self }
    }
}

impl Run {
    pub fn new(
        slot_endpoints: Vec<Vec<String>>,
        storage_endpoints: Vec<Vec<String>>,
        session: Duration,
        tls: Option<baton_client::ClientTls>,
        door: Door,
        zk_sync_reads: bool,
    ) -> Arc<Run> {
        let slots = slot_endpoints.len();
        let start_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Arc::new(Run {
            start: Instant::now(),
            start_unix_ms,
            history: Mutex::new(History::default()),
            next_process: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            paused: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            faults: Mutex::new(Vec::new()),
            ops_done: AtomicU64::new(0),
            slot_endpoints,
            storage_endpoints,
            holders: Mutex::new(Default::default()),
            waiters: Mutex::new(Default::default()),
            session,
            tls,
            door,
            zk_sync_reads,
            finished: AtomicBool::new(false),
            long_holds: AtomicBool::new(false),
            cli: std::sync::OnceLock::new(),
        })
    }

    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn new_process(&self) -> u64 {
        self.next_process.fetch_add(1, Ordering::SeqCst)
    }

    fn push(&self, process: u64, ty: OpType, f: &str, key: Option<&str>, value: Value, error: Option<String>) {
        let op =
            Op { index: 0, process, ty, f: f.to_string(), key: key.map(String::from), value, time: self.now(), error };
        self.history.lock().unwrap_or_else(|p| p.into_inner()).push(op);
    }

    /// Records one operation of process `p`: its invocation now, then runs
    /// `body` and records its completion: `ok` with the value `body`
    /// returns beside its result, or on an error `info` if the operation
    /// may have happened and `fail` if it definitely did not (see
    /// [`Call::definite`]). Returns `body`'s result.
    pub async fn op<T>(
        &self,
        p: u64,
        call: Call<'_>,
        body: impl Future<Output = Result<(T, Value), OpError>>,
    ) -> Result<T, OpError> {
        self.push(p, OpType::Invoke, call.f, Some(call.key), call.args, None);
        let r = body.await;
        self.ops_done.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok((out, value)) => {
                self.push(p, OpType::Ok, call.f, Some(call.key), value, None);
                Ok(out)
            }
            Err(e) => {
                let ty = if e.may_have_happened() && !call.definite { OpType::Info } else { OpType::Fail };
                self.push(p, ty, call.f, Some(call.key), call.error_value, Some(e.to_string()));
                Err(e)
            }
        }
    }

    /// Records what process `p` observed rather than did (a leader change,
    /// a watch event): an invocation and its `ok` at once.
    pub fn event(&self, p: u64, f: &str, key: &str, value: Value) {
        self.push(p, OpType::Invoke, f, Some(key), Value::Null, None);
        self.ops_done.fetch_add(1, Ordering::Relaxed);
        self.push(p, OpType::Ok, f, Some(key), value, None);
    }

    pub fn take_history(&self) -> History {
        self.finished.store(true, Ordering::SeqCst);
        std::mem::take(&mut *self.history.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn fault_windows(&self) -> Vec<FaultWindow> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_holder(&self, slot: usize, holds: bool) {
        let mut h = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        if holds {
            h.insert(slot, Holder { since: self.now(), ..Holder::default() });
        } else {
            h.remove(&slot);
        }
    }

    /// Marks `slot` as queued (or no longer) for a lock or leadership.
    pub fn set_waiting(&self, slot: usize, waits: bool) {
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if waits {
            w.insert(slot, self.now());
        } else {
            w.remove(&slot);
        }
    }

    /// A slot in the middle of a queue, likely: the one waiting longest
    /// while another holds and at least one more waits behind it (None if
    /// no queue is that long now).
    pub fn mid_queue_waiter(&self) -> Option<usize> {
        let w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if w.len() < 2 || self.holders().is_empty() {
            return None;
        }
        w.iter().min_by_key(|(_, since)| **since).map(|(s, _)| *s)
    }

    /// Records which member a holder's client is talking to.
    pub fn set_holder_member(&self, slot: usize, member: u64) {
        if let Some(h) = self.holders.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&slot) {
            h.member = Some(member);
        }
    }

    pub fn holders(&self) -> Vec<usize> {
        self.holders.lock().unwrap_or_else(|p| p.into_inner()).keys().copied().collect()
    }

    /// Current holders.
    pub fn holder_list(&self) -> Vec<(usize, Holder)> {
        self.holders.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(s, h)| (*s, *h)).collect()
    }

    /// Whether any holder of this run ever meant to hold on for long.
    pub fn has_long_holds(&self) -> bool {
        self.long_holds.load(Ordering::SeqCst)
    }

    /// Marks holder `slot` as holding on for long (see `Holder::long`).
    pub fn set_holder_long(&self, slot: usize) {
        self.long_holds.store(true, Ordering::SeqCst);
        if let Some(h) = self.holders.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&slot) {
            h.long = true;
        }
    }

    /// Marks `slot` a holder and asks its client in the background which
    /// member it talks to (`status` is answered by that member from its own
    /// state and vouches for nothing; the worker does not wait for it).
    pub fn became_holder(self: &Arc<Self>, slot: usize, c: &DoorClient) {
        self.set_holder(slot, true);
        if let DoorClient::Cli(cli) = c {
            if let Some(h) = self.holders.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&slot) {
                h.pid = cli.pid();
            }
        }
        let (run, c) = (self.clone(), c.clone());
        tokio::spawn(async move {
            if let Ok(Some(id)) = tokio::time::timeout(Duration::from_millis(200), c.member()).await {
                run.set_holder_member(slot, id);
            }
        });
    }

    pub fn set_paused(&self, slot: usize, paused: bool) {
        if let Some(p) = self.paused.get(slot) {
            p.store(paused, Ordering::SeqCst);
        }
    }

    pub fn is_paused(&self, slot: usize) -> bool {
        self.paused.get(slot).is_some_and(|p| p.load(Ordering::SeqCst))
    }

    /// A pause point: a frozen client slot makes no progress here.
    pub async fn checkpoint(&self, slot: usize) {
        while self.is_paused(slot) && !self.stopped() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sleeps up to `d`, returning early when the run stops.
    pub async fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end && !self.stopped() {
            tokio::time::sleep((end - Instant::now()).min(Duration::from_millis(50))).await;
        }
    }

    /// A new client (session) for `slot`, retrying until it connects or the
    /// run stops.
    pub async fn connect_slot(&self, slot: usize) -> Option<DoorClient> {
        self.connect(self.door, self.slot_endpoints[slot].clone()).await
    }

    /// An election observer's client: through the run's door, except the
    /// CLI door's, which only holds (a native client then).
    pub async fn connect_observer(&self, slot: usize) -> Option<DoorClient> {
        self.connect(self.resource_door(), self.slot_endpoints[slot].clone()).await
    }

    /// The storage ("resource") client: through the run's door, except the
    /// CLI door's (a script's `baton set --fence` is a native client).
    pub async fn connect_storage(&self, home: usize) -> Option<DoorClient> {
        self.connect(self.resource_door(), self.storage_endpoints[home % self.storage_endpoints.len()].clone()).await
    }

    fn resource_door(&self) -> Door {
        match self.door {
            Door::Cli => Door::Native,
            d => d,
        }
    }

    async fn connect(&self, door: Door, endpoints: Vec<String>) -> Option<DoorClient> {
        while !self.stopped() {
            let c = match door {
                Door::Native => {
                    let cfg = ClientConfig::new(endpoints.clone())
                        .session_timeout(self.session)
                        .op_timeout(Duration::from_secs(5))
                        .tls(self.tls.clone());
                    Client::connect_with(cfg).await.ok().map(DoorClient::Native)
                }
                Door::Zookeeper => {
                    ZkSession::connect(&endpoints, self.session, self.zk_sync_reads).await.ok().map(DoorClient::Zk)
                }
                Door::Cli => {
                    let o = self.cli.get()?;
                    Some(DoorClient::Cli(CliClient::new(o.clone(), endpoints.clone())))
                }
            };
            match c {
                Some(c) => return Some(c),
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        None
    }
}

impl Run {
    /// Records `c`'s session state now and every change after it, as
    /// session-state notes of worker process `of` (see the module doc).
    /// Call it when the client is handed to its worker, before its first
    /// operation.
    pub fn watch_state(self: &Arc<Self>, c: &DoorClient, of: u64, role: &'static str, slot: usize) {
        let me = self.new_process();
        let session = c.session_id();
        let mut rx = c.state();
        let first = *rx.borrow_and_update();
        self.note_state(me, of, role, slot, session, first);
        if first == SessionState::Expired {
            return;
        }
        let run = self.clone();
        tokio::spawn(async move {
            let mut last = first;
            let mut stopped_at: Option<Instant> = None;
            while !run.finished.load(Ordering::SeqCst) {
                // Bounded after the stop too, should the history never be
                // taken (a harness error) and the client never close.
                if run.stopped() && stopped_at.get_or_insert_with(Instant::now).elapsed() > WATCH_AFTER_STOP {
                    return;
                }
                // Bounded wait, so a finished run is noticed.
                match tokio::time::timeout(Duration::from_millis(200), rx.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return, // the client's actor is gone
                    Err(_) => continue,
                }
                let s = *rx.borrow_and_update();
                if s != last {
                    run.note_state(me, of, role, slot, session, s);
                    last = s;
                }
                if s == SessionState::Expired {
                    return;
                }
            }
        });
    }

    fn note_state(&self, me: u64, of: u64, role: &str, slot: usize, session: u64, s: SessionState) {
        let state = match s {
            SessionState::Connected => "connected",
            SessionState::Suspended => "suspended",
            SessionState::Expired => "expired",
        };
        let v = serde_json::json!({"of": of, "role": role, "slot": slot, "session": session, "state": state});
        self.push(me, OpType::Info, SESSION_STATE, None, v, None);
    }
}

/// Closes a client in the background (its session ends; do not wait).
pub fn retire(c: DoorClient) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(2), c.close()).await;
    });
}
