//! The HTTP listener (`--http-addr`): `GET /metrics` (Prometheus text, the
//! names in metrics.rs), `GET /health` and `GET /ready` (JSON).
//!
//! - `/health` answers 200 when this member passes the health rule
//!   (`baton_proto::health`: it is the leader or heard from one within an
//!   election timeout, and has applied within 1,000 entries of its commit
//!   index), 503 otherwise; the body says why.
//! - `/ready` answers 200 when this member is healthy and is a voter or
//!   learner of the configuration (a removed member, or a new one that has
//!   not received the leader's snapshot, is not ready), 503 otherwise.
//! - A member that applied its own removal closes its client and peer
//!   ports at once; for 3 s more both endpoints answer 503 with `"removed":
//!   true` and a reason starting "removed", then it exits 2.
//!
//! Both read the status the driver publishes every tick ([`Board`]), never
//! the driver itself: a busy driver cannot make these endpoints hang, and a
//! stuck one shows as a stale `age_ms` and, past three election timeouts,
//! as unhealthy.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use baton_proto::StatusResp;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;

use crate::metrics::{COUNT_BUCKETS, SECONDS_BUCKETS};

/// The status the driver last published, and when; and whether this
/// member was removed from the cluster.
#[derive(Clone, Default)]
pub struct Board(Arc<RwLock<Option<(StatusResp, Instant)>>>, Arc<std::sync::atomic::AtomicBool>);

impl Board {
    pub fn publish(&self, s: StatusResp, now: Instant) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some((s, now));
    }

    /// This member applied its own removal: it serves no one and is about
    /// to exit (member.rs, `REMOVED_LINGER`).
    pub fn set_removed(&self) {
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn get(&self) -> Option<(StatusResp, Instant)> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Installs the process-wide Prometheus recorder.
pub fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    let b = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(Matcher::Prefix("baton_ready_".into()), COUNT_BUCKETS)?;
    let handle = b.install_recorder()?;
    crate::metrics::register_hot();
    Ok(handle)
}

/// A verdict and its JSON body.
fn verdict(board: &Board, stale_after: Duration, need_member: bool) -> (StatusCode, serde_json::Value) {
    if board.1.load(std::sync::atomic::Ordering::SeqCst) {
        let why = "removed: this member was removed from the cluster; it serves no one and exits (exit code 2)";
        return (StatusCode::SERVICE_UNAVAILABLE, json!({"healthy": false, "removed": true, "reason": why}));
    }
    let Some((s, at)) = board.get() else {
        return (StatusCode::SERVICE_UNAVAILABLE, json!({"healthy": false, "reason": "starting"}));
    };
    let age = at.elapsed();
    let mut why = baton_proto::health(&s).err();
    if why.is_none() && age > stale_after {
        why = Some(format!("the member's status is {} ms old: its Raft loop is stuck", age.as_millis()));
    }
    let member = s.voters.contains(&s.id) || s.learners.contains(&s.id);
    if why.is_none() && need_member && !member {
        why = Some(format!("member {} is not in the configuration (removed, or not yet joined)", s.id));
    }
    let body = json!({
        "healthy": why.is_none(),
        "reason": why,
        "id": s.id,
        "role": s.role,
        "term": s.term,
        "leader_id": s.leader_id,
        "leader_contact": s.leader_contact,
        "commit_index": s.commit_index,
        "applied_index": s.applied_index,
        "member": member,
        "age_ms": age.as_millis() as u64,
    });
    let code = if why.is_none() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, body)
}

fn json_response(code: StatusCode, v: serde_json::Value) -> axum::response::Response {
    (code, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// Serves until the runtime stops. `stale_after`: a published status older
/// than this makes the member unhealthy.
pub async fn serve(
    listener: tokio::net::TcpListener,
    prom: PrometheusHandle,
    board: Board,
    stale_after: Duration,
    mut signal: crate::shutdown::Signal,
) {
    let (b1, b2) = (board.clone(), board);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let text = prom.render();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
            }),
        )
        .route(
            "/health",
            get(move || {
                let (c, v) = verdict(&b1, stale_after, false);
                async move { json_response(c, v) }
            }),
        )
        .route(
            "/ready",
            get(move || {
                let (c, v) = verdict(&b2, stale_after, true);
                async move { json_response(c, v) }
            }),
        );
    let stop = async move { signal.wait().await };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
        tracing::error!("http listener stopped: {e}");
    }
}
