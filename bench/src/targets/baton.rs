//! Baton as a target: `batond` processes started by [`baton_jepsen::db::Db`] in
//! direct mode (no proxies), driven by Baton's own client and lock recipe.
//!
//! With `tls` (`compare --baton-tls`), the members run with TLS on both
//! ports and every client uses it; the failover workload's holder process
//! gets the certificates' folder as `BATON_JEPSEN_TLS_DIR` (`child_env`).

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use baton_client::{
    member_status_with, Client, ClientConfig, ClientTls, CreateOptions, Error, ErrorKind, LockGuard, Op,
};

use super::{Kind, OpError, OpResult, Target, TargetClient};
use baton_jepsen::db::{locate_bin, Db, DbOpts};

/// Keys and fences live under this folder.
const ROOT: &str = "/cmp";

pub struct BatonTarget {
    db: Mutex<Db>,
    endpoints: Vec<String>,
    tls: Option<ClientTls>,
    tls_dir: Option<std::path::PathBuf>,
    /// Peer links through the kit's proxies ([`BatonOpts::proxied`]).
    proxied: bool,
    /// Each member's data dir, member 0 first.
    data_dirs: Vec<std::path::PathBuf>,
    /// Each member's /metrics address ([`BatonOpts::http`]).
    http: Vec<Option<String>>,
}

/// How [`BatonTarget::start_opts`] starts the members.
#[derive(Debug, Clone, Default)]
pub struct BatonOpts {
    /// TLS on both ports.
    pub tls: bool,
    /// Every member opens its ZooKeeper port.
    pub zk: bool,
    /// Peer links through the kit's proxies, so that a member can be cut
    /// off ([`Target::isolate`]); with the harness's test timing
    /// (`baton_jepsen::db`, module doc). Otherwise direct links and the server's
    /// defaults, as a benchmark wants.
    pub proxied: bool,
    /// Deliberate bugs: runs `batond-faulty` with these `--server-fault`s.
    pub server_faults: Vec<String>,
    /// More flags for every member.
    pub extra_flags: Vec<String>,
    /// Every member serves /metrics ([`BatonTarget::http_addr`]).
    pub http: bool,
}

/// The client TLS a holder process uses (from `BATON_JEPSEN_TLS_DIR`).
pub fn tls_from_env() -> anyhow::Result<Option<ClientTls>> {
    let Some(dir) = std::env::var_os("BATON_JEPSEN_TLS_DIR") else { return Ok(None) };
    let dir = std::path::PathBuf::from(dir);
    let (cert, key) = (dir.join("client-jepsen.pem"), dir.join("client-jepsen.key"));
    Ok(Some(ClientTls::load(&dir.join("ca.pem"), Some((&cert, &key)))?))
}

impl BatonTarget {
    pub async fn start(dir: &Path, tls: bool) -> anyhow::Result<BatonTarget> {
        Self::start_with(dir, tls, false).await
    }

    /// With `zk`, every member also opens its ZooKeeper port
    /// ([`BatonTarget::zk_endpoints`]).
    pub async fn start_with(dir: &Path, tls: bool, zk: bool) -> anyhow::Result<BatonTarget> {
        Self::start_opts(dir, BatonOpts { tls, zk, ..BatonOpts::default() }).await
    }

    /// A cluster as `o` says (binary, links, member flags).
    pub async fn start_opts(dir: &Path, o: BatonOpts) -> anyhow::Result<BatonTarget> {
        let db = Db::start(DbOpts {
            nodes: 3,
            slots: 0,
            bin: locate_bin(!o.server_faults.is_empty())?,
            dir: dir.to_path_buf(),
            server_faults: o.server_faults,
            direct: !o.proxied,
            session_ms: o.proxied.then_some(baton_jepsen::db::SESSION_MS),
            tls: o.tls,
            zk: o.zk,
            zk_clients: false,
            extra_flags: o.extra_flags,
            http: o.http,
        })
        .await?;
        let endpoints = db.direct_endpoints();
        let tls = db.client_tls();
        let cfg = ClientConfig::new(endpoints.clone()).tls(tls.clone());
        let setup = Client::connect_with(cfg).await?;
        match setup.create(ROOT, Vec::new(), CreateOptions::persistent()).await {
            Ok(_) | Err(Error::Server { kind: ErrorKind::NodeExists, .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let _ = setup.close().await;
        let tls_dir = tls.as_ref().map(|_| dir.join("tls"));
        let (data_dirs, http) = (db.data_dirs(), db.http_addrs());
        Ok(BatonTarget { db: Mutex::new(db), endpoints, tls, tls_dir, proxied: o.proxied, data_dirs, http })
    }

    /// `member`'s data dir.
    pub fn data_dir(&self, member: usize) -> Option<&Path> {
        self.data_dirs.get(member).map(|d| d.as_path())
    }

    /// `member`'s /metrics address (None unless started with [`BatonOpts::http`]).
    pub fn http_addr(&self, member: usize) -> Option<&str> {
        self.http.get(member)?.as_deref()
    }

    /// The members' ZooKeeper ports (empty unless started with `zk`).
    pub fn zk_endpoints(&self) -> Vec<String> {
        self.with_db(|db| db.zk_endpoints())
    }

    fn with_db<T>(&self, f: impl FnOnce(&mut Db) -> T) -> T {
        let mut g = self.db.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }
}

fn op_err(e: Error) -> OpError {
    match e {
        Error::SessionExpired | Error::Closed => OpError::SessionLost(e.to_string()),
        e if e.is_ambiguous() => OpError::Indeterminate(e.to_string()),
        e => OpError::Failed(e.to_string()),
    }
}

pub struct BatonClient {
    client: Client,
}

impl BatonClient {
    /// A session whose first contact is `endpoints[member]`.
    pub async fn connect_to(
        mut endpoints: Vec<String>,
        member: usize,
        ttl: Duration,
        tls: Option<ClientTls>,
    ) -> anyhow::Result<BatonClient> {
        let n = endpoints.len().max(1);
        endpoints.rotate_left(member % n);
        let cfg = ClientConfig::new(endpoints).session_timeout(ttl).tls(tls);
        let client = Client::connect_with(cfg).await?;
        Ok(BatonClient { client })
    }
}

impl TargetClient for BatonClient {
    type Lock = LockGuard;

    async fn lock(&self, name: &str) -> OpResult<LockGuard> {
        self.client.lock(name).await.map_err(op_err)
    }

    async fn unlock(&self, held: LockGuard) -> OpResult<()> {
        held.release().await.map_err(op_err)
    }

    async fn token(&self, held: &LockGuard) -> OpResult<u64> {
        Ok(held.fencing_token())
    }

    async fn put(&self, key: &str, value: &[u8]) -> OpResult<()> {
        let path = format!("{ROOT}/{key}");
        match self.client.set(&path, value.to_vec(), None).await {
            Ok(_) => Ok(()),
            Err(Error::Server { kind: ErrorKind::NoNode, .. }) => {
                match self.client.create(&path, value.to_vec(), CreateOptions::persistent()).await {
                    Ok(_) => Ok(()),
                    // Created by someone else meanwhile: overwrite.
                    Err(Error::Server { kind: ErrorKind::NodeExists, .. }) => {
                        self.client.set(&path, value.to_vec(), None).await.map(|_| ()).map_err(op_err)
                    }
                    Err(e) => Err(op_err(e)),
                }
            }
            Err(e) => Err(op_err(e)),
        }
    }

    async fn get(&self, key: &str) -> OpResult<Option<Vec<u8>>> {
        match self.client.get(&format!("{ROOT}/{key}")).await {
            Ok((data, _)) => Ok(Some(data.to_vec())),
            Err(Error::Server { kind: ErrorKind::NoNode, .. }) => Ok(None),
            Err(e) => Err(op_err(e)),
        }
    }

    async fn fenced_put(&self, held: &LockGuard, key: &str, value: &[u8]) -> OpResult<bool> {
        let path = format!("{ROOT}/{key}");
        for attempt in 0..3 {
            // Set, or create when the key is missing (and set again if
            // someone created it meanwhile).
            let op = if attempt % 2 == 0 {
                Op::Set { path: path.clone(), data: value.to_vec().into(), version: None }
            } else {
                Op::Create { path: path.clone(), data: value.to_vec().into(), options: CreateOptions::persistent() }
            };
            match held.fenced(&path, &[op]).await {
                Ok(_) => return Ok(true),
                Err(Error::Server { kind: ErrorKind::FenceRejected, .. }) => return Ok(false),
                Err(Error::Server { kind: ErrorKind::NoNode | ErrorKind::NodeExists, .. }) => continue,
                Err(e) => return Err(op_err(e)),
            }
        }
        Err(OpError::Failed(format!("{path} kept appearing and vanishing")))
    }

    async fn close(self) {
        let _ = self.client.close().await;
    }
}

impl Target for BatonTarget {
    type Client = BatonClient;

    fn kind(&self) -> Kind {
        Kind::Baton
    }

    fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    fn child_env(&self) -> Vec<(String, std::path::PathBuf)> {
        self.tls_dir.iter().map(|d| ("BATON_JEPSEN_TLS_DIR".to_string(), d.clone())).collect()
    }

    async fn connect(&self, member: usize, ttl: Duration) -> anyhow::Result<BatonClient> {
        BatonClient::connect_to(self.endpoints.clone(), member, ttl, self.tls.clone()).await
    }

    async fn leader(&self) -> anyhow::Result<usize> {
        for (i, ep) in self.endpoints.iter().enumerate() {
            if let Ok(s) = member_status_with(ep, Duration::from_millis(300), self.tls.as_ref()).await {
                if s.role == "leader" {
                    return Ok(i);
                }
            }
        }
        anyhow::bail!("no member reports itself leader")
    }

    fn kill(&self, member: usize) -> anyhow::Result<()> {
        self.with_db(|db| db.kill(member as u64 + 1));
        Ok(())
    }

    fn pause(&self, member: usize, paused: bool) -> anyhow::Result<()> {
        self.with_db(|db| if paused { db.pause(member as u64 + 1) } else { db.resume(member as u64 + 1) });
        Ok(())
    }

    fn stop(&self) {
        self.with_db(|db| db.stop_all());
    }

    fn member_pids(&self) -> Vec<i32> {
        self.data_dirs.iter().filter_map(|d| super::pid_with_arg(&format!("--data-dir={}", d.display()))).collect()
    }

    fn restart_supported(&self) -> bool {
        true
    }

    fn restart(&self, member: usize) -> anyhow::Result<bool> {
        self.with_db(|db| db.restart(member as u64 + 1))?;
        Ok(true)
    }

    fn isolate(&self, member: usize, cut: bool) -> anyhow::Result<bool> {
        if !self.proxied {
            return Ok(false);
        }
        self.with_db(|db| if cut { db.proxies().isolate_peers(member as u64 + 1) } else { db.proxies().heal() });
        Ok(true)
    }
}
