//! Transactions: one client write's ops, checked and applied against the
//! tree with an undo log; a failed op (or any op of a failed `multi`)
//! rolls every change back (the module doc's invariants).

use super::*;

/// One write in progress, with what it takes to undo it.
/// Where a fence's guard lives: a node `/_baton/fences/<name>` whose ACL
/// says who may use fence `<name>` (WRITE); no node, no guard.
pub const FENCE_GUARDS: &str = "/_baton/fences";

/// The most fence names the cluster keeps: a constant, so every member
/// applies the same rule (a new name past it is `BUSY`).
pub const MAX_FENCES: usize = 100_000;

pub(super) struct Txn<'a> {
    pub(super) sm: &'a mut StateMachine,
    pub(super) undo: Vec<Undo>,
    pub(super) changes: Vec<Change>,
    pub(super) index: u64,
    pub(super) time: i64,
    pub(super) session: u64,
    /// Whose write this is, for ACL checks (acl.rs).
    pub(super) caller: Caller,
}

/// A failed write: code, message, and (for multi) the per-op results.
pub(super) type TxnError = Box<(ErrorCode, String, Option<response::Body>)>;

impl Txn<'_> {
    pub(super) fn run(&mut self, w: &ClientWrite) -> Result<response::Body, TxnError> {
        use baton_proto::client_write::Op as W;
        let single = |r: Result<response::Body, OpError>| r.map_err(|(c, m)| Box::new((c, m, None)));
        match &w.op {
            Some(W::Create(c)) => single(self.create(c).map(|(path, stat)| {
                response::Body::Create(CreateResp { path, stat: Some(stat), ..Default::default() })
            })),
            Some(W::Set(s)) => single(self.set(s).map(|stat| response::Body::Set(SetResp { stat: Some(stat) }))),
            Some(W::Delete(d)) => single(self.delete(d).map(|_| response::Body::Empty(Empty {}))),
            Some(W::Multi(m)) => self.multi(&m.ops),
            Some(W::SetAcl(a)) => single(self.set_acl(a).map(|stat| response::Body::Set(SetResp { stat: Some(stat) }))),
            Some(W::AddUser(u)) => single(self.add_user(u).map(|_| response::Body::Empty(Empty {}))),
            Some(W::ResetFence(f)) => single(self.reset_fence(&f.resource).map(|_| response::Body::Empty(Empty {}))),
            Some(W::SetSettings(s)) => single(self.set_settings(s).map(|_| response::Body::Empty(Empty {}))),
            Some(W::RemoveUser(u)) => single(self.remove_user(&u.name).map(|_| response::Body::Empty(Empty {}))),
            Some(W::CloseSession(_)) | Some(W::ClaimSession(_)) | None => {
                Err(Box::new((ErrorCode::BadRequest, "unknown write".into(), None)))
            }
        }
    }

    fn multi(&mut self, ops: &[baton_proto::Op]) -> Result<response::Body, TxnError> {
        let mut results = Vec::with_capacity(ops.len());
        for (i, o) in ops.iter().enumerate() {
            let r = match &o.op {
                Some(op::Op::Create(c)) => {
                    self.create(c).map(|(path, stat)| OpResult { path, stat: Some(stat), ..Default::default() })
                }
                Some(op::Op::Set(s)) => self.set(s).map(|stat| OpResult { stat: Some(stat), ..Default::default() }),
                Some(op::Op::Delete(d)) => self.delete(d).map(|_| OpResult::default()),
                Some(op::Op::Check(c)) => self.check(c).map(|_| OpResult::default()),
                Some(op::Op::CheckFence(f)) => self.check_fence(f).map(|_| OpResult::default()),
                Some(op::Op::SetAcl(a)) => {
                    self.set_acl(a).map(|stat| OpResult { stat: Some(stat), ..Default::default() })
                }
                None => err(ErrorCode::BadRequest, "empty op"),
            };
            match r {
                Ok(res) => results.push(res),
                Err((code, msg)) => {
                    results.push(OpResult { error: code as i32, ..Default::default() });
                    let body = response::Body::Multi(MultiResp { results });
                    return Err(Box::new((code, format!("multi op #{i} failed: {msg}"), Some(body))));
                }
            }
        }
        Ok(response::Body::Multi(MultiResp { results }))
    }

    fn save_node(&mut self, path: &str) {
        let prev = self.sm.nodes.get(path).cloned();
        self.undo.push(Undo::Node(path.to_string(), prev));
        self.sm.mark_node(path);
    }

    fn create(&mut self, c: &CreateOp) -> Result<(String, Stat), OpError> {
        check_path(&c.path)?;
        if c.data.len() > MAX_DATA {
            return err(ErrorCode::TooLarge, format!("data is {} bytes, over {MAX_DATA}", c.data.len()));
        }
        if c.path == "/" && !c.sequential {
            return err(ErrorCode::NodeExists, "/ exists");
        }
        let parent = parent_of(&c.path).unwrap_or("/").to_string();
        if !self.sm.nodes.contains_key(&parent) {
            if c.parents {
                self.create_parents(&parent)?;
            } else {
                return err(ErrorCode::NoNode, format!("parent {parent} does not exist"));
            }
        }
        let p = &self.sm.nodes[&parent];
        self.caller.check(&p.acl, acl::CREATE, "create in", &parent)?;
        if p.stat.ephemeral_owner != 0 {
            return err(ErrorCode::NoChildrenForEphemerals, format!("{parent} is ephemeral and cannot have children"));
        }
        acl::validate(&c.acl)?;
        check_kind(c)?;
        let node_acl = if c.acl.is_empty() { p.acl.clone() } else { self.caller.expand(&c.acl)? };
        let mut seq = p.next_seq;
        let path = if c.sequential {
            loop {
                let candidate = format!("{}{seq:010}", c.path);
                if !self.sm.nodes.contains_key(&candidate) {
                    break candidate;
                }
                seq += 1;
            }
        } else {
            c.path.clone()
        };
        if c.sequential {
            check_path(&path)?; // the suffix may push it over the limit
        }
        if self.sm.nodes.contains_key(&path) {
            return err(ErrorCode::NodeExists, format!("{path} exists"));
        }
        let owner = if c.ephemeral { self.session } else { 0 };
        self.insert_node(&parent, &path, c.data.clone(), owner, c.sequential.then_some(seq + 1), node_acl);
        if c.container || c.ttl_ms > 0 {
            if let Some(n) = self.sm.nodes.get_mut(&path) {
                n.stat.container = c.container;
                n.stat.ttl_ms = c.ttl_ms;
            }
            self.sm.reapable.insert(path.clone());
        }
        Ok((path.clone(), full_stat(&self.sm.nodes[&path])))
    }

    fn create_parents(&mut self, path: &str) -> Result<(), OpError> {
        let mut missing = Vec::new();
        let mut cur = path;
        while !self.sm.nodes.contains_key(cur) {
            missing.push(cur.to_string());
            cur = parent_of(cur).unwrap_or("/");
        }
        let top = &self.sm.nodes[cur];
        self.caller.check(&top.acl, acl::CREATE, "create in", cur)?;
        if top.stat.ephemeral_owner != 0 {
            return err(ErrorCode::NoChildrenForEphemerals, format!("{cur} is ephemeral and cannot have children"));
        }
        let inherited = top.acl.clone();
        for p in missing.iter().rev() {
            let parent = parent_of(p).unwrap_or("/").to_string();
            self.insert_node(&parent, p, Bytes::new(), 0, None, inherited.clone());
        }
        Ok(())
    }

    /// `next_seq`: the parent's counter after a sequential create.
    fn insert_node(&mut self, parent: &str, path: &str, data: Bytes, owner: u64, next_seq: Option<u64>, acl: Vec<Acl>) {
        self.save_node(parent);
        self.save_node(path);
        let (index, time) = (self.index, self.time);
        if let Some(p) = self.sm.nodes.get_mut(parent) {
            if let Some(n) = next_seq {
                p.next_seq = n;
            }
            p.stat.num_children += 1;
            p.stat.cversion += 1;
            p.stat.pzxid = index;
        }
        let stat = Stat {
            czxid: index,
            mzxid: index,
            pzxid: index,
            ctime: time,
            mtime: time,
            ephemeral_owner: owner,
            ..Default::default()
        };
        self.sm.kids.entry(parent.to_string()).or_default().insert(base_name(path).to_string());
        self.undo.push(Undo::Child { parent: parent.to_string(), name: base_name(path).to_string(), added: true });
        self.sm.nodes.insert(path.to_string(), Box::new(Node { data, stat, next_seq: 0, acl }));
        if owner != 0 {
            if let Some(s) = self.sm.sessions.get_mut(&owner) {
                if s.ephemerals.insert(path.to_string()) {
                    self.undo.push(Undo::Ephemeral { session: owner, path: path.to_string(), added: true });
                }
            }
        }
        self.changes.push(Change::Created(path.to_string()));
        self.changes.push(Change::ChildrenChanged(parent.to_string()));
    }

    fn set(&mut self, s: &SetOp) -> Result<Stat, OpError> {
        check_path(&s.path)?;
        if s.data.len() > MAX_DATA {
            return err(ErrorCode::TooLarge, format!("data is {} bytes, over {MAX_DATA}", s.data.len()));
        }
        let n = self.sm.lookup(&s.path)?;
        self.caller.check(&n.acl, acl::WRITE, "set", &s.path)?;
        check_version(&s.path, n, s.version)?;
        self.save_node(&s.path);
        let (index, time) = (self.index, self.time);
        let n = self.sm.nodes.get_mut(&s.path).ok_or((ErrorCode::Internal, "vanished".to_string()))?;
        n.data = s.data.clone();
        n.stat.version += 1;
        n.stat.mzxid = index;
        n.stat.mtime = time;
        let stat = full_stat(n);
        self.changes.push(Change::DataChanged(s.path.clone()));
        Ok(stat)
    }

    fn delete(&mut self, d: &DeleteOp) -> Result<(), OpError> {
        check_path(&d.path)?;
        if d.path == "/" {
            return err(ErrorCode::InvalidPath, "/ cannot be deleted");
        }
        let n = self.sm.lookup(&d.path)?;
        let parent_acl = parent_of(&d.path).and_then(|p| self.sm.nodes.get(p)).map(|p| p.acl.as_slice()).unwrap_or(&[]);
        self.caller.check(parent_acl, acl::DELETE, "delete", &d.path)?;
        check_version(&d.path, n, d.version)?;
        if n.stat.num_children > 0 {
            return err(ErrorCode::NotEmpty, format!("{} has {} children", d.path, n.stat.num_children));
        }
        let owner = n.stat.ephemeral_owner;
        let parent = parent_of(&d.path).unwrap_or("/").to_string();
        self.save_node(&d.path);
        self.save_node(&parent);
        if owner != 0 {
            if let Some(s) = self.sm.sessions.get_mut(&owner) {
                if s.ephemerals.remove(&d.path) {
                    self.undo.push(Undo::Ephemeral { session: owner, path: d.path.clone(), added: false });
                }
            }
        }
        self.undo.push(Undo::Child { parent: parent.clone(), name: base_name(&d.path).to_string(), added: false });
        let mut changes = Vec::new();
        self.sm.remove_node(&d.path, self.index, &mut changes);
        self.changes.extend(changes);
        Ok(())
    }

    fn set_acl(&mut self, a: &baton_proto::SetAclOp) -> Result<Stat, OpError> {
        check_path(&a.path)?;
        acl::validate(&a.acl)?;
        let n = self.sm.lookup(&a.path)?;
        self.caller.check(&n.acl, acl::ADMIN, "set-acl", &a.path)?;
        // After ADMIN, as ZooKeeper checks them. An empty list here would
        // mean "open to everyone", which no one asking to set an ACL means;
        // ZooKeeper answers INVALIDACL.
        if a.acl.is_empty() {
            return err(
                ErrorCode::BadRequest,
                format!("an empty ACL would open {} to everyone: to mean that, set world:anyone:rwcda", a.path),
            );
        }
        if let Some(v) = a.version {
            if v != n.stat.aversion {
                return err(
                    ErrorCode::BadVersion,
                    format!("{}'s ACL is at version {}, not {v}", a.path, n.stat.aversion),
                );
            }
        }
        let new = self.caller.expand(&a.acl)?;
        self.save_node(&a.path);
        let n = self.sm.nodes.get_mut(&a.path).ok_or((ErrorCode::Internal, "vanished".to_string()))?;
        n.acl = new;
        n.stat.aversion += 1;
        Ok(full_stat(n))
    }

    fn superuser_only(&self, what: &str) -> Result<(), OpError> {
        if self.caller.superuser {
            return Ok(());
        }
        err(ErrorCode::NoAuth, format!("{what} needs a superuser (--superuser)"))
    }

    fn add_user(&mut self, u: &AddUserOp) -> Result<(), OpError> {
        self.superuser_only("add-user")?;
        if u.name.is_empty() || u.name.len() > 256 || u.name.contains(':') || u.name.chars().any(char::is_control) {
            return err(ErrorCode::BadRequest, "a user name is 1..256 characters, no ':' or control characters");
        }
        if self.sm.users.contains_key(&u.name) {
            return err(ErrorCode::NodeExists, format!("user {} exists", u.name));
        }
        self.undo.push(Undo::User(u.name.clone(), None));
        self.sm.users.insert(u.name.clone(), (u.salt.clone(), u.hash.clone()));
        self.sm.dirty_users.insert(u.name.clone());
        Ok(())
    }

    /// Replaces the cluster-wide settings (settings.rs): superusers only,
    /// never to settings that leave no admin; logged on every member.
    fn set_settings(&mut self, op: &baton_proto::SetSettingsOp) -> Result<(), OpError> {
        self.superuser_only("changing the cluster settings")?;
        let s = op.settings.clone().unwrap_or_default();
        crate::settings::validate(&s).map_err(|m| (ErrorCode::BadRequest, m))?;
        tracing::warn!(
            superusers = ?s.superusers,
            open_admin = s.open_admin,
            index = self.index,
            by = ?self.caller.identities,
            "audit: cluster settings changed by a superuser"
        );
        // Last: nothing after it can fail, so there is nothing to undo.
        self.sm.cluster.settings = Some(s);
        self.sm.dirty_cluster = true;
        Ok(())
    }

    /// An admin's way out of a jammed fence: forgets `resource`'s highest
    /// token (the next check takes any valid token), with an audit line on
    /// every member that applies it.
    fn reset_fence(&mut self, resource: &str) -> Result<(), OpError> {
        self.superuser_only("fence reset")?;
        let Some(prev) = self.sm.fences.remove(resource) else {
            return err(ErrorCode::NoNode, format!("no fence {resource}"));
        };
        tracing::warn!(
            fence = resource,
            token = prev,
            index = self.index,
            by = ?self.caller.identities,
            "audit: fence reset by a superuser (it was at token {prev})"
        );
        self.undo.push(Undo::Fence(resource.to_string(), Some(prev)));
        self.sm.dirty_fences.insert(resource.to_string());
        Ok(())
    }

    fn remove_user(&mut self, name: &str) -> Result<(), OpError> {
        self.superuser_only("remove-user")?;
        let Some(prev) = self.sm.users.remove(name) else {
            return err(ErrorCode::NoNode, format!("no user {name}"));
        };
        self.undo.push(Undo::User(name.to_string(), Some(prev)));
        self.sm.dirty_users.insert(name.to_string());
        Ok(())
    }

    fn check(&mut self, c: &CheckOp) -> Result<(), OpError> {
        let n = self.sm.lookup(&c.path)?;
        check_version(&c.path, n, c.version)
    }

    fn check_fence(&mut self, f: &CheckFenceOp) -> Result<(), OpError> {
        if f.resource.is_empty() || f.resource.len() > baton_proto::MAX_PATH {
            return err(ErrorCode::BadRequest, "fence resource name must be 1..4096 bytes");
        }
        // A token is a log index: one above this entry's own index was
        // handed out by no lock, and would jam the fence for every real
        // holder (finding A3: `--fence counter=18446744073709551615`).
        if f.token > self.index {
            return err(
                ErrorCode::BadRequest,
                format!(
                    "fence {}: token {} is above this write's log index {}: no lock has handed it out",
                    f.resource, f.token, self.index
                ),
            );
        }
        // Who may use a fence: a node `/_baton/fences/<name>` guards it with
        // its ACL (WRITE), as a lock's folder guards the lock.
        let guard = format!("{FENCE_GUARDS}/{}", f.resource);
        if let Some(n) = self.sm.nodes.get(&guard) {
            self.caller.check(&n.acl, acl::WRITE, "fence", &guard)?;
        }
        let prev = self.sm.fences.get(&f.resource).copied();
        if prev.is_none() && self.sm.fences.len() >= MAX_FENCES {
            return err(
                ErrorCode::Busy,
                format!("fence {}: the cluster already keeps {MAX_FENCES} fences (the most it keeps)", f.resource),
            );
        }
        if let Some(seen) = prev.filter(|_| !self.sm.faults.no_fence_check()) {
            if f.token < seen {
                return err(
                    ErrorCode::FenceRejected,
                    format!("fence {}: token {} is older than {} already used", f.resource, f.token, seen),
                );
            }
        }
        self.undo.push(Undo::Fence(f.resource.clone(), prev));
        self.sm.fences.insert(f.resource.clone(), f.token);
        self.sm.dirty_fences.insert(f.resource.clone());
        Ok(())
    }

    pub(super) fn rollback(&mut self) {
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Node(path, prev) => match prev {
                    Some(n) => {
                        if n.stat.container || n.stat.ttl_ms > 0 {
                            self.sm.reapable.insert(path.clone());
                        }
                        self.sm.nodes.insert(path, n);
                    }
                    None => {
                        self.sm.nodes.remove(&path);
                    }
                },
                Undo::Fence(name, prev) => match prev {
                    Some(t) => {
                        self.sm.fences.insert(name, t);
                    }
                    None => {
                        self.sm.fences.remove(&name);
                    }
                },
                Undo::User(name, prev) => match prev {
                    Some(v) => {
                        self.sm.users.insert(name, v);
                    }
                    None => {
                        self.sm.users.remove(&name);
                    }
                },
                Undo::Child { parent, name, added } => {
                    let set = self.sm.kids.entry(parent).or_default();
                    if added {
                        set.remove(&name);
                    } else {
                        set.insert(name);
                    }
                }
                Undo::Ephemeral { session, path, added } => {
                    if let Some(s) = self.sm.sessions.get_mut(&session) {
                        if added {
                            s.ephemerals.remove(&path);
                        } else {
                            s.ephemerals.insert(path);
                        }
                    }
                }
            }
        }
        self.changes.clear();
    }
}
