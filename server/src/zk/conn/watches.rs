//! addWatch, setWatches, checkWatches and removeWatches: the watches this
//! connection holds, recorded here (for the events' ZooKeeper types) and
//! registered at the driver.
//!
//! - addWatch: `PERSISTENT` is a persistent exists and children watch,
//!   `PERSISTENT_RECURSIVE` a recursive one; another mode or an invalid
//!   path is BAD_ARGUMENTS and records nothing.
//! - setWatches (a reconnect's watches): re-registered by one attach,
//!   which fires at once what each missed since `relative_zxid`. Only an
//!   exist watch was set on a missing node; a persistent one is re-added
//!   quietly, as ZooKeeper does (what changed since shows).
//! - A read, addWatch or setWatches the driver refused registered nothing
//!   there: what was recorded here is forgotten ([`forget_refused`];
//!   finding Z5: refused watches were kept, past `--max-watches`).
//! - checkWatches and removeWatches: this connection's watches on `path`
//!   of ZooKeeper's type `kind`; NO_WATCHER when there are none.
//!   removeWatches forgets them here (no event for them is written after
//!   this reply) and at the driver.

use super::*;

impl Gateway {
    /// Records watch `id`'s kind here and returns its spec for the driver.
    fn record_watch(&mut self, path: &str, kind: WatchKind, persistent: bool, existed: bool) -> WatchSpec {
        let id = self.next_watch;
        self.next_watch += 1;
        self.watches.insert(id, Watch { path: path.to_string(), kind, persistent });
        WatchSpec { watch_id: id, path: path.to_string(), kind: kind as i32, persistent, existed }
    }

    pub(super) fn add_watch(&mut self, reqs: &mut Zreqs, x: i32, o: i32, path: String, mode: i32) -> bool {
        let kinds: &[WatchKind] = match mode {
            jute::watch_mode::PERSISTENT => &[WatchKind::Exists, WatchKind::Children],
            jute::watch_mode::PERSISTENT_RECURSIVE => &[WatchKind::Recursive],
            _ => {
                self.answer(reqs, x, o, err::BAD_ARGUMENTS, Response::Empty);
                return true;
            }
        };
        if baton_proto::validate_path(&path).is_err() {
            self.answer(reqs, x, o, err::BAD_ARGUMENTS, Response::Empty);
            return true;
        }
        let specs: Vec<WatchSpec> = kinds.iter().map(|k| self.record_watch(&path, *k, true, false)).collect();
        let ids = specs.iter().map(|s| s.watch_id).collect();
        let bodies =
            specs.into_iter().map(|s| (request::Body::AddWatch(AddWatchReq { watch: Some(s) }), false)).collect();
        self.forward(reqs, x, o, What::Watches { ids }, bodies)
    }

    /// `lists`: data, exist, child, persistent and persistent recursive
    /// paths, in that order.
    pub(super) fn set_watches(&mut self, reqs: &mut Zreqs, x: i32, o: i32, zxid: i64, lists: [Vec<String>; 5]) -> bool {
        if lists.iter().any(|l| l.iter().any(|p| baton_proto::validate_path(p).is_err())) {
            // Nothing recorded for a path the driver would refuse.
            self.answer(reqs, x, o, err::BAD_ARGUMENTS, Response::Empty);
            return true;
        }
        let kinds = [
            (WatchKind::Data, false),
            (WatchKind::Exists, false),
            (WatchKind::Children, false),
            (WatchKind::Exists, true),
            (WatchKind::Recursive, true),
        ];
        let mut specs = Vec::new();
        for (paths, (kind, persistent)) in lists.iter().zip(kinds) {
            for p in paths {
                let mut kinds = vec![kind];
                if persistent && kind == WatchKind::Exists {
                    kinds.push(WatchKind::Children);
                }
                for k in kinds {
                    let existed = k != WatchKind::Exists || persistent;
                    specs.push(self.record_watch(p, k, persistent, existed));
                }
            }
        }
        let ids = specs.iter().map(|s| s.watch_id).collect();
        let attach = AttachReq {
            session_id: self.session,
            secret: self.secret.clone().into(),
            last_zxid: zxid.max(0) as u64,
            watches: specs,
        };
        self.forward(reqs, x, o, What::Watches { ids }, vec![(request::Body::Attach(attach), false)])
    }

    pub(super) fn check_or_remove_watches(
        &mut self,
        reqs: &mut Zreqs,
        x: i32,
        o: i32,
        path: String,
        kind: i32,
    ) -> bool {
        let mut ids: Vec<u64> =
            self.watches.iter().filter(|(_, w)| w.path == path && w.is_of(kind)).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        if ids.is_empty() || !(1..=5).contains(&kind) {
            self.answer(reqs, x, o, err::NO_WATCHER, Response::Empty);
            return true;
        }
        if o == op::REMOVE_WATCHES {
            for watch_id in ids {
                self.watches.remove(&watch_id);
                let id = self.id();
                let body = request::Body::RemoveWatch(RemoveWatchReq { watch_id });
                if !self.send(baton_proto::Request { id, body: Some(body), ..Default::default() }) {
                    return false;
                }
            }
        }
        self.answer(reqs, x, o, err::OK, Response::Empty);
        true
    }
}

/// A failed read, addWatch or setWatches: forget the watches recorded
/// for it here (the module doc).
pub(super) fn forget_refused(what: &What, watches: &mut HashMap<u64, Watch>) {
    match what {
        What::Watched { watch: Some(w) } => {
            watches.remove(w);
        }
        What::Watches { ids } => {
            for w in ids {
                watches.remove(w);
            }
        }
        _ => {}
    }
}
