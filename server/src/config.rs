//! A member's configuration, from the command line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Config {
    pub id: u64,
    pub data_dir: PathBuf,
    /// Where the client port listens (`HOST:PORT`; a name is resolved).
    pub client_addr: String,
    /// Where the peer port listens.
    pub peer_addr: String,
    /// The addresses other members and clients reach this one at, as it
    /// records them in the configuration (membership.rs).
    pub advertise_client_addr: String,
    pub advertise_peer_addr: String,
    /// Peer addresses known at start, this member's included: the founding
    /// members (`--peers`), or what `--join` learned from the cluster.
    pub peers: BTreeMap<u64, String>,
    /// `--peers`: a fresh data dir starts a new cluster with `peers` as its
    /// voters. `--join`: it waits for the leader's snapshot instead.
    pub founding: bool,
    /// Raft tick length in ms.
    pub tick_ms: u64,
    /// Election timeout in ticks (each countdown is randomized in [n, 2n):
    /// `Driver::randomize_election`).
    pub election_ticks: usize,
    /// Heartbeat interval in ticks.
    pub heartbeat_ticks: usize,
    /// Applied entries between snapshots (log compaction threshold).
    pub snapshot_entries: u64,
    /// Largest client frame accepted, in bytes.
    pub max_frame: usize,
    pub min_session_ms: u32,
    pub max_session_ms: u32,
    /// How long a request may wait for its commit or read before it fails.
    pub request_timeout_ms: u64,
    /// Caps on what clients may hold (every one a flag).
    pub limits: Limits,
    /// Identities that may do everything (acl.rs), e.g. `x509:admin`.
    pub superusers: Vec<String>,
    /// `--insecure-open-admin`: with no superuser configured, every client
    /// may take backups and change the membership (local development only).
    /// Without it, and with no superuser, those admin operations are
    /// refused. Both seed the cluster-wide settings (settings.rs).
    pub open_admin: bool,
    /// Requests slower than this are logged (listener.rs); 0: none.
    pub slow_request_ms: u64,
    /// Deliberate bugs (test builds only; see `faults`).
    pub faults: crate::faults::Faults,
}

/// What one member lets clients hold. Over a cap, a request gets a typed
/// error (BUSY or TOO_LARGE) or the connection is closed with a logged
/// reason; the member keeps serving everyone else.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Client connections open at once (more are answered BUSY and closed).
    pub max_connections: usize,
    /// Requests one connection may have without a response (the reader
    /// stops reading until one is answered).
    pub max_inflight: usize,
    /// Bytes of responses and watch events queued for one connection (a
    /// client that stops reading is disconnected past it).
    pub max_queued_bytes: usize,
    /// Live sessions in the cluster, as this member sees it when a client
    /// asks it for a new one (BUSY past it).
    pub max_sessions: usize,
    /// Watches one connection may hold (BUSY past it).
    pub max_watches: usize,
    /// Operations in one multi (TOO_LARGE past it).
    pub max_multi_ops: usize,
    /// Largest response (TOO_LARGE instead, e.g. a huge children list).
    pub max_reply_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            max_inflight: 1024,
            max_queued_bytes: 64 << 20,
            max_sessions: 100_000,
            max_watches: 100_000,
            max_multi_ops: 1_000,
            max_reply_bytes: 16 << 20,
        }
    }
}

/// Session timeout when the client asks for 0 (ms).
pub const DEFAULT_SESSION_MS: u32 = 10_000;

impl Config {
    /// Member `id` alone, with every flag at its default (`batond --help`):
    /// for tools and tests that need a configuration and no member (the
    /// fuzz targets).
    pub fn defaults(id: u64) -> Config {
        Config {
            id,
            data_dir: PathBuf::new(),
            client_addr: "127.0.0.1:7000".into(),
            peer_addr: "127.0.0.1:7100".into(),
            advertise_client_addr: "127.0.0.1:7000".into(),
            advertise_peer_addr: "127.0.0.1:7100".into(),
            peers: [(id, "127.0.0.1:7100".to_string())].into(),
            founding: true,
            tick_ms: 50,
            election_ticks: 10,
            heartbeat_ticks: 2,
            snapshot_entries: 20_000,
            max_frame: baton_proto::DEFAULT_MAX_FRAME,
            min_session_ms: 1000,
            max_session_ms: 120_000,
            request_timeout_ms: 8000,
            limits: Limits::default(),
            superusers: Vec::new(),
            open_admin: false,
            slow_request_ms: 1000,
            faults: Default::default(),
        }
    }

    pub fn negotiate_timeout(&self, asked: u32) -> u32 {
        let asked = if asked == 0 { DEFAULT_SESSION_MS } else { asked };
        asked.clamp(self.min_session_ms, self.max_session_ms)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The base election timeout (the driver randomizes each countdown in
    /// [1x, 2x)).
    pub fn election_timeout(&self) -> Duration {
        Duration::from_millis(self.tick_ms * self.election_ticks as u64)
    }

    /// The smallest session timeout this timing allows: twice the base
    /// election timeout, i.e. the longest randomized election timeout. A
    /// client stays `Connected` for 2/3 of its timeout after a keepalive it
    /// sent; with less, one failed election would suspend every client
    /// (liveness), and the drift margin in docs/guarantees.md assumes it.
    pub fn session_floor_ms(&self) -> u32 {
        (2 * self.tick_ms * self.election_ticks as u64).min(u32::MAX as u64) as u32
    }

    /// Checks the timing flags against each other.
    /// Raises every value below its floor to it (flags, config files and
    /// tools all come through here: the one place the floors live), then
    /// refuses what no floor can fix. The floors: a tick of 1 ms, a
    /// heartbeat of 1 tick, a snapshot every 10 entries, frames of 1 KiB,
    /// a request timeout of 100 ms, 1 connection, 1 request in flight,
    /// 64 KiB queued per connection, 1 session, multis of 1 op, replies of
    /// 64 KiB.
    pub fn validate(&mut self) -> Result<(), String> {
        self.tick_ms = self.tick_ms.max(1);
        self.heartbeat_ticks = self.heartbeat_ticks.max(1);
        self.snapshot_entries = self.snapshot_entries.max(10);
        self.max_frame = self.max_frame.max(1024);
        self.request_timeout_ms = self.request_timeout_ms.max(100);
        let l = &mut self.limits;
        l.max_connections = l.max_connections.max(1);
        l.max_inflight = l.max_inflight.max(1);
        l.max_queued_bytes = l.max_queued_bytes.max(64 << 10);
        l.max_sessions = l.max_sessions.max(1);
        l.max_multi_ops = l.max_multi_ops.max(1);
        l.max_reply_bytes = l.max_reply_bytes.max(64 << 10);
        if self.election_ticks <= self.heartbeat_ticks {
            return Err("--election-ticks must be greater than --heartbeat-ticks".into());
        }
        if self.min_session_ms > self.max_session_ms {
            return Err("--min-session-ms is over --max-session-ms".into());
        }
        let floor = self.session_floor_ms();
        if self.min_session_ms < floor {
            return Err(format!(
                "--min-session-ms {} is under twice the election timeout ({floor} ms = 2 x {} ticks x {} ms): \
                 a session must outlast an election (see docs/guarantees.md)",
                self.min_session_ms, self.election_ticks, self.tick_ms
            ));
        }
        Ok(())
    }
}

/// Checks that `s` is `HOST:PORT` (an IP address or a DNS name; names are
/// resolved when used, and again on every reconnect).
pub fn check_addr(s: &str) -> Result<(), String> {
    if s.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let (host, port) = s.rsplit_once(':').ok_or_else(|| format!("address {s:?} is not HOST:PORT"))?;
    port.parse::<u16>().map_err(|_| format!("address {s:?}: port {port:?} is not a number"))?;
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
    if host.is_empty() || host.len() > 253 || !host.chars().all(ok) {
        return Err(format!("address {s:?}: {host:?} is not a host name or IP address"));
    }
    Ok(())
}

/// Parses `1=127.0.0.1:7201,2=db2.example:7202`.
pub fn parse_peers(s: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('=').ok_or_else(|| format!("peer {part:?} is not ID=HOST:PORT"))?;
        let id: u64 = id.trim().parse().map_err(|_| format!("peer id {id:?} is not a number"))?;
        if id == 0 {
            return Err("peer id 0 is reserved".into());
        }
        let addr = addr.trim();
        check_addr(addr).map_err(|e| format!("peer {id}: {e}"))?;
        if out.insert(id, addr.to_string()).is_some() {
            return Err(format!("peer id {id} given twice"));
        }
    }
    if out.is_empty() {
        return Err("no peers given".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_raises_every_value_to_its_floor_and_refuses_what_it_cannot_fix() {
        let mut c = Config::defaults(1);
        c.tick_ms = 0;
        c.max_frame = 1;
        c.limits = Limits {
            max_connections: 0,
            max_inflight: 0,
            max_queued_bytes: 0,
            max_sessions: 0,
            max_multi_ops: 0,
            max_reply_bytes: 0,
            ..Limits::default()
        };
        c.validate().expect("valid once raised");
        assert_eq!((c.tick_ms, c.max_frame), (1, 1024));
        let l = &c.limits;
        assert_eq!((l.max_connections, l.max_inflight, l.max_sessions, l.max_multi_ops), (1, 1, 1, 1));
        assert_eq!((l.max_queued_bytes, l.max_reply_bytes), (64 << 10, 64 << 10));
        let mut bad = Config { election_ticks: 2, heartbeat_ticks: 2, ..Config::defaults(1) };
        assert!(bad.validate().is_err());
        let mut short = Config { min_session_ms: 100, ..Config::defaults(1) };
        assert!(short.validate().unwrap_err().contains("twice the election timeout"));
        Config::defaults(1).validate().expect("the defaults are valid");
    }

    #[test]
    fn peers() {
        let p = parse_peers("1=127.0.0.1:1,2=127.0.0.1:2").unwrap();
        assert_eq!(p.len(), 2);
        assert!(parse_peers("x=1").is_err());
        assert!(parse_peers("1=127.0.0.1:1,1=127.0.0.1:2").is_err());
        assert!(parse_peers("0=127.0.0.1:1").is_err());
        assert_eq!(parse_peers("1=baton-1.local:7201").unwrap()[&1], "baton-1.local:7201");
        assert!(parse_peers("1=baton 1:7201").is_err());
        assert!(parse_peers("1=baton-1").is_err());
        assert!(check_addr("[::1]:7").is_ok());
    }
}
