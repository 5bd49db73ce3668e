//! Shared run state: the history being recorded, process ids, the stop
//! signal, and which client slots the nemesis has paused.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{Client, ClientConfig, Error};
use serde_json::Value;

use crate::history::{FaultWindow, History, Op, OpType};

/// Everything workers and the nemesis share.
pub struct Run {
    start: Instant,
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
    /// nemesis prefers them).
    holders: Mutex<std::collections::BTreeSet<usize>>,
}

/// How an operation ended, from a client error.
pub fn classify(e: &Error, is_write: bool) -> OpType {
    match e {
        Error::Ambiguous(_) if is_write => OpType::Info,
        _ => OpType::Fail,
    }
}

impl Run {
    pub fn new(slot_endpoints: Vec<Vec<String>>, storage_endpoints: Vec<Vec<String>>) -> Arc<Run> {
        let slots = slot_endpoints.len();
        Arc::new(Run {
            start: Instant::now(),
            history: Mutex::new(History::default()),
            next_process: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            paused: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            faults: Mutex::new(Vec::new()),
            ops_done: AtomicU64::new(0),
            slot_endpoints,
            storage_endpoints,
            holders: Mutex::new(Default::default()),
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

    pub fn invoke(&self, process: u64, f: &str, key: Option<&str>, value: Value) {
        self.push(process, OpType::Invoke, f, key, value, None);
    }

    pub fn complete(&self, process: u64, ty: OpType, f: &str, key: Option<&str>, value: Value, error: Option<String>) {
        if ty != OpType::Invoke {
            self.ops_done.fetch_add(1, Ordering::Relaxed);
        }
        self.push(process, ty, f, key, value, error);
    }

    pub fn take_history(&self) -> History {
        std::mem::take(&mut *self.history.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn fault_windows(&self) -> Vec<FaultWindow> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_holder(&self, slot: usize, holds: bool) {
        let mut h = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        if holds {
            h.insert(slot);
        } else {
            h.remove(&slot);
        }
    }

    pub fn holders(&self) -> Vec<usize> {
        self.holders.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect()
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
    pub async fn connect_slot(&self, slot: usize) -> Option<Client> {
        self.connect(self.slot_endpoints[slot].clone()).await
    }

    pub async fn connect_storage(&self, home: usize) -> Option<Client> {
        self.connect(self.storage_endpoints[home % self.storage_endpoints.len()].clone()).await
    }

    async fn connect(&self, endpoints: Vec<String>) -> Option<Client> {
        while !self.stopped() {
            let cfg = ClientConfig::new(endpoints.clone())
                .session_timeout(Duration::from_millis(crate::db::SESSION_MS))
                .op_timeout(Duration::from_secs(5));
            match Client::connect_with(cfg).await {
                Ok(c) => return Some(c),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        None
    }
}

/// Closes a client in the background (its session ends; do not wait).
pub fn retire(c: Client) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(2), c.close()).await;
    });
}
