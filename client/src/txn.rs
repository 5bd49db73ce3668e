//! Multi-operation transactions: [`Client::multi`] with a slice of [`Op`]s,
//! or the [`Txn`] builder (`client.txn().check(..).set(..).commit()`).
//!
//! Rules:
//! - All ops succeed or none is applied, at one log index.
//! - On failure the error names the failing op (`multi op #i failed: ...`)
//!   and its kind is that op's reason (e.g. `BadVersion` for a failed
//!   check).

use baton_proto::{op, CheckFenceOp, CheckOp, CreateOp, DeleteOp, SetOp};
use bytes::Bytes;

use crate::{Client, CreateOptions, Result, Stat};

/// One operation of a [`Client::multi`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Create a node.
    Create {
        /// Its path (a prefix, for a sequential node).
        path: String,
        /// Its data.
        data: Bytes,
        /// Ephemeral, sequential, parents.
        options: CreateOptions,
    },
    /// Set a node's data.
    Set {
        /// The node.
        path: String,
        /// The new data.
        data: Bytes,
        /// Only at this version (any when `None`).
        version: Option<i32>,
    },
    /// Delete a node.
    Delete {
        /// The node.
        path: String,
        /// Only at this version (any when `None`).
        version: Option<i32>,
    },
    /// Fails the multi unless the node exists (at `version`, if given).
    Check {
        /// The node.
        path: String,
        /// The version it must be at (any when `None`).
        version: Option<i32>,
    },
    /// Fails the multi with `FENCE_REJECTED` if a higher token was already
    /// used on `resource`; records `token` otherwise.
    CheckFence {
        /// The fenced resource's name (not a node path).
        resource: String,
        /// The holder's fencing token.
        token: u64,
    },
}

impl Op {
    pub(crate) fn to_proto(&self) -> baton_proto::Op {
        let o = match self {
            Op::Create { path, data, options } => op::Op::Create(create_op(path, data.clone(), *options)),
            Op::Set { path, data, version } => {
                op::Op::Set(SetOp { path: path.clone(), data: data.clone(), version: *version })
            }
            Op::Delete { path, version } => op::Op::Delete(DeleteOp { path: path.clone(), version: *version }),
            Op::Check { path, version } => op::Op::Check(CheckOp { path: path.clone(), version: *version }),
            Op::CheckFence { resource, token } => {
                op::Op::CheckFence(CheckFenceOp { resource: resource.clone(), token: *token })
            }
        };
        baton_proto::Op { op: Some(o) }
    }
}

/// The result of one op of a successful multi.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpResult {
    /// The created path, for creates ("" otherwise).
    pub path: String,
    /// The resulting stat, for creates and sets.
    pub stat: Option<Stat>,
}

pub(crate) fn create_op(path: &str, data: Bytes, o: CreateOptions) -> CreateOp {
    CreateOp {
        path: path.to_string(),
        data,
        ephemeral: o.ephemeral,
        sequential: o.sequential,
        parents: o.parents,
        acl: Vec::new(),
        container: o.container,
        // A TTL under 1 ms is 1 ms: zero would mean "no TTL".
        ttl_ms: o.ttl.map_or(0, |t| (t.as_millis() as u64).max(1)),
    }
}

/// A transaction being built (see [`Client::txn`]): ops in order, sent as
/// one multi by [`Txn::commit`].
#[derive(Debug)]
#[must_use = "a transaction does nothing until committed"]
pub struct Txn<'a> {
    client: &'a Client,
    ops: Vec<Op>,
}

impl<'a> Txn<'a> {
    pub(crate) fn new(client: &'a Client) -> Self {
        Txn { client, ops: Vec::new() }
    }
    /// Adds a create.
    pub fn create(mut self, path: &str, data: impl Into<Bytes>, options: CreateOptions) -> Self {
        self.ops.push(Op::Create { path: path.to_string(), data: data.into(), options });
        self
    }
    /// Adds a set (at `version`, if given).
    pub fn set(mut self, path: &str, data: impl Into<Bytes>, version: Option<i32>) -> Self {
        self.ops.push(Op::Set { path: path.to_string(), data: data.into(), version });
        self
    }
    /// Adds a delete (at `version`, if given).
    pub fn delete(mut self, path: &str, version: Option<i32>) -> Self {
        self.ops.push(Op::Delete { path: path.to_string(), version });
        self
    }
    /// Adds a check that the node exists (at `version`, if given).
    pub fn check(mut self, path: &str, version: Option<i32>) -> Self {
        self.ops.push(Op::Check { path: path.to_string(), version });
        self
    }
    /// Adds a fence check: refused if a higher token was used on `resource`.
    pub fn check_fence(mut self, resource: &str, token: u64) -> Self {
        self.ops.push(Op::CheckFence { resource: resource.to_string(), token });
        self
    }
    /// The ops so far.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }
    /// Runs every op atomically: one result per op, in order.
    pub async fn commit(self) -> Result<Vec<OpResult>> {
        self.client.multi(&self.ops).await
    }
}
