//! exists, getData, getChildren (and getChildren2), getACL and sync:
//! each as Baton's read, and its reply back.
//!
//! - A read with a watch records the watch here first
//!   (`Gateway::read_req`); a read that fails forgets it again
//!   (watches.rs, `forget_refused`). An exists on a missing node is not a
//!   failure: it answers NO_NODE, and its watch fires on the create.
//! - A sync is any read through ReadIndex: once it is answered, this
//!   member has applied everything committed before the sync; its reply
//!   names its path.
//! - A read is served from this member's state unless the port was
//!   started with `--zk-linearizable-reads` (conn.rs, `read_req` and
//!   `class_of`).

use super::*;

impl Gateway {
    pub(super) fn exists(&mut self, reqs: &mut Zreqs, x: i32, o: i32, path: String, watch: bool) -> bool {
        let (r, w) = self.read_req(path, watch.then_some(WatchKind::Exists));
        self.forward(reqs, x, o, What::Watched { watch: w }, vec![(request::Body::Exists(r), false)])
    }

    pub(super) fn get_data(&mut self, reqs: &mut Zreqs, x: i32, o: i32, path: String, watch: bool) -> bool {
        let (r, w) = self.read_req(path, watch.then_some(WatchKind::Data));
        self.forward(reqs, x, o, What::Watched { watch: w }, vec![(request::Body::Get(r), false)])
    }

    pub(super) fn get_children(&mut self, reqs: &mut Zreqs, x: i32, o: i32, path: String, watch: bool) -> bool {
        let (r, w) = self.read_req(path, watch.then_some(WatchKind::Children));
        self.forward(reqs, x, o, What::Watched { watch: w }, vec![(request::Body::Children(r), false)])
    }

    pub(super) fn get_acl(&mut self, reqs: &mut Zreqs, x: i32, o: i32, path: String) -> bool {
        let (r, _) = self.read_req(path, None);
        self.forward(reqs, x, o, What::Watched { watch: None }, vec![(request::Body::GetAcl(r), false)])
    }

    pub(super) fn sync(&mut self, reqs: &mut Zreqs, x: i32, o: i32, path: String) -> bool {
        let r = ReadReq { path: path.clone(), stale: false, watch: None };
        self.forward(reqs, x, o, What::Sync { path }, vec![(request::Body::Exists(r), false)])
    }
}

/// The reply to a read that succeeded; Err: the header's code (an exists
/// on a missing node: NO_NODE).
pub(super) fn reply(op: i32, body: &Option<response::Body>, what: &What) -> Result<Response, i32> {
    Ok(match (op, body) {
        (op::EXISTS, Some(response::Body::Exists(e))) => match &e.stat {
            Some(s) => Response::Stat(stat_out(Some(s))),
            None => return Err(err::NO_NODE),
        },
        (op::SYNC, _) => match what {
            What::Sync { path } => Response::Path(path.clone()),
            _ => Response::Empty,
        },
        (op::GET_DATA, Some(response::Body::Get(g))) => {
            Response::GetData { data: g.data.to_vec(), stat: stat_out(g.stat.as_ref()) }
        }
        (op::GET_CHILDREN, Some(response::Body::Children(c))) => Response::Children(c.children.clone()),
        (op::GET_CHILDREN2, Some(response::Body::Children(c))) => {
            Response::Children2 { children: c.children.clone(), stat: stat_out(c.stat.as_ref()) }
        }
        (op::GET_ACL, Some(response::Body::Acl(a))) => {
            Response::GetAcl { acl: acl_out(&a.acl), stat: stat_out(a.stat.as_ref()) }
        }
        _ => Response::Empty,
    })
}

fn acl_out(acl: &[Acl]) -> Vec<jute::Acl> {
    acl.iter()
        .map(|a| {
            let (scheme, id) = a.id.split_once(':').unwrap_or((a.id.as_str(), ""));
            jute::Acl { perms: a.perms as i32, scheme: scheme.to_string(), id: id.to_string() }
        })
        .collect()
}
