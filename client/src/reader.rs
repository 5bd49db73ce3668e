//! Reads without a session: for tools and scripts that only look (`baton
//! get`, `ls`, `stat`). A [`Client`](crate::Client) opens a session, and a
//! session costs two Raft writes (create, close) and needs a quorum; a
//! [`Reader`] costs neither.
//!
//! Rules:
//! - A read is linearizable unless asked `stale`, exactly as on a session:
//!   the member runs a ReadIndex round (the leader confirms it still leads
//!   with a majority) and answers once it has applied that index. A
//!   `stale` read is served from the member's state at once, so it works
//!   on a member cut off from the quorum (it may lag).
//! - Endpoints are tried in the order given. A member that cannot be
//!   reached, or cannot serve the read in time (no leader: TIMEOUT), is
//!   skipped for the next one; a read changes nothing, so asking again is
//!   safe. When none answers, the error lists each endpoint and why.
//! - An answer from the tree (NO_NODE, NO_AUTH, ...) is final.
//! - Connections are kept and reused, one per read in flight (at most
//!   [`POOL`] idle), each with the configured TLS and password user.
//! - No watches (a watch belongs to a session) and no ephemeral state.
//! - The configured namespace applies, as on a session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use baton_proto::tls::BoxStream;
use baton_proto::{request, response, server_frame, ClientFrame, ErrorCode, ReadReq, Request, Response, ServerFrame};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::namespace::Namespace;
use crate::types::stat;
use crate::{ClientConfig, Error, ErrorKind, Result, Stat};

/// Idle connections kept for reuse.
pub const POOL: usize = 16;

type Conn = Framed<BoxStream, LengthDelimitedCodec>;

/// Sessionless reads against a cluster (module doc: the rules).
pub struct Reader {
    cfg: ClientConfig,
    ns: Namespace,
    idle: Mutex<Vec<(usize, Conn)>>,
    /// Request ids (0 is reserved by the protocol).
    next_id: AtomicU64,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("endpoints", &self.cfg.endpoints).finish()
    }
}

/// Why one endpoint did not answer: try the next.
struct Skip(String);

/// An outcome of asking one endpoint: the answer, or a final error
/// (`Err(Ok)`), or a reason to ask the next one (`Err(Err)`).
type Asked<T> = std::result::Result<T, std::result::Result<Error, Skip>>;

fn skip<T>(why: &dyn std::fmt::Display) -> Asked<T> {
    Err(Err(Skip(why.to_string())))
}

impl Reader {
    /// A reader for `cfg`'s endpoints (TLS, user and namespace as
    /// configured; `op_timeout` bounds each read, `connect_timeout` each
    /// dial). Fails only on a malformed endpoint or namespace.
    pub fn new(cfg: ClientConfig) -> Result<Reader> {
        if cfg.endpoints.is_empty() {
            return Err(Error::Invalid("no endpoints given".into()));
        }
        for e in &cfg.endpoints {
            crate::check_endpoint(e)?;
        }
        let ns = Namespace::new(&cfg.namespace).map_err(Error::Invalid)?;
        Ok(Reader { cfg, ns, idle: Mutex::new(Vec::new()), next_id: AtomicU64::new(1) })
    }

    /// A node's data and stat.
    pub async fn get(&self, path: &str, stale: bool) -> Result<(Bytes, Stat)> {
        match self.read(request::Body::Get(read_req(path, stale))).await?.body {
            Some(response::Body::Get(g)) => Ok((g.data, stat(g.stat))),
            _ => Err(Error::unexpected()),
        }
    }

    /// Child names, sorted, and the node's stat.
    pub async fn children(&self, path: &str, stale: bool) -> Result<(Vec<String>, Stat)> {
        match self.read(request::Body::Children(read_req(path, stale))).await?.body {
            Some(response::Body::Children(c)) => Ok((c.children, stat(c.stat))),
            _ => Err(Error::unexpected()),
        }
    }

    /// The node's stat, or `None` if it does not exist.
    pub async fn exists(&self, path: &str, stale: bool) -> Result<Option<Stat>> {
        match self.read(request::Body::Exists(read_req(path, stale))).await?.body {
            Some(response::Body::Exists(e)) => Ok(e.stat.map(|s| stat(Some(s)))),
            _ => Err(Error::unexpected()),
        }
    }

    /// One read: each endpoint in turn until one answers.
    async fn read(&self, body: request::Body) -> Result<Response> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut req = Request { id, body: Some(body), ..Default::default() };
        self.ns.request(&mut req);
        let mut tried = Vec::new();
        let deadline = tokio::time::Instant::now() + self.cfg.op_timeout;
        for (i, endpoint) in self.cfg.endpoints.iter().enumerate() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                tried.push(format!("{endpoint}: not tried (op timeout {:?} spent)", self.cfg.op_timeout));
                continue;
            }
            match tokio::time::timeout(left, self.ask(i, &req)).await {
                Ok(Ok(mut resp)) => {
                    self.ns.response(&mut resp);
                    return Ok(resp);
                }
                Ok(Err(Ok(final_error))) => return Err(final_error),
                Ok(Err(Err(Skip(why)))) => tried.push(format!("{endpoint}: {why}")),
                Err(_) => tried.push(format!("{endpoint}: no answer within {left:?}")),
            }
        }
        if tried.iter().all(|t| t.contains(baton_proto::NOT_A_CLIENT_PORT)) {
            return Err(Error::Invalid(format!("no endpoint is a Baton client port ({})", tried.join("; "))));
        }
        Err(Error::Unavailable(format!("no member served the read: {}", tried.join("; "))))
    }

    /// Asks endpoint `i`: the answer, a final error, or why to skip it.
    async fn ask(&self, i: usize, req: &Request) -> Asked<Response> {
        let pooled = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.iter().position(|(e, _)| *e == i).map(|k| idle.swap_remove(k).1)
        };
        let mut conn = match pooled {
            Some(c) => c,
            None => self.dial(i).await?,
        };
        let frame: Bytes = ClientFrame { request: Some(req.clone()) }.encode_to_vec().into();
        if let Err(e) = conn.send(frame).await {
            return skip(&e);
        }
        let resp = loop {
            match conn.next().await {
                None => return skip(&"connection closed"),
                Some(Err(e)) => match crate::session::wrong_port(conn.read_buffer(), None) {
                    Some(what) => return skip(&what),
                    None => return skip(&e),
                },
                Some(Ok(frame)) => {
                    if let Ok(ServerFrame { frame: Some(server_frame::Frame::Response(r)) }) =
                        ServerFrame::decode(frame)
                    {
                        // Only a refusal can be another port's answer.
                        if r.error == ErrorCode::BadRequest as i32 {
                            if let Some(what) = crate::session::wrong_port(&[], Some(&r.message)) {
                                return skip(&what);
                            }
                        }
                        // 0: the server could not read the request's id.
                        if r.id == req.id || r.id == 0 {
                            break r;
                        }
                    }
                }
            }
        };
        {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < POOL {
                idle.push((i, conn));
            }
        }
        if resp.error == 0 {
            return Ok(resp);
        }
        let code = ErrorCode::try_from(resp.error).unwrap_or(ErrorCode::Internal);
        match code {
            // This member cannot serve it now (no leader, busy): the next may.
            ErrorCode::Timeout
            | ErrorCode::LeaderChanged
            | ErrorCode::Busy
            | ErrorCode::NoLeader
            | ErrorCode::NotLeader
            | ErrorCode::ShuttingDown => skip(&format!("{:?}: {}", code, resp.message)),
            ErrorCode::NoAuth => Err(Ok(Error::NoAuth(resp.message))),
            _ => Err(Ok(Error::server(ErrorKind::from_code(code).unwrap_or(ErrorKind::Internal), resp.message))),
        }
    }

    /// A new connection to endpoint `i`, with the password user's `auth`.
    async fn dial(&self, i: usize) -> Asked<Conn> {
        let endpoint = &self.cfg.endpoints[i];
        let s = match crate::session::dial(endpoint, self.cfg.connect_timeout, self.cfg.tls.as_ref()).await {
            Ok(s) => s,
            Err(e) => return skip(&e),
        };
        let mut conn = Framed::new(s, baton_proto::codec(crate::session::MAX_FRAME));
        if let Some((user, password)) = &self.cfg.auth {
            let a = request::Body::Auth(baton_proto::AuthReq { user: user.clone(), password: password.clone() });
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let req = Request { id, body: Some(a), ..Default::default() };
            let frame: Bytes = ClientFrame { request: Some(req) }.encode_to_vec().into();
            if let Err(e) = conn.send(frame).await {
                return skip(&e);
            }
            let answer = tokio::time::timeout(AUTH_TIMEOUT, conn.next()).await;
            let Ok(Some(Ok(frame))) = answer else {
                return skip(&"no answer to auth");
            };
            match ServerFrame::decode(frame) {
                Ok(ServerFrame { frame: Some(server_frame::Frame::Response(r)) }) if r.error == 0 => {}
                // A wrong password is wrong everywhere: final.
                Ok(ServerFrame { frame: Some(server_frame::Frame::Response(r)) }) => {
                    return Err(Ok(Error::NoAuth(format!("{endpoint}: {}", r.message))))
                }
                _ => return skip(&"unexpected answer to auth"),
            }
        }
        Ok(conn)
    }
}

/// How long a member has to answer `auth`.
const AUTH_TIMEOUT: Duration = Duration::from_secs(3);

fn read_req(path: &str, stale: bool) -> ReadReq {
    ReadReq { path: path.to_string(), stale, watch: None }
}
