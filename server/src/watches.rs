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
//! A `FIRST` watch also fires `NODE_DELETED` on `Deleted(path)`, and
//! `NODE_FIRST` on `ChildrenChanged(parent)` when its node is then the
//! parent's first child (below).
//!
//! # The pushed grant (`FIRST`)
//! A one-shot `FIRST` watch on a queue node is due when the node is the
//! first of its parent's children by [`baton_proto::queue_key`] (the
//! sequence number in the name's last 10 digits, then the name):
//! `NODE_FIRST`; or when the node is gone: `NODE_DELETED`. The native lock
//! recipe holds its lock exactly then, so the member that applies the
//! entry which makes a waiter first (its predecessor's release, or an
//! expiry) pushes the grant with that entry's index as `zxid`, and the
//! waiter needs no read of the queue after it:
//! - It is the same predicate the classic recipe evaluates on its member's
//!   local state after each wake-up, evaluated on the state the entry
//!   produced, so it grants exactly what that recipe would, no earlier.
//! - Only the first child can be due, so a change fires at most one
//!   `NODE_FIRST` per queue: one wake-up per release, and none for a waiter
//!   whose predecessor left from the middle of the queue (it keeps
//!   waiting, with nothing to re-read). The herd check holds.
//! - It is checked only for parents that hold a `FIRST` watch on a child
//!   (`first_dirs`): a change elsewhere costs one map look-up.
//! - Registered with a read or `add_watch` when already due, it is not
//!   kept: the event is sent right after the answer. Registered with a
//!   create (`first_watch_id`, driver/pending.rs) it is added while the
//!   create's entry is applied, only if the new node is not first; the
//!   answer names the node's predecessor either way.
//! - A gap (a snapshot install, or an attach) checks it as due-or-not,
//!   like any watch ([`missed_event`]): `since` does not matter.
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
//! | `FIRST` | absent | | `NODE_DELETED` |
//! | `FIRST` | present | first of its parent's children | `NODE_FIRST` |
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
    tally: Tally,
    /// The deliberate bug `first-to-successor` (faults.rs): a deleted
    /// queue node's successor is told it is first.
    first_to_successor: bool,
}

/// Counts that keep a change from scanning what cannot fire.
#[derive(Default)]
struct Tally {
    /// How many recursive watches exist: none, and a change looks at its
    /// own path only.
    recursive: usize,
    /// Parent -> FIRST watches on its children: only these parents'
    /// changes look for a first child.
    first_dirs: BTreeMap<String, usize>,
}

impl Tally {
    fn added(&mut self, path: &str, kind: WatchKind) {
        match kind {
            WatchKind::Recursive => self.recursive += 1,
            WatchKind::First => *self.first_dirs.entry(parent(path).to_string()).or_default() += 1,
            _ => {}
        }
    }

    fn dropped(&mut self, path: &str, kind: WatchKind) {
        match kind {
            WatchKind::Recursive => self.recursive -= 1,
            WatchKind::First => {
                let dir = parent(path);
                if let Some(n) = self.first_dirs.get_mut(dir) {
                    *n -= 1;
                    if *n == 0 {
                        self.first_dirs.remove(dir);
                    }
                }
            }
            _ => {}
        }
    }
}

fn parent(path: &str) -> &str {
    baton_proto::parent_of(path).unwrap_or("/")
}

/// `dir`'s first child by [`baton_proto::queue_key`], as a path.
fn first_child(sm: &StateMachine, dir: &str) -> Option<String> {
    let name = sm.child_names(dir).min_by(|a, b| baton_proto::queue_key(a).cmp(&baton_proto::queue_key(b)))?;
    Some(child_path(dir, name))
}

fn child_path(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// The sibling just ahead of `path` in its queue (None: it is first, or
/// it does not exist).
pub fn predecessor(sm: &StateMachine, path: &str) -> Option<String> {
    let dir = parent(path);
    let own = baton_proto::queue_key(path.rsplit('/').next().unwrap_or_default());
    sm.child_names(dir).map(baton_proto::queue_key).filter(|k| *k < own).max().map(|(_, name)| name.to_string())
}

/// The sibling just behind deleted node `path` in its queue (for the
/// deliberate bug `first-to-successor` only).
fn successor(sm: &StateMachine, path: &str) -> Option<String> {
    let dir = parent(path);
    let own = baton_proto::queue_key(path.rsplit('/').next().unwrap_or_default());
    let (_, name) = sm.child_names(dir).map(baton_proto::queue_key).filter(|k| *k > own).min()?;
    Some(child_path(dir, name))
}

/// A FIRST watch on `path` is due: the node is gone, or first.
fn first_due(sm: &StateMachine, path: &str) -> Option<EventType> {
    match sm.stat_of(path) {
        None => Some(EventType::NodeDeleted),
        Some(_) if first_child(sm, parent(path)).as_deref() == Some(path) => Some(EventType::NodeFirst),
        Some(_) => None,
    }
}

impl Watches {
    /// An empty table; `first_to_successor` switches on that deliberate
    /// bug (faults.rs; always false in a release build).
    pub fn new(first_to_successor: bool) -> Watches {
        Watches { first_to_successor, ..Watches::default() }
    }

    /// Registers (or replaces) `conn`'s watch `spec.watch_id`, as of the
    /// state `sm` is in now. A FIRST watch that is due already is not
    /// kept: its event is returned, for the caller to send after the
    /// answer that registered it.
    #[must_use]
    pub fn add(&mut self, conn: ConnId, spec: &WatchSpec, sm: &StateMachine) -> Option<Fired> {
        let kind = WatchKind::try_from(spec.kind).unwrap_or(WatchKind::Data);
        if kind == WatchKind::First {
            if let Some(ty) = first_due(sm, &spec.path) {
                if let Some(list) = self.by_path.get_mut(&spec.path) {
                    if drop_where(list, &spec.path, &mut self.tally, |w| w.conn == conn && w.id == spec.watch_id) > 0 {
                        Self::forget(&mut self.per_conn, conn);
                    }
                }
                return Some(Fired { conn, watch_id: spec.watch_id, ty, path: spec.path.clone(), recursive: false });
            }
        }
        self.register(conn, spec, kind, sm);
        None
    }

    /// Registers a FIRST watch the caller already knows is not due (a
    /// create that found its node's predecessor): `add` without scanning
    /// the queue a second time.
    pub fn add_first_not_due(&mut self, conn: ConnId, spec: &WatchSpec, sm: &StateMachine) {
        debug_assert!(first_due(sm, &spec.path).is_none(), "a due FIRST watch registered as not due");
        self.register(conn, spec, WatchKind::First, sm);
    }

    fn register(&mut self, conn: ConnId, spec: &WatchSpec, kind: WatchKind, sm: &StateMachine) {
        let existed = sm.stat_of(&spec.path).is_some();
        let since = sm.applied();
        let list = self.by_path.entry(spec.path.clone()).or_default();
        if drop_where(list, &spec.path, &mut self.tally, |w| w.conn == conn && w.id == spec.watch_id) == 0 {
            *self.per_conn.entry(conn).or_default() += 1;
        }
        let persistent = (spec.persistent && kind != WatchKind::First) || kind == WatchKind::Recursive;
        self.tally.added(&spec.path, kind);
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
        for (path, list) in self.by_path.iter_mut() {
            let before = list.len();
            drop_where(list, path, &mut self.tally, |w| w.conn == conn && w.id == watch_id);
            if list.len() < before {
                Self::forget(&mut self.per_conn, conn);
            }
        }
        self.by_path.retain(|_, l| !l.is_empty());
    }

    pub fn remove_conn(&mut self, conn: ConnId) {
        for (path, list) in self.by_path.iter_mut() {
            drop_where(list, path, &mut self.tally, |w| w.conn == conn);
        }
        self.by_path.retain(|_, l| !l.is_empty());
        self.per_conn.remove(&conn);
    }

    /// The watches one committed change fires (one-shots are removed);
    /// `sm` is the state with the change applied.
    pub fn fire(&mut self, change: &Change, sm: &StateMachine) -> Vec<Fired> {
        use WatchKind::{Children, Data, Exists, First, Recursive};
        let (path, ty, kinds): (&str, EventType, &[WatchKind]) = match change {
            Change::Created(p) => (p, EventType::NodeCreated, &[Exists, Recursive]),
            Change::Deleted(p) => (p, EventType::NodeDeleted, &[Data, Exists, Children, Recursive, First]),
            Change::DataChanged(p) => (p, EventType::NodeDataChanged, &[Data, Exists, Recursive]),
            Change::ChildrenChanged(p) => (p, EventType::NodeChildrenChanged, &[Children]),
        };
        let mut fired = Vec::new();
        if let (Change::Deleted(p), true) = (change, self.first_to_successor) {
            if self.tally.first_dirs.contains_key(parent(p)) {
                if let Some(next) = successor(sm, p) {
                    fired.extend(self.take(&next, EventType::NodeFirst, &[First]));
                }
            }
        }
        if let Change::ChildrenChanged(dir) = change {
            if self.tally.first_dirs.contains_key(dir.as_str()) {
                if let Some(first) = first_child(sm, dir) {
                    fired.extend(self.take(&first, EventType::NodeFirst, &[First]));
                }
            }
        }
        if self.tally.recursive > 0 && ty != EventType::NodeChildrenChanged {
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
        fired.extend(self.take(path, ty, kinds));
        fired
    }

    /// Fires the watches of `kinds` on `path` with `ty` (one-shots go).
    fn take(&mut self, path: &str, ty: EventType, kinds: &[WatchKind]) -> Vec<Fired> {
        let mut fired = Vec::new();
        let Some(list) = self.by_path.get_mut(path) else { return fired };
        let (per_conn, tally) = (&mut self.per_conn, &mut self.tally);
        list.retain(|w| {
            if kinds.contains(&w.kind) {
                let recursive = w.kind == WatchKind::Recursive;
                fired.push(Fired { conn: w.conn, watch_id: w.id, ty, path: path.to_string(), recursive });
                if !w.persistent {
                    Self::forget(per_conn, w.conn);
                    tally.dropped(path, w.kind);
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
        let (per_conn, tally) = (&mut self.per_conn, &mut self.tally);
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
                    tally.dropped(path, w.kind);
                }
                w.persistent
            });
        }
        self.by_path.retain(|_, l| !l.is_empty());
        out
    }
}

/// Removes the watches `gone` picks from `path`'s `list`, keeping the
/// tally right without a scan; how many went.
fn drop_where(list: &mut Vec<Watch>, path: &str, tally: &mut Tally, gone: impl Fn(&Watch) -> bool) -> usize {
    let before = list.len();
    list.retain(|w| {
        let drop = gone(w);
        if drop {
            tally.dropped(path, w.kind);
        }
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
    if spec.kind == WatchKind::First as i32 {
        return first_due(sm, &spec.path);
    }
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

    fn fired(w: &mut Watches, changes: &[Change], sm: &StateMachine) -> Vec<(EventType, String)> {
        changes.iter().flat_map(|c| w.fire(c, sm)).map(|f| (f.ty, f.path)).collect()
    }

    #[test]
    fn a_recursive_watch_names_each_changed_node_below_it_and_stays() {
        let mut sm = tree(&["/a", "/a/b", "/z"]);
        let mut w = Watches::default();
        let _ = w.add(1, &spec("/a", WatchKind::Recursive, true), &sm);
        let create = write(
            &mut sm,
            10,
            baton_proto::client_write::Op::Create(CreateOp { path: "/a/b/c".into(), ..Default::default() }),
        );
        assert_eq!(fired(&mut w, &create, &sm), vec![(EventType::NodeCreated, "/a/b/c".to_string())]);
        let set =
            write(&mut sm, 11, baton_proto::client_write::Op::Set(SetOp { path: "/a".into(), ..Default::default() }));
        assert_eq!(fired(&mut w, &set, &sm), vec![(EventType::NodeDataChanged, "/a".to_string())]);
        let elsewhere =
            write(&mut sm, 12, baton_proto::client_write::Op::Set(SetOp { path: "/z".into(), ..Default::default() }));
        assert!(fired(&mut w, &elsewhere, &sm).is_empty(), "a change outside the subtree fired");
        assert_eq!(w.total(), 1, "the recursive watch must stay after firing");
        w.remove(1, 7);
        assert!(fired(&mut w, &set, &sm).is_empty(), "a removed recursive watch fired");
    }

    #[test]
    fn a_recursive_watch_on_the_root_sees_everything() {
        let mut sm = tree(&[]);
        let mut w = Watches::default();
        let _ = w.add(1, &spec("/", WatchKind::Recursive, true), &sm);
        let create = write(
            &mut sm,
            5,
            baton_proto::client_write::Op::Create(CreateOp { path: "/x".into(), ..Default::default() }),
        );
        assert_eq!(fired(&mut w, &create, &sm), vec![(EventType::NodeCreated, "/x".to_string())]);
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

    fn delete(sm: &mut StateMachine, index: u64, path: &str) -> Vec<Change> {
        write(
            sm,
            index,
            baton_proto::client_write::Op::Delete(baton_proto::DeleteOp { path: path.into(), version: None }),
        )
    }

    fn first(path: &str, id: u64) -> WatchSpec {
        WatchSpec { watch_id: id, path: path.into(), kind: WatchKind::First as i32, persistent: false, existed: true }
    }

    /// The lock queue `/q` with `lock-0000000001` .. `lock-0000000004`
    /// (names whose order by sequence differs from their order as text
    /// would be: `z-` sorts after `lock-` but its sequence is lower).
    fn queue() -> StateMachine {
        tree(&["/q", "/q/z-0000000000", "/q/lock-0000000001", "/q/lock-0000000002", "/q/lock-0000000003"])
    }

    #[test]
    fn a_first_watch_fires_once_its_node_leads_the_queue_and_only_then() {
        let mut sm = queue();
        let mut w = Watches::default();
        assert_eq!(predecessor(&sm, "/q/lock-0000000002").as_deref(), Some("lock-0000000001"));
        assert_eq!(predecessor(&sm, "/q/z-0000000000"), None, "ordered by sequence, not by name");
        assert!(w.add(1, &first("/q/lock-0000000003", 3), &sm).is_none(), "not first: kept");
        assert!(w.add(2, &first("/q/lock-0000000002", 2), &sm).is_none());
        // A waiter leaving from the middle wakes no one.
        let mid = delete(&mut sm, 20, "/q/lock-0000000002");
        assert_eq!(fired(&mut w, &mid, &sm), vec![(EventType::NodeDeleted, "/q/lock-0000000002".to_string())]);
        // The holder's release: its successor is not first yet (one more ahead).
        let z = delete(&mut sm, 21, "/q/z-0000000000");
        assert!(fired(&mut w, &z, &sm).is_empty(), "fired while a node is still ahead");
        let head = delete(&mut sm, 22, "/q/lock-0000000001");
        assert_eq!(fired(&mut w, &head, &sm), vec![(EventType::NodeFirst, "/q/lock-0000000003".to_string())]);
        assert_eq!(w.total(), 0, "a fired FIRST watch stays");
        assert!(w.tally.first_dirs.is_empty(), "the tally keeps a parent with no FIRST watch");
        // Nothing left to fire on a later change in the queue.
        let last = delete(&mut sm, 23, "/q/lock-0000000003");
        assert!(fired(&mut w, &last, &sm).is_empty());
    }

    #[test]
    fn a_first_watch_that_is_due_fires_at_registration_and_after_a_gap() {
        let mut sm = queue();
        let mut w = Watches::default();
        let due = w.add(1, &first("/q/z-0000000000", 9), &sm).map(|f| (f.ty, f.path));
        assert_eq!(due, Some((EventType::NodeFirst, "/q/z-0000000000".to_string())));
        let gone = w.add(1, &first("/q/nope-0000000007", 8), &sm).map(|f| f.ty);
        assert_eq!(gone, Some(EventType::NodeDeleted));
        assert_eq!(w.total(), 0, "a due FIRST watch is not kept");
        // As an attach or a snapshot install sees it: due or not, whatever
        // the index the watcher last saw.
        let spec = first("/q/lock-0000000001", 1);
        assert!(missed_events(&sm, &spec, 0).is_empty());
        assert!(w.add(1, &spec, &sm).is_none());
        delete(&mut sm, 20, "/q/z-0000000000");
        assert_eq!(missed_events(&sm, &spec, 0), vec![(EventType::NodeFirst, spec.path.clone())]);
        let replayed: Vec<EventType> = w.after_snapshot(&sm).into_iter().map(|f| f.ty).collect();
        assert_eq!(replayed, vec![EventType::NodeFirst]);
        assert!(w.tally.first_dirs.is_empty());
    }

    #[test]
    fn a_closed_connection_takes_its_first_watches_off_the_tally() {
        let sm = queue();
        let mut w = Watches::default();
        assert!(w.add(1, &first("/q/lock-0000000002", 1), &sm).is_none());
        assert!(w.add(2, &first("/q/lock-0000000003", 1), &sm).is_none());
        w.remove_conn(1);
        assert_eq!(w.tally.first_dirs.get("/q"), Some(&1));
        w.remove(2, 1);
        assert!(w.tally.first_dirs.is_empty());
    }
}
