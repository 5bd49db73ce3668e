//! DB automation: real `batond` processes on free loopback ports, every
//! link through the harness's proxies, logs collected into the run folder,
//! and everything torn down on drop (so on error, Ctrl-C and panic too).
//! Ports, binaries, processes, proxies and the wait for a leader are the
//! cluster kit's (`baton-kit`); this module adds the harness's timing, the
//! client slots' endpoints and the nemesis's operations.
//!
//! Timing: a test cluster runs with explicit Raft timing ([`TICK_MS`],
//! [`ELECTION_TICKS`], the server's defaults) and `--min-session-ms` at the
//! server's floor (twice the election timeout, [`session_floor_ms`]), so any
//! session timeout a run asks for (`DbOpts::session_ms`) at or above the
//! floor is granted as asked; a smaller one is refused before anything
//! starts. A benchmark cluster (`direct`) runs with the server's defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use baton_client::ClientTls;
use baton_kit::{Bin, ClusterSpec, Links};
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
    /// Open every member's ZooKeeper port (`--zk-addr`, [`Db::zk_endpoints`]).
    pub zk: bool,
    /// The client slots' and storage proxies lead to the ZooKeeper ports
    /// (needs `zk`): the harness's ZooKeeper door.
    pub zk_clients: bool,
    /// More flags for every member (e.g. `--zk-linearizable-reads`).
    pub extra_flags: Vec<String>,
    /// Every member serves /metrics on an HTTP port ([`Db::http_addrs`]).
    pub http: bool,
}

pub struct Db {
    pub nodes: u64,
    pub slots: usize,
    /// The members (founding ones are ids `1..=nodes`) and the proxies.
    cluster: baton_kit::Cluster,
    /// The clients' TLS settings (None: plaintext).
    tls: Option<ClientTls>,
    /// Members the `membership` nemesis added and has not removed yet (ids
    /// past `nodes`, never reused).
    added: Vec<u64>,
}

/// Finds `batond` (or `batond-faulty`) next to this executable, in the
/// cargo target folder, or on PATH.
pub fn locate_bin(faulty: bool) -> anyhow::Result<PathBuf> {
    baton_kit::locate(if faulty { Bin::BatondFaulty } else { Bin::Batond })
}

/// Every member's flags: small snapshots exercise installation under
/// faults (a benchmark runs with the server's defaults), the timing that
/// grants `session_ms`, and the deliberate bugs.
fn member_flags(o: &DbOpts) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    v.extend((!o.direct).then(|| "--snapshot-entries=2000".to_string()));
    // The `membership` nemesis changes the membership as an anonymous
    // client: a local test cluster, open to admin operations.
    v.push("--insecure-open-admin".to_string());
    if let Some(ms) = o.session_ms {
        v.push(format!("--tick-ms={TICK_MS}"));
        v.push(format!("--election-ticks={ELECTION_TICKS}"));
        v.push(format!("--min-session-ms={}", session_floor_ms()));
        v.push(format!("--max-session-ms={}", ms.max(120_000)));
    }
    v.extend(o.server_faults.iter().map(|f| format!("--server-fault={f}")));
    v.extend(o.extra_flags.iter().cloned());
    v
}

impl Db {
    pub async fn start(o: DbOpts) -> anyhow::Result<Db> {
        if let Some(ms) = o.session_ms {
            check_session_ms(ms)?;
        }
        std::fs::create_dir_all(&o.dir)?;
        let (tls, kit_tls) = if o.tls {
            let ca = std::sync::Arc::new(Authority::create(&o.dir.join("tls"), "baton-jepsen throwaway CA")?);
            let c = ca.client("jepsen")?;
            let client = ClientTls::load(&ca.ca, Some((&c.cert, &c.key)))?;
            let member_ca = ca.clone();
            (Some(client), Some(baton_kit::Tls::new(move |id| member_ca.member_args(id), &ca.ca, &c.cert, &c.key)?))
        } else {
            (None, None)
        };
        let spec = ClusterSpec {
            extra: member_flags(&o),
            env: vec![("RUST_LOG".into(), "info,raft=warn".into())],
            tls: kit_tls,
            links: if o.direct { Links::Direct } else { Links::Proxied { slots: o.slots } },
            zk: o.zk,
            zk_clients: o.zk_clients,
            http: o.http,
            ..ClusterSpec::new(o.nodes, &o.dir, &o.bin)
        };
        let cluster =
            baton_kit::Cluster::start(spec, Duration::from_secs(30)).await.context("cluster did not elect a leader")?;
        Ok(Db { nodes: o.nodes, slots: o.slots, cluster, tls, added: Vec::new() })
    }

    /// The proxies on every link (none with `direct`).
    pub fn proxies(&self) -> &Proxies {
        &self.cluster.proxies
    }

    /// A sessionless admin configuration on the direct endpoints.
    fn admin(&self) -> baton_client::ClientConfig {
        baton_client::ClientConfig::new(self.direct_endpoints())
            .op_timeout(Duration::from_secs(20))
            .tls(self.client_tls())
    }

    /// The `membership` nemesis: adds a fresh member with the next unused
    /// id (`member add`, then `batond --join`; the leader promotes it once
    /// it has caught up). Its links are direct (no proxies): partitions
    /// stay among the founding members.
    pub async fn add_member(&mut self, voter: bool) -> anyhow::Result<u64> {
        let id = self.cluster.new_member()?;
        let m = &self.cluster.member(id).spec;
        let (peer, client) = (m.peer_addr.to_string(), m.client_addr.to_string());
        if let Err(e) = baton_client::admin::member_add(&self.admin(), id, &peer, &client, voter).await {
            self.cluster.remove(id);
            return Err(anyhow::Error::new(e).context(format!("member add {id}")));
        }
        self.cluster.start_member(id)?;
        self.added.push(id);
        Ok(id)
    }

    /// Hands leadership to the last added member (`member move-leader`),
    /// so that removing it removes the leader.
    pub async fn lead_added(&mut self) -> anyhow::Result<Option<u64>> {
        let Some(&id) = self.added.last() else { return Ok(None) };
        baton_client::admin::member_move_leader(&self.admin(), id)
            .await
            .with_context(|| format!("move-leader {id}"))?;
        Ok(Some(id))
    }

    /// Removes the members `add_member` added (`member remove`, then stops
    /// them and deletes their data). Returns the ids removed.
    pub async fn remove_added(&mut self) -> anyhow::Result<Vec<u64>> {
        let mut done = Vec::new();
        while let Some(&id) = self.added.last() {
            if let Err(e) = baton_client::admin::member_remove(&self.admin(), id).await {
                return Err(anyhow::anyhow!("member remove: {e}"));
            }
            self.added.pop();
            self.cluster.remove(id);
            done.push(id);
        }
        Ok(done)
    }

    /// The `corrupt` nemesis: kill -9 member `id`, then flip `flips` bytes
    /// of its newest RocksDB data file (WAL or SST, within its length).
    /// Returns the file and its original bytes (for [`Db::repair`]).
    pub fn damage(&mut self, id: u64, rng: &mut impl rand::Rng, flips: usize) -> Option<(PathBuf, Vec<u8>)> {
        self.kill(id);
        let db = self.cluster.member(id).spec.data_dir.join("db");
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
        self.cluster.poll_exit(id)
    }

    /// The clients' TLS settings (None: plaintext).
    pub fn client_tls(&self) -> Option<ClientTls> {
        self.tls.clone()
    }

    /// The founding members' data dirs, member 1 first.
    pub fn data_dirs(&self) -> Vec<PathBuf> {
        self.cluster.members.iter().take(self.nodes as usize).map(|m| m.spec.data_dir.clone()).collect()
    }

    /// The founding members' HTTP addresses (None without `http`).
    pub fn http_addrs(&self) -> Vec<Option<String>> {
        self.cluster.members.iter().take(self.nodes as usize).map(|m| m.spec.http_addr.map(|a| a.to_string())).collect()
    }

    /// kill -9 member `id`.
    pub fn kill(&mut self, id: u64) {
        self.cluster.kill(id);
    }

    /// Restarts member `id` (same data dir) if it is not running.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        self.cluster.start_member(id)
    }

    /// SIGSTOP member `id`.
    pub fn pause(&mut self, id: u64) {
        self.cluster.pause(id);
    }

    /// SIGCONT member `id`.
    pub fn resume(&mut self, id: u64) {
        self.cluster.resume(id);
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.cluster.is_up(id)
    }

    /// Heals everything: links open, paused members resumed, killed ones
    /// restarted.
    pub fn heal_all(&mut self) -> anyhow::Result<()> {
        self.cluster.proxies.heal();
        for id in 1..=self.nodes {
            self.resume(id);
            self.restart(id)?;
        }
        Ok(())
    }

    /// The current leader as the members report it (asked directly, not
    /// through the proxies: the harness's control channel).
    pub async fn leader(&self) -> Option<u64> {
        for id in (1..=self.nodes).filter(|id| self.is_up(*id)) {
            if let Ok(s) = self.cluster.status(id, Duration::from_millis(300)).await {
                if s.role == "leader" {
                    return Some(s.id);
                }
            }
        }
        None
    }

    /// Waits until the running members agree on one leader.
    pub async fn wait_leader(&self, timeout: Duration) -> anyhow::Result<u64> {
        self.cluster.wait_leader(timeout).await
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
            .filter_map(|to| self.cluster.proxies.addr(link(to)).map(|a| a.to_string()))
            .collect()
    }

    /// Direct (unproxied) client endpoints of the founding members, for
    /// setup and final reads.
    pub fn direct_endpoints(&self) -> Vec<String> {
        self.cluster.endpoints().into_iter().take(self.nodes as usize).collect()
    }

    /// The founding members' ZooKeeper ports (with [`DbOpts::zk`]).
    pub fn zk_endpoints(&self) -> Vec<String> {
        self.cluster.zk_endpoints().into_iter().take(self.nodes as usize).collect()
    }

    /// Kills every member (also done on drop).
    pub fn stop_all(&mut self) {
        self.cluster.kill_all();
    }
}
