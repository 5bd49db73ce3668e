//! Metrics: every name a member exports, in one place, recorded through the
//! `metrics` facade and rendered by `metrics-exporter-prometheus` at
//! `GET /metrics` (http.rs). Without an installed recorder (the simulator,
//! unit tests) every call here is a no-op.
//!
//! Names (all prefixed `baton_`; durations in seconds, sizes in bytes):
//! - Raft, set every tick: `raft_term`, `raft_is_leader`, `raft_leader_id`,
//!   `raft_commit_index`, `raft_applied_index`, `raft_persisted_index`,
//!   `raft_apply_lag` (commit - applied), `raft_voters`, `raft_learners`;
//!   counted: `raft_leader_changes_total`; per Ready: `ready_entries` and
//!   `ready_committed` (histograms of entries to persist and to apply).
//! - Writes: `proposals_pending` (gauge), `proposals_failed_total{reason}`
//!   (`timeout`, `leader_changed`, `not_proposed`).
//! - Storage: `fsync_seconds` (histogram, the syncer's synced writes),
//!   `db_bytes` (RocksDB SST files and memtables, every second),
//!   `snapshots_total{kind}` and `snapshot_seconds{kind}` (`made`,
//!   `installed`).
//! - State, set every second: `sessions`, `nodes`, `ephemeral_nodes`,
//!   `watches`, `client_connections`; counted:
//!   `session_expirations_total`.
//! - Clients (listener.rs): `requests_total{type}`,
//!   `request_errors_total{type,code}`, `request_seconds{type}` (from the
//!   request read to its response written to the socket),
//!   `client_bytes_received_total`, `client_bytes_sent_total`.
//! - Peers (transport.rs): `peer_bytes_sent_total`,
//!   `peer_bytes_received_total`; `peer_messages_sent_total{type}` (one
//!   frame each: a raft-rs message type such as `append`,
//!   `append_response`, `heartbeat`, or a session message such as `touch`,
//!   `sync`), and `peer_flushes_total` (socket writes, each carrying the
//!   frames queued by then).
//! - Locks (the recipes' queues under `/_baton/locks/<name>/`, judged on
//!   apply): `lock_grants_total{kind}`, `free` when a queue node is created
//!   into an empty queue, `handoff` when the head of a queue with waiters
//!   goes (released, or its session expired) and the next one is granted.
//!   Hand-off latency is a client's figure (`baton bench lock-contended`):
//!   a member cannot see when the next holder learns of its grant.
//!
//! Every family is described (`# HELP`, [`FAMILIES`]) and present from the
//! moment the recorder is installed ([`register_hot`]): gauges at 0 until
//! set, and the counters counted on events (leader changes, expirations,
//! failed proposals and snapshots by reason or kind, lock grants by kind)
//! at 0, so an alert on `rate(...)` sees 0, not "no data". Tested against
//! the dashboard's and the alert table's expressions on a live member
//! (observability/o15).

use std::sync::OnceLock;
use std::time::Duration;

use baton_proto::StatusResp;
use metrics::{counter, gauge, histogram, Counter, Histogram};

/// Histogram buckets (seconds) for every `*_seconds` metric: 50 us to 10 s.
pub const SECONDS_BUCKETS: &[f64] =
    &[0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Buckets for counts per Ready.
pub const COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0, 4096.0];

/// The Raft gauges, from a status (every tick).
pub fn raft(s: &StatusResp, persisted: u64, pending: usize) {
    gauge!("baton_raft_term").set(s.term as f64);
    gauge!("baton_raft_is_leader").set(if s.role == "leader" { 1.0 } else { 0.0 });
    gauge!("baton_raft_leader_id").set(s.leader_id as f64);
    gauge!("baton_raft_commit_index").set(s.commit_index as f64);
    gauge!("baton_raft_applied_index").set(s.applied_index as f64);
    gauge!("baton_raft_persisted_index").set(persisted as f64);
    gauge!("baton_raft_apply_lag").set(s.commit_index.saturating_sub(s.applied_index) as f64);
    gauge!("baton_raft_voters").set(s.voters.len() as f64);
    gauge!("baton_raft_learners").set(s.learners.len() as f64);
    gauge!("baton_proposals_pending").set(pending as f64);
}

/// The state gauges (every second: some walk the sessions).
pub fn state(sessions: usize, nodes: usize, ephemerals: usize, watches: usize, conns: usize, db_bytes: u64) {
    gauge!("baton_sessions").set(sessions as f64);
    gauge!("baton_nodes").set(nodes as f64);
    gauge!("baton_ephemeral_nodes").set(ephemerals as f64);
    gauge!("baton_watches").set(watches as f64);
    gauge!("baton_client_connections").set(conns as f64);
    gauge!("baton_db_bytes").set(db_bytes as f64);
}

pub fn leader_changed() {
    counter!("baton_raft_leader_changes_total").increment(1);
}

pub fn ready(entries: usize, committed: usize) {
    match HOT.get() {
        Some(h) => {
            h.ready_entries.record(entries as f64);
            h.ready_committed.record(committed as f64);
        }
        None => {
            histogram!("baton_ready_entries").record(entries as f64);
            histogram!("baton_ready_committed").record(committed as f64);
        }
    }
}

pub fn proposal_failed(reason: &'static str, n: usize) {
    counter!("baton_proposals_failed_total", "reason" => reason).increment(n as u64);
}

pub fn expirations(n: usize) {
    counter!("baton_session_expirations_total").increment(n as u64);
}

pub fn snapshot(kind: &'static str, took: Duration) {
    counter!("baton_snapshots_total", "kind" => kind).increment(1);
    histogram!("baton_snapshot_seconds", "kind" => kind).record(took.as_secs_f64());
}

pub fn fsync(took: Duration) {
    match HOT.get() {
        Some(h) => h.fsync.record(took.as_secs_f64()),
        None => histogram!("baton_fsync_seconds").record(took.as_secs_f64()),
    }
}

/// One client request answered: its type, error code name (None: OK) and
/// time from read to written.
pub fn request(kind: &'static str, error: Option<&'static str>, took: Duration) {
    match HOT.get().and_then(|h| h.requests.iter().find(|(k, ..)| *k == kind)) {
        Some((_, n, t)) => {
            n.increment(1);
            t.record(took.as_secs_f64());
        }
        None => {
            counter!("baton_requests_total", "type" => kind).increment(1);
            histogram!("baton_request_seconds", "type" => kind).record(took.as_secs_f64());
        }
    }
    if let Some(code) = error {
        counter!("baton_request_errors_total", "type" => kind, "code" => code).increment(1);
    }
}

pub fn client_bytes(received: usize, sent: usize) {
    let h = HOT.get();
    if received > 0 {
        match h {
            Some(h) => h.client_in.increment(received as u64),
            None => counter!("baton_client_bytes_received_total").increment(received as u64),
        }
    }
    if sent > 0 {
        match h {
            Some(h) => h.client_out.increment(sent as u64),
            None => counter!("baton_client_bytes_sent_total").increment(sent as u64),
        }
    }
}

/// One message sent to a peer (one frame), by kind: a raft-rs message
/// type, or a session-layer message (issue 26: messages per write).
pub fn peer_message(kind: &'static str) {
    match HOT.get().and_then(|h| h.peer_messages.iter().find(|(k, _)| *k == kind)) {
        Some((_, n)) => n.increment(1),
        None => counter!("baton_peer_messages_sent_total", "type" => kind).increment(1),
    }
}

/// One write of queued peer frames to a socket (several messages each when
/// they queue up: batch.rs).
pub fn peer_flush() {
    match HOT.get() {
        Some(h) => h.peer_flushes.increment(1),
        None => counter!("baton_peer_flushes_total").increment(1),
    }
}

pub fn peer_bytes(received: usize, sent: usize) {
    let h = HOT.get();
    if received > 0 {
        match h {
            Some(h) => h.peer_in.increment(received as u64),
            None => counter!("baton_peer_bytes_received_total").increment(received as u64),
        }
    }
    if sent > 0 {
        match h {
            Some(h) => h.peer_out.increment(sent as u64),
            None => counter!("baton_peer_bytes_sent_total").increment(sent as u64),
        }
    }
}

/// The handles of the metrics recorded per request, per message or per
/// Ready, registered once (issue 26, R2): through the macros each call
/// looked its metric up in the recorder's registry, and one with a label
/// built the label first. `register_hot` fills them right after the
/// recorder is installed (http.rs); before that, and in a process without
/// a recorder, the functions above go through the macros (no-ops).
struct Hot {
    fsync: Histogram,
    ready_entries: Histogram,
    ready_committed: Histogram,
    client_in: Counter,
    client_out: Counter,
    peer_in: Counter,
    peer_out: Counter,
    peer_flushes: Counter,
    requests: Vec<(&'static str, Counter, Histogram)>,
    peer_messages: Vec<(&'static str, Counter)>,
}

static HOT: OnceLock<Hot> = OnceLock::new();

/// Request types on the client port (every name `request_kind` gives).
const REQUEST_KINDS: &[&str] = &[
    "unknown",
    "create_session",
    "attach",
    "keepalive",
    "close_session",
    "create",
    "set",
    "delete",
    "multi",
    "get",
    "exists",
    "children",
    "add_watch",
    "remove_watch",
    "status",
    "set_acl",
    "get_acl",
    "auth",
    "add_user",
    "reset_fence",
    "set_settings",
    "remove_user",
    "list_users",
    "whoami",
    "members",
    "member_change",
    "snapshot",
    "claim_session",
];

/// Peer message types (transport.rs, `message_kind`).
const PEER_MESSAGE_KINDS: &[&str] = &[
    "append",
    "append_response",
    "heartbeat",
    "heartbeat_response",
    "propose",
    "read_index",
    "read_index_response",
    "vote",
    "vote_response",
    "snapshot",
    "raft_other",
    "touch",
    "touch_ack",
    "sync",
    "sync_ack",
];

/// Every family: its kind, name and help text.
pub const FAMILIES: &[(Kind, &str, &str)] = &[
    (Kind::Gauge, "baton_raft_term", "The member's Raft term."),
    (Kind::Gauge, "baton_raft_is_leader", "1 if this member is the leader, else 0."),
    (Kind::Gauge, "baton_raft_leader_id", "The leader this member knows of (0: none)."),
    (Kind::Gauge, "baton_raft_commit_index", "The highest log index known committed."),
    (Kind::Gauge, "baton_raft_applied_index", "The highest log index applied to the state."),
    (Kind::Gauge, "baton_raft_persisted_index", "The highest log index synced to disk."),
    (Kind::Gauge, "baton_raft_apply_lag", "Committed but not yet applied entries."),
    (Kind::Gauge, "baton_raft_voters", "Voters in the configuration."),
    (Kind::Gauge, "baton_raft_learners", "Learners in the configuration."),
    (Kind::Counter, "baton_raft_leader_changes_total", "Leader changes this member has seen."),
    (Kind::Histogram, "baton_ready_entries", "Entries to persist per Raft Ready."),
    (Kind::Histogram, "baton_ready_committed", "Entries to apply per Raft Ready."),
    (Kind::Gauge, "baton_proposals_pending", "Proposals waiting for their entry to apply."),
    (
        Kind::Counter,
        "baton_proposals_failed_total",
        "Proposals that failed, by reason (timeout, leader_changed, not_proposed).",
    ),
    (Kind::Histogram, "baton_fsync_seconds", "Time of each synced storage write."),
    (Kind::Gauge, "baton_db_bytes", "RocksDB's SST files and memtables, in bytes."),
    (Kind::Counter, "baton_snapshots_total", "Raft snapshots, by kind (made, installed)."),
    (Kind::Histogram, "baton_snapshot_seconds", "Time to make or install a snapshot, by kind."),
    (Kind::Gauge, "baton_sessions", "Live sessions."),
    (Kind::Gauge, "baton_nodes", "Nodes in the tree."),
    (Kind::Gauge, "baton_ephemeral_nodes", "Ephemeral nodes in the tree."),
    (Kind::Gauge, "baton_watches", "Watches registered on this member."),
    (Kind::Gauge, "baton_client_connections", "Client connections open to this member."),
    (Kind::Counter, "baton_session_expirations_total", "Sessions expired (applied on this member)."),
    (Kind::Counter, "baton_requests_total", "Client requests answered, by type."),
    (Kind::Counter, "baton_request_errors_total", "Client requests answered with an error, by type and code."),
    (Kind::Histogram, "baton_request_seconds", "Time from a request read to its response written, by type."),
    (Kind::Counter, "baton_client_bytes_received_total", "Bytes read from clients."),
    (Kind::Counter, "baton_client_bytes_sent_total", "Bytes written to clients."),
    (Kind::Counter, "baton_peer_bytes_sent_total", "Bytes written to peers."),
    (Kind::Counter, "baton_peer_bytes_received_total", "Bytes read from peers."),
    (Kind::Counter, "baton_peer_messages_sent_total", "Frames sent to peers, by message type."),
    (Kind::Counter, "baton_peer_flushes_total", "Socket writes to peers (each carries the frames queued by then)."),
    (Kind::Counter, "baton_lock_grants_total", "Lock grants seen on apply, by kind (free, handoff)."),
];

/// A family's kind, for its description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Describes every family and registers, at 0, the series only events
/// would create (module doc).
fn describe_all() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    for &(kind, name, help) in FAMILIES {
        match kind {
            Kind::Counter => describe_counter!(name, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::Histogram => describe_histogram!(name, help),
        }
        // Registered unchanged (a counter or gauge with labels is
        // registered per label below, or by the first event).
        match kind {
            _ if LABELLED.contains(&name) => {}
            Kind::Counter => counter!(name).increment(0),
            Kind::Gauge => gauge!(name).increment(0.0),
            Kind::Histogram => {}
        }
    }
    for reason in ["timeout", "leader_changed", "not_proposed"] {
        counter!("baton_proposals_failed_total", "reason" => reason).increment(0);
    }
    for kind in ["made", "installed"] {
        counter!("baton_snapshots_total", "kind" => kind).increment(0);
    }
    for kind in ["free", "handoff"] {
        counter!("baton_lock_grants_total", "kind" => kind).increment(0);
    }
}

/// Families whose every series carries labels: never registered bare.
const LABELLED: &[&str] = &[
    "baton_proposals_failed_total",
    "baton_snapshots_total",
    "baton_snapshot_seconds",
    "baton_requests_total",
    "baton_request_errors_total",
    "baton_request_seconds",
    "baton_peer_messages_sent_total",
    "baton_lock_grants_total",
];

/// Registers the hot handles with the installed recorder (once per
/// process), after describing every family.
pub fn register_hot() {
    describe_all();
    let _ = HOT.get_or_init(|| Hot {
        fsync: histogram!("baton_fsync_seconds"),
        ready_entries: histogram!("baton_ready_entries"),
        ready_committed: histogram!("baton_ready_committed"),
        client_in: counter!("baton_client_bytes_received_total"),
        client_out: counter!("baton_client_bytes_sent_total"),
        peer_in: counter!("baton_peer_bytes_received_total"),
        peer_out: counter!("baton_peer_bytes_sent_total"),
        peer_flushes: counter!("baton_peer_flushes_total"),
        requests: REQUEST_KINDS
            .iter()
            .map(|&k| {
                (k, counter!("baton_requests_total", "type" => k), histogram!("baton_request_seconds", "type" => k))
            })
            .collect(),
        peer_messages: PEER_MESSAGE_KINDS
            .iter()
            .map(|&k| (k, counter!("baton_peer_messages_sent_total", "type" => k)))
            .collect(),
    });
}

/// Lock grants among the changes of one applied entry (see the module
/// docs); `sm` is the state after the entry.
pub fn lock_changes(sm: &crate::state::StateMachine, changes: &[crate::state::Change]) {
    use crate::state::Change;
    const LOCKS: &str = "/_baton/locks/";
    for ch in changes {
        let (path, created) = match ch {
            Change::Created(p) => (p, true),
            Change::Deleted(p) => (p, false),
            _ => continue,
        };
        let Some(rest) = path.strip_prefix(LOCKS) else { continue };
        let Some((name, node)) = rest.split_once('/') else { continue };
        if node.contains('/') {
            continue;
        }
        // Borrowed names, no copy of the queue: this runs on the driver
        // thread for every create and delete in a lock's queue.
        let dir = format!("{LOCKS}{name}");
        let seq = |n: &str| n.len().checked_sub(10).and_then(|i| n.get(i..)).and_then(|d| d.parse::<u64>().ok());
        if created && sm.child_names(&dir).take(2).count() == 1 {
            counter!("baton_lock_grants_total", "kind" => "free").increment(1);
        } else if !created {
            let gone = seq(node);
            let head = sm.child_names(&dir).filter_map(seq).min();
            if let (Some(g), Some(h)) = (gone, head) {
                if g < h {
                    counter!("baton_lock_grants_total", "kind" => "handoff").increment(1);
                }
            }
        }
    }
}

/// A request's type, for labels.
pub fn request_kind(body: Option<&baton_proto::request::Body>) -> &'static str {
    use baton_proto::request::Body as B;
    match body {
        None => "unknown",
        Some(B::CreateSession(_)) => "create_session",
        Some(B::Attach(_)) => "attach",
        Some(B::Keepalive(_)) => "keepalive",
        Some(B::CloseSession(_)) => "close_session",
        Some(B::Create(_)) => "create",
        Some(B::Set(_)) => "set",
        Some(B::Delete(_)) => "delete",
        Some(B::Multi(_)) => "multi",
        Some(B::Get(_)) => "get",
        Some(B::Exists(_)) => "exists",
        Some(B::Children(_)) => "children",
        Some(B::AddWatch(_)) => "add_watch",
        Some(B::RemoveWatch(_)) => "remove_watch",
        Some(B::Status(_)) => "status",
        Some(B::SetAcl(_)) => "set_acl",
        Some(B::GetAcl(_)) => "get_acl",
        Some(B::Auth(_)) => "auth",
        Some(B::AddUser(_)) => "add_user",
        Some(B::ResetFence(_)) => "reset_fence",
        Some(B::SetSettings(_)) => "set_settings",
        Some(B::RemoveUser(_)) => "remove_user",
        Some(B::ListUsers(_)) => "list_users",
        Some(B::Whoami(_)) => "whoami",
        Some(B::Members(_)) => "members",
        Some(B::MemberChange(_)) => "member_change",
        Some(B::Snapshot(_)) => "snapshot",
        Some(B::ClaimSession(_)) => "claim_session",
    }
}
