//! Test support: real `batond` processes on free loopback ports, started
//! through the cluster kit (`baton-kit`); this layer adds the client
//! library (configurations, clients, typed status) and panics instead of
//! returning errors.
//!
//! A [`Cluster`] owns its member processes and kills them (SIGKILL) when
//! dropped, so a failing test leaves nothing running. Every wait here is
//! bounded in time; nothing listens or connects outside 127.0.0.1.

use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_client::{Client, ClientConfig, ClientTls, MemberStatus};
use baton_kit::{Bin, ClusterSpec, Links};
use baton_server::certs::Authority;

pub use baton_kit::proxy::{LinkId, Proxies};
pub use baton_kit::{distinct_ports, free_port};

/// How long a status request gets.
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// Finds the `batond` binary: `$BATOND_BIN`, or next to the test executable
/// (`target/<profile>/batond`).
pub fn batond_bin() -> PathBuf {
    baton_kit::locate(Bin::Batond).unwrap_or_else(|e| panic!("{e}"))
}

/// The `baton` CLI binary, found like [`batond_bin`].
pub fn baton_bin() -> PathBuf {
    baton_kit::locate(Bin::Baton).unwrap_or_else(|e| panic!("{e}"))
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

/// A test cluster: the kit's cluster in a temporary folder.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub kit: baton_kit::Cluster,
    /// TLS on both ports (`start_tls`).
    pub tls: Option<Tls>,
}

/// A TLS cluster's certificates: a throwaway CA, and a client identity.
pub struct Tls {
    pub ca: Arc<Authority>,
    pub client: ClientTls,
}

impl Tls {
    /// A CA in `<dir>/tls`, and the kit's half: member flags, client config.
    pub fn create(dir: &std::path::Path, name: &str) -> (Tls, baton_kit::Tls) {
        let ca = Arc::new(Authority::create(&dir.join("tls"), name).expect("CA"));
        let c = ca.client("admin").expect("client certificate");
        let client = ClientTls::load(&ca.ca, Some((&c.cert, &c.key))).expect("client TLS");
        let member_ca = ca.clone();
        let kit = baton_kit::Tls::new(move |id| member_ca.member_args(id), &ca.ca, &c.cert, &c.key).expect("kit TLS");
        (Tls { ca, client }, kit)
    }
}

impl Cluster {
    /// Starts `n` members with extra `batond` flags and waits for a leader.
    pub async fn start(n: u64, extra: &[&str]) -> Cluster {
        Self::start_with(n, extra, false, Links::Direct).await
    }

    /// [`Cluster::start`] with the ZooKeeper port open on every member
    /// ([`Cluster::zk_endpoints`]).
    pub async fn start_zk(n: u64, extra: &[&str]) -> Cluster {
        Self::start_spec(n, extra, false, Links::Direct, true).await
    }

    /// [`Cluster::start_zk`] with `batond-faulty` and the deliberate bugs
    /// `faults` switched on (`--server-fault`; server/src/faults.rs): how a
    /// test proves it catches the bug it guards against.
    pub async fn start_zk_faulty(n: u64, faults: &str, extra: &[&str]) -> Cluster {
        Self::start_faulty(n, faults, extra, Links::Direct).await
    }

    /// `batond-faulty` with `--server-fault=faults` and the ZooKeeper port.
    async fn start_faulty(n: u64, faults: &str, extra: &[&str], links: Links) -> Cluster {
        let bin = baton_kit::locate(Bin::BatondFaulty).unwrap_or_else(|e| panic!("{e}"));
        let flag = format!("--server-fault={faults}");
        let extra: Vec<&str> = extra.iter().copied().chain([flag.as_str()]).collect();
        Self::start_spec_bin(n, &extra, false, links, true, bin).await
    }

    /// [`Cluster::start_proxied`] with the ZooKeeper port open on every
    /// member (ZooKeeper clients connect to it directly, not through a
    /// proxy: [`Proxies::isolate_peers`] leaves them connected); with
    /// `faults`, `batond-faulty` and those deliberate bugs.
    pub async fn start_proxied_zk(n: u64, faults: Option<&str>, extra: &[&str]) -> Cluster {
        let links = Links::Proxied { slots: 1 };
        match faults {
            Some(faults) => Self::start_faulty(n, faults, extra, links).await,
            None => Self::start_spec(n, extra, false, links, true).await,
        }
    }

    /// The members' ZooKeeper ports, member 1 first.
    pub fn zk_endpoints(&self) -> Vec<String> {
        self.kit.zk_endpoints()
    }

    /// [`Cluster::start`] with TLS on both ports (mutual TLS for peers and
    /// for clients); [`Cluster::client`] and `status` use it.
    pub async fn start_tls(n: u64, extra: &[&str]) -> Cluster {
        Self::start_with(n, extra, true, Links::Direct).await
    }

    /// [`Cluster::start_tls`] with the ZooKeeper port open on every member
    /// too (TLS only, as the client port; [`Cluster::zk_tls_tunnel`]).
    pub async fn start_tls_zk(n: u64, extra: &[&str]) -> Cluster {
        Self::start_spec(n, extra, true, Links::Direct, true).await
    }

    /// A client of a TLS cluster ([`Cluster::start_tls`]) with a certificate
    /// named `cn` (not a superuser) and, if given, a password user.
    pub async fn guest(&self, cn: &str, user: Option<(&str, &str)>) -> Result<Client, baton_client::Error> {
        let tls = self.tls.as_ref().expect("guest needs a TLS cluster");
        let files = tls.ca.client(cn).expect("certificate");
        let ct = ClientTls::load(&tls.ca.ca, Some((&files.cert, &files.key))).expect("tls");
        let mut cfg = ClientConfig::new(self.endpoints()).tls(ct).op_timeout(Duration::from_secs(10));
        if let Some((u, p)) = user {
            cfg = cfg.auth(u, p);
        }
        Client::connect_with(cfg).await
    }

    /// A plaintext loopback port that carries each connection to `target`
    /// (a TLS cluster's ZooKeeper port) over TLS with a client certificate
    /// named `cn`: stunnel's job, for ZooKeeper clients built without TLS.
    /// It serves until the test's runtime ends.
    pub async fn zk_tls_tunnel(&self, target: &str, cn: &str) -> String {
        let tls = self.tls.as_ref().expect("zk_tls_tunnel needs a TLS cluster (start_tls_zk)");
        let c = tls.ca.client(cn).expect("client certificate");
        let cfg = baton_proto::tls::client_config(&tls.ca.ca, Some((&c.cert, &c.key))).expect("client TLS config");
        let name = baton_proto::tls::server_name_of(target).expect("server name");
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the tunnel");
        let addr = l.local_addr().expect("tunnel address").to_string();
        let target = target.to_string();
        tokio::spawn(async move {
            while let Ok((mut plain, _)) = l.accept().await {
                let (cfg, name, target) = (cfg.clone(), name.clone(), target.clone());
                tokio::spawn(async move {
                    let Ok(tcp) = tokio::net::TcpStream::connect(&target).await else { return };
                    let Ok(mut secure) = baton_proto::tls::connect(cfg, name, tcp).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut plain, &mut secure).await;
                });
            }
        });
        addr
    }

    /// [`Cluster::start`] with every peer link, and `slots` client slots,
    /// through the kit's proxies ([`Cluster::proxies`]).
    pub async fn start_proxied(n: u64, slots: usize, extra: &[&str]) -> Cluster {
        Self::start_with(n, extra, false, Links::Proxied { slots }).await
    }

    /// `n` members with extra `batond` flags, started without waiting for
    /// a leader (with long election timeouts, a cluster that has none yet).
    pub async fn launch(n: u64, extra: &[&str]) -> Cluster {
        let dir = tempfile::Builder::new().prefix("baton-test-").tempdir().expect("tempdir");
        let spec =
            ClusterSpec { extra: with_admin(extra), http: true, ..ClusterSpec::new(n, dir.path(), batond_bin()) };
        let kit = baton_kit::Cluster::launch(spec).await.unwrap_or_else(|e| panic!("{e:#}"));
        Cluster { dir, kit, tls: None }
    }

    async fn start_with(n: u64, extra: &[&str], tls: bool, links: Links) -> Cluster {
        Self::start_spec(n, extra, tls, links, false).await
    }

    async fn start_spec(n: u64, extra: &[&str], tls: bool, links: Links, zk: bool) -> Cluster {
        Self::start_spec_bin(n, extra, tls, links, zk, batond_bin()).await
    }

    async fn start_spec_bin(n: u64, extra: &[&str], tls: bool, links: Links, zk: bool, bin: PathBuf) -> Cluster {
        let dir = tempfile::Builder::new().prefix("baton-test-").tempdir().expect("tempdir");
        let (tls, kit_tls) = match tls {
            true => {
                let (t, k) = Tls::create(dir.path(), "baton test CA");
                (Some(t), Some(k))
            }
            false => (None, None),
        };
        let log = std::env::var("BATON_TEST_LOG").unwrap_or_else(|_| "info,raft=info".into());
        let spec = ClusterSpec {
            extra: with_admin(extra),
            env: vec![("RUST_LOG".into(), log)],
            http: true,
            tls: kit_tls,
            links,
            zk,
            ..ClusterSpec::new(n, dir.path(), bin)
        };
        let kit = baton_kit::Cluster::start(spec, Duration::from_secs(20)).await.unwrap_or_else(|e| panic!("{e:#}"));
        Cluster { dir, kit, tls }
    }

    /// The proxies on the links ([`Cluster::start_proxied`]).
    pub fn proxies(&self) -> &Proxies {
        &self.kit.proxies
    }

    /// A new member slot (the next id, fresh ports) that starts with
    /// `--join` (the founding members' peer addresses). Add it with `baton
    /// member add`, then [`Cluster::start_member`].
    pub fn new_member(&mut self) -> u64 {
        self.kit.new_member().expect("new member")
    }

    /// Member `id`'s HTTP (metrics and health) address.
    pub fn http_addr(&self, id: u64) -> String {
        self.kit.member(id).spec.http_addr.expect("http addr").to_string()
    }

    /// `GET path` on member `id`'s HTTP port: (status code, body); None if
    /// it does not answer within 2 s.
    pub async fn http_get(&self, id: u64, path: &str) -> Option<(u16, String)> {
        let addr = self.kit.member(id).spec.http_addr.expect("http addr");
        http_get(&addr.to_string(), path).await
    }

    /// Starts (or restarts, with the same data dir) member `id`.
    pub fn start_member(&mut self, id: u64) {
        assert!(!self.kit.is_running(id), "member {id} already running");
        self.kit.start_member(id).expect("start member");
    }

    /// SIGTERM member `id` (a clean stop) and reap it; SIGKILL after 10 s.
    pub fn stop(&mut self, id: u64) {
        self.kit.stop(id);
    }

    /// SIGKILL member `id` (kill -9) and reap it.
    pub fn kill(&mut self, id: u64) {
        self.kit.kill(id);
    }

    /// SIGSTOP / SIGCONT member `id`.
    pub fn pause(&mut self, id: u64, stop: bool) {
        match stop {
            true => self.kit.pause(id),
            false => self.kit.resume(id),
        }
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.kit.is_running(id)
    }

    /// Member `id`'s exit code once its process has exited (reaped then).
    pub fn exit_code(&mut self, id: u64) -> Option<i32> {
        self.kit.poll_exit(id)
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
        self.kit.member(id).spec.data_dir.clone()
    }

    /// Member `id`'s peer address.
    pub fn peer_addr(&self, id: u64) -> String {
        self.kit.member(id).spec.peer_addr.to_string()
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
        self.kit.member(id).spec.client_addr.to_string()
    }

    /// All endpoints, starting with member `first`'s (the client tries them
    /// in order, so it connects to `first` while it is up).
    pub fn endpoints_from(&self, first: u64) -> Vec<String> {
        let mut v = self.kit.endpoints();
        v.rotate_left((first - 1) as usize);
        v
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints_from(1)
    }

    pub async fn status(&self, id: u64) -> Option<MemberStatus> {
        self.kit.status(id, STATUS_TIMEOUT).await.ok().map(MemberStatus::from)
    }

    /// Waits until the running members agree on one leader; returns its id.
    pub async fn wait_leader(&self, timeout: Duration) -> u64 {
        self.kit.wait_leader(timeout).await.unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Waits until member `id` has applied at least `index`.
    pub async fn wait_applied(&self, id: u64, index: u64, timeout: Duration) -> MemberStatus {
        let what = format!("member {id} applies {index}");
        eventually(timeout, &what, || async { self.status(id).await.filter(|s| s.applied_index >= index) }).await
    }

    pub async fn client(&self) -> Client {
        self.client_with(self.config()).await
    }

    pub async fn client_with(&self, cfg: ClientConfig) -> Client {
        Client::connect_with(cfg).await.expect("connect")
    }

    /// The last `n` lines of every member's log (for failure messages).
    pub fn log_tails(&self, n: usize) -> String {
        self.kit.log_tails(n)
    }

    /// The log of member `id` (for assertions and failure messages).
    pub fn log(&self, id: u64) -> String {
        self.kit.log(id)
    }

    /// Keeps the data dir for inspection when the env says so.
    pub fn keep(self) -> PathBuf {
        let Cluster { dir, kit, tls } = self;
        drop((kit, tls));
        dir.keep()
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

/// Debian's ZooKeeper CLI (`make rival-deps` installs it).
pub const ZKCLI: &str = "/usr/share/zookeeper/bin/zkCli.sh";

/// Runs zkCli.sh against `server` with `script` on stdin (on a blocking
/// thread); its output without the JVM's log lines. Bounded: a zkCli
/// still running after 60 s is killed and the test fails.
pub async fn zkcli(server: &str, script: &str) -> String {
    let (server, script) = (server.to_string(), script.to_string());
    tokio::task::spawn_blocking(move || zkcli_blocking(&server, &script)).await.expect("zkCli")
}

fn zkcli_blocking(server: &str, script: &str) -> String {
    use std::io::Write;
    assert!(
        std::path::Path::new(ZKCLI).exists(),
        "{ZKCLI} is missing: `make rival-deps` installs Debian's zookeeper (make test runs it first)"
    );
    let mut child = std::process::Command::new(ZKCLI)
        .args(["-server", server])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("zkCli.sh starts");
    child.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("script");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("zkCli.sh did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    text.lines().filter(|l| !l.starts_with("20") && !l.trim_start().starts_with("at ")).collect::<Vec<_>>().join("\n")
}

/// A test cluster's flags: `extra`, and `--insecure-open-admin` unless it
/// names a `--superuser` or says `--insecure-open-admin=...` itself (so
/// tests may take backups and change the membership as on `batond
/// cluster`; backup/b30 runs without it).
fn with_admin(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    if !v.iter().any(|a| a.starts_with("--superuser") || a.starts_with("--insecure-open-admin")) {
        v.push("--insecure-open-admin".into());
    }
    v
}
