//! ping, auth, closeSession, whoAmI, getEphemerals and
//! getAllChildrenNumber: the session's own requests, and the two reads
//! this port answers from this member's state.
//!
//! - A ping is answered here, outside the request order as in ZooKeeper,
//!   and written only while the session rule allows (vouch.rs): held, it
//!   asks for a keepalive.
//! - auth is served here, before any later request is sent, so every
//!   later one carries the new identities. The reply echoes the request's
//!   xid, as ZooKeeper's does (the Java client sends -4, handled outside
//!   the order; `zookeeper-client` an ordinary xid it matches). A failure
//!   ends the connection, as in ZooKeeper. Scheme `digest` with
//!   `NAME:PASSWORD` always gives `digest:NAME:HASH` (ZooKeeper's
//!   DigestAuthenticationProvider: no user store), and `user:NAME` too
//!   when NAME is a Baton password user and the password is theirs.
//! - whoAmI names a digest identity by its user alone, as ZooKeeper's
//!   DigestAuthenticationProvider.getUserName does.
//! - getEphemerals and getAllChildrenNumber are answered from this
//!   member's state, as ZooKeeper does; getAllChildrenNumber needs READ on
//!   the node.

use super::*;

impl Gateway {
    pub(super) fn ping(&mut self) -> bool {
        let h = ReplyHeader { xid: xid::PING, zxid: self.applied(), err: err::OK };
        if let Some(s) = &self.stats {
            s.sent();
        }
        self.push(Out::Frame(Response::encode(h, &Response::Empty)));
        true
    }

    pub(super) fn auth(&mut self, reqs: &mut Zreqs, x: i32, o: i32, scheme: String, auth: Vec<u8>) -> bool {
        if authenticate(&self.state, &self.tx, &scheme, &auth) {
            self.answer(reqs, x, o, err::OK, Response::Empty);
        } else {
            self.answer(reqs, x, o, err::AUTH_FAILED, Response::Empty);
            self.closing = true;
        }
        true
    }

    pub(super) fn close_session(&mut self, reqs: &mut Zreqs, x: i32, o: i32) -> bool {
        self.closing = true;
        self.forward(reqs, x, o, What::Close, vec![(request::Body::CloseSession(CloseSessionReq {}), true)])
    }

    pub(super) fn who_am_i(&mut self, reqs: &mut Zreqs, x: i32, o: i32) -> bool {
        self.forward(reqs, x, o, What::Plain, vec![(request::Body::Whoami(WhoAmIReq {}), false)])
    }

    pub(super) fn get_ephemerals(&mut self, reqs: &mut Zreqs, x: i32, o: i32, prefix: String) -> bool {
        let mut list = read(&self.state).session_ephemerals(self.session);
        list.retain(|p| p.starts_with(&prefix));
        self.answer(reqs, x, o, err::OK, Response::Children(list));
        true
    }

    pub(super) fn get_all_children_number(&mut self, reqs: &mut Zreqs, x: i32, o: i32, path: String) -> bool {
        let settings = {
            let sm = read(&self.state);
            sm.cluster().settings.clone().unwrap_or_else(|| self.flags.clone())
        };
        let caller = crate::acl::Caller::new(self.tx.identities(), &settings.superusers);
        let n = {
            let sm = read(&self.state);
            match sm.exists(&path).ok().flatten() {
                None => Err(err::NO_NODE),
                Some(_) => match sm.check_read(&path, &caller, "getAllChildrenNumber") {
                    Ok(()) => Ok(sm.descendants(&path).len()),
                    Err(_) => Err(err::NO_AUTH),
                },
            }
        };
        match n {
            Ok(n) => self.answer(reqs, x, o, err::OK, Response::Number(n.min(i32::MAX as usize) as i32)),
            Err(code) => self.answer(reqs, x, o, code, Response::Empty),
        }
        true
    }
}

/// whoAmI's reply from the names Baton answered.
pub(super) fn who_am_i_reply(body: &Option<response::Body>) -> Response {
    let Some(response::Body::Names(n)) = body else { return Response::Empty };
    Response::WhoAmI(
        n.names
            .iter()
            .map(|id| {
                let (s, i) = id.split_once(':').unwrap_or((id.as_str(), ""));
                let i = if s == "digest" { i.split(':').next().unwrap_or(i) } else { i };
                (s.to_string(), i.to_string())
            })
            .collect(),
    )
}

/// ZooKeeper's `auth` packet (the module doc); the password check runs
/// with the runtime told this thread blocks. False (AUTH_FAILED): another
/// scheme, or bytes that are not UTF-8 `NAME:PASSWORD` with a non-empty
/// name.
fn authenticate(state: &SharedState, tx: &ConnTx, scheme: &str, auth: &[u8]) -> bool {
    if scheme != "digest" {
        debug!(scheme, "zookeeper: auth with a scheme this port does not serve");
        return false;
    }
    let Some((name, password)) = std::str::from_utf8(auth).ok().and_then(|a| a.split_once(':')) else {
        return false;
    };
    if name.is_empty() {
        return false;
    }
    tx.add_identity(crate::acl::digest(name, password));
    let check = || crate::listener::password_user(state, name, password);
    let user = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(check),
        _ => check(),
    };
    if user {
        tx.add_identity(format!("user:{name}"));
    }
    true
}
