//! DB automation: real `batond` processes on free loopback ports, every
//! link through the harness's proxies, logs collected into the run folder,
//! and everything torn down on drop (so on error, Ctrl-C and panic too).
//!
//! Timing: a test cluster runs with explicit Raft timing ([`TICK_MS`],
//! [`ELECTION_TICKS`], the server's defaults) and `--min-session-ms` at the
//! server's floor (twice the election timeout, [`session_floor_ms`]), so any
//! session timeout a run asks for (`DbOpts::session_ms`) at or above the
//! floor is granted as asked; a smaller one is refused before anything
//! starts. A benchmark cluster (`direct`) runs with the server's defaults.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use baton_client::{member_status_with, ClientTls};
use baton_server::certs::Authority;

use crate::proxy::{LinkId, Proxies};

/// Default session timeout the harness's clients ask for (ms): pauses of
/// 3-8 s outlive it. `baton-jepsen test --session-timeout` overrides it.
pub const SESSION_MS: u64 = 2000;

/// Raft tick (ms) test clusters run with (the server's default).
pub const TICK_MS: u64 = 50;
/// Base election timeout in ticks (the server's default).
pub const ELECTION_TICKS: u64 = 10;

/// The smallest session timeout members grant (ms): twice the election
/// timeout, as the server requires of `--min-session-ms`.
pub fn session_floor_ms() -> u64 {
    2 * TICK_MS * ELECTION_TICKS
}

/// Refuses a session timeout the members cannot grant.
pub fn check_session_ms(ms: u64) -> anyhow::Result<()> {
    let floor = session_floor_ms();
    if ms < floor {
        anyhow::bail!(
            "session timeout {ms} ms is under the members' floor of {floor} ms \
             (2 x election timeout = 2 x {ELECTION_TICKS} ticks x {TICK_MS} ms; batond refuses a smaller \
             --min-session-ms): use --session-timeout {floor} or more"
        );
    }
    Ok(())
}

pub struct DbOpts {
    pub nodes: u64,
    /// Client slots (each gets its own proxied links).
    pub slots: usize,
    pub bin: PathBuf,
    /// Run folder: member data dirs and logs go below it.
    pub dir: PathBuf,
    /// Deliberate server bugs (needs `batond-faulty`).
    pub server_faults: Vec<String>,
    /// Members talk to each other directly, with no proxies on any link
    /// (for benchmarks: a proxy hop would be counted against Baton).
    pub direct: bool,
    /// The session timeout the run's clients ask for (ms): members start
    /// with timing that grants it (module doc). None: the server's defaults.
    pub session_ms: Option<u64>,
    /// TLS on both ports, with a throwaway CA in `<dir>/tls` (clients use
    /// [`Db::client_tls`]).
    pub tls: bool,
}

/// A TLS cluster's CA and the client identity the run uses.
struct DbTls {
    ca: Authority,
    client: ClientTls,
}

struct Member {
    id: u64,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    data_dir: PathBuf,
    log: PathBuf,
    peers_arg: String,
    /// Added while the run goes (the `membership` nemesis): `--join`.
    joins: bool,
    child: Option<Child>,
    paused: bool,
}

pub struct Db {
    pub nodes: u64,
    pub slots: usize,
    members: Vec<Member>,
    pub proxies: Proxies,
    bin: PathBuf,
    server_faults: Vec<String>,
    direct: bool,
    session_ms: Option<u64>,
    tls: Option<DbTls>,
    /// Members the `membership` nemesis added (ids past `nodes`, never
    /// reused), and the next id to use.
    extra: Vec<Member>,
    next_id: u64,
    dir: PathBuf,
}

/// A free loopback port below Linux's ephemeral range (32768-60999), so no
/// outgoing connection's source port can take it before the member binds it.
fn free_addr() -> anyhow::Result<SocketAddr> {
    for _ in 0..1000 {
        let port = 20_000 + rand::random::<u16>() % 12_000;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return Ok(l.local_addr()?);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Finds `batond` (or `batond-faulty`) next to this executable, in the
/// cargo target folder, or on PATH.
pub fn locate_bin(faulty: bool) -> anyhow::Result<PathBuf> {
    let name = if faulty { "batond-faulty" } else { "batond" };
    if let Some(p) = std::env::var_os(if faulty { "BATOND_FAULTY_BIN" } else { "BATOND_BIN" }) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    for _ in 0..2 {
        let cand = dir.join(name);
        if cand.exists() {
            return Ok(cand);
        }
        dir.pop(); // target/debug/deps -> target/debug
    }
    for d in std::env::var("PATH").unwrap_or_default().split(':') {
        let cand = Path::new(d).join(name);
        if cand.exists() {
            return Ok(cand);
        }
    }
    let hint = if faulty {
        "cargo build -p baton-server --features fault-injection --bin batond-faulty"
    } else {
        "cargo build --bins"
    };
    anyhow::bail!("{name} not found next to {} nor on PATH (build it: {hint})", exe.display())
}

impl Db {
    pub async fn start(o: DbOpts) -> anyhow::Result<Db> {
        if let Some(ms) = o.session_ms {
            check_session_ms(ms)?;
        }
        std::fs::create_dir_all(&o.dir)?;
        // Fresh data dirs: a reused run folder must not leak old state.
        for id in 1..=o.nodes {
            let _ = std::fs::remove_dir_all(o.dir.join(format!("member-{id}")));
            let _ = std::fs::remove_file(o.dir.join(format!("member-{id}.log")));
        }
        let mut proxies = Proxies::default();
        let mut members = Vec::new();
        // Distinct free ports (a released port can be handed out again).
        let mut taken = std::collections::HashSet::new();
        let mut fresh = || -> anyhow::Result<SocketAddr> {
            for _ in 0..100 {
                let a = free_addr()?;
                if taken.insert(a) {
                    return Ok(a);
                }
            }
            anyhow::bail!("no free loopback port")
        };
        for id in 1..=o.nodes {
            members.push(Member {
                id,
                client_addr: fresh()?,
                peer_addr: fresh()?,
                data_dir: o.dir.join(format!("member-{id}")),
                log: o.dir.join(format!("member-{id}.log")),
                peers_arg: String::new(),
                joins: false,
                child: None,
                paused: false,
            });
        }
        // Peer links: member `from` reaches member `to` through a proxy.
        let mut peer_proxy = BTreeMap::new();
        for from in 1..=o.nodes {
            for to in 1..=o.nodes {
                if from != to && !o.direct {
                    let target = members[(to - 1) as usize].peer_addr;
                    peer_proxy.insert((from, to), proxies.add(LinkId::Peer { from, to }, target).await?);
                }
            }
        }
        let members_peer: Vec<SocketAddr> = members.iter().map(|m| m.peer_addr).collect();
        for m in members.iter_mut() {
            let parts: Vec<String> = (1..=o.nodes)
                .map(|to| {
                    let addr = match peer_proxy.get(&(m.id, to)) {
                        Some(p) if to != m.id => *p,
                        _ => members_peer[(to - 1) as usize],
                    };
                    format!("{to}={addr}")
                })
                .collect();
            m.peers_arg = parts.join(",");
        }
        // Client links: per slot, and the storage links per home member.
        for to in (1..=o.nodes).filter(|_| !o.direct) {
            let target = members[(to - 1) as usize].client_addr;
            for slot in 0..o.slots {
                let home = slot as u64 % o.nodes + 1;
                proxies.add(LinkId::Client { slot, home, to }, target).await?;
            }
            for home in 1..=o.nodes {
                proxies.add(LinkId::Storage { home, to }, target).await?;
            }
        }
        let tls = if o.tls {
            let ca = Authority::create(&o.dir.join("tls"), "baton-jepsen throwaway CA")?;
            let c = ca.client("jepsen")?;
            let client = ClientTls::load(&ca.ca, Some((&c.cert, &c.key)))?;
            Some(DbTls { ca, client })
        } else {
            None
        };
        let mut db = Db {
            tls,
            nodes: o.nodes,
            slots: o.slots,
            members,
            proxies,
            bin: o.bin,
            server_faults: o.server_faults,
            direct: o.direct,
            session_ms: o.session_ms,
            extra: Vec::new(),
            next_id: o.nodes + 1,
            dir: o.dir.clone(),
        };
        for id in 1..=o.nodes {
            db.start_member(id)?;
        }
        db.wait_leader(Duration::from_secs(30)).await.context("cluster did not elect a leader")?;
        Ok(db)
    }

    fn start_member(&mut self, id: u64) -> anyhow::Result<()> {
        let m = &self.members[(id - 1) as usize];
        if m.child.is_some() {
            return Ok(());
        }
        let child = self.spawn(m)?;
        let m = &mut self.members[(id - 1) as usize];
        m.child = Some(child);
        m.paused = false;
        Ok(())
    }

    /// Starts member `m`'s process.
    fn spawn(&self, m: &Member) -> anyhow::Result<Child> {
        let id = m.id;
        let tls_args = match &self.tls {
            Some(t) => t.ca.member_args(id)?,
            None => Vec::new(),
        };
        let (direct, session_ms) = (self.direct, self.session_ms);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&m.log)?;
        let mut cmd = Command::new(&self.bin);
        let peers = if m.joins { format!("--join={}", m.peers_arg) } else { format!("--peers={}", m.peers_arg) };
        cmd.arg(format!("--id={id}"))
            .arg(format!("--data-dir={}", m.data_dir.display()))
            .arg(format!("--client-addr={}", m.client_addr))
            .arg(format!("--peer-addr={}", m.peer_addr))
            .arg(peers)
            .args(tls_args)
            // Small snapshots exercise installation under faults; a
            // benchmark runs with the server's defaults.
            .args((!direct).then_some("--snapshot-entries=2000"))
            .env("RUST_LOG", "info,raft=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(ms) = session_ms {
            cmd.arg(format!("--tick-ms={TICK_MS}"))
                .arg(format!("--election-ticks={ELECTION_TICKS}"))
                .arg(format!("--min-session-ms={}", session_floor_ms()))
                .arg(format!("--max-session-ms={}", ms.max(120_000)));
        }
        for f in &self.server_faults {
            cmd.arg(format!("--server-fault={f}"));
        }
        cmd.spawn().with_context(|| format!("starting member {id}"))
    }

    /// A sessionless admin configuration on the direct endpoints.
    fn admin(&self) -> baton_client::ClientConfig {
        let mut cfg = baton_client::ClientConfig::new(self.direct_endpoints()).op_timeout(Duration::from_secs(20));
        cfg.tls = self.client_tls();
        cfg
    }

    /// The `membership` nemesis: adds a fresh member with the next unused
    /// id (`member add`, then `batond --join`; the leader promotes it once
    /// it has caught up). Its links are direct (no proxies): partitions
    /// stay among the founding members.
    pub async fn add_member(&mut self, voter: bool) -> anyhow::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let (client_addr, peer_addr) = (free_addr()?, free_addr()?);
        baton_client::admin::member_add(&self.admin(), id, &peer_addr.to_string(), &client_addr.to_string(), voter)
            .await
            .with_context(|| format!("member add {id}"))?;
        let join = self.members.iter().map(|m| format!("{}={}", m.id, m.peer_addr)).collect::<Vec<_>>().join(",");
        let mut m = Member {
            id,
            client_addr,
            peer_addr,
            data_dir: self.dir.join(format!("member-{id}")),
            log: self.dir.join(format!("member-{id}.log")),
            peers_arg: join,
            joins: true,
            child: None,
            paused: false,
        };
        m.child = Some(self.spawn(&m)?);
        self.extra.push(m);
        Ok(id)
    }

    /// Hands leadership to the last added member (`member move-leader`),
    /// so that removing it removes the leader.
    pub async fn lead_added(&mut self) -> anyhow::Result<Option<u64>> {
        let Some(id) = self.extra.last().map(|m| m.id) else { return Ok(None) };
        baton_client::admin::member_move_leader(&self.admin(), id)
            .await
            .with_context(|| format!("move-leader {id}"))?;
        Ok(Some(id))
    }

    /// Removes the members `add_member` added (`member remove`, then stops
    /// them and deletes their data). Returns the ids removed.
    pub async fn remove_added(&mut self) -> anyhow::Result<Vec<u64>> {
        let mut done = Vec::new();
        while let Some(mut m) = self.extra.pop() {
            if let Err(e) = baton_client::admin::member_remove(&self.admin(), m.id).await {
                self.extra.push(m);
                return Err(anyhow::anyhow!("member remove: {e}"));
            }
            if let Some(mut c) = m.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = std::fs::remove_dir_all(&m.data_dir);
            done.push(m.id);
        }
        Ok(done)
    }

    /// The `corrupt` nemesis: kill -9 member `id`, then flip `flips` bytes
    /// of its newest RocksDB data file (WAL or SST, within its length).
    /// Returns the file and its original bytes (for [`Db::repair`]).
    pub fn damage(&mut self, id: u64, rng: &mut impl rand::Rng, flips: usize) -> Option<(PathBuf, Vec<u8>)> {
        self.kill(id);
        let db = self.members[(id - 1) as usize].data_dir.join("db");
        let newest = std::fs::read_dir(&db)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log" || x == "sst"))
            .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
            .filter(|(_, p)| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
            .max()?
            .1;
        let original = std::fs::read(&newest).ok()?;
        let mut bytes = original.clone();
        for _ in 0..flips.max(1) {
            let at = rng.gen_range(0..bytes.len());
            bytes[at] ^= 1 << rng.gen_range(0..8);
        }
        std::fs::write(&newest, bytes).ok()?;
        Some((newest, original))
    }

    /// Puts back what [`Db::damage`] changed.
    pub fn repair(&mut self, file: &Path, original: &[u8]) {
        let _ = std::fs::write(file, original);
    }

    /// Member `id`'s exit code once it has exited (reaped then).
    pub fn exit_code(&mut self, id: u64) -> Option<i32> {
        let m = &mut self.members[(id - 1) as usize];
        let status = m.child.as_mut()?.try_wait().ok()??;
        m.child = None;
        Some(status.code().unwrap_or(-1))
    }

    /// The clients' TLS settings (None: plaintext).
    pub fn client_tls(&self) -> Option<ClientTls> {
        self.tls.as_ref().map(|t| t.client.clone())
    }

    /// kill -9 member `id`.
    pub fn kill(&mut self, id: u64) {
        let m = &mut self.members[(id - 1) as usize];
        if let Some(mut c) = m.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        m.paused = false;
    }

    /// Restarts member `id` (same data dir) if it is not running.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        self.start_member(id)
    }

    fn signal(&self, id: u64, sig: i32) {
        if let Some(c) = &self.members[(id - 1) as usize].child {
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
            }
        }
    }

    /// SIGSTOP member `id`.
    pub fn pause(&mut self, id: u64) {
        self.signal(id, libc::SIGSTOP);
        self.members[(id - 1) as usize].paused = true;
    }

    /// SIGCONT member `id`.
    pub fn resume(&mut self, id: u64) {
        self.signal(id, libc::SIGCONT);
        self.members[(id - 1) as usize].paused = false;
    }

    pub fn is_up(&self, id: u64) -> bool {
        let m = &self.members[(id - 1) as usize];
        m.child.is_some() && !m.paused
    }

    /// Heals everything: links open, paused members resumed, killed ones
    /// restarted.
    pub fn heal_all(&mut self) -> anyhow::Result<()> {
        self.proxies.heal();
        for id in 1..=self.nodes {
            if self.members[(id - 1) as usize].paused {
                self.resume(id);
            }
            self.restart(id)?;
        }
        Ok(())
    }

    /// The current leader as the members report it (asked directly, not
    /// through the proxies: the harness's control channel).
    pub async fn leader(&self) -> Option<u64> {
        for m in &self.members {
            if !self.is_up(m.id) {
                continue;
            }
            let tls = self.client_tls();
            if let Ok(s) =
                member_status_with(&m.client_addr.to_string(), Duration::from_millis(300), tls.as_ref()).await
            {
                if s.role == "leader" {
                    return Some(s.id);
                }
            }
        }
        None
    }

    pub async fn wait_leader(&self, timeout: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader().await {
                return Ok(l);
            }
            if Instant::now() >= deadline {
                anyhow::bail!("no leader within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Endpoints for client slot `slot`: its own proxied links, its home
    /// member first.
    pub fn slot_endpoints(&self, slot: usize) -> Vec<String> {
        let home = slot as u64 % self.nodes + 1;
        self.rotate(home, |to| LinkId::Client { slot, home, to })
    }

    /// Endpoints for a storage client homed at member `home`.
    pub fn storage_endpoints(&self, home: u64) -> Vec<String> {
        self.rotate(home, |to| LinkId::Storage { home, to })
    }

    fn rotate(&self, home: u64, link: impl Fn(u64) -> LinkId) -> Vec<String> {
        (0..self.nodes)
            .map(|i| (home - 1 + i) % self.nodes + 1)
            .filter_map(|to| self.proxies.addr(link(to)).map(|a| a.to_string()))
            .collect()
    }

    /// Direct (unproxied) client endpoints, for setup and final reads.
    pub fn direct_endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_addr.to_string()).collect()
    }
}

impl Db {
    /// Kills every member (also done on drop).
    pub fn stop_all(&mut self) {
        for m in self.members.iter_mut().chain(self.extra.iter_mut()) {
            if let Some(mut c) = m.child.take() {
                // SAFETY: resume a possibly stopped child so it can die.
                unsafe {
                    libc::kill(c.id() as libc::pid_t, libc::SIGCONT);
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        self.stop_all();
    }
}
