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
//! - A recursive watch is always persistent. It fires NODE_CREATED,
//!   NODE_DATA_CHANGED and NODE_DELETED for its node and every node below
//!   it, each event naming the node that changed (never
//!   NODE_CHILDREN_CHANGED for a live change: a child's create or delete is
//!   reported as that child's event).
//! - After a gap (a snapshot install, or an attach that re-registers the
//!   watch as of the client's last index) a recursive watch reports what it
//!   missed: NODE_CREATED or NODE_DATA_CHANGED for each node in its subtree
//!   created or changed since, NODE_DELETED for its own node if it went, and
//!   NODE_CHILDREN_CHANGED for each node whose children changed since (a
//!   deleted child cannot be named any more: re-read that node's children).
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
//!   and no watch is registered. A watch on a node the connection may not
//!   READ (all but a one-shot `EXISTS`) is skipped: not registered, nothing
//!   replayed (finding Z8).
//!
//! # Who sees a recursive watch's events
//! A recursive watch's event names a node below the watched one; the
//! driver sends it only to a connection that may READ that node (a node
//! that is gone: its nearest ancestor still there), live, replayed, or
//! after a snapshot install (`Driver::visible`; ZooKeeper 3.8.4's fix for
//! CVE-2024-23944). [`Fired::recursive`] marks them.
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
    /// Fired by a recursive watch: `path` may be a node below the watched
    /// one, which its watcher may not be allowed to see (the driver
    /// filters these by READ: [`crate::acl`], CVE-2024-23944's class).
    pub recursive: bool,
}

/// path -> watches on it. A BTreeMap so that iteration (snapshot installs)
/// is the same on every run: the simulator replays exactly.
#[derive(Default)]
pub struct Watches {
    by_path: BTreeMap<String, Vec<Watch>>,
    /// Watches each connection holds (for the `max_watches` cap).
    per_conn: BTreeMap<ConnId, usize>,
    /// How many recursive watches exist: none, and a change looks at its
    /// own path only.
    recursive: usize,
}

impl Watches {
    /// Registers (or replaces) `conn`'s watch `spec.watch_id`, as of the
    /// state `sm` is in now.
    pub fn add(&mut self, conn: ConnId, spec: &WatchSpec, sm: &StateMachine) {
        let existed = sm.stat_of(&spec.path).is_some();
        let since = sm.applied();
        let list = self.by_path.entry(spec.path.clone()).or_default();
        if drop_where(list, &mut self.recursive, |w| w.conn == conn && w.id == spec.watch_id) == 0 {
            *self.per_conn.entry(conn).or_default() += 1;
        }
        let kind = WatchKind::try_from(spec.kind).unwrap_or(WatchKind::Data);
        let persistent = spec.persistent || kind == WatchKind::Recursive;
        self.recursive += (kind == WatchKind::Recursive) as usize;
        list.push(Watch { conn, id: spec.watch_id, kind, persistent, since, existed });
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
            drop_where(list, &mut self.recursive, |w| w.conn == conn && w.id == watch_id);
            if list.len() < before {
                Self::forget(&mut self.per_conn, conn);
            }
        }
        self.by_path.retain(|_, l| !l.is_empty());
    }

    pub fn remove_conn(&mut self, conn: ConnId) {
        for list in self.by_path.values_mut() {
            drop_where(list, &mut self.recursive, |w| w.conn == conn);
        }
        self.by_path.retain(|_, l| !l.is_empty());
        self.per_conn.remove(&conn);
    }

    /// The watches one committed change fires (one-shots are removed).
    pub fn fire(&mut self, change: &Change) -> Vec<Fired> {
        use WatchKind::{Children, Data, Exists, Recursive};
        let (path, ty, kinds): (&str, EventType, &[WatchKind]) = match change {
            Change::Created(p) => (p, EventType::NodeCreated, &[Exists, Recursive]),
            Change::Deleted(p) => (p, EventType::NodeDeleted, &[Data, Exists, Children, Recursive]),
            Change::DataChanged(p) => (p, EventType::NodeDataChanged, &[Data, Exists, Recursive]),
            Change::ChildrenChanged(p) => (p, EventType::NodeChildrenChanged, &[Children]),
        };
        let mut fired = Vec::new();
        if self.recursive > 0 && ty != EventType::NodeChildrenChanged {
            // Recursive watches on the ancestors (one on `path` itself is
            // found below, with the others on `path`).
            let mut at = path;
            while let Some(cut) = at.rfind('/') {
                at = if cut == 0 { "/" } else { &at[..cut] };
                for w in self.by_path.get(at).into_iter().flatten().filter(|w| w.kind == Recursive) {
                    fired.push(Fired { conn: w.conn, watch_id: w.id, ty, path: path.to_string(), recursive: true });
                }
                if at == "/" {
                    break;
                }
            }
        }
        let Some(list) = self.by_path.get_mut(path) else { return fired };
        let per_conn = &mut self.per_conn;
        list.retain(|w| {
            if kinds.contains(&w.kind) {
                let recursive = w.kind == Recursive;
                fired.push(Fired { conn: w.conn, watch_id: w.id, ty, path: path.to_string(), recursive });
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
                let missed = missed_events(sm, &spec, w.since);
                if missed.is_empty() {
                    return true;
                }
                let recursive = w.kind == WatchKind::Recursive;
                out.extend(missed.into_iter().map(|(ty, p)| Fired {
                    conn: w.conn,
                    watch_id: w.id,
                    ty,
                    path: p,
                    recursive,
                }));
                // A persistent watch goes on from here.
                w.since = sm.applied();
                w.existed = sm.stat_of(path).is_some();
                if !w.persistent {
                    Self::forget(per_conn, w.conn);
                }
                w.persistent
            });
        }
        self.by_path.retain(|_, l| !l.is_empty());
        out
    }
}

/// Removes the watches `gone` picks from `list`, keeping `recursive` (the
/// table's count of recursive watches) right without a scan; how many went.
/// (Firing never removes a recursive watch: they are persistent.)
fn drop_where(list: &mut Vec<Watch>, recursive: &mut usize, gone: impl Fn(&Watch) -> bool) -> usize {
    let before = list.len();
    list.retain(|w| {
        let drop = gone(w);
        *recursive -= (drop && w.kind == WatchKind::Recursive) as usize;
        !drop
    });
    before - list.len()
}

/// What a watch registered at `since` would have seen by now, as events
/// (type, path): at most one for a plain watch, the subtree's for a
/// recursive one (see the module doc).
pub fn missed_events(sm: &StateMachine, spec: &WatchSpec, since: u64) -> Vec<(EventType, String)> {
    if WatchKind::try_from(spec.kind) != Ok(WatchKind::Recursive) {
        return missed_event(sm, spec, since).map(|ty| vec![(ty, spec.path.clone())]).unwrap_or_default();
    }
    let Some(own) = sm.stat_of(&spec.path) else {
        return if spec.existed { vec![(EventType::NodeDeleted, spec.path.clone())] } else { Vec::new() };
    };
    let mut out = Vec::new();
    for (path, s) in std::iter::once((spec.path.clone(), own)).chain(sm.descendants(&spec.path)) {
        let own_node = path == spec.path;
        if s.czxid > since || (own_node && !spec.existed) {
            out.push((EventType::NodeCreated, path.clone()));
        } else if s.mzxid > since {
            out.push((EventType::NodeDataChanged, path.clone()));
        }
        if s.pzxid > since {
            out.push((EventType::NodeChildrenChanged, path));
        }
    }
    out
}

/// What a plain (non-recursive) watch registered at `since` would have seen
/// by now, if anything.
fn missed_event(sm: &StateMachine, spec: &WatchSpec, since: u64) -> Option<EventType> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Change;
    use baton_proto::{command, ClientWrite, Command, CreateOp, NewSession, SetOp};
    use bytes::Bytes;

    /// A state machine with session 1 and the nodes `paths`, created in
    /// order at indexes 2, 3, ...
    fn tree(paths: &[&str]) -> StateMachine {
        let mut sm = StateMachine::new();
        let ns = NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        for (i, p) in paths.iter().enumerate() {
            write(
                &mut sm,
                i as u64 + 2,
                baton_proto::client_write::Op::Create(CreateOp { path: p.to_string(), ..Default::default() }),
            );
        }
        sm
    }

    fn write(sm: &mut StateMachine, index: u64, op: baton_proto::client_write::Op) -> Vec<Change> {
        let w = ClientWrite {
            session_id: 1,
            seq: index,
            secret: Bytes::from_static(b"s"),
            op: Some(op),
            ..Default::default()
        };
        let applied = sm.apply(index, &Command { body: Some(command::Body::Write(w)), ..Default::default() });
        assert_eq!(applied.reply.map(|r| r.error), Some(0));
        applied.changes
    }

    fn spec(path: &str, kind: WatchKind, existed: bool) -> WatchSpec {
        WatchSpec { watch_id: 7, path: path.into(), kind: kind as i32, persistent: false, existed }
    }

    fn fired(w: &mut Watches, changes: &[Change]) -> Vec<(EventType, String)> {
        changes.iter().flat_map(|c| w.fire(c)).map(|f| (f.ty, f.path)).collect()
    }

    #[test]
    fn a_recursive_watch_names_each_changed_node_below_it_and_stays() {
        let mut sm = tree(&["/a", "/a/b", "/z"]);
        let mut w = Watches::default();
        w.add(1, &spec("/a", WatchKind::Recursive, true), &sm);
        let create = write(
            &mut sm,
            10,
            baton_proto::client_write::Op::Create(CreateOp { path: "/a/b/c".into(), ..Default::default() }),
        );
        assert_eq!(fired(&mut w, &create), vec![(EventType::NodeCreated, "/a/b/c".to_string())]);
        let set =
            write(&mut sm, 11, baton_proto::client_write::Op::Set(SetOp { path: "/a".into(), ..Default::default() }));
        assert_eq!(fired(&mut w, &set), vec![(EventType::NodeDataChanged, "/a".to_string())]);
        let elsewhere =
            write(&mut sm, 12, baton_proto::client_write::Op::Set(SetOp { path: "/z".into(), ..Default::default() }));
        assert!(fired(&mut w, &elsewhere).is_empty(), "a change outside the subtree fired");
        assert_eq!(w.total(), 1, "the recursive watch must stay after firing");
        w.remove(1, 7);
        assert!(fired(&mut w, &set).is_empty(), "a removed recursive watch fired");
    }

    #[test]
    fn a_recursive_watch_on_the_root_sees_everything() {
        let mut sm = tree(&[]);
        let mut w = Watches::default();
        w.add(1, &spec("/", WatchKind::Recursive, true), &sm);
        let create = write(
            &mut sm,
            5,
            baton_proto::client_write::Op::Create(CreateOp { path: "/x".into(), ..Default::default() }),
        );
        assert_eq!(fired(&mut w, &create), vec![(EventType::NodeCreated, "/x".to_string())]);
    }

    #[test]
    fn after_a_gap_a_recursive_watch_reports_what_changed_below_it() {
        let mut sm = tree(&["/a", "/a/old", "/a/gone"]);
        let since = sm.applied();
        write(
            &mut sm,
            10,
            baton_proto::client_write::Op::Create(CreateOp { path: "/a/new".into(), ..Default::default() }),
        );
        write(&mut sm, 11, baton_proto::client_write::Op::Set(SetOp { path: "/a/old".into(), ..Default::default() }));
        write(
            &mut sm,
            12,
            baton_proto::client_write::Op::Delete(baton_proto::DeleteOp { path: "/a/gone".into(), version: None }),
        );
        let missed = missed_events(&sm, &spec("/a", WatchKind::Recursive, true), since);
        assert!(missed.contains(&(EventType::NodeCreated, "/a/new".to_string())), "{missed:?}");
        assert!(missed.contains(&(EventType::NodeDataChanged, "/a/old".to_string())), "{missed:?}");
        assert!(missed.contains(&(EventType::NodeChildrenChanged, "/a".to_string())), "{missed:?}");
        assert!(missed_events(&sm, &spec("/a", WatchKind::Recursive, true), sm.applied()).is_empty());
    }
}
