//! Persistence: loading the state from the store, staging what changed
//! (the module doc's "Persistence"), snapshots and backups.

use super::*;

impl StateMachine {
    /// Loads state from `kv` (empty tree if nothing is stored).
    pub fn load(kv: &dyn Kv) -> Result<Self, KvError> {
        let mut sm = StateMachine::new();
        if let Some(b) = kv.get(KEY_APPLIED)? {
            sm.applied =
                u64::from_be_bytes(b.as_slice().try_into().map_err(|_| KvError("corrupt applied index".into()))?);
        }
        kv.for_each_prefix(&[PREFIX_NODE], &mut |k, v| {
            let path = std::str::from_utf8(&k[1..]).map_err(|_| KvError("corrupt node key".into()))?;
            let rec = NodeRecord::decode(v).map_err(|e| KvError(format!("corrupt node {path}: {e}")))?;
            sm.nodes.insert(path.to_string(), Box::new(node_from_record(rec)));
            Ok(())
        })?;
        for (_, v) in kv.scan_prefix(&[PREFIX_SESSION])? {
            let rec = SessionRecord::decode(v.as_slice()).map_err(|e| KvError(format!("corrupt session: {e}")))?;
            sm.sessions.insert(rec.id, session_from_record(rec));
        }
        for (_, v) in kv.scan_prefix(&[PREFIX_FENCE])? {
            let rec = FenceRecord::decode(v.as_slice()).map_err(|e| KvError(format!("corrupt fence: {e}")))?;
            sm.fences.insert(rec.resource, rec.token);
        }
        for (_, v) in kv.scan_prefix(&[PREFIX_USER])? {
            let u = UserRecord::decode(v.as_slice()).map_err(|e| KvError(format!("corrupt user: {e}")))?;
            sm.users.insert(u.name, (u.salt, u.hash));
        }
        if let Some(b) = kv.get(KEY_CLUSTER)? {
            sm.cluster = ClusterRecord::decode(b.as_slice()).map_err(|e| KvError(format!("corrupt cluster: {e}")))?;
        }
        sm.rebuild_derived();
        Ok(sm)
    }

    /// Rebuilds what is not stored (the module doc of kv.rs): child lists,
    /// child counts, reapable paths and each session's ephemerals, in one
    /// pass over the nodes; each child list is sorted once and built whole.
    fn rebuild_derived(&mut self) {
        self.nodes.entry("/".into()).or_insert_with(|| Box::new(root_node()));
        self.kids.clear();
        self.reapable.clear();
        let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
        for (path, n) in self.nodes.iter() {
            if n.stat.container || n.stat.ttl_ms > 0 {
                self.reapable.insert(path.clone());
            }
            if n.stat.ephemeral_owner != 0 {
                if let Some(s) = self.sessions.get_mut(&n.stat.ephemeral_owner) {
                    s.ephemerals.insert(path.clone());
                }
            }
            if let Some(parent) = parent_of(path).filter(|p| self.nodes.contains_key(p)) {
                children.entry(parent).or_default().push(base_name(path));
            }
        }
        let mut counts: Vec<(String, u32)> = Vec::with_capacity(children.len());
        for (parent, mut names) in children {
            names.sort_unstable();
            counts.push((parent.to_string(), names.len() as u32));
            let set: BTreeSet<String> = names.into_iter().map(str::to_string).collect();
            self.kids.insert(parent.to_string(), set);
        }
        for n in self.nodes.values_mut() {
            n.stat.num_children = 0;
        }
        for (parent, count) in counts {
            if let Some(p) = self.nodes.get_mut(&parent) {
                p.stat.num_children = count;
            }
        }
    }

    /// Keys changed since the last [`flush`](Self::flush).
    pub fn dirty_keys(&self) -> usize {
        self.dirty_nodes.len() + self.dirty_sessions.len() + self.dirty_fences.len() + self.dirty_users.len()
    }

    /// A change that must be on disk with this Ready: the whole state was
    /// replaced (a snapshot) or the cluster record changed (it goes with
    /// the configuration raft-rs stores).
    pub fn must_flush(&self) -> bool {
        self.dirty_all || self.dirty_cluster
    }

    /// Stages every change since the last flush, and the applied index.
    pub fn flush(&mut self, batch: &mut Batch) {
        if self.dirty_all {
            for prefix in [PREFIX_NODE, PREFIX_SESSION, PREFIX_FENCE, PREFIX_USER] {
                batch.delete_range(vec![prefix], prefix_end(&[prefix]));
            }
            self.dirty_nodes = self.nodes.keys().cloned().collect();
            self.dirty_sessions = self.sessions.keys().copied().collect();
            self.dirty_fences = self.fences.keys().cloned().collect();
            self.dirty_cluster = true;
            self.dirty_users = self.users.keys().cloned().collect();
            self.dirty_all = false;
        }
        for path in self.dirty_nodes.drain() {
            let key = node_key(&path);
            match self.nodes.get(&path) {
                Some(n) => batch.put(key, node_record(n).encode_to_vec()),
                // Created and deleted since the last flush: never on disk.
                None if self.born.contains(&path) => {}
                None => batch.delete(key),
            }
        }
        self.born.clear();
        for id in self.dirty_sessions.drain() {
            let key = session_key(id);
            match self.sessions.get(&id) {
                Some(s) => batch.put(key, session_record(id, s).encode_to_vec()),
                None => batch.delete(key),
            }
        }
        for name in self.dirty_fences.drain() {
            let mut key = vec![PREFIX_FENCE];
            key.extend_from_slice(name.as_bytes());
            match self.fences.get(&name) {
                Some(t) => batch.put(key, FenceRecord { resource: name.clone(), token: *t }.encode_to_vec()),
                None => batch.delete(key),
            }
        }
        for name in self.dirty_users.drain() {
            let mut key = vec![PREFIX_USER];
            key.extend_from_slice(name.as_bytes());
            match self.users.get(&name) {
                Some((salt, hash)) => {
                    let rec = UserRecord { name: name.clone(), salt: salt.clone(), hash: hash.clone() };
                    batch.put(key, rec.encode_to_vec())
                }
                None => batch.delete(key),
            }
        }
        if std::mem::take(&mut self.dirty_cluster) {
            batch.put(KEY_CLUSTER, self.cluster.encode_to_vec());
        }
        batch.put(KEY_APPLIED, self.applied.to_be_bytes().to_vec());
    }

    /// The whole state as bytes (Raft snapshot payload).
    pub fn snapshot(&self) -> Vec<u8> {
        self.encode_state(self.snapshot_record())
    }

    /// `rest` (a snapshot record without its nodes) with every node, sorted
    /// by path, encoded one at a time straight into the output: the same
    /// bytes as encoding the whole record, without a million cloned node
    /// records alive at once (a `snapshot save` at 1M nodes left the
    /// member ~300 MB larger, in freed pieces the allocator kept).
    fn encode_state(&self, mut rest: baton_proto::Snapshot) -> Vec<u8> {
        use prost::encoding::{encode_key, encode_varint, WireType};
        const NODES_FIELD: u32 = 2;
        let mut paths: Vec<(&String, &Node)> = self.nodes.iter().map(|(p, n)| (p, &**n)).collect();
        paths.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut out = Vec::new();
        let head = baton_proto::Snapshot { applied_index: rest.applied_index, ..Default::default() };
        head.encode(&mut out).expect("a Vec grows");
        for (path, n) in paths {
            let entry = NodeEntry { path: path.clone(), node: Some(node_record(n)) };
            encode_key(NODES_FIELD, WireType::LengthDelimited, &mut out);
            encode_varint(entry.encoded_len() as u64, &mut out);
            entry.encode(&mut out).expect("a Vec grows");
        }
        rest.applied_index = 0;
        rest.encode(&mut out).expect("a Vec grows");
        out
    }

    /// The state for a backup file (backup.rs): [`StateMachine::snapshot`]
    /// without what lets a reader act as a session. Every session's secret
    /// and cached replies are left out, so no one holding the file can
    /// resume or close a session of the live cluster; a restore gives the
    /// sessions new secrets ([`StateMachine::rekey_sessions`]).
    pub fn backup(&self) -> Vec<u8> {
        let mut snap = self.snapshot_record();
        for s in &mut snap.sessions {
            s.secret = Bytes::new();
            s.replies.clear();
        }
        self.encode_state(snap)
    }

    /// Gives every session a fresh random secret (a restored backup's
    /// sessions: no client knows it, so they expire after their timeout
    /// with their ephemerals, and none can be taken over).
    pub fn rekey_sessions(&mut self, rng: &mut impl rand::Rng) {
        for s in self.sessions.values_mut() {
            let mut secret = [0u8; 16];
            rng.fill(&mut secret[..]);
            s.secret = Bytes::copy_from_slice(&secret);
            s.replies.clear();
            s.reply_bytes = 0;
        }
    }

    /// The snapshot of the state checkpointed in `view` (the store as the
    /// syncer left it after a checkpoint), and the index it is at: the
    /// same bytes [`StateMachine::snapshot`] makes of that state, built
    /// from the stored records without decoding them, on any thread
    /// (driver/ready.rs, "Snapshots off the driver").
    pub fn snapshot_from_store(view: &dyn KvView) -> Result<(u64, Vec<u8>), KvError> {
        Self::encode_store(view, false)
    }

    /// The backup of the state checkpointed in `view`: the same bytes
    /// [`StateMachine::backup`] makes of that state (every session's secret
    /// and replies left out), built on any thread (backup.rs).
    pub fn backup_from_store(view: &dyn KvView) -> Result<(u64, Vec<u8>), KvError> {
        Self::encode_store(view, true)
    }

    fn encode_store(view: &dyn KvView, backup: bool) -> Result<(u64, Vec<u8>), KvError> {
        use prost::encoding::{encode_key, encode_varint, WireType};
        fn field(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
            encode_key(tag, WireType::LengthDelimited, out);
            encode_varint(bytes.len() as u64, out);
            out.extend_from_slice(bytes);
        }
        let applied = match view.get(KEY_APPLIED)? {
            Some(b) => {
                u64::from_be_bytes(b.as_slice().try_into().map_err(|_| KvError("corrupt applied index".into()))?)
            }
            None => 0,
        };
        let mut out = Vec::new();
        baton_proto::Snapshot { applied_index: applied, ..Default::default() }.encode(&mut out).expect("a Vec grows");
        // NodeEntry { path = 1, node = 2 }, inside Snapshot.nodes = 2.
        let mut entry = Vec::new();
        // The root is stored only once it changed; the loaded state has it
        // either way (`rebuild_derived`), and so does the snapshot. It
        // sorts first.
        if view.get(&[PREFIX_NODE, b'/'])?.is_none() {
            field(&mut entry, 1, b"/");
            field(&mut entry, 2, &node_record(&root_node()).encode_to_vec());
            field(&mut out, 2, &entry);
        }
        view.for_each_prefix(&[PREFIX_NODE], &mut |k, v| {
            entry.clear();
            field(&mut entry, 1, &k[1..]);
            field(&mut entry, 2, v);
            field(&mut out, 2, &entry);
            Ok(())
        })?;
        view.for_each_prefix(&[PREFIX_SESSION], &mut |_, v| {
            if !backup {
                field(&mut out, 3, v);
                return Ok(());
            }
            let mut rec = baton_proto::SessionRecord::decode(v).map_err(|e| KvError(format!("session record: {e}")))?;
            rec.secret = Bytes::new();
            rec.replies.clear();
            field(&mut out, 3, &rec.encode_to_vec());
            Ok(())
        })?;
        view.for_each_prefix(&[PREFIX_FENCE], &mut |_, v| {
            field(&mut out, 4, v);
            Ok(())
        })?;
        // An empty cluster record is left out, as `snapshot_record` does.
        if let Some(c) = view.get(KEY_CLUSTER)?.filter(|c| !c.is_empty()) {
            field(&mut out, 5, &c);
        }
        view.for_each_prefix(&[PREFIX_USER], &mut |_, v| {
            field(&mut out, 6, v);
            Ok(())
        })?;
        Ok((applied, out))
    }

    /// Everything but the nodes ([`Self::encode_state`] adds them).
    fn snapshot_record(&self) -> baton_proto::Snapshot {
        let mut fences: Vec<FenceRecord> =
            self.fences.iter().map(|(r, t)| FenceRecord { resource: r.clone(), token: *t }).collect();
        fences.sort_by(|a, b| a.resource.cmp(&b.resource));
        baton_proto::Snapshot {
            applied_index: self.applied,
            nodes: Vec::new(),
            sessions: self.sessions.iter().map(|(id, s)| session_record(*id, s)).collect(),
            fences,
            cluster: (self.cluster != ClusterRecord::default()).then(|| self.cluster.clone()),
            users: self
                .users
                .iter()
                .map(|(n, (s, h))| UserRecord { name: n.clone(), salt: s.clone(), hash: h.clone() })
                .collect(),
        }
    }

    /// Replaces the whole state with a snapshot's.
    pub fn restore(&mut self, data: &[u8]) -> Result<(), prost::DecodeError> {
        let snap = baton_proto::Snapshot::decode(data)?;
        let mut sm = StateMachine::new();
        sm.applied = snap.applied_index;
        for e in snap.nodes {
            if let Some(rec) = e.node {
                sm.nodes.insert(e.path, Box::new(node_from_record(rec)));
            }
        }
        for s in snap.sessions {
            sm.sessions.insert(s.id, session_from_record(s));
        }
        for f in snap.fences {
            sm.fences.insert(f.resource, f.token);
        }
        sm.cluster = snap.cluster.unwrap_or_default();
        for u in snap.users {
            sm.users.insert(u.name, (u.salt, u.hash));
        }
        sm.rebuild_derived();
        sm.dirty_all = true;
        sm.faults = self.faults;
        *self = sm;
        Ok(())
    }

    /// A canonical text dump of the whole state (tests, golden scripts).
    pub fn dump(&self) -> String {
        let mut out = String::new();
        let mut paths: Vec<&String> = self.nodes.keys().collect();
        paths.sort();
        for p in paths {
            let n = &self.nodes[p];
            let s = &n.stat;
            out.push_str(&format!(
                "{p} data={:?} czxid={} mzxid={} pzxid={} v={} cv={} owner={} children={}\n",
                String::from_utf8_lossy(&n.data),
                s.czxid,
                s.mzxid,
                s.pzxid,
                s.version,
                s.cversion,
                s.ephemeral_owner,
                s.num_children
            ));
        }
        let mut acls: Vec<(&String, &Node)> =
            self.nodes.iter().filter(|(_, n)| !n.acl.is_empty()).map(|(p, n)| (p, &**n)).collect();
        acls.sort_by(|a, b| a.0.cmp(b.0));
        for (p, n) in acls {
            let acl: Vec<String> = n.acl.iter().map(acl::format).collect();
            out.push_str(&format!("acl {p} {}\n", acl.join(",")));
        }
        for name in self.users.keys() {
            out.push_str(&format!("user {name}\n"));
        }
        for (id, s) in &self.sessions {
            out.push_str(&format!("session {id} timeout={} ephemerals={:?}\n", s.timeout_ms, s.ephemerals));
        }
        let mut fences: Vec<_> = self.fences.iter().collect();
        fences.sort();
        for (r, t) in fences {
            out.push_str(&format!("fence {r} = {t}\n"));
        }
        if !self.cluster.cluster_id.is_empty() {
            let c = &self.cluster;
            out.push_str(&format!("cluster {} set at {} joined {:?}\n", c.cluster_id, c.index, c.joined));
        }
        for m in &self.cluster.members {
            out.push_str(&format!("member {} peer {} client {}\n", m.id, m.peer_addr, m.client_addr));
        }
        out
    }
}
