//! The watch table of one member: which connection watches which path, and
//! what each committed change fires.
//!
//! Invariants:
//! - A one-shot watch fires at most once and is removed when it fires; a
//!   persistent one stays until removed or its connection closes.
//! - Events are produced while the entry that caused them is applied, so a
//!   connection sees them in log order and before any answer that reflects
//!   the change (the driver queues both on the same connection, in order).
//! - `since` and `existed` record what the watcher saw at registration, so
//!   a snapshot install (which skips entries) fires what was missed.
//!
//! A watch belongs to the connection that registered it, on the member
//! that connection is attached to, and watches one exact path. It is tied
//! to the connection, not to the session: a closed connection's watches go
//! (`remove_conn`), and the client re-registers them on its next one.
//!
//! # What fires what ([`Watches::fire`])
//! | Change | Event | Fires kinds |
//! |---|---|---|
//! | `Created(path)` | `NODE_CREATED` | `EXISTS` |
//! | `Deleted(path)` | `NODE_DELETED` | `DATA`, `EXISTS`, `CHILDREN` |
//! | `DataChanged(path)` | `NODE_DATA_CHANGED` | `DATA`, `EXISTS` |
//! | `ChildrenChanged(path)` | `NODE_CHILDREN_CHANGED` | `CHILDREN` |
//!
//! A create reports `Created(child)` then `ChildrenChanged(parent)`, a
//! delete `Deleted(child)` then `ChildrenChanged(parent)`; a failed write
//! (a failed `multi` too) reports nothing.
//!
//! # Registering
//! - With a read (`get`, `exists`, `children` with a `WatchSpec`): added in
//!   the driver step that reads the state, so no change falls between the
//!   read and the registration. `get` and `children` add it only when the
//!   read succeeds; `exists` whether or not the node exists.
//! - With `add_watch`: at the current applied index; nothing is replayed.
//! - With `attach` (a reconnect), after the member has applied both a fresh
//!   ReadIndex and the client's `last_zxid`: each watch is checked with
//!   [`missed_event`] against `last_zxid`. If an event is due it is sent at
//!   once (with the applied index as `zxid`), and a one-shot watch is not
//!   registered again (a persistent one is); otherwise it is registered.
//!   The driver checks every watch first: one with an invalid path or an
//!   unknown kind fails the whole attach (`INVALID_PATH` / `BAD_REQUEST`),
//!   and no watch is registered.
//!
//! # What a watch missed ([`missed_event`])
//! | Kind | Node now | Condition | Event |
//! |---|---|---|---|
//! | `DATA` | absent | | `NODE_DELETED` |
//! | `DATA` | present | `mzxid > since` | `NODE_DATA_CHANGED` |
//! | `EXISTS` | present | `!existed` or `czxid > since` | `NODE_CREATED` |
//! | `EXISTS` | present | `mzxid > since` | `NODE_DATA_CHANGED` |
//! | `EXISTS` | absent | `existed` | `NODE_DELETED` |
//! | `CHILDREN` | absent | | `NODE_DELETED` |
//! | `CHILDREN` | present | `pzxid > since` | `NODE_CHILDREN_CHANGED` |
//!
//! `existed` is what the watcher saw (the client's record in an attach;
//! the member's record at registration after a snapshot install), `since`
//! the index it saw it at. Several changes collapse into one event. After a
//! snapshot install ([`Watches::after_snapshot`]) a watch fires exactly when
//! its node changed in the skipped entries, with the snapshot's index as
//! `zxid`; a persistent one goes on from there.
//!
//! Pure bookkeeping: no I/O, no clock. The driver sends what it returns.

use std::collections::BTreeMap;

use baton_proto::{EventType, WatchKind, WatchSpec};

use crate::message::ConnId;
use crate::state::{Change, StateMachine};

#[derive(Clone, Debug)]
pub struct Watch {
    pub conn: ConnId,
    pub id: u64,
    pub kind: WatchKind,
    pub persistent: bool,
    /// Applied index when registered, and whether the node existed then
    /// (to tell what a snapshot install skipped over).
    pub since: u64,
    pub existed: bool,
}

/// An event to send: to `conn`, for its watch `watch_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fired {
    pub conn: ConnId,
    pub watch_id: u64,
    pub ty: EventType,
    pub path: String,
}

/// path -> watches on it. A BTreeMap so that iteration (snapshot installs)
/// is the same on every run: the simulator replays exactly.
#[derive(Default)]
pub struct Watches {
    by_path: BTreeMap<String, Vec<Watch>>,
    /// Watches each connection holds (for the `max_watches` cap).
    per_conn: BTreeMap<ConnId, usize>,
}

impl Watches {
    /// Registers (or replaces) `conn`'s watch `spec.watch_id`, as of the
    /// state `sm` is in now.
    pub fn add(&mut self, conn: ConnId, spec: &WatchSpec, sm: &StateMachine) {
        let existed = sm.stat_of(&spec.path).is_some();
        let since = sm.applied();
        let list = self.by_path.entry(spec.path.clone()).or_default();
        let before = list.len();
        list.retain(|w| !(w.conn == conn && w.id == spec.watch_id));
        if list.len() == before {
            *self.per_conn.entry(conn).or_default() += 1;
        }
        list.push(Watch {
            conn,
            id: spec.watch_id,
            kind: WatchKind::try_from(spec.kind).unwrap_or(WatchKind::Data),
            persistent: spec.persistent,
            since,
            existed,
        });
    }

    /// Watches held by every connection.
    pub fn total(&self) -> usize {
        self.per_conn.values().sum()
    }

    /// How many watches `conn` holds.
    pub fn count(&self, conn: ConnId) -> usize {
        self.per_conn.get(&conn).copied().unwrap_or(0)
    }

    fn forget(per_conn: &mut BTreeMap<ConnId, usize>, conn: ConnId) {
        if let Some(n) = per_conn.get_mut(&conn) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_conn.remove(&conn);
            }
        }
    }

    pub fn remove(&mut self, conn: ConnId, watch_id: u64) {
        for list in self.by_path.values_mut() {
            let before = list.len();
            list.retain(|w| !(w.conn == conn && w.id == watch_id));
            if list.len() < before {
                Self::forget(&mut self.per_conn, conn);
            }
        }
        self.by_path.retain(|_, l| !l.is_empty());
    }

    pub fn remove_conn(&mut self, conn: ConnId) {
        for list in self.by_path.values_mut() {
            list.retain(|w| w.conn != conn);
        }
        self.by_path.retain(|_, l| !l.is_empty());
        self.per_conn.remove(&conn);
    }

    /// The watches one committed change fires (one-shots are removed).
    pub fn fire(&mut self, change: &Change) -> Vec<Fired> {
        let (path, ty, kinds): (&str, EventType, &[WatchKind]) = match change {
            Change::Created(p) => (p, EventType::NodeCreated, &[WatchKind::Exists]),
            Change::Deleted(p) => {
                (p, EventType::NodeDeleted, &[WatchKind::Data, WatchKind::Exists, WatchKind::Children])
            }
            Change::DataChanged(p) => (p, EventType::NodeDataChanged, &[WatchKind::Data, WatchKind::Exists]),
            Change::ChildrenChanged(p) => (p, EventType::NodeChildrenChanged, &[WatchKind::Children]),
        };
        let Some(list) = self.by_path.get_mut(path) else { return Vec::new() };
        let mut fired = Vec::new();
        let per_conn = &mut self.per_conn;
        list.retain(|w| {
            if kinds.contains(&w.kind) {
                fired.push(Fired { conn: w.conn, watch_id: w.id, ty, path: path.to_string() });
                if !w.persistent {
                    Self::forget(per_conn, w.conn);
                }
                w.persistent
            } else {
                true
            }
        });
        if list.is_empty() {
            self.by_path.remove(path);
        }
        fired
    }

    /// After a snapshot install: what every watch missed, if anything
    /// (one-shots that fire are removed).
    pub fn after_snapshot(&mut self, sm: &StateMachine) -> Vec<Fired> {
        let mut out = Vec::new();
        let per_conn = &mut self.per_conn;
        for (path, list) in self.by_path.iter_mut() {
            list.retain_mut(|w| {
                let spec = WatchSpec {
                    watch_id: w.id,
                    path: path.clone(),
                    kind: w.kind as i32,
                    persistent: w.persistent,
                    existed: w.existed,
                };
                match missed_event(sm, &spec, w.since) {
                    Some(ty) => {
                        out.push(Fired { conn: w.conn, watch_id: w.id, ty, path: path.clone() });
                        // A persistent watch goes on from here.
                        w.since = sm.applied();
                        w.existed = sm.stat_of(path).is_some();
                        if !w.persistent {
                            Self::forget(per_conn, w.conn);
                        }
                        w.persistent
                    }
                    None => true,
                }
            });
        }
        self.by_path.retain(|_, l| !l.is_empty());
        out
    }
}

/// What a watch registered at `since` would have seen by now, if anything.
pub fn missed_event(sm: &StateMachine, spec: &WatchSpec, since: u64) -> Option<EventType> {
    let stat = sm.stat_of(&spec.path);
    match (WatchKind::try_from(spec.kind).unwrap_or(WatchKind::Data), stat) {
        (WatchKind::Data, None) => Some(EventType::NodeDeleted),
        (WatchKind::Data, Some(s)) if s.mzxid > since => Some(EventType::NodeDataChanged),
        (WatchKind::Exists, Some(s)) if !spec.existed || s.czxid > since => Some(EventType::NodeCreated),
        (WatchKind::Exists, Some(s)) if s.mzxid > since => Some(EventType::NodeDataChanged),
        (WatchKind::Exists, None) if spec.existed => Some(EventType::NodeDeleted),
        (WatchKind::Children, None) => Some(EventType::NodeDeleted),
        (WatchKind::Children, Some(s)) if s.pzxid > since => Some(EventType::NodeChildrenChanged),
        _ => None,
    }
}
