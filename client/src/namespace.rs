//! Chroot: a client configured with a namespace (`/app`) sees the subtree
//! under it as its whole tree (Curator's `namespace`, ZooKeeper's chroot).
//!
//! Rules:
//! - Every path the caller gives is taken as relative to the namespace:
//!   `/a` is `/app/a` on the servers and `/` is `/app` itself.
//! - Every path the client returns (a created node, a multi's results, a
//!   watch event) is stripped back: the caller never sees `/app`.
//! - The rewrite happens once, on the request and the response at the
//!   session actor's door, so every call and recipe gets it alike.
//! - The namespace node is not created for you (create it once, e.g. with
//!   a client without a namespace, or `CreateOptions::with_parents`).
//!   Fence resources (`check_fence`) are names, not paths: not rewritten.

use baton_proto::{op, request, response, Op, Request, Response};

/// A namespace prefix ("" for none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Namespace {
    prefix: String,
}

impl Namespace {
    /// `ns` must be a valid absolute path; `/` or "" means none.
    pub(crate) fn new(ns: &str) -> Result<Namespace, String> {
        if ns.is_empty() || ns == "/" {
            return Ok(Namespace::default());
        }
        baton_proto::validate_path(ns).map_err(|e| format!("namespace {ns:?}: {e}"))?;
        Ok(Namespace { prefix: ns.to_string() })
    }

    /// The server's path for the caller's `path`.
    pub(crate) fn to_server(&self, path: &str) -> String {
        match (self.prefix.is_empty(), path) {
            (true, _) => path.to_string(),
            (false, "/") => self.prefix.clone(),
            (false, p) if p.starts_with('/') => format!("{}{p}", self.prefix),
            // Invalid (relative): left for the server to refuse as is.
            (false, p) => p.to_string(),
        }
    }

    /// The caller's path for the server's `path`.
    pub(crate) fn to_user(&self, path: &str) -> String {
        if self.prefix.is_empty() {
            return path.to_string();
        }
        match path.strip_prefix(&self.prefix) {
            Some("") => "/".to_string(),
            Some(rest) if rest.starts_with('/') => rest.to_string(),
            _ => path.to_string(),
        }
    }

    fn fix(&self, path: &mut String) {
        if !self.prefix.is_empty() {
            *path = self.to_server(path);
        }
    }

    /// Rewrites every path in an outgoing request.
    pub(crate) fn request(&self, req: &mut Request) {
        use request::Body as B;
        if self.prefix.is_empty() {
            return;
        }
        match req.body.as_mut() {
            Some(B::Create(c)) => self.fix(&mut c.path),
            Some(B::Set(s)) => self.fix(&mut s.path),
            Some(B::Delete(d)) => self.fix(&mut d.path),
            Some(B::SetAcl(a)) => self.fix(&mut a.path),
            Some(B::Multi(m)) => m.ops.iter_mut().for_each(|o| self.op(o)),
            Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)) | Some(B::GetAcl(r)) => {
                self.fix(&mut r.path);
                if let Some(w) = r.watch.as_mut() {
                    self.fix(&mut w.path);
                }
            }
            Some(B::AddWatch(a)) => {
                if let Some(w) = a.watch.as_mut() {
                    self.fix(&mut w.path);
                }
            }
            _ => {}
        }
    }

    fn op(&self, o: &mut Op) {
        match o.op.as_mut() {
            Some(op::Op::Create(c)) => self.fix(&mut c.path),
            Some(op::Op::Set(s)) => self.fix(&mut s.path),
            Some(op::Op::Delete(d)) => self.fix(&mut d.path),
            Some(op::Op::Check(c)) => self.fix(&mut c.path),
            Some(op::Op::SetAcl(a)) => self.fix(&mut a.path),
            Some(op::Op::CheckFence(_)) | None => {}
        }
    }

    /// Strips the namespace from every path in a response.
    pub(crate) fn response(&self, resp: &mut Response) {
        if self.prefix.is_empty() {
            return;
        }
        match resp.body.as_mut() {
            Some(response::Body::Create(c)) => c.path = self.to_user(&c.path),
            Some(response::Body::Multi(m)) => {
                for r in m.results.iter_mut().filter(|r| !r.path.is_empty()) {
                    r.path = self.to_user(&r.path);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_go_in_under_the_namespace_and_come_back_without_it() {
        let ns = Namespace::new("/app").expect("valid");
        assert_eq!(ns.to_server("/"), "/app");
        assert_eq!(ns.to_server("/a/b"), "/app/a/b");
        assert_eq!(ns.to_user("/app"), "/");
        assert_eq!(ns.to_user("/app/a/b"), "/a/b");
        // Not under it (cannot happen from the server): left alone.
        assert_eq!(ns.to_user("/apple"), "/apple");
        let none = Namespace::new("/").expect("valid");
        assert_eq!(none.to_server("/a"), "/a");
        assert!(Namespace::new("app").is_err());
        assert!(Namespace::new("/app/").is_err());
    }

    #[test]
    fn every_path_in_a_multi_is_rewritten() {
        let ns = Namespace::new("/app").expect("valid");
        let mut req = Request {
            body: Some(request::Body::Multi(baton_proto::MultiOp {
                ops: vec![
                    Op { op: Some(op::Op::Check(baton_proto::CheckOp { path: "/x".into(), version: None })) },
                    Op { op: Some(op::Op::CheckFence(baton_proto::CheckFenceOp { resource: "/r".into(), token: 1 })) },
                ],
            })),
            ..Default::default()
        };
        ns.request(&mut req);
        let Some(request::Body::Multi(m)) = req.body else { panic!("not a multi") };
        assert!(matches!(&m.ops[0].op, Some(op::Op::Check(c)) if c.path == "/app/x"));
        assert!(matches!(&m.ops[1].op, Some(op::Op::CheckFence(f)) if f.resource == "/r"));
    }
}
