//! A local cluster: members on free loopback ports, their links direct or
//! through the [`proxy`](crate::proxy), member `id` at index `id - 1`.
//!
//! Layout under the spec's `dir`: `member-<id>/` (data) and
//! `member-<id>.log` per member; both are removed before the cluster starts,
//! so a reused folder leaks no old state.
//!
//! Port-taken retry: ports are free when picked but can be taken before a
//! member binds them. A member that cannot bind exits at once, so
//! [`Cluster::start`] waits [`BIND_GRACE`], and if any member has exited
//! it kills them all and starts the cluster again on new ports (up to
//! [`START_ATTEMPTS`] times).
//!
//! With [`Links::Proxied`], member `a` dials member `b` through the proxy
//! `LinkId::Peer { from: a, to: b }`, and every client slot (and each
//! member's "storage" clients) has its own proxies to every member, as the
//! Jepsen harness needs them. Members added later ([`Cluster::new_member`])
//! have direct links.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use baton_proto::tls::rustls::ClientConfig;
use baton_proto::StatusResp;

use crate::member::{Join, MemberSpec, Process};
use crate::ports::Ports;
use crate::proxy::{LinkId, Proxies};
use crate::status;

/// How long a member gets to fail binding its ports before the cluster
/// counts as started.
pub const BIND_GRACE: Duration = Duration::from_millis(300);
/// How many times [`Cluster::start`] picks ports.
pub const START_ATTEMPTS: u32 = 3;
/// How long [`Cluster::stop`] waits after SIGTERM before SIGKILL.
pub const STOP_BOUND: Duration = Duration::from_secs(10);

/// How members and clients reach members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    Direct,
    /// Every founding peer link through a proxy, and `slots` client slots
    /// with their own proxies (module doc).
    Proxied {
        slots: usize,
    },
}

/// A TLS cluster's pieces, made by the caller (the kit makes no
/// certificates).
#[derive(Clone)]
pub struct Tls {
    /// Member `id`'s TLS flags (called for members added later too).
    pub member_args: Arc<dyn Fn(u64) -> anyhow::Result<Vec<String>> + Send + Sync>,
    /// For the kit's own status requests.
    pub client: Arc<ClientConfig>,
}

impl Tls {
    /// `member_args` for the members; the kit's client configuration from
    /// the CA file and a client certificate and key.
    pub fn new(
        member_args: impl Fn(u64) -> anyhow::Result<Vec<String>> + Send + Sync + 'static,
        ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> anyhow::Result<Tls> {
        let client = baton_proto::tls::client_config(ca, Some((cert, key)))?;
        Ok(Tls { member_args: Arc::new(member_args), client })
    }
}

/// What to start.
#[derive(Clone)]
pub struct ClusterSpec {
    pub nodes: u64,
    /// Data dirs and logs go below it (module doc).
    pub dir: PathBuf,
    /// The `batond` (or `batond-faulty`) binary.
    pub bin: PathBuf,
    /// Flags every member gets.
    pub extra: Vec<String>,
    /// Environment every member gets.
    pub env: Vec<(String, String)>,
    /// Serve `--http-addr` on a free port.
    pub http: bool,
    pub tls: Option<Tls>,
    pub links: Links,
    /// Open the ZooKeeper port (`--zk-addr`) on a free port per member.
    pub zk: bool,
    /// With [`Links::Proxied`] and `zk`: the client slots' and storage
    /// proxies lead to the members' ZooKeeper ports instead of their
    /// native client ports (the harness's ZooKeeper door).
    pub zk_clients: bool,
}

impl ClusterSpec {
    /// `nodes` members of `bin` in `dir`: direct links, no HTTP, no TLS.
    pub fn new(nodes: u64, dir: impl Into<PathBuf>, bin: impl Into<PathBuf>) -> ClusterSpec {
        ClusterSpec {
            nodes,
            dir: dir.into(),
            bin: bin.into(),
            extra: Vec::new(),
            env: Vec::new(),
            http: false,
            tls: None,
            links: Links::Direct,
            zk: false,
            zk_clients: false,
        }
    }
}

/// A member: its spec and, while it runs, its process.
pub struct Member {
    pub spec: MemberSpec,
    process: Option<Process>,
    /// Taken out of the cluster (`member remove`): no longer a voter.
    removed: bool,
}

/// Running members; every process is killed on drop.
pub struct Cluster {
    pub spec: ClusterSpec,
    pub members: Vec<Member>,
    /// Empty with [`Links::Direct`].
    pub proxies: Proxies,
}

impl Cluster {
    /// Starts the cluster (module doc: port-taken retry) and waits up to
    /// `leader_timeout` for a leader.
    pub async fn start(spec: ClusterSpec, leader_timeout: Duration) -> anyhow::Result<Cluster> {
        let c = Self::launch(spec).await?;
        c.wait_leader(leader_timeout).await?;
        Ok(c)
    }

    /// [`Cluster::start`] without waiting for a leader: the members are
    /// running (none exited at start).
    pub async fn launch(spec: ClusterSpec) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(&spec.dir)?;
        let mut attempt = 1;
        let c = loop {
            let mut c = Cluster::layout(spec.clone()).await?;
            for id in 1..=spec.nodes {
                c.start_member(id)?;
            }
            tokio::time::sleep(BIND_GRACE).await;
            let exited = (1..=spec.nodes).any(|id| c.poll_exit(id).is_some());
            if !exited || attempt == START_ATTEMPTS {
                break c;
            }
            eprintln!("a member exited at start (port taken?); retrying on other ports\n{}", c.log_tails(3));
            attempt += 1;
        };
        Ok(c)
    }

    /// Fresh dirs, ports and proxies; nothing started.
    async fn layout(spec: ClusterSpec) -> anyhow::Result<Cluster> {
        for id in 1..=spec.nodes {
            let _ = std::fs::remove_dir_all(spec.dir.join(format!("member-{id}")));
            let _ = std::fs::remove_file(spec.dir.join(format!("member-{id}.log")));
        }
        let mut ports = Ports::default();
        let mut addrs: Vec<(SocketAddr, SocketAddr, Option<SocketAddr>)> = Vec::new();
        let mut zk_addrs: Vec<Option<SocketAddr>> = Vec::new();
        for _ in 1..=spec.nodes {
            addrs.push((ports.addr(), ports.addr(), spec.http.then(|| ports.addr())));
            zk_addrs.push(spec.zk.then(|| ports.addr()));
        }
        let mut proxies = Proxies::default();
        let mut peer_via = BTreeMap::new();
        if let Links::Proxied { slots } = spec.links {
            for (from, to) in (1..=spec.nodes).flat_map(|f| (1..=spec.nodes).map(move |t| (f, t))) {
                let (native, peer, _) = addrs[(to - 1) as usize];
                let client = match zk_addrs[(to - 1) as usize] {
                    Some(zk) if spec.zk_clients => zk,
                    _ => native,
                };
                if from != to {
                    peer_via.insert((from, to), proxies.add(LinkId::Peer { from, to }, peer).await?);
                }
                // Client links: per slot, and the storage links per home member.
                let home = from;
                for slot in (0..slots).filter(|s| *s as u64 % spec.nodes + 1 == home) {
                    proxies.add(LinkId::Client { slot, home, to }, client).await?;
                }
                proxies.add(LinkId::Storage { home, to }, client).await?;
            }
        }
        let mut members = Vec::new();
        for id in 1..=spec.nodes {
            let (client_addr, peer_addr, http_addr) = addrs[(id - 1) as usize];
            let peers = (1..=spec.nodes)
                .map(|to| format!("{to}={}", peer_via.get(&(id, to)).unwrap_or(&addrs[(to - 1) as usize].1)))
                .collect::<Vec<_>>()
                .join(",");
            let mut spec_of = member_spec(&spec, id, client_addr, peer_addr, http_addr, Join::Peers(peers))?;
            if let Some(zk) = zk_addrs[(id - 1) as usize] {
                // The port the proxies lead to, not the free one member_spec picked.
                spec_of.extra.retain(|a| !a.starts_with("--zk-addr="));
                spec_of.extra.push(format!("--zk-addr={zk}"));
            }
            members.push(Member { spec: spec_of, process: None, removed: false });
        }
        Ok(Cluster { spec, members, proxies })
    }

    /// A new member slot (the next id, fresh ports) that starts with
    /// `--join` (the founding members' direct peer addresses). Add it with
    /// `member add`, then [`Cluster::start_member`].
    pub fn new_member(&mut self) -> anyhow::Result<u64> {
        let id = self.members.len() as u64 + 1;
        let used = self.members.iter().flat_map(|m| {
            let s = &m.spec;
            [Some(s.client_addr), Some(s.peer_addr), s.http_addr].into_iter().flatten().map(|a| a.port())
        });
        let mut ports = Ports::avoiding(used);
        let (client, peer, http) = (ports.addr(), ports.addr(), self.spec.http.then(|| ports.addr()));
        let founders = self.members.iter().take(self.spec.nodes as usize);
        let join = founders.map(|m| format!("{}={}", m.spec.id, m.spec.peer_addr)).collect::<Vec<_>>().join(",");
        let spec = member_spec(&self.spec, id, client, peer, http, Join::Join(join))?;
        self.members.push(Member { spec, process: None, removed: false });
        Ok(id)
    }

    pub fn member(&self, id: u64) -> &Member {
        &self.members[(id - 1) as usize]
    }

    fn process(&mut self, id: u64) -> &mut Option<Process> {
        &mut self.members[(id - 1) as usize].process
    }

    /// Starts (or restarts, same data dir) member `id`; nothing if it runs.
    pub fn start_member(&mut self, id: u64) -> anyhow::Result<()> {
        if self.is_running(id) {
            return Ok(());
        }
        let p = self.member(id).spec.start(&self.spec.bin)?;
        *self.process(id) = Some(p);
        Ok(())
    }

    /// SIGTERM member `id` (a clean stop); SIGKILL after [`STOP_BOUND`].
    pub fn stop(&mut self, id: u64) {
        if let Some(p) = self.process(id).take() {
            p.stop(STOP_BOUND);
        }
    }

    /// kill -9 member `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(p) = self.process(id).take() {
            p.kill();
        }
    }

    /// Kills every member.
    pub fn kill_all(&mut self) {
        for m in &mut self.members {
            m.process.take();
        }
    }

    /// kill -9 member `id`, delete its data, and stop counting it as a
    /// voter (after `member remove`).
    pub fn remove(&mut self, id: u64) {
        self.kill(id);
        let m = &mut self.members[(id - 1) as usize];
        m.removed = true;
        let _ = std::fs::remove_dir_all(&m.spec.data_dir);
    }

    /// SIGSTOP member `id`.
    pub fn pause(&mut self, id: u64) {
        if let Some(p) = self.process(id) {
            p.pause();
        }
    }

    /// SIGCONT member `id`.
    pub fn resume(&mut self, id: u64) {
        if let Some(p) = self.process(id) {
            p.resume();
        }
    }

    /// A process was started and has not been reaped.
    pub fn is_running(&self, id: u64) -> bool {
        self.member(id).process.is_some()
    }

    /// Running and not paused.
    pub fn is_up(&self, id: u64) -> bool {
        self.member(id).process.as_ref().is_some_and(|p| !p.is_paused())
    }

    pub fn is_paused(&self, id: u64) -> bool {
        self.member(id).process.as_ref().is_some_and(Process::is_paused)
    }

    /// Member `id`'s exit code once its process has exited (reaped then).
    pub fn poll_exit(&mut self, id: u64) -> Option<i32> {
        let slot = self.process(id);
        let code = slot.as_mut()?.exit_code()?;
        *slot = None;
        Some(code)
    }

    /// Member `id`'s status, asked directly (not through a proxy).
    pub async fn status(&self, id: u64, timeout: Duration) -> anyhow::Result<StatusResp> {
        let tls = self.spec.tls.as_ref().map(|t| &t.client);
        status::status(&self.member(id).spec.client_addr.to_string(), timeout, tls).await
    }

    /// [`status::wait_leader`] over the running, unpaused members; the
    /// error carries the members' log tails.
    pub async fn wait_leader(&self, timeout: Duration) -> anyhow::Result<u64> {
        let up = self.members.iter().filter(|m| self.is_up(m.spec.id));
        let endpoints: Vec<String> = up.map(|m| m.spec.client_addr.to_string()).collect();
        let voters = self.members.iter().filter(|m| !m.removed).count();
        let tls = self.spec.tls.as_ref().map(|t| &t.client);
        status::wait_leader(&endpoints, voters, timeout, tls).await.map_err(|e| e.context(self.log_tails(15)))
    }

    /// The log of member `id`.
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(&self.member(id).spec.log).unwrap_or_default()
    }

    /// The last `n` lines of every member's log (for failure messages).
    pub fn log_tails(&self, n: usize) -> String {
        let mut out = String::new();
        for m in &self.members {
            let log = self.log(m.spec.id);
            let lines: Vec<&str> = log.lines().collect();
            out.push_str(&format!("--- member {} ({}):\n", m.spec.id, m.spec.client_addr));
            for l in &lines[lines.len().saturating_sub(n)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// The members' ZooKeeper ports (with [`ClusterSpec::zk`]), member 1
    /// first.
    pub fn zk_endpoints(&self) -> Vec<String> {
        let flag = |m: &Member| m.spec.extra.iter().find_map(|a| a.strip_prefix("--zk-addr=").map(str::to_string));
        self.members.iter().filter_map(flag).collect()
    }

    /// Direct client endpoints, member 1 first.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.spec.client_addr.to_string()).collect()
    }
}

fn member_spec(
    c: &ClusterSpec,
    id: u64,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    join: Join,
) -> anyhow::Result<MemberSpec> {
    Ok(MemberSpec {
        id,
        data_dir: c.dir.join(format!("member-{id}")),
        log: c.dir.join(format!("member-{id}.log")),
        client_addr,
        peer_addr,
        http_addr,
        join,
        tls_args: match &c.tls {
            Some(t) => (t.member_args)(id)?,
            None => Vec::new(),
        },
        extra: {
            let mut e = c.extra.clone();
            if c.zk {
                e.push(format!("--zk-addr=127.0.0.1:{}", crate::free_port()));
            }
            e
        },
        env: c.env.clone(),
    })
}
