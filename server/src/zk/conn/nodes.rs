//! create (create, create2, createContainer, createTTL), delete, setData
//! and setACL: each request as Baton's write, and its reply back.
//!
//! - Every create mode is served: a container (`CONTAINER`, by
//!   `createContainer` or inside a multi) and a TTL node
//!   (`PERSISTENT[_SEQUENTIAL]_WITH_TTL`, by `createTTL` or inside a
//!   multi) are Baton's container and TTL nodes, which the leader reaps
//!   (state/mod.rs, "Reaping"). As in ZooKeeper, a TTL mode needs a TTL of
//!   1 ms to 2^40 - 1 ms and a TTL with another mode is refused
//!   (`BAD_ARGUMENTS`); unlike ZooKeeper, no server flag is needed to turn
//!   them on. Creates of every kind, in a multi too, go through
//!   [`create_op`].
//! - ZooKeeper's version -1 is "any version".
//! - An ACL is refused (`INVALID_ACL`) when empty, or when an entry is one
//!   Baton does not enforce (`ip`, `sasl`, a malformed digest) or has no or
//!   unknown permission bits: refused rather than stored and never matched
//!   ([`acl_in`]).

use super::*;

impl Gateway {
    pub(super) fn create(&mut self, reqs: &mut Zreqs, x: i32, o: i32, c: jute::Create) -> bool {
        // create, create2, createContainer: the reply's shape is the opcode's.
        match create_op(c) {
            Ok(create) => self.forward(reqs, x, o, What::Plain, vec![(request::Body::Create(create), true)]),
            Err(code) => {
                self.answer(reqs, x, o, code, Response::Empty);
                true
            }
        }
    }

    pub(super) fn delete(&mut self, reqs: &mut Zreqs, x: i32, o: i32, path: String, version: i32) -> bool {
        let d = DeleteOp { path, version: version_of(version) };
        self.forward(reqs, x, o, What::Plain, vec![(request::Body::Delete(d), true)])
    }

    pub(super) fn set_data(&mut self, reqs: &mut Zreqs, x: i32, o: i32, path: String, data: Vec<u8>, v: i32) -> bool {
        let s = SetOp { path, data: data.into(), version: version_of(v) };
        self.forward(reqs, x, o, What::Plain, vec![(request::Body::Set(s), true)])
    }

    pub(super) fn set_acl(
        &mut self,
        reqs: &mut Zreqs,
        x: i32,
        o: i32,
        path: String,
        acl: Vec<jute::Acl>,
        v: i32,
    ) -> bool {
        let Some(acl) = acl_in(&acl) else {
            self.answer(reqs, x, o, err::INVALID_ACL, Response::Empty);
            return true;
        };
        let a = SetAclOp { path, acl, version: version_of(v) };
        self.forward(reqs, x, o, What::Plain, vec![(request::Body::SetAcl(a), true)])
    }
}

/// The reply to a create, delete, setData or setACL that succeeded.
pub(super) fn reply(op: i32, body: &Option<response::Body>) -> Response {
    match (op, body) {
        (op::CREATE, Some(response::Body::Create(c))) => Response::Path(c.path.clone()),
        (op::CREATE2 | op::CREATE_CONTAINER | op::CREATE_TTL, Some(response::Body::Create(c))) => {
            Response::PathStat(c.path.clone(), stat_out(c.stat.as_ref()))
        }
        (op::SET_DATA | op::SET_ACL, Some(response::Body::Set(s))) => Response::Stat(stat_out(s.stat.as_ref())),
        _ => Response::Empty,
    }
}

/// ZooKeeper's version -1 is "any version".
pub(super) fn version_of(v: i32) -> Option<i32> {
    (v != -1).then_some(v)
}

/// A ZooKeeper ACL as Baton's (acl.rs): `world:anyone`,
/// `digest:NAME:HASH`, `user:NAME` and `x509:CN` as `scheme:id`; scheme
/// `auth` (any id) as Baton's `auth` entry. None, which is answered
/// INVALID_ACL, as the module doc says.
pub(super) fn acl_in(acl: &[jute::Acl]) -> Option<Vec<Acl>> {
    if acl.is_empty() {
        return None;
    }
    let out: Vec<Acl> = acl
        .iter()
        .map(|a| Acl {
            perms: u32::try_from(a.perms).unwrap_or(0),
            id: if a.scheme == "auth" { "auth".to_string() } else { format!("{}:{}", a.scheme, a.id) },
        })
        .collect();
    crate::acl::validate(&out).ok()?;
    Some(out)
}

/// True when `req` sets an ACL with an `auth` entry (a create, also inside
/// a multi, or a setACL).
pub(super) fn uses_auth_acl(req: &Request) -> bool {
    let auth = |acl: &[jute::Acl]| acl.iter().any(|a| a.scheme == "auth");
    match req {
        Request::Create { c, .. } => auth(&c.acl),
        Request::SetAcl { acl, .. } => auth(acl),
        Request::Multi(ops) => ops.iter().any(uses_auth_acl),
        _ => false,
    }
}

/// A ZooKeeper create as Baton's; Err: the reply's error code (the module
/// doc has the rules).
pub(super) fn create_op(c: jute::Create) -> Result<CreateOp, i32> {
    use jute::create_mode as m;
    let ttl_mode = matches!(c.flags, m::PERSISTENT_WITH_TTL | m::PERSISTENT_SEQUENTIAL_WITH_TTL);
    let ttl_ms = match (ttl_mode, c.ttl_ms) {
        (true, Some(t)) if t > 0 && t as u64 <= crate::state::MAX_TTL_MS => t as u64,
        (true, _) => return Err(err::BAD_ARGUMENTS),
        (false, Some(t)) if t >= 0 => return Err(err::BAD_ARGUMENTS),
        (false, _) => 0,
    };
    if !(m::PERSISTENT..=m::PERSISTENT_SEQUENTIAL_WITH_TTL).contains(&c.flags) {
        return Err(err::BAD_ARGUMENTS);
    }
    let container = c.flags == m::CONTAINER;
    let acl = acl_in(&c.acl).ok_or(err::INVALID_ACL)?;
    Ok(CreateOp {
        path: c.path,
        data: c.data.into(),
        ephemeral: matches!(c.flags, m::EPHEMERAL | m::EPHEMERAL_SEQUENTIAL),
        sequential: matches!(
            c.flags,
            m::PERSISTENT_SEQUENTIAL | m::EPHEMERAL_SEQUENTIAL | m::PERSISTENT_SEQUENTIAL_WITH_TTL
        ),
        parents: false,
        acl,
        container,
        ttl_ms,
    })
}
