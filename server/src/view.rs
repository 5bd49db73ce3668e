//! The read view: the state machine as the driver shares it with the
//! listeners, and the reads they answer from it without the driver.
//!
//! The driver is the only writer ([`SharedState`]'s write lock is taken
//! only while it applies entries); the client listener, the ZooKeeper
//! port, the peer transport (the cluster record) and the HTTP port read
//! it. They depend on this view and on the message types, never on the
//! driver. What is answered here: a `stale` read without a watch
//! ([`fast_read`]: the state as this member has applied it, however far
//! behind); every other read goes to the driver (a watch must be
//! registered in log order; a linearizable read waits for a ReadIndex
//! round: reads.rs). A response over `--max-reply-bytes` is replaced by
//! TOO_LARGE ([`capped`]) wherever it is made.

use std::sync::{Arc, RwLock, RwLockReadGuard};

use baton_proto::{request, response, ChildrenResp, ErrorCode, ExistsResp, GetResp, Request, Response};
use prost::Message as _;

use crate::acl::Caller;
use crate::state::{error_response, StateMachine};

/// The state machine as the driver and the listeners share it.
pub type SharedState = Arc<RwLock<StateMachine>>;

/// Reads the shared state (a poisoned lock is still read: only the
/// driver writes it, and a panic there stops the member).
pub fn read(st: &SharedState) -> RwLockReadGuard<'_, StateMachine> {
    st.read().unwrap_or_else(|p| p.into_inner())
}

/// `resp`, or TOO_LARGE in its place when it is over `max` bytes.
pub fn capped(resp: Response, max: usize) -> Response {
    let len = resp.encoded_len();
    if len <= max {
        return resp;
    }
    let msg = format!("the response is {len} bytes, over {max} (--max-reply-bytes)");
    Response { id: resp.id, ..error_response(resp.zxid, ErrorCode::TooLarge, msg) }
}

/// A get or exists answered from local state (no watch, no session needed).
pub fn local_read(
    sm: &StateMachine,
    body: &Option<request::Body>,
    caller: &Caller,
) -> Result<response::Body, (ErrorCode, String)> {
    use request::Body as B;
    match body {
        Some(B::Get(r)) => sm
            .check_read(&r.path, caller, "get")
            .and_then(|_| sm.get(&r.path))
            .map(|(data, stat)| response::Body::Get(GetResp { data, stat: Some(stat) })),
        Some(B::Exists(r)) => sm.exists(&r.path).map(|stat| response::Body::Exists(ExistsResp { stat })),
        Some(B::Children(r)) => sm
            .check_read(&r.path, caller, "children")
            .and_then(|_| sm.children(&r.path))
            .map(|(children, stat)| response::Body::Children(ChildrenResp { children, stat: Some(stat) })),
        Some(B::GetAcl(r)) => sm.get_acl(&r.path, caller).map(response::Body::Acl),
        _ => Err((ErrorCode::BadRequest, "not a read".into())),
    }
}

/// The listener's fast path: a local read without a watch, answered from
/// the shared state without waiting for the driver's turn. Linearizable reads and anything with a watch go to the driver.
pub fn fast_read(state: &SharedState, req: &Request, caller: &Caller) -> Option<Response> {
    use request::Body as B;
    let r = match &req.body {
        Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)) | Some(B::GetAcl(r)) => r,
        _ => return None,
    };
    if !r.stale || r.watch.is_some() {
        return None;
    }
    let sm = read(state);
    let zxid = sm.applied();
    Some(match local_read(&sm, &req.body, caller) {
        Ok(body) => Response { id: req.id, zxid, body: Some(body), ..Default::default() },
        Err((code, msg)) => {
            let mut resp = error_response(zxid, code, msg);
            resp.id = req.id;
            resp
        }
    })
}
