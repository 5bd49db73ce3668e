//! multi (and a check outside one) and multiRead: each as Baton's, and
//! the per-operation results back.
//!
//! - A multi is one Baton multi, all or nothing. A failed one is answered
//!   as ZooKeeper's: OK for the operations before the failed one, its
//!   error, RUNTIME_INCONSISTENCY after.
//! - A check is only served inside a multi, as in ZooKeeper's client API
//!   (alone: UNIMPLEMENTED).
//! - A multiRead is one Baton read per operation (getData or getChildren;
//!   anything else is BAD_ARGUMENTS), answered together; one over
//!   `--max-multi-ops` is BAD_ARGUMENTS and reads nothing, as a multi
//!   write over the cap; each failed read is its own error result.

use super::nodes::{create_op, version_of};
use super::*;

impl Gateway {
    pub(super) fn check_alone(&mut self, reqs: &mut Zreqs, x: i32, o: i32) -> bool {
        self.answer(reqs, x, o, err::UNIMPLEMENTED, Response::Empty);
        true
    }

    pub(super) fn multi(&mut self, reqs: &mut Zreqs, x: i32, o: i32, ops: Vec<Request>) -> bool {
        let kinds: Vec<i32> = ops.iter().map(Request::op).collect();
        let mut out = Vec::with_capacity(kinds.len());
        for r in ops {
            match multi_op(r) {
                Ok(op) => out.push(op),
                Err(code) => {
                    self.answer(reqs, x, o, code, Response::Empty);
                    return true;
                }
            }
        }
        let body = request::Body::Multi(MultiOp { ops: out });
        self.forward(reqs, x, o, What::Multi { ops: kinds }, vec![(body, true)])
    }

    pub(super) fn multi_read(&mut self, reqs: &mut Zreqs, x: i32, o: i32, ops: Vec<Request>) -> bool {
        if ops.len() > self.max_multi_ops {
            self.answer(reqs, x, o, err::BAD_ARGUMENTS, Response::Empty);
            return true;
        }
        let kinds: Vec<i32> = ops.iter().map(Request::op).collect();
        let mut bodies = Vec::with_capacity(ops.len());
        for r in ops {
            let (path, children) = match r {
                Request::GetData { path, .. } => (path, false),
                Request::GetChildren { path, .. } => (path, true),
                _ => {
                    self.answer(reqs, x, o, err::BAD_ARGUMENTS, Response::Empty);
                    return true;
                }
            };
            let (rr, _) = self.read_req(path, None);
            bodies.push((if children { request::Body::Children(rr) } else { request::Body::Get(rr) }, false));
        }
        if bodies.is_empty() {
            self.answer(reqs, x, o, err::OK, Response::Multi(vec![]));
            return true;
        }
        self.forward(reqs, x, o, What::MultiRead { ops: kinds }, bodies)
    }
}

/// One op of a ZooKeeper `multi` as Baton's; Err: the reply's error code.
fn multi_op(r: Request) -> Result<baton_proto::Op, i32> {
    let op = match r {
        Request::Create { c, .. } => bop::Op::Create(create_op(c)?),
        Request::Delete { path, version } => bop::Op::Delete(DeleteOp { path, version: version_of(version) }),
        Request::SetData { path, data, version } => {
            bop::Op::Set(SetOp { path, data: data.into(), version: version_of(version) })
        }
        Request::Check { path, version } => bop::Op::Check(CheckOp { path, version: version_of(version) }),
        _ => return Err(err::BAD_ARGUMENTS),
    };
    Ok(baton_proto::Op { op: Some(op) })
}

/// A multiRead's results, one per operation, from its Baton responses.
pub(super) fn read_results(ops: &[i32], got: &[baton_proto::Response]) -> Response {
    let results = ops
        .iter()
        .zip(got)
        .map(|(o, r)| match (&r.body, zk_err(r.error)) {
            (Some(response::Body::Get(g)), err::OK) if *o == op::GET_DATA => {
                OpResult::GetData { data: g.data.to_vec(), stat: stat_out(g.stat.as_ref()) }
            }
            (Some(response::Body::Children(c)), err::OK) if *o == op::GET_CHILDREN => {
                OpResult::GetChildren { children: c.children.clone() }
            }
            (_, e) => OpResult::Error { err: if e == err::OK { err::SYSTEM_ERROR } else { e } },
        })
        .collect();
    Response::Multi(results)
}

/// A multi's results from its Baton response (`code`: its error as
/// ZooKeeper's); Err: the header's code, for a reply that is not a multi.
pub(super) fn results(ops: &[i32], first: &baton_proto::Response, code: i32) -> Result<Response, i32> {
    let results: Vec<OpResult> = match &first.body {
        Some(response::Body::Multi(m)) if code == err::OK => ops
            .iter()
            .zip(&m.results)
            .map(|(o, r)| {
                let (path, stat) = (r.path.clone(), stat_out(r.stat.as_ref()));
                match *o {
                    op::CREATE => OpResult::Create { path },
                    op::CREATE2 | op::CREATE_CONTAINER | op::CREATE_TTL => OpResult::Create2 { path, stat },
                    op::SET_DATA => OpResult::SetData { stat },
                    op::DELETE => OpResult::Delete,
                    _ => OpResult::Check,
                }
            })
            .collect(),
        Some(response::Body::Multi(m)) => {
            let failed = m.results.len().saturating_sub(1);
            (0..ops.len())
                .map(|i| OpResult::Error {
                    err: match i.cmp(&failed) {
                        std::cmp::Ordering::Less => err::OK,
                        std::cmp::Ordering::Equal => code,
                        std::cmp::Ordering::Greater => err::RUNTIME_INCONSISTENCY,
                    },
                })
                .collect()
        }
        _ => return Err(code),
    };
    Ok(Response::Multi(results))
}
