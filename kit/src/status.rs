//! A member's status without a session, and waiting for a leader.
//!
//! The request is one `Status` frame on a fresh connection to the client
//! port (as the client library's `member_status` sends it); TLS when a
//! rustls client configuration is given.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use baton_proto::tls::rustls::ClientConfig;
use baton_proto::{request, response, server_frame, ClientFrame, Request, ServerFrame, StatusResp};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use prost::Message as _;

/// Largest frame accepted from a member (a status reply is small).
const MAX_FRAME: usize = 1 << 20;
/// How long one status request gets in [`wait_leader`].
pub const STATUS_TIMEOUT: Duration = Duration::from_millis(500);
/// Pause between two rounds of [`wait_leader`].
const POLL: Duration = Duration::from_millis(50);

/// Member `endpoint`'s status, within `timeout`.
pub async fn status(endpoint: &str, timeout: Duration, tls: Option<&Arc<ClientConfig>>) -> anyhow::Result<StatusResp> {
    let go = async {
        let tcp = tokio::net::TcpStream::connect(endpoint).await?;
        let _ = tcp.set_nodelay(true);
        let stream: baton_proto::tls::BoxStream = match tls {
            None => Box::new(tcp),
            Some(cfg) => {
                baton_proto::tls::connect(cfg.clone(), baton_proto::tls::server_name_of(endpoint)?, tcp).await?
            }
        };
        let mut f = tokio_util::codec::Framed::new(stream, baton_proto::codec(MAX_FRAME));
        let req = Request { id: 1, body: Some(request::Body::Status(Default::default())), ..Default::default() };
        let frame: Bytes = ClientFrame { request: Some(req) }.encode_to_vec().into();
        f.send(frame).await?;
        while let Some(frame) = f.next().await {
            if let Ok(ServerFrame { frame: Some(server_frame::Frame::Response(r)) }) = ServerFrame::decode(frame?) {
                return match r.body {
                    Some(response::Body::Status(s)) => Ok(s),
                    _ => Err(anyhow::anyhow!("no status: error {} {}", r.error, r.message)),
                };
            }
        }
        anyhow::bail!("connection closed")
    };
    tokio::time::timeout(timeout, go).await.with_context(|| format!("{endpoint}: no answer in {timeout:?}"))?
}

/// Waits up to `timeout` until the members at `endpoints` (the running
/// ones) agree on one leader: exactly one says it leads, and more than half
/// of `voters` name it. Returns its id.
pub async fn wait_leader(
    endpoints: &[String],
    voters: usize,
    timeout: Duration,
    tls: Option<&Arc<ClientConfig>>,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut seen = Vec::new();
        for ep in endpoints {
            if let Ok(s) = status(ep, STATUS_TIMEOUT, tls).await {
                seen.push(s);
            }
        }
        let leaders: Vec<u64> = seen.iter().filter(|s| s.role == "leader").map(|s| s.id).collect();
        if let [l] = leaders[..] {
            if seen.iter().filter(|s| s.leader_id == l).count() * 2 > voters {
                return Ok(l);
            }
        }
        if Instant::now() >= deadline {
            anyhow::bail!("no leader within {timeout:?} (leaders seen: {leaders:?})");
        }
        tokio::time::sleep(POLL).await;
    }
}
