//! What an operator watches: `/metrics` scraped and parsed, `/health` and
//! `/ready` turning unhealthy when quorum is lost, JSON logs with slow
//! requests (docs/operations.md, "Watch it").

use std::collections::BTreeMap;
use std::time::Duration;

use baton_client::CreateOptions;
use baton_tests::{eventually, Cluster};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// One sample of the Prometheus text format: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the Prometheus text exposition format (0.0.4); panics on a line
/// that is not a comment, blank, or `name{labels} value`.
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"));
                let labels = body
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once('=').unwrap_or_else(|| panic!("bad label in {line}"));
                        (k.to_string(), v.trim_matches('"').to_string())
                    })
                    .collect();
                (n.to_string(), labels)
            }
        };
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'), "bad metric name in {line}");
        out.push((name, labels, value));
    }
    out
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o10_metrics_health_and_logs() {
    let mut c = Cluster::start(3, &["--log-format=json", "--slow-request-ms=1"]).await;
    let cl = c.client().await;
    cl.create("/o", Vec::new(), CreateOptions::persistent()).await.expect("create");
    for i in 0..20 {
        cl.create(&format!("/o/n{i}"), vec![b'x'; 100], CreateOptions::persistent()).await.expect("create");
    }
    let _ = cl.get("/o/n1").await.expect("get");
    // Two lock grants: one free, one handed off.
    let other = c.client().await;
    let g = cl.lock("m").await.expect("lock");
    let waiter = tokio::spawn(async move {
        let g = other.lock("m").await.expect("second lock");
        g.release().await.expect("release");
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.release().await.expect("release");
    waiter.await.expect("waiter");
    let _ = cl.get("/o/missing").await;

    // Gauges are set every tick: wait for the writes to show.
    eventually(SECS(5), "commit index in the gauges", || async {
        let mut all = true;
        for id in 1..=3 {
            let (_, text) = c.http_get(id, "/metrics").await?;
            all &= value(&parse(&text), "baton_raft_commit_index", &[]).unwrap_or(0.0) >= 20.0;
        }
        all.then_some(())
    })
    .await;
    // Every member's /metrics parses and has the names docs/operations.md lists.
    let mut leaders = 0.0;
    for id in 1..=3 {
        let (code, text) = c.http_get(id, "/metrics").await.expect("metrics answer");
        assert_eq!(code, 200);
        let s = parse(&text);
        for name in [
            "baton_raft_term",
            "baton_raft_commit_index",
            "baton_raft_applied_index",
            "baton_raft_persisted_index",
            "baton_raft_apply_lag",
            "baton_proposals_pending",
            "baton_sessions",
            "baton_nodes",
            "baton_ephemeral_nodes",
            "baton_watches",
            "baton_client_connections",
            "baton_db_bytes",
            "baton_fsync_seconds_count",
            "baton_ready_entries_count",
            "baton_peer_bytes_sent_total",
            "baton_raft_leader_changes_total",
        ] {
            assert!(s.iter().any(|x| x.0 == name), "member {id} lacks {name}");
        }
        // Every member sent raft messages, one frame each, and fewer
        // socket writes than frames can only mean batching, never loss.
        let appends = value(&s, "baton_peer_messages_sent_total", &[("type", "append")]).unwrap_or(0.0);
        let acks = value(&s, "baton_peer_messages_sent_total", &[("type", "append_response")]).unwrap_or(0.0);
        assert!(appends + acks > 0.0, "member {id} counted no append or append response");
        let frames: f64 = s.iter().filter(|x| x.0 == "baton_peer_messages_sent_total").map(|x| x.2).sum();
        let flushes = value(&s, "baton_peer_flushes_total", &[]).unwrap_or(0.0);
        assert!(flushes > 0.0 && flushes <= frames, "member {id}: {flushes} flushes for {frames} frames");
        leaders += value(&s, "baton_raft_is_leader", &[]).unwrap_or(0.0);
        assert!(value(&s, "baton_raft_commit_index", &[]).unwrap_or(0.0) >= 20.0);
        assert!(value(&s, "baton_db_bytes", &[]).unwrap_or(0.0) > 0.0);
    }
    assert_eq!(leaders, 1.0, "exactly one member says it leads");
    // The member the client talks to counted its requests, errors and times.
    eventually(SECS(5), "request metrics", || async {
        let mut total = [0.0; 4];
        for id in 1..=3 {
            let (_, text) = c.http_get(id, "/metrics").await?;
            let s = parse(&text);
            let count = value(&s, "baton_request_seconds_count", &[("type", "create")]).unwrap_or(0.0);
            assert!(count >= value(&s, "baton_requests_total", &[("type", "create")]).unwrap_or(0.0));
            let series: [(&str, &[(&str, &str)]); 4] = [
                ("baton_requests_total", &[("type", "create")]),
                ("baton_request_errors_total", &[("type", "get"), ("code", "NO_NODE")]),
                ("baton_lock_grants_total", &[("kind", "free")]),
                ("baton_lock_grants_total", &[("kind", "handoff")]),
            ];
            for (t, (name, labels)) in total.iter_mut().zip(series) {
                *t += value(&s, name, labels).unwrap_or(0.0);
            }
        }
        let [creates, no_node, free, handoff] = total;
        // Every member applies every entry: 3 x (1 free, 1 hand-off).
        (creates >= 21.0 && no_node >= 1.0 && free >= 3.0 && handoff >= 3.0).then_some(())
    })
    .await;
    // Slow requests (over 1 ms here) are logged, as JSON like every line.
    let log = c.log(1) + &c.log(2) + &c.log(3);
    let mut slow = 0;
    for line in log.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["message"] == "slow request" {
            assert!(v["kind"].is_string() && v["took_ms"].is_u64(), "{line}");
            slow += 1;
        }
    }
    assert!(slow > 0, "no slow-request line");
    assert!(log.lines().filter(|l| !l.trim().is_empty()).all(|l| l.starts_with('{')), "a non-JSON log line");

    // Healthy and ready everywhere; then quorum is lost.
    for id in 1..=3 {
        let (code, body) = c.http_get(id, "/health").await.expect("health");
        assert_eq!(code, 200, "{body}");
        assert_eq!(c.http_get(id, "/ready").await.map(|r| r.0), Some(200));
    }
    drop(cl);
    c.kill(2);
    c.kill(3);
    let body = eventually(SECS(20), "member 1 unhealthy without quorum", || async {
        match c.http_get(1, "/health").await {
            Some((503, body)) => Some(body),
            _ => None,
        }
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(v["healthy"], false);
    assert!(v["reason"].as_str().is_some_and(|r| r.contains("leader")), "{body}");
    assert_eq!(c.http_get(1, "/ready").await.map(|r| r.0), Some(503));
    // Quorum back: healthy again.
    c.start_member(2);
    eventually(SECS(20), "member 1 healthy again", || async {
        (c.http_get(1, "/health").await.map(|r| r.0) == Some(200)).then_some(())
    })
    .await;
}

/// The metric names a text uses (`baton_...`), histogram suffixes kept.
fn names_in(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("baton_") {
        let tail = &rest[at..];
        let end =
            tail.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Issue 28, U10: on a member that has just started (no snapshot, no
/// failed proposal, no expiry, no lock yet), every family has `# HELP` and
/// `# TYPE`, and every series the Grafana dashboard and the alert table in
/// docs/operations.md use is there (the event counters at 0), so alerts
/// see 0 and not "no data".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o15_every_family_is_described_and_present_from_the_start() {
    let c = Cluster::start(1, &[]).await;
    c.wait_leader(SECS(10)).await;
    let (code, text) = eventually(SECS(10), "/metrics", || async { c.http_get(1, "/metrics").await }).await;
    assert_eq!(code, 200);
    let samples = parse(&text);
    let families: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(String::from)
        .collect();
    for f in &families {
        assert!(text.contains(&format!("# HELP {f} ")), "no HELP for {f}");
    }
    for zero in [
        ("baton_proposals_failed_total", ("reason", "timeout")),
        ("baton_snapshots_total", ("kind", "made")),
        ("baton_snapshots_total", ("kind", "installed")),
        ("baton_lock_grants_total", ("kind", "handoff")),
    ] {
        assert_eq!(value(&samples, zero.0, &[zero.1]), Some(0.0), "{zero:?}");
    }
    assert_eq!(value(&samples, "baton_session_expirations_total", &[]), Some(0.0));
    let dashboard = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/grafana-dashboard.json"))
        .expect("the dashboard");
    let ops =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md")).expect("operations.md");
    let alerts = ops.split("What to alert on:").nth(1).and_then(|t| t.split("\n## ").next()).expect("the alert table");
    let used = names_in(&dashboard).into_iter().chain(names_in(alerts)).collect::<std::collections::BTreeSet<_>>();
    assert!(used.len() > 15, "{used:?}");
    let live: std::collections::BTreeSet<&str> = samples.iter().map(|s| s.0.as_str()).collect();
    let missing: Vec<&String> = used.iter().filter(|n| !live.contains(n.as_str())).collect();
    // A request error has no honest zero (type x code): it is described
    // and appears with the first error.
    let missing: Vec<&&String> = missing.iter().filter(|n| n.as_str() != "baton_request_errors_total").collect();
    assert!(missing.is_empty(), "used by the dashboard or the alerts, absent from a fresh member: {missing:?}");
    // The first error brings its family, described.
    let client = c.client().await;
    assert!(client.get("/none").await.is_err());
    let described = eventually(SECS(10), "request errors on /metrics", || async {
        let (_, text) = c.http_get(1, "/metrics").await?;
        text.contains("baton_request_errors_total{").then_some(text)
    })
    .await;
    assert!(described.contains("# HELP baton_request_errors_total "), "request errors described");
}
