//! Test support: real `batond` processes on free loopback ports.
//!
//! A [`Cluster`] owns its member processes and kills them (SIGKILL) when
//! dropped, so a failing test leaves nothing running. Every wait here is
//! bounded in time; nothing listens or connects outside 127.0.0.1.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_client::{member_status_with, Client, ClientConfig, ClientTls, MemberStatus};
use baton_server::certs::Authority;

/// Finds the `batond` binary: `$BATOND_BIN`, or next to the test executable
/// (`target/<profile>/batond`).
pub fn batond_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("BATOND_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("batond");
    assert!(bin.exists(), "batond not built at {} (run `cargo build --bins` first or set BATOND_BIN)", bin.display());
    bin
}

/// The `baton` CLI binary, found like [`batond_bin`].
pub fn baton_bin() -> PathBuf {
    let mut p = batond_bin();
    p.set_file_name("baton");
    assert!(p.exists(), "baton not built at {}", p.display());
    p
}

/// Processes a test started itself (outside a [`Cluster`]); killed on drop.
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `n` distinct free loopback ports.
pub fn distinct_ports(n: usize) -> Vec<u16> {
    let mut v: Vec<u16> = Vec::new();
    while v.len() < n {
        let p = free_port();
        if !v.contains(&p) {
            v.push(p);
        }
    }
    v
}

/// `GET path` from `addr` over HTTP/1.1: (status code, body); None if no
/// answer within 2 s.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fut = async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out).to_string();
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Some((code, body))
    };
    tokio::time::timeout(Duration::from_secs(2), fut).await.ok().flatten()
}

/// A free loopback port, picked at random below Linux's ephemeral range
/// (32768-60999): a port the kernel hands out for port 0 can also be taken
/// meanwhile as the source port of some outgoing connection. Bound then
/// released, so a race remains; [`Cluster::start`] retries if a member
/// cannot bind.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = 20_000 + (rand_u64() % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0").local_addr().expect("addr").port()
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

pub struct Member {
    pub id: u64,
    pub client_addr: String,
    pub peer_addr: String,
    /// `--http-addr`: /metrics, /health, /ready.
    pub http_addr: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// Started with `--join` (added to a running cluster) instead of
    /// `--peers` (a founding member).
    pub joins: bool,
    child: Option<Child>,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub members: Vec<Member>,
    peers_arg: String,
    extra: Vec<String>,
    /// TLS on both ports (`start_tls`).
    pub tls: Option<Tls>,
}

/// A TLS cluster's certificates: a throwaway CA, and a client identity.
pub struct Tls {
    pub ca: Authority,
    pub client: ClientTls,
}

impl Tls {
    fn create(dir: &std::path::Path) -> Tls {
        let ca = Authority::create(&dir.join("tls"), "baton test CA").expect("CA");
        let c = ca.client("admin").expect("client certificate");
        let client = ClientTls::load(&ca.ca, Some((&c.cert, &c.key))).expect("client TLS");
        Tls { ca, client }
    }
}

impl Cluster {
    /// Starts `n` members with extra `batond` flags and waits for a leader.
    pub async fn start(n: u64, extra: &[&str]) -> Cluster {
        Self::start_with(n, extra, false).await
    }

    /// [`Cluster::start`] with TLS on both ports (mutual TLS for peers and
    /// for clients); [`Cluster::client`] and `status` use it.
    pub async fn start_tls(n: u64, extra: &[&str]) -> Cluster {
        Self::start_with(n, extra, true).await
    }

    async fn start_with(n: u64, extra: &[&str], tls: bool) -> Cluster {
        for attempt in 1..=3 {
            let dir = tempfile::Builder::new().prefix("baton-test-").tempdir().expect("tempdir");
            let tls = tls.then(|| Tls::create(dir.path()));
            let mut ports = std::collections::HashSet::new();
            let mut fresh = || loop {
                let p = free_port();
                if ports.insert(p) {
                    return p;
                }
            };
            let mut members = Vec::new();
            for id in 1..=n {
                let data_dir = dir.path().join(format!("member-{id}"));
                members.push(Member {
                    id,
                    client_addr: format!("127.0.0.1:{}", fresh()),
                    peer_addr: format!("127.0.0.1:{}", fresh()),
                    http_addr: format!("127.0.0.1:{}", fresh()),
                    log: dir.path().join(format!("member-{id}.log")),
                    data_dir,
                    joins: false,
                    child: None,
                });
            }
            let peers_arg = members.iter().map(|m| format!("{}={}", m.id, m.peer_addr)).collect::<Vec<_>>().join(",");
            let mut c = Cluster { dir, members, peers_arg, extra: extra.iter().map(|s| s.to_string()).collect(), tls };
            for id in 1..=n {
                c.start_member(id);
            }
            // A member that could not bind its port exits at once: start
            // the whole cluster again on other ports.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let exited =
                c.members.iter_mut().any(|m| m.child.as_mut().is_some_and(|ch| matches!(ch.try_wait(), Ok(Some(_)))));
            if exited && attempt < 3 {
                eprintln!("a member exited at start (port taken?); retrying on other ports\n{}", c.log_tails(3));
                for id in 1..=n {
                    c.kill(id);
                }
                continue;
            }
            c.wait_leader(Duration::from_secs(20)).await;
            return c;
        }
        unreachable!("the last attempt returns")
    }

    /// A new member slot (the next id, fresh ports) that starts with
    /// `--join` (the founding members' peer addresses). Add it with `baton
    /// member add`, then [`Cluster::start_member`].
    pub fn new_member(&mut self) -> u64 {
        let id = self.members.len() as u64 + 1;
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 3 {
            let p = free_port();
            let port = format!(":{p}");
            let taken = |m: &Member| [&m.client_addr, &m.peer_addr, &m.http_addr].iter().any(|a| a.ends_with(&port));
            if !ports.contains(&p) && !self.members.iter().any(taken) {
                ports.push(p);
            }
        }
        let (client, peer, http) = (ports[0], ports[1], ports[2]);
        self.members.push(Member {
            id,
            client_addr: format!("127.0.0.1:{client}"),
            peer_addr: format!("127.0.0.1:{peer}"),
            http_addr: format!("127.0.0.1:{http}"),
            data_dir: self.dir.path().join(format!("member-{id}")),
            log: self.dir.path().join(format!("member-{id}.log")),
            joins: true,
            child: None,
        });
        id
    }

    /// `GET path` on member `id`'s HTTP port: (status code, body); None if
    /// it does not answer within 2 s.
    pub async fn http_get(&self, id: u64, path: &str) -> Option<(u16, String)> {
        http_get(&self.member(id).http_addr, path).await
    }

    fn member(&self, id: u64) -> &Member {
        &self.members[(id - 1) as usize]
    }

    /// Starts (or restarts, with the same data dir) member `id`.
    pub fn start_member(&mut self, id: u64) {
        let bin = batond_bin();
        let peers = self.peers_arg.clone();
        let mut extra = self.extra.clone();
        if let Some(t) = &self.tls {
            extra.extend(t.ca.member_args(id).expect("member certificate"));
        }
        let m = &mut self.members[(id - 1) as usize];
        assert!(m.child.is_none(), "member {id} already running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&m.log).expect("log file");
        let child = Command::new(bin)
            .arg(format!("--id={id}"))
            .arg(format!("--data-dir={}", m.data_dir.display()))
            .arg(format!("--client-addr={}", m.client_addr))
            .arg(format!("--peer-addr={}", m.peer_addr))
            .arg(format!("--http-addr={}", m.http_addr))
            .arg(if m.joins { format!("--join={peers}") } else { format!("--peers={peers}") })
            .args(extra)
            .env("RUST_LOG", std::env::var("BATON_TEST_LOG").unwrap_or_else(|_| "info,raft=info".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn batond");
        m.child = Some(child);
    }

    /// SIGTERM member `id` (a clean stop) and reap it; SIGKILL after 10 s.
    pub fn stop(&mut self, id: u64) {
        let m = &mut self.members[(id - 1) as usize];
        if let Some(mut c) = m.child.take() {
            // SAFETY: signalling a child we spawned and have not reaped.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
            for _ in 0..200 {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL member `id` (kill -9) and reap it.
    pub fn kill(&mut self, id: u64) {
        let m = &mut self.members[(id - 1) as usize];
        if let Some(mut c) = m.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP / SIGCONT member `id`.
    pub fn pause(&self, id: u64, stop: bool) {
        if let Some(c) = &self.member(id).child {
            let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: signalling a child we spawned and have not reaped.
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
            }
        }
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.member(id).child.is_some()
    }

    /// Member `id`'s exit code once its process has exited (reaped then).
    pub fn exit_code(&mut self, id: u64) -> Option<i32> {
        let m = &mut self.members[(id - 1) as usize];
        let status = m.child.as_mut()?.try_wait().ok()??;
        m.child = None;
        Some(status.code().unwrap_or(-1))
    }

    /// Waits up to `timeout` for member `id` to exit; its exit code.
    pub async fn wait_exit(&mut self, id: u64, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(code) = self.exit_code(id) {
                return Some(code);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Member `id`'s data dir.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.member(id).data_dir.clone()
    }

    /// Member `id`'s peer address.
    pub fn peer_addr(&self, id: u64) -> String {
        self.member(id).peer_addr.clone()
    }

    /// The client configuration for this cluster (its TLS included).
    pub fn config(&self) -> ClientConfig {
        let cfg = ClientConfig::new(self.endpoints());
        match &self.tls {
            Some(t) => cfg.tls(t.client.clone()),
            None => cfg,
        }
    }

    pub fn endpoint(&self, id: u64) -> String {
        self.member(id).client_addr.clone()
    }

    /// All endpoints, starting with member `first`'s (the client tries them
    /// in order, so it connects to `first` while it is up).
    pub fn endpoints_from(&self, first: u64) -> Vec<String> {
        let mut v: Vec<String> = self.members.iter().map(|m| m.client_addr.clone()).collect();
        v.rotate_left((first - 1) as usize);
        v
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints_from(1)
    }

    pub async fn status(&self, id: u64) -> Option<MemberStatus> {
        let tls = self.tls.as_ref().map(|t| &t.client);
        member_status_with(&self.endpoint(id), Duration::from_millis(500), tls).await.ok()
    }

    /// Waits until the running members agree on one leader; returns its id.
    pub async fn wait_leader(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let mut leaders = Vec::new();
            let mut running = 0;
            for m in &self.members {
                if m.child.is_none() {
                    continue;
                }
                running += 1;
                if let Some(s) = self.status(m.id).await {
                    if s.role == "leader" {
                        leaders.push(s.id);
                    }
                }
            }
            if leaders.len() == 1 && running > 0 {
                // The leader's followers must know it too.
                let l = leaders[0];
                let mut agree = 0;
                for m in self.members.iter().filter(|m| m.child.is_some()) {
                    if self.status(m.id).await.is_some_and(|s| s.leader_id == l) {
                        agree += 1;
                    }
                }
                if agree * 2 > self.members.len() {
                    return l;
                }
            }
            if Instant::now() >= deadline {
                panic!("no leader within {timeout:?}\n{}", self.log_tails(15));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until member `id` has applied at least `index`.
    pub async fn wait_applied(&self, id: u64, index: u64, timeout: Duration) -> MemberStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.status(id).await {
                if s.applied_index >= index {
                    return s;
                }
            }
            assert!(Instant::now() < deadline, "member {id} did not apply {index} within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn client(&self) -> Client {
        self.client_with(self.config()).await
    }

    pub async fn client_with(&self, cfg: ClientConfig) -> Client {
        Client::connect_with(cfg).await.expect("connect")
    }

    /// The last `n` lines of every member's log (for failure messages).
    pub fn log_tails(&self, n: usize) -> String {
        let mut out = String::new();
        for m in &self.members {
            let log = self.log(m.id);
            let lines: Vec<&str> = log.lines().collect();
            out.push_str(&format!("--- member {} ({}):\n", m.id, m.client_addr));
            for l in &lines[lines.len().saturating_sub(n)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// The log of member `id` (for assertions and failure messages).
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(&self.member(id).log).unwrap_or_default()
    }

    /// Keeps the data dir for inspection when the env says so.
    pub fn keep(self) -> PathBuf {
        let p = self.dir.path().to_path_buf();
        std::mem::forget(self);
        p
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                // SAFETY: resume a possibly stopped child so SIGKILL is reaped fast.
                unsafe {
                    libc::kill(c.id() as libc::pid_t, libc::SIGCONT);
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Polls `f` every 25 ms until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A raw protocol connection, for tests that need to misbehave (drop a
/// reply, stop keepalives, send garbage).
pub mod raw {
    use baton_proto::{request, server_frame, ClientFrame, Request, Response, ServerFrame};
    use bytes::Bytes;
    use futures::{SinkExt, StreamExt};
    use prost::Message as _;
    use std::time::Duration;
    use tokio::net::TcpStream;
    use tokio_util::codec::Framed;

    pub struct RawConn {
        pub f: Framed<TcpStream, tokio_util::codec::LengthDelimitedCodec>,
        pub events: Vec<baton_proto::WatchEvent>,
    }

    impl RawConn {
        pub async fn connect(addr: &str) -> RawConn {
            let s = TcpStream::connect(addr).await.expect("connect");
            RawConn { f: Framed::new(s, baton_proto::codec(64 << 20)), events: Vec::new() }
        }

        pub async fn send(&mut self, req: Request) {
            let b: Bytes = ClientFrame { request: Some(req) }.encode_to_vec().into();
            self.f.send(b).await.expect("send");
        }

        /// The next response (events are collected on the side), or None
        /// when the server closed the connection or 5 s passed.
        pub async fn recv(&mut self) -> Option<Response> {
            loop {
                let frame = tokio::time::timeout(Duration::from_secs(5), self.f.next()).await.ok()??.ok()?;
                match ServerFrame::decode(frame).ok()?.frame? {
                    server_frame::Frame::Response(r) => return Some(r),
                    server_frame::Frame::Event(e) => self.events.push(e),
                }
            }
        }

        pub async fn call(&mut self, req: Request) -> Response {
            self.send(req).await;
            self.recv().await.expect("response")
        }

        /// Creates a session on this connection (bound to it) and returns it.
        pub async fn create_session(&mut self, id: u64, timeout_ms: u32) -> baton_proto::CreateSessionResp {
            let body = request::Body::CreateSession(baton_proto::CreateSessionReq { timeout_ms });
            let r = self.call(Request { id, body: Some(body), ..Default::default() }).await;
            match r.body {
                Some(baton_proto::response::Body::CreateSession(cs)) => cs,
                _ => panic!("no session: {r:?}"),
            }
        }

        /// Attaches this connection to a session; returns the response.
        pub async fn attach(&mut self, id: u64, session_id: u64, secret: Bytes) -> Response {
            let body = request::Body::Attach(baton_proto::AttachReq { session_id, secret, ..Default::default() });
            self.call(Request { id, body: Some(body), ..Default::default() }).await
        }
    }
}
