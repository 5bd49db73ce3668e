//! An in-process Baton cluster for deterministic tests: real drivers
//! (raft-rs, the state machine, sessions, reads, watches) with a manual
//! clock, a seeded network and a queue for a disk. Nothing runs unless the
//! simulator says so, so a run is a function of its seed and script, and a
//! failing seed replays exactly (`BATON_SIM_SEED=<n>`).
//!
//! What it models:
//! - Members: `Driver`s over `MemKv`. A member's disk writes complete in
//!   order after a seeded delay; a crash loses what was not yet written; a
//!   restart loads from what was. A paused member (SIGSTOP) handles nothing
//!   and writes nothing until resumed, then handles everything queued in
//!   one turn, as the runtime would.
//! - The network: per directed link FIFO (TCP), a seeded delay per message,
//!   links cut in either or both directions (in-flight messages on a cut
//!   link are lost).
//! - Clients ([`SimClient`]): a session's keepalive cadence, member
//!   switching and the `Connected` rule of the real client
//!   (`baton_client::liveness`), optionally polling stale reads.
//!
//! What it checks, all the time: whenever any member applies the expiry of
//! a session, no client of that session may be `Connected` at that moment
//! (docs/guarantees.md, "Sessions"). Violations are collected, not
//! panicked on, so a test can print the trace and the seed.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::liveness::{Liveness, KEEPALIVE_FRACTION};
use baton_proto::{
    request, response, server_frame, AttachReq, CreateSessionReq, ErrorCode, KeepaliveReq, ReadReq, Request,
    ServerFrame,
};
use baton_server::config::Config;
use baton_server::driver::{Driver, WallClock};
use baton_server::faults::Faults;
use baton_server::kv::{Kv, MemKv};
use baton_server::message::{ConnId, ConnTx, Input, PeerOut, PeerSink};
use baton_server::syncer::{build_backup, build_snapshot, Persist, SyncJob, Synced};
use bytes::Bytes;
use raft::StateRole;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc::UnboundedReceiver;

/// The simulator's knobs.
#[derive(Clone, Debug)]
pub struct Opts {
    pub nodes: u64,
    pub tick_ms: u64,
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// Session timeout clients ask for (the minimum allowed by default).
    pub session_ms: u32,
    /// One-way network delay, in microseconds.
    pub net_delay_us: (u64, u64),
    /// Disk write (fsync) time, in microseconds.
    pub disk_delay_us: (u64, u64),
    /// Members whose disk writes take this range instead (a slow disk).
    pub disk_delay_of: BTreeMap<u64, (u64, u64)>,
    /// Inputs a member takes per turn at most (the runtime's
    /// `MAX_INPUTS_PER_TURN`); a resumed member works through its queue in
    /// turns of this size, ticking after each.
    pub max_inputs_per_turn: usize,
    /// Every member ticks at the same instants (processes started together
    /// on one machine tick almost in step).
    pub aligned_ticks: bool,
    pub faults: Faults,
    /// Changes member `id`'s configuration before each boot (flags that
    /// differ between members).
    pub config_of: Option<fn(u64, &mut Config)>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            nodes: 3,
            tick_ms: 50,
            election_ticks: 10,
            heartbeat_ticks: 2,
            session_ms: 1000,
            net_delay_us: (100, 2_000),
            disk_delay_us: (200, 3_000),
            disk_delay_of: BTreeMap::new(),
            max_inputs_per_turn: baton_server::driver::MAX_INPUTS_PER_TURN,
            aligned_ticks: false,
            faults: Faults::default(),
            config_of: None,
        }
    }
}

struct Sink(Arc<Mutex<Vec<(u64, PeerOut)>>>);

impl PeerSink for Sink {
    fn send(&self, to: u64, msg: PeerOut) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((to, msg));
    }
}

struct Disk(Arc<Mutex<VecDeque<SyncJob>>>);

impl Persist for Disk {
    fn submit(&mut self, job: SyncJob) {
        if job.batch.is_empty() && job.after.is_empty() && job.number == 0 {
            return;
        }
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push_back(job);
    }
    fn stop(&mut self) {}
}

pub struct Member {
    pub id: u64,
    kv: Arc<MemKv>,
    pub driver: Option<Driver>,
    out: Arc<Mutex<Vec<(u64, PeerOut)>>>,
    disk: Arc<Mutex<VecDeque<SyncJob>>>,
    paused: bool,
    inbox: Vec<Input>,
    disk_busy: bool,
    /// Bumped on crash: events scheduled for an earlier life are void.
    life: u64,
}

#[derive(Debug)]
enum Ev {
    Tick(u64, u64),
    Deliver { to: u64, life: u64, from: Option<u64>, input: InputBox },
    DiskDone(u64, u64),
    ClientTick(usize),
    Resume(u64),
}

/// `Input` is not `Debug`; events only need to carry it.
struct InputBox(Input);

impl std::fmt::Debug for InputBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("input")
    }
}

/// Which requests a client counts as proof of life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContactRule {
    /// The real client: only keepalives answered OK, from their send time.
    Keepalives,
    /// Finding S1 (the old client): any OK answer, from when it arrived.
    AnyAnswer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Req {
    Create,
    Attach,
    Keepalive,
    StaleRead,
}

/// A client of one session, as the real one behaves (simplified).
pub struct SimClient {
    pub name: String,
    /// The members it tries, in order.
    pub endpoints: Vec<u64>,
    ep: usize,
    conn: Option<(u64, u64, ConnId, UnboundedReceiver<ServerFrame>)>,
    attached: bool,
    pub session: u64,
    secret: Bytes,
    timeout: Duration,
    liveness: Option<Liveness>,
    pending: BTreeMap<u64, (Req, Instant)>,
    next_id: u64,
    last_keepalive: Instant,
    keepalive_retry: Option<Instant>,
    last_stale: Instant,
    /// False: the client process is frozen or gone (sends nothing).
    pub alive: bool,
    pub expired: bool,
    last_zxid: u64,
    /// Polls stale reads every 50 ms (finding S1's workload).
    pub stale_poll: bool,
    pub rule: ContactRule,
    /// When the last keepalive went out.
    pub last_keepalive_sent: Option<Instant>,
    /// With `ContactRule::AnyAnswer`: when the last OK answer arrived.
    any_answer: Option<Instant>,
    /// When any member last answered anything.
    last_heard: Instant,
    /// Every state change: (time since start, state).
    pub states: Vec<(Duration, &'static str)>,
}

impl SimClient {
    /// `Connected`, `Suspended` or `Expired` at `now`.
    pub fn state(&self, now: Instant) -> &'static str {
        if self.expired {
            return "Expired";
        }
        if self.session == 0 || !self.attached {
            return "Suspended";
        }
        let connected = match self.rule {
            ContactRule::Keepalives => self.liveness.is_some_and(|l| l.connected(now)),
            ContactRule::AnyAnswer => self.any_answer.is_some_and(|t| now < t + self.timeout * 2 / 3),
        };
        if connected {
            "Connected"
        } else {
            "Suspended"
        }
    }
}

/// A connection a test drives by hand ([`Sim::raw_call`]).
pub struct RawConn {
    pub member: u64,
    life: u64,
    conn: ConnId,
    rx: UnboundedReceiver<ServerFrame>,
    next_id: u64,
}

pub struct Sim {
    pub opts: Opts,
    pub start: Instant,
    pub now: Instant,
    rng: StdRng,
    pub members: BTreeMap<u64, Member>,
    events: BinaryHeap<Reverse<(Instant, u64)>>,
    pending: BTreeMap<u64, Ev>,
    seq: u64,
    cut: BTreeSet<(u64, u64)>,
    /// Links whose messages wait until released (delay without loss).
    held: BTreeMap<(u64, u64), Vec<(u64, Input)>>,
    last_delivery: BTreeMap<(u64, u64), Instant>,
    pub clients: Vec<SimClient>,
    next_conn: ConnId,
    expiries_seen: BTreeSet<u64>,
    /// Every ReadIndex context a member sent: (member, context bytes).
    pub read_contexts: Vec<(u64, Vec<u8>)>,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
}

/// Client links are named by this pseudo member id on the network.
const CLIENT_NET: u64 = 1_000_000;

impl Sim {
    pub fn new(seed: u64, opts: Opts) -> Sim {
        let start = Instant::now();
        let mut sim = Sim {
            opts,
            start,
            now: start,
            rng: StdRng::seed_from_u64(seed),
            members: BTreeMap::new(),
            events: BinaryHeap::new(),
            pending: BTreeMap::new(),
            seq: 0,
            cut: BTreeSet::new(),
            held: BTreeMap::new(),
            last_delivery: BTreeMap::new(),
            clients: Vec::new(),
            next_conn: 1,
            expiries_seen: BTreeSet::new(),
            read_contexts: Vec::new(),
            violations: Vec::new(),
            trace: Vec::new(),
        };
        for id in 1..=sim.opts.nodes {
            let m = Member {
                id,
                kv: Arc::new(MemKv::default()),
                driver: None,
                out: Arc::new(Mutex::new(Vec::new())),
                disk: Arc::new(Mutex::new(VecDeque::new())),
                paused: false,
                inbox: Vec::new(),
                disk_busy: false,
                life: 0,
            };
            sim.members.insert(id, m);
            sim.boot(id);
        }
        sim
    }

    fn config(&self, id: u64) -> Config {
        let peers = (1..=self.opts.nodes).map(|i| (i, format!("127.0.0.1:{}", 20000 + i))).collect();
        let mut cfg = Config {
            id,
            data_dir: "/nonexistent".into(),
            client_addr: "127.0.0.1:1".into(),
            peer_addr: "127.0.0.1:2".into(),
            advertise_client_addr: "127.0.0.1:1".into(),
            advertise_peer_addr: "127.0.0.1:2".into(),
            peers,
            founding: true,
            tick_ms: self.opts.tick_ms,
            election_ticks: self.opts.election_ticks,
            heartbeat_ticks: self.opts.heartbeat_ticks,
            snapshot_entries: 2000,
            max_frame: 1 << 20,
            min_session_ms: self.opts.session_ms.min(1000),
            max_session_ms: 120_000,
            request_timeout_ms: 4000,
            limits: Default::default(),
            superusers: Vec::new(),
            open_admin: true,
            slow_request_ms: 0,
            faults: self.opts.faults,
        };
        if let Some(f) = self.opts.config_of {
            f(id, &mut cfg);
        }
        cfg
    }

    fn boot(&mut self, id: u64) {
        let cfg = self.config(id);
        let seed = self.rng.gen();
        let now = self.now;
        let m = self.members.get_mut(&id).expect("member exists");
        m.life += 1;
        m.out.lock().unwrap_or_else(|p| p.into_inner()).clear();
        m.disk.lock().unwrap_or_else(|p| p.into_inner()).clear();
        m.disk_busy = false;
        m.paused = false;
        m.inbox.clear();
        let wall = WallClock { mono: self.start, wall_ms: 1_700_000_000_000 };
        let mut d = Driver::new(
            cfg,
            m.kv.as_ref() as &dyn Kv,
            Box::new(Sink(m.out.clone())),
            Box::new(Disk(m.disk.clone())),
            seed,
            now,
            wall,
        )
        .expect("driver starts from its store");
        d.observe_expiries();
        m.driver = Some(d);
        let life = m.life;
        // Ticks at a per-member phase.
        let phase = match self.opts.aligned_ticks {
            true => Duration::from_millis(self.opts.tick_ms) - self.elapsed_in_tick(now),
            false => Duration::from_micros(self.rng.gen_range(0..self.opts.tick_ms * 1000)),
        };
        self.at(now + phase, Ev::Tick(id, life));
    }

    fn at(&mut self, t: Instant, ev: Ev) {
        self.seq += 1;
        self.pending.insert(self.seq, ev);
        self.events.push(Reverse((t, self.seq)));
    }

    /// How far `now` is into the current tick (ticks counted from the start).
    fn elapsed_in_tick(&self, now: Instant) -> Duration {
        let tick = self.opts.tick_ms * 1000;
        let us = now.saturating_duration_since(self.start).as_micros() as u64;
        Duration::from_micros(us % tick)
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn log(&mut self, s: String) {
        let t = self.elapsed().as_secs_f64();
        self.trace.push(format!("[{t:8.3}] {s}"));
    }

    // ------------------------------------------------------------ faults

    /// Cuts the links between `a` and `b` in both directions.
    pub fn cut(&mut self, a: u64, b: u64) {
        self.cut.insert((a, b));
        self.cut.insert((b, a));
        self.log(format!("cut {a} <-> {b}"));
    }

    /// Cuts `from -> to` only.
    pub fn cut_oneway(&mut self, from: u64, to: u64) {
        self.cut.insert((from, to));
        self.log(format!("cut {from} -> {to}"));
    }

    /// Cuts every peer link of `m`; its clients' links stay up.
    pub fn isolate_peers(&mut self, m: u64) {
        for o in 1..=self.opts.nodes {
            if o != m {
                self.cut.insert((m, o));
                self.cut.insert((o, m));
            }
        }
        self.log(format!("isolate peers of {m}"));
    }

    /// Cuts client `c`'s links to every member.
    pub fn cut_client(&mut self, c: usize) {
        for m in 1..=self.opts.nodes {
            self.cut.insert((CLIENT_NET + c as u64, m));
            self.cut.insert((m, CLIENT_NET + c as u64));
        }
        self.log(format!("cut client {c}"));
    }

    /// Holds every message `from -> to` until [`Sim::release`].
    pub fn hold(&mut self, from: u64, to: u64) {
        self.held.entry((from, to)).or_default();
        self.log(format!("hold {from} -> {to}"));
    }

    /// Delivers what `from -> to` held, in order, and stops holding.
    pub fn release(&mut self, from: u64, to: u64) {
        let q = self.held.remove(&(from, to)).unwrap_or_default();
        self.log(format!("release {from} -> {to} ({} messages)", q.len()));
        // What waited in the sender's queue goes to whichever process now
        // listens there (a restarted member's new connection).
        let life = self.members.get(&to).map(|m| m.life).unwrap_or(0);
        for (_, input) in q {
            self.send_net(from, to, life, input);
        }
    }

    pub fn heal(&mut self) {
        self.cut.clear();
        self.log("heal".into());
    }

    /// SIGSTOP for `d`.
    pub fn pause(&mut self, m: u64, d: Duration) {
        if let Some(mm) = self.members.get_mut(&m) {
            if mm.driver.is_some() && !mm.paused {
                mm.paused = true;
                let t = self.now + d;
                self.at(t, Ev::Resume(m));
                self.log(format!("pause {m} for {d:?}"));
            }
        }
    }

    /// kill -9: unwritten disk writes are lost.
    pub fn crash(&mut self, m: u64) {
        let Some(mm) = self.members.get_mut(&m) else { return };
        if mm.driver.is_none() {
            return;
        }
        mm.driver = None;
        mm.life += 1;
        mm.disk.lock().unwrap_or_else(|p| p.into_inner()).clear();
        mm.out.lock().unwrap_or_else(|p| p.into_inner()).clear();
        mm.inbox.clear();
        mm.paused = false;
        for c in self.clients.iter_mut() {
            if c.conn.as_ref().is_some_and(|x| x.0 == m) {
                c.conn = None;
                c.attached = false;
            }
        }
        // The others see its connections close.
        for o in 1..=self.opts.nodes {
            if o != m {
                self.deliver_now(o, Input::PeerGone(m));
            }
        }
        self.log(format!("crash {m}"));
    }

    pub fn restart(&mut self, m: u64) {
        if self.members.get(&m).is_some_and(|mm| mm.driver.is_none()) {
            self.boot(m);
            self.log(format!("restart {m}"));
        }
    }

    fn deliver_now(&mut self, to: u64, input: Input) {
        let life = self.members.get(&to).map(|m| m.life).unwrap_or(0);
        let now = self.now;
        self.at(now, Ev::Deliver { to, life, from: None, input: InputBox(input) });
    }

    // ------------------------------------------------------------ clients

    /// Adds a client that will create a session on `endpoints[0]` first.
    pub fn add_client(&mut self, name: &str, endpoints: Vec<u64>) -> usize {
        let i = self.clients.len();
        let now = self.now;
        self.clients.push(SimClient {
            name: name.into(),
            endpoints,
            ep: 0,
            conn: None,
            attached: false,
            session: 0,
            secret: Bytes::new(),
            timeout: Duration::from_millis(self.opts.session_ms as u64),
            liveness: None,
            pending: BTreeMap::new(),
            next_id: 1,
            last_keepalive: now,
            keepalive_retry: None,
            last_stale: now,
            alive: true,
            expired: false,
            last_zxid: 0,
            stale_poll: false,
            rule: ContactRule::Keepalives,
            last_keepalive_sent: None,
            any_answer: None,
            last_heard: now,
            states: Vec::new(),
        });
        self.at(now, Ev::ClientTick(i));
        i
    }

    pub fn client_state(&self, c: usize) -> &'static str {
        self.clients[c].state(self.now)
    }

    /// The member client `c` is connected to.
    pub fn client_member(&self, c: usize) -> Option<u64> {
        self.clients[c].conn.as_ref().map(|x| x.0)
    }

    fn client_send(&mut self, c: usize, body: request::Body, kind: Req) {
        let now = self.now;
        let cl = &mut self.clients[c];
        let Some((member, life, conn, _)) = cl.conn.as_ref() else { return };
        let (member, life, conn) = (*member, *life, *conn);
        let id = cl.next_id;
        cl.next_id += 1;
        cl.pending.insert(id, (kind, now));
        let req = Request { id, body: Some(body), ..Default::default() };
        self.send_net(CLIENT_NET + c as u64, member, life, Input::Client { conn, req });
    }

    fn client_connect(&mut self, c: usize) {
        let n = self.clients[c].endpoints.len();
        let member = self.clients[c].endpoints[self.clients[c].ep % n];
        self.clients[c].ep += 1;
        let Some(m) = self.members.get(&member) else { return };
        if m.driver.is_none() {
            return;
        }
        let life = m.life;
        let (tx, rx) = ConnTx::new(usize::MAX);
        let conn = self.next_conn;
        self.next_conn += 1;
        self.send_net(CLIENT_NET + c as u64, member, life, Input::ConnOpened { conn, tx });
        let cl = &mut self.clients[c];
        cl.conn = Some((member, life, conn, rx));
        cl.attached = false;
        cl.pending.clear();
        if cl.session == 0 {
            self.client_send(
                c,
                request::Body::CreateSession(CreateSessionReq { timeout_ms: self.opts.session_ms }),
                Req::Create,
            );
        } else {
            let a = AttachReq {
                session_id: cl.session,
                secret: cl.secret.clone(),
                last_zxid: cl.last_zxid,
                watches: Vec::new(),
            };
            self.client_send(c, request::Body::Attach(a), Req::Attach);
        }
    }

    fn client_drop_conn(&mut self, c: usize) {
        let (name, member) = (self.clients[c].name.clone(), self.client_member(c).unwrap_or(0));
        self.log(format!("client {name}: leaves member {member}"));
        if let Some((member, life, conn, _)) = self.clients[c].conn.take() {
            self.send_net(CLIENT_NET + c as u64, member, life, Input::ConnClosed { conn });
        }
        self.clients[c].attached = false;
        self.clients[c].pending.clear();
    }

    fn keepalive(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        cl.last_keepalive = self.now;
        cl.keepalive_retry = None;
        cl.pending.retain(|_, (k, _)| *k != Req::Keepalive);
        cl.last_keepalive_sent = Some(self.now);
        self.client_send(c, request::Body::Keepalive(KeepaliveReq {}), Req::Keepalive);
    }

    fn client_tick(&mut self, c: usize) {
        let now = self.now;
        self.note_state(c);
        let cl = &self.clients[c];
        if !cl.alive || cl.expired {
            return;
        }
        if let Some(l) = cl.liveness {
            // As the real client: Expired when no member answered anything
            // for three timeouts (otherwise only when told).
            if l.give_up(cl.last_heard, now) {
                self.clients[c].expired = true;
                self.note_state(c);
                return;
            }
        }
        if cl.conn.is_none() {
            self.client_connect(c);
            return;
        }
        if !cl.attached {
            // An attach or create that was never answered: move on.
            if cl.pending.values().any(|(_, t)| now.duration_since(*t) > cl.timeout / 2) {
                self.client_drop_conn(c);
            }
            return;
        }
        // The old client (ContactRule::AnyAnswer) moved only when its
        // connection went silent.
        let modern = cl.rule == ContactRule::Keepalives;
        let switch = modern && cl.liveness.is_some_and(|l| l.should_switch(now)) && cl.keepalive_retry.is_some();
        let stalled = cl
            .pending
            .values()
            .any(|(k, t)| modern && *k == Req::Keepalive && now.duration_since(*t) >= cl.timeout / KEEPALIVE_FRACTION);
        if switch || stalled {
            self.client_drop_conn(c);
            return;
        }
        let due = now.duration_since(cl.last_keepalive) >= cl.timeout / KEEPALIVE_FRACTION
            || cl.keepalive_retry.is_some_and(|t| now >= t);
        if due {
            self.keepalive(c);
        }
        let cl = &self.clients[c];
        if cl.stale_poll && now.duration_since(cl.last_stale) >= Duration::from_millis(50) {
            self.clients[c].last_stale = now;
            let r = ReadReq { path: "/".into(), stale: true, watch: None };
            self.client_send(c, request::Body::Get(r), Req::StaleRead);
        }
    }

    fn client_frames(&mut self, member: u64) {
        for c in 0..self.clients.len() {
            loop {
                let frame = match self.clients[c].conn.as_mut() {
                    Some((m, _, _, rx)) if *m == member => rx.try_recv().ok(),
                    _ => None,
                };
                let Some(frame) = frame else { break };
                if let Some(server_frame::Frame::Response(r)) = frame.frame {
                    self.client_response(c, r);
                }
            }
        }
    }

    fn client_response(&mut self, c: usize, r: baton_proto::Response) {
        let now = self.now;
        let code = ErrorCode::try_from(r.error).unwrap_or(ErrorCode::Internal);
        let cl = &mut self.clients[c];
        cl.last_zxid = cl.last_zxid.max(r.zxid);
        cl.last_heard = now;
        let Some((kind, sent)) = cl.pending.remove(&r.id) else { return };
        if kind != Req::StaleRead && code != ErrorCode::Ok || kind == Req::Attach {
            let (name, member) = (cl.name.clone(), cl.conn.as_ref().map(|x| x.0).unwrap_or(0));
            self.log(format!("client {name}: {kind:?} at member {member}: {code:?} {}", r.message));
        }
        let cl = &mut self.clients[c];
        if code == ErrorCode::Ok && cl.rule == ContactRule::AnyAnswer {
            cl.any_answer = Some(now);
        }
        match (kind, code) {
            (Req::Create, ErrorCode::Ok) => {
                if let Some(response::Body::CreateSession(cs)) = r.body {
                    cl.session = cs.session_id;
                    cl.secret = cs.secret;
                    cl.timeout = Duration::from_millis(cs.timeout_ms as u64);
                    cl.liveness = Some(Liveness::new(cl.timeout, sent));
                    cl.attached = true;
                    cl.last_keepalive = now;
                    let name = cl.name.clone();
                    let sid = cl.session;
                    self.log(format!("client {name}: session {sid}"));
                }
            }
            (Req::Create, _) => self.client_drop_conn(c),
            (Req::Attach, ErrorCode::Ok) => {
                cl.attached = true;
                self.keepalive(c);
            }
            (Req::Attach, ErrorCode::SessionExpired | ErrorCode::SessionMoved) => {
                cl.expired = true;
            }
            (Req::Attach, _) => self.client_drop_conn(c),
            (Req::Keepalive, ErrorCode::Ok) => {
                if let Some(l) = cl.liveness.as_mut() {
                    l.vouched(sent);
                }
            }
            (Req::Keepalive, ErrorCode::SessionExpired) => cl.expired = true,
            (Req::Keepalive, _) => cl.keepalive_retry = Some(now + Duration::from_millis(40)),
            (Req::StaleRead, _) => {}
        }
        self.note_state(c);
    }

    fn note_state(&mut self, c: usize) {
        let now = self.now;
        let s = self.clients[c].state(now);
        if self.clients[c].states.last().map(|x| x.1) != Some(s) {
            let t = self.elapsed();
            self.clients[c].states.push((t, s));
            let name = self.clients[c].name.clone();
            self.log(format!("client {name}: {s}"));
        }
    }

    // ------------------------------------------------------------ network

    fn send_net(&mut self, from: u64, to: u64, life: u64, input: Input) {
        if self.cut.contains(&(from, to)) {
            return;
        }
        if let Some(q) = self.held.get_mut(&(from, to)) {
            q.push((life, input));
            return;
        }
        let (lo, hi) = self.opts.net_delay_us;
        let delay = Duration::from_micros(self.rng.gen_range(lo..=hi));
        let last = self.last_delivery.get(&(from, to)).copied().unwrap_or(self.now);
        let t = (self.now + delay).max(last + Duration::from_micros(1));
        self.last_delivery.insert((from, to), t);
        self.at(t, Ev::Deliver { to, life, from: Some(from), input: InputBox(input) });
    }

    fn flush_member(&mut self, id: u64) {
        let Some(m) = self.members.get(&id) else { return };
        let out: Vec<(u64, PeerOut)> = std::mem::take(&mut *m.out.lock().unwrap_or_else(|p| p.into_inner()));
        for (to, msg) in out {
            if let PeerOut::Raft(m) = &msg {
                if m.get_msg_type() == raft::prelude::MessageType::MsgReadIndex {
                    if let Some(e) = m.entries.first() {
                        self.read_contexts.push((id, e.data.to_vec()));
                    }
                }
            }
            let life = self.members.get(&to).map(|m| m.life).unwrap_or(0);
            self.send_net(id, to, life, msg.into_input(id));
        }
        let m = self.members.get(&id).expect("member exists");
        let has_disk = !m.disk.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
        if has_disk && !m.disk_busy && !m.paused {
            let life = m.life;
            let (lo, hi) = self.opts.disk_delay_of.get(&id).copied().unwrap_or(self.opts.disk_delay_us);
            let t = self.now + Duration::from_micros(self.rng.gen_range(lo..=hi));
            self.members.get_mut(&id).expect("member exists").disk_busy = true;
            self.at(t, Ev::DiskDone(id, life));
        }
        self.client_frames(id);
        self.check_expiries(id);
    }

    /// The guarantee: at an applied expiry, no client of that session is
    /// Connected.
    fn check_expiries(&mut self, id: u64) {
        let Some(d) = self.members.get_mut(&id).and_then(|m| m.driver.as_mut()) else { return };
        let applied = d.take_expiries();
        for e in applied {
            if !self.expiries_seen.insert(e.index) {
                continue;
            }
            self.log(format!("member {id} applied expiry of {:?} at index {}", e.sessions, e.index));
            for sid in e.sessions {
                for c in 0..self.clients.len() {
                    if self.clients[c].session == sid && self.clients[c].state(self.now) == "Connected" {
                        let name = self.clients[c].name.clone();
                        let t = self.elapsed().as_secs_f64();
                        self.violations.push(format!(
                            "at {t:.3}s: session {sid} expired (index {}) while client {name} was Connected",
                            e.index
                        ));
                    }
                }
            }
        }
    }

    // ------------------------------------------------------------ running

    /// Runs every event up to `until`.
    pub fn run_until(&mut self, until: Instant) {
        while let Some(Reverse((t, seq))) = self.events.peek().copied() {
            if t > until {
                break;
            }
            self.events.pop();
            let Some(ev) = self.pending.remove(&seq) else { continue };
            self.now = self.now.max(t);
            self.step(ev);
        }
        self.now = self.now.max(until);
    }

    pub fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.run_until(until);
    }

    fn step(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Tick(id, life) => {
                let tick = Duration::from_millis(self.opts.tick_ms);
                let Some(m) = self.members.get_mut(&id) else { return };
                if m.life != life || m.driver.is_none() {
                    return;
                }
                self.at(now + tick, Ev::Tick(id, life));
                let m = self.members.get_mut(&id).expect("member exists");
                if m.paused {
                    return;
                }
                let d = m.driver.as_mut().expect("checked above");
                d.tick(now, true);
                if let Err(e) = d.end_turn(now) {
                    panic!("member {id}: {e}");
                }
                self.flush_member(id);
            }
            Ev::Deliver { to, life, from, input } => {
                if let Some(f) = from {
                    if self.cut.contains(&(f, to)) {
                        return; // lost in flight
                    }
                }
                if to >= CLIENT_NET {
                    return;
                }
                let Some(m) = self.members.get_mut(&to) else { return };
                if m.life != life || m.driver.is_none() {
                    return;
                }
                if m.paused {
                    m.inbox.push(input.0);
                    return;
                }
                let d = m.driver.as_mut().expect("checked above");
                d.handle(input.0, now);
                if let Err(e) = d.end_turn(now) {
                    panic!("member {to}: {e}");
                }
                self.flush_member(to);
            }
            Ev::DiskDone(id, life) => {
                let Some(m) = self.members.get_mut(&id) else { return };
                if m.life != life || m.driver.is_none() {
                    return;
                }
                m.disk_busy = false;
                if m.paused {
                    return; // resumed later: Resume reschedules
                }
                let job = m.disk.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                let mut built = None;
                let mut backed = None;
                if let Some(job) = job {
                    m.kv.write(job.batch, job.sync).expect("memory store writes");
                    if job.snapshot {
                        // The snapshot thread's view, taken before the next
                        // write; its answer comes some time later.
                        m.kv.with_view(&mut |view| built = Some(build_snapshot(view)));
                    }
                    if job.backup {
                        m.kv.with_view(&mut |view| backed = Some(build_backup(view)));
                    }
                    let d = m.driver.as_mut().expect("checked above");
                    d.on_persisted(Synced { number: job.number, after: job.after });
                    if let Err(e) = d.end_turn(now) {
                        panic!("member {id}: {e}");
                    }
                }
                if let Some(b) = built {
                    let t = now + Duration::from_millis(self.rng.gen_range(1..=300));
                    let input = InputBox(Input::SnapshotBuilt(Box::new(b)));
                    self.at(t, Ev::Deliver { to: id, life, from: None, input });
                }
                if let Some(b) = backed {
                    let t = now + Duration::from_millis(self.rng.gen_range(1..=300));
                    let input = InputBox(Input::BackupBuilt(Box::new(b)));
                    self.at(t, Ev::Deliver { to: id, life, from: None, input });
                }
                self.flush_member(id);
            }
            Ev::ClientTick(c) => {
                self.at(now + Duration::from_millis(10), Ev::ClientTick(c));
                self.client_tick(c);
            }
            Ev::Resume(id) => {
                let Some(m) = self.members.get_mut(&id) else { return };
                if !m.paused {
                    return;
                }
                m.paused = false;
                let mut inbox: VecDeque<Input> = std::mem::take(&mut m.inbox).into();
                self.log(format!("resume {id} ({} inputs queued)", inbox.len()));
                // The runtime's turns: up to `max_inputs_per_turn` inputs,
                // the overdue tick (told whether the queue was drained),
                // then the Ready.
                let per_turn = self.opts.max_inputs_per_turn.max(1);
                loop {
                    let Some(m) = self.members.get_mut(&id) else { return };
                    let Some(d) = m.driver.as_mut() else { return };
                    for _ in 0..per_turn {
                        match inbox.pop_front() {
                            Some(i) => d.handle(i, now),
                            None => break,
                        }
                    }
                    d.tick(now, inbox.is_empty());
                    if let Err(e) = d.end_turn(now) {
                        panic!("member {id}: {e}");
                    }
                    self.flush_member(id);
                    if inbox.is_empty() {
                        break;
                    }
                }
            }
        }
    }

    // ------------------------------------------------------------ raw requests

    /// Opens a connection to `member` that the test drives by hand.
    pub fn raw_conn(&mut self, member: u64) -> RawConn {
        self.raw_conn_as(member, &[])
    }

    /// [`Sim::raw_conn`] for a caller with `identities` (as if
    /// authenticated: `user:NAME`, `x509:CN`).
    pub fn raw_conn_as(&mut self, member: u64, identities: &[&str]) -> RawConn {
        let life = self.members.get(&member).map(|m| m.life).unwrap_or(0);
        let (tx, rx) = ConnTx::new(usize::MAX);
        for id in identities {
            tx.add_identity(id.to_string());
        }
        let conn = self.next_conn;
        self.next_conn += 1;
        self.send_net(CLIENT_NET + 999, member, life, Input::ConnOpened { conn, tx });
        RawConn { member, life, conn, rx, next_id: 1 }
    }

    /// Sends `body` on `rc` (writes get `seq` = the request id); returns
    /// the request id.
    pub fn raw_send(&mut self, rc: &mut RawConn, body: request::Body) -> u64 {
        let id = rc.next_id;
        rc.next_id += 1;
        let write = matches!(
            body,
            request::Body::Create(_) | request::Body::Set(_) | request::Body::Delete(_) | request::Body::Multi(_)
        );
        let req = Request { id, seq: if write { id } else { 0 }, body: Some(body), ..Default::default() };
        let life = self.members.get(&rc.member).map(|m| m.life).unwrap_or(0);
        if life != rc.life {
            return id; // the member restarted: this connection is gone
        }
        self.send_net(CLIENT_NET + 999, rc.member, rc.life, Input::Client { conn: rc.conn, req });
        id
    }

    /// Runs until request `id`'s answer on `rc` (at most `limit`).
    pub fn raw_wait(&mut self, rc: &mut RawConn, id: u64, limit: Duration) -> Option<baton_proto::Response> {
        let end = self.now + limit;
        loop {
            while let Ok(f) = rc.rx.try_recv() {
                if let Some(server_frame::Frame::Response(r)) = f.frame {
                    if r.id == id {
                        return Some(r);
                    }
                }
            }
            if self.now >= end {
                return None;
            }
            self.run_for(Duration::from_millis(1));
        }
    }

    /// [`Sim::raw_send`] then [`Sim::raw_wait`].
    pub fn raw_call(
        &mut self,
        rc: &mut RawConn,
        body: request::Body,
        limit: Duration,
    ) -> Option<baton_proto::Response> {
        let id = self.raw_send(rc, body);
        self.raw_wait(rc, id, limit)
    }

    /// The session id and secret of client `c`.
    pub fn client_session(&self, c: usize) -> (u64, Bytes) {
        (self.clients[c].session, self.clients[c].secret.clone())
    }

    // ------------------------------------------------------------ queries

    /// The live member raft-rs calls leader in the highest term.
    pub fn leader(&self) -> Option<u64> {
        self.members
            .values()
            .filter(|m| !m.paused)
            .filter_map(|m| m.driver.as_ref().map(|d| (d.raft_role(), m.id)))
            .filter(|((r, _), _)| *r == StateRole::Leader)
            .max_by_key(|((_, t), _)| *t)
            .map(|(_, id)| id)
    }

    /// Runs until some member leads (at most `limit`).
    pub fn await_leader(&mut self, limit: Duration) -> Option<u64> {
        let end = self.now + limit;
        while self.now < end {
            if let Some(l) = self.leader() {
                return Some(l);
            }
            self.run_for(Duration::from_millis(10));
        }
        self.leader()
    }

    /// Runs until client `c` has a session and is Connected (at most `limit`).
    pub fn await_connected(&mut self, c: usize, limit: Duration) -> bool {
        let end = self.now + limit;
        while self.now < end {
            if self.client_state(c) == "Connected" {
                return true;
            }
            self.run_for(Duration::from_millis(10));
        }
        false
    }

    /// `member`'s raft-rs role and term, and its applied index (None: not
    /// running).
    pub fn member_role(&self, member: u64) -> Option<(StateRole, u64, u64)> {
        let d = self.members.get(&member)?.driver.as_ref()?;
        let (role, term) = d.raft_role();
        Some((role, term, d.applied()))
    }

    /// The last index of `member`'s Raft log (None: not running).
    pub fn member_last_index(&self, member: u64) -> Option<u64> {
        Some(self.members.get(&member)?.driver.as_ref()?.last_index())
    }

    /// Every running member's state-machine dump, by member.
    pub fn dumps(&self) -> BTreeMap<u64, (u64, String)> {
        self.members.values().filter_map(|m| m.driver.as_ref().map(|d| (m.id, (d.applied(), d.dump())))).collect()
    }

    /// Whether `member` still has session `sid`.
    pub fn session_exists(&self, member: u64, sid: u64) -> bool {
        self.members.get(&member).and_then(|m| m.driver.as_ref()).is_some_and(|d| d.session_exists(sid))
    }

    /// The trace and violations, for a failure message.
    pub fn report(&self) -> String {
        let tail: Vec<&String> = self.trace.iter().rev().take(80).collect();
        let mut s = String::new();
        for l in tail.into_iter().rev() {
            s.push_str(l);
            s.push('\n');
        }
        for v in &self.violations {
            s.push_str("VIOLATION ");
            s.push_str(v);
            s.push('\n');
        }
        s
    }
}
