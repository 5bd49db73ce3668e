//! Session liveness: who may say a session is alive, and when the leader
//! may expire it.
//!
//! # The rule
//! A member answers a keepalive with OK only after a quorum of voters has
//! recorded the touch in the current leader's term. A client counts only
//! such answers as contact, from the moment it *sent* the keepalive, and
//! leaves `Connected` 2/3 of its session timeout `T` after that moment
//! (`client/src/liveness.rs`). No leader expires a session earlier than `T`
//! after the last touch any member vouched for:
//!
//! 1. The leader that recorded the touch at `a` (after the client sent it
//!    at `s <= a`) keeps the deadline `a + T` on its monotonic clock.
//! 2. A leader that takes over was elected by a quorum, and that quorum
//!    shares a member with the quorum that acknowledged the touch. That
//!    member acknowledged in the old term, so it voted for the new leader
//!    later: the new leader's election happened after `s`. It starts every
//!    session at (its election + `T`), and lowers that to (the latest record
//!    a quorum reports + `T`) but not below (its election + `T/2`, time for
//!    the clients of a failed leader to find this one): some member of any
//!    quorum recorded the last vouched-for touch, so neither is before
//!    `s + T`.
//! 3. Expiry is proposed only by a member that is leader in raft-rs's live
//!    state (never the cached role, never forwarded), that has applied its
//!    term's first entry (so it knows every earlier expiry), whose input
//!    queue was drained this turn (touches that waited are counted), and not
//!    in the turn after a tick gap: a member that was paused (SIGSTOP, a VM
//!    stall) restarts every deadline instead of expiring from stale ones.
//!
//! So a leader change never shortens a session's life below what was
//! vouched for, and under leaderships shorter than `T` (but longer than
//! `T/2`) a dead client's session still expires: a new leader learns from
//! the reports when the session was last heard of.
//!
//! # The protocol
//! - Every request on a connection bound to a session touches it
//!   ([`Sessions::touch`]); a keepalive is one such request, sent every
//!   `T/3`. A session is created by a `NewSession` entry (its id is the
//!   entry's index); applying it records it ([`Sessions::created`]).
//! - Not yet applied is not expired: a member asked about a session it
//!   does not hold answers `SESSION_EXPIRED` only if the session's id is at
//!   or below its applied index (the session was made here and has ended);
//!   an id above it names a session made by an entry not applied here yet
//!   (another member applied it first, its fsync having come sooner), and
//!   the answer is `BUSY`, retry. One function decides ([`not_live`]) for
//!   a follower's keepalive, a leader's round and a write's route.
//! - Follower: a keepalive is refused `NO_LEADER` if the member has not
//!   heard from its leader within an election timeout, and
//!   `SESSION_EXPIRED` or `BUSY` as [`not_live`] says (driver/requests.rs
//!   `on_keepalive`). Otherwise it waits for the next touch forward
//!   (`Touch`, by batch number; sent at the end of the turn when a
//!   keepalive waits on it, else every 2 ticks) to be acknowledged
//!   (`TouchAck`) for *that* batch by the current leader. It is given up
//!   with `NO_LEADER` when the leader changes, when the member loses contact
//!   with it for an election timeout, or after two election timeouts.
//!   Other requests' sessions ride along with the forwards.
//! - Leader: touches (its own clients', forwarded ones) set the session's
//!   deadline to `now + T` and go into the next round: `Sync{term, round,
//!   ids}` to every voter, at the end of the turn when a keepalive, a
//!   forward or a report request waits on it, else every 2 ticks. A voter
//!   records the ids and answers `SyncAck` only while it is in that term
//!   with the sender as leader. A round acked by a quorum (the leader counts
//!   itself) answers its keepalives and acknowledges its forwards: `OK`;
//!   `SESSION_EXPIRED` or `BUSY` as [`not_live`] says (the leader applies
//!   an entry only once its own fsync is done, and the quorum's may come
//!   sooner, so a follower can serve a session the leader has not applied);
//!   `BUSY` if its expiry is proposed or while this leader has not applied
//!   its term's first entry.
//!   Rounds not acked are resent every 2 ticks and given up after two
//!   election timeouts (their keepalives get `NO_LEADER`).
//! - A new leader asks for reports in its rounds until a quorum has sent
//!   them; each is "session -> how long ago this member recorded it", with
//!   how long ago the member started.
//!
//! # Expiry
//! - Every tick the leader gives each session it has no deadline for one
//!   of `now + T`, and proposes one `ExpireSessions` entry for the sessions
//!   whose deadline passed and whose expiry it has not proposed already (or
//!   proposed longer than the request timeout ago), when rule 3 allows.
//! - Applying the entry on every member ends each listed session that
//!   still exists and deletes its ephemeral nodes in path order, with
//!   `NODE_DELETED` and `NODE_CHILDREN_CHANGED` events at the entry's index
//!   (state/mod.rs `end_session`); unknown ids are ignored. Apply does not ask
//!   whether the session was touched after the expiry was proposed: once the
//!   entry is in the log, the session ends.
//! - `close_session` is a client write that ends the session the same way,
//!   with a reply.
//!
//! Pure bookkeeping: time, the state machine and the configuration come in
//! as arguments; what to send or answer goes out as [`Effect`]s (effect.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use baton_proto::{ErrorCode, SessionAge};

use crate::effect::Effect;
use crate::message::{ConnId, PeerOut, Report};
use crate::state::{SessionState, StateMachine};

/// Ticks between background rounds (touches of requests other than
/// keepalives, which go at once).
const ROUND_EVERY_TICKS: u32 = 2;
/// Ticks between prunes of records of sessions that no longer exist.
const PRUNE_EVERY_TICKS: u64 = 100;

/// The voters of the current configuration (both halves while joint).
#[derive(Debug, Clone, Default)]
pub struct Voters {
    pub incoming: Vec<u64>,
    pub outgoing: Vec<u64>,
}

impl Voters {
    pub fn has_quorum(&self, acks: &BTreeSet<u64>) -> bool {
        let majority = |set: &[u64]| set.is_empty() || set.iter().filter(|v| acks.contains(v)).count() * 2 > set.len();
        !self.incoming.is_empty() && majority(&self.incoming) && majority(&self.outgoing)
    }

    /// The earliest instant `x` such that some quorum's members all have
    /// `at[m] <= x`: the smallest "latest record" over every quorum (None
    /// if the members in `at` hold no quorum). Every quorum shares a member
    /// with any other, so a touch some quorum recorded is at or before the
    /// latest record of *every* quorum, this one included.
    pub fn quorum_floor(&self, at: &BTreeMap<u64, Instant>) -> Option<Instant> {
        let half = |set: &[u64]| -> Option<Option<Instant>> {
            if set.is_empty() {
                return Some(None);
            }
            let mut v: Vec<Instant> = set.iter().filter_map(|m| at.get(m).copied()).collect();
            v.sort();
            let q = set.len() / 2 + 1;
            v.get(q - 1).map(|x| Some(*x))
        };
        if self.incoming.is_empty() {
            return None;
        }
        let a = half(&self.incoming)?;
        let b = half(&self.outgoing)?;
        a.max(b)
    }

    /// Every voter but `me`.
    pub fn others(&self, me: u64) -> BTreeSet<u64> {
        self.incoming.iter().chain(self.outgoing.iter()).copied().filter(|v| *v != me).collect()
    }
}

/// Timing the session layer needs from the member's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub tick: Duration,
    /// The (base) election timeout: rounds and follower keepalives give up
    /// after twice this.
    pub election: Duration,
    /// Grace for a new leader before expiring (0 only with the deliberate
    /// bug `expire-without-grace`).
    pub no_grace: bool,
    /// Deliberate bug `no-deadline-rebuild`: keep the fresh deadlines.
    pub no_rebuild: bool,
    /// Deliberate bug `not-yet-applied-expired`: the leader's round answers
    /// `SESSION_EXPIRED` for a session it has not applied yet.
    pub not_yet_applied_expired: bool,
}

/// The state of one member's session layer.
pub struct Sessions {
    me: u64,
    timing: Timing,
    /// When this member started: it has no records from before.
    booted: Instant,
    /// When this member last recorded activity of each session (a touch it
    /// saw as leader, a `Sync` from a leader, the session's creation).
    seen: BTreeMap<u64, Instant>,
    lead: Option<Lead>,
    /// Follower: sessions heard from since the last forward.
    touched: BTreeSet<u64>,
    /// Follower: number of the next forward.
    batch: u64,
    next_forward: Instant,
    /// Follower: keepalives waiting for their batch's acknowledgement.
    keepalives: Vec<Waiting>,
    ticks: u64,
}

struct Waiting {
    batch: u64,
    conn: ConnId,
    id: u64,
    sid: u64,
    since: Instant,
}

/// Leader-only state; dropped on stepping down.
struct Lead {
    term: u64,
    /// When this member learned it leads (deadlines start here).
    since: Instant,
    /// Index of the term's first entry: until it is applied, this leader
    /// may not know of expiries committed by earlier leaders.
    term_start: u64,
    deadlines: BTreeMap<u64, Instant>,
    /// Sessions whose expiry was proposed, with when.
    expiring: BTreeMap<u64, Instant>,
    /// Reports received: member -> its records as instants here.
    reports: BTreeMap<u64, Records>,
    rebuilt: bool,
    next_round: u64,
    open: Round,
    in_flight: BTreeMap<u64, Round>,
    last_round: Instant,
}

/// One member's records, converted to this member's clock (each instant
/// is at or after the true one: the report's transit time only adds).
#[derive(Clone)]
struct Records {
    booted: Instant,
    seen: BTreeMap<u64, Instant>,
}

impl Records {
    /// The latest this member can have vouched for `sid`: its record, or,
    /// lacking one, its start (what it knew before is lost).
    fn latest(&self, sid: u64) -> Instant {
        self.seen.get(&sid).copied().unwrap_or(self.booted)
    }
}

#[derive(Default)]
struct Round {
    ids: BTreeSet<u64>,
    acks: BTreeSet<u64>,
    /// This member's own keepalives: (conn, request id, session).
    local: Vec<(ConnId, u64, u64)>,
    /// Followers' forwards: (member, batch, sessions).
    forwards: Vec<(u64, u64, Vec<u64>)>,
    want_report: bool,
    started: Option<Instant>,
    sent: Option<Instant>,
}

impl Round {
    fn urgent(&self) -> bool {
        !self.local.is_empty() || !self.forwards.is_empty() || self.want_report
    }
}

/// The answer for a session this member does not hold, or `None` if it
/// holds it: `SESSION_EXPIRED` if it has ended here, `BUSY` if it was made
/// by an entry this member has not applied yet (see the module doc).
pub fn not_live(state: SessionState) -> Option<ErrorCode> {
    match state {
        SessionState::Live => None,
        SessionState::Gone => Some(ErrorCode::SessionExpired),
        SessionState::NotYetApplied => Some(ErrorCode::Busy),
    }
}

/// [`not_live`] with the message a client sees.
pub fn not_live_msg(sid: u64, state: SessionState) -> Option<(ErrorCode, String)> {
    let msg = match state {
        SessionState::Live => return None,
        SessionState::Gone => format!("session {sid:#x} expired"),
        SessionState::NotYetApplied => format!("session {sid:#x} is not yet applied on this member; retry"),
    };
    not_live(state).map(|code| (code, msg))
}

fn timeout_of(sm: &StateMachine, sid: u64) -> Option<Duration> {
    sm.session_timeout(sid).map(|t| Duration::from_millis(t as u64))
}

fn reply(conn: ConnId, id: u64, code: ErrorCode, msg: impl Into<String>) -> Effect {
    Effect::reply(conn, id, code, msg)
}

impl Sessions {
    pub fn new(me: u64, timing: Timing, now: Instant) -> Self {
        Sessions {
            me,
            timing,
            booted: now,
            seen: BTreeMap::new(),
            lead: None,
            touched: BTreeSet::new(),
            batch: 1,
            next_forward: now,
            keepalives: Vec::new(),
            ticks: 0,
        }
    }

    /// True if this leader proposed the session's expiry.
    pub fn is_expiring(&self, sid: u64) -> bool {
        self.lead.as_ref().is_some_and(|l| l.expiring.contains_key(&sid))
    }

    /// This member became leader of `term`; its first entry is `term_start`.
    pub fn become_leader(&mut self, term: u64, term_start: u64, now: Instant) -> Vec<Effect> {
        let out = self.drop_follower_keepalives("this member became leader; retry");
        self.touched.clear();
        let open = Round { want_report: true, ..Default::default() };
        self.lead = Some(Lead {
            term,
            since: now,
            term_start,
            deadlines: BTreeMap::new(),
            expiring: BTreeMap::new(),
            reports: BTreeMap::new(),
            rebuilt: false,
            next_round: 1,
            open,
            in_flight: BTreeMap::new(),
            last_round: now,
        });
        out
    }

    /// This member no longer leads (or its leader changed): nothing it was
    /// about to vouch for may be vouched for now.
    pub fn leader_changed(&mut self) -> Vec<Effect> {
        let mut out = self.drop_follower_keepalives("the leader changed; retry");
        if let Some(lead) = self.lead.take() {
            let rounds = lead.in_flight.into_values().chain(std::iter::once(lead.open));
            for r in rounds {
                for (conn, id, _) in r.local {
                    out.push(reply(conn, id, ErrorCode::NoLeader, "this member stopped leading; retry"));
                }
            }
        }
        out
    }

    fn drop_follower_keepalives(&mut self, why: &str) -> Vec<Effect> {
        self.keepalives.drain(..).map(|k| reply(k.conn, k.id, ErrorCode::NoLeader, why)).collect()
    }

    /// A request of session `sid` arrived (any kind): it is alive.
    pub fn touch(&mut self, sid: u64, sm: &StateMachine, now: Instant) {
        match self.lead.as_mut() {
            Some(lead) => {
                if let Some(t) = timeout_of(sm, sid) {
                    let d = lead.deadlines.entry(sid).or_insert(now + t);
                    *d = (*d).max(now + t);
                    lead.open.ids.insert(sid);
                    self.seen.insert(sid, now);
                }
            }
            None => {
                self.touched.insert(sid);
            }
        }
    }

    /// A keepalive of `sid` (known to exist locally) from `conn`.
    pub fn keepalive(&mut self, conn: ConnId, id: u64, sid: u64, sm: &StateMachine, now: Instant) {
        self.touch(sid, sm, now);
        match self.lead.as_mut() {
            Some(lead) => lead.open.local.push((conn, id, sid)),
            None => self.keepalives.push(Waiting { batch: self.batch, conn, id, sid, since: now }),
        }
    }

    /// A follower's forward. Ignored unless leading.
    pub fn on_touch(&mut self, from: u64, batch: u64, ids: Vec<u64>, sm: &StateMachine, now: Instant) {
        if self.lead.is_none() {
            return;
        }
        for sid in &ids {
            self.touch(*sid, sm, now);
        }
        if let Some(lead) = self.lead.as_mut() {
            lead.open.forwards.push((from, batch, ids));
        }
    }

    /// The leader acknowledged touch batch `batch` (`from_leader`: it came
    /// from the member this one follows). Answers exactly that batch's
    /// keepalives (finding S6).
    pub fn on_touch_ack(
        &mut self,
        from_leader: bool,
        batch: u64,
        expired: &[u64],
        expiring: &[u64],
        sm: &StateMachine,
    ) -> Vec<Effect> {
        if !from_leader {
            return Vec::new();
        }
        let (done, wait): (Vec<Waiting>, Vec<Waiting>) = self.keepalives.drain(..).partition(|k| k.batch == batch);
        self.keepalives = wait;
        done.into_iter()
            .map(|k| {
                if expired.contains(&k.sid) || !sm.session_exists(k.sid) {
                    reply(k.conn, k.id, ErrorCode::SessionExpired, format!("session {:#x} expired", k.sid))
                } else if expiring.contains(&k.sid) {
                    reply(k.conn, k.id, ErrorCode::Busy, "the leader cannot vouch for this session now; retry")
                } else {
                    reply(k.conn, k.id, ErrorCode::Ok, "")
                }
            })
            .collect()
    }

    /// A leader's `Sync`: record its sessions; acknowledge only while in
    /// `term` following `from` (`raft_term`, `raft_leader`: raft-rs's live
    /// state).
    #[allow(clippy::too_many_arguments)]
    pub fn on_sync(
        &mut self,
        from: u64,
        term: u64,
        round: u64,
        ids: &[u64],
        want_report: bool,
        raft_term: u64,
        raft_leader: u64,
        now: Instant,
    ) -> Option<Effect> {
        for sid in ids {
            self.seen.insert(*sid, now);
        }
        if raft_term != term || raft_leader != from {
            return None;
        }
        let report = want_report.then(|| self.report(now));
        Some(Effect::Send { to: from, out: PeerOut::SyncAck { term, round, report } })
    }

    /// This member's records, as ages.
    pub fn report(&self, now: Instant) -> Report {
        let age = |at: Instant| now.saturating_duration_since(at).as_millis() as u64;
        Report {
            boot_age_ms: age(self.booted),
            ages: self.seen.iter().map(|(sid, at)| SessionAge { session_id: *sid, age_ms: age(*at) }).collect(),
        }
    }

    /// A voter's `SyncAck`.
    #[allow(clippy::too_many_arguments)]
    pub fn on_sync_ack(
        &mut self,
        from: u64,
        term: u64,
        round: u64,
        report: Option<Report>,
        voters: &Voters,
        sm: &StateMachine,
        now: Instant,
    ) -> Vec<Effect> {
        let Some(lead) = self.lead.as_mut() else { return Vec::new() };
        if lead.term != term {
            return Vec::new();
        }
        if let Some(report) = report {
            let back = |ms: u64| now.checked_sub(Duration::from_millis(ms)).unwrap_or(now);
            let seen = report.ages.iter().map(|a| (a.session_id, back(a.age_ms))).collect();
            lead.reports.insert(from, Records { booted: back(report.boot_age_ms), seen });
        }
        let complete = match lead.in_flight.get_mut(&round) {
            Some(r) => {
                r.acks.insert(from);
                voters.has_quorum(&r.acks)
            }
            None => false,
        };
        let mut out = Vec::new();
        if complete {
            if let Some(r) = lead.in_flight.remove(&round) {
                out = self.complete(r, sm);
            }
        }
        self.maybe_rebuild(voters, sm);
        out
    }

    /// Lowers the fresh deadlines of a new leader to what a quorum's
    /// records allow (rule 2), once a quorum has reported. For each session
    /// the bound is the smallest, over every quorum of reporters, of that
    /// quorum's latest record (`Voters::quorum_floor`): a member that
    /// restarted and lost its records counts with its start instead.
    fn maybe_rebuild(&mut self, voters: &Voters, sm: &StateMachine) {
        if self.lead.as_ref().is_none_or(|l| l.rebuilt) {
            return;
        }
        let mine = Records { booted: self.booted, seen: self.seen.clone() };
        let Some(lead) = self.lead.as_mut() else { return };
        let mut reporters: BTreeSet<u64> = lead.reports.keys().copied().collect();
        reporters.insert(self.me);
        if !voters.has_quorum(&reporters) {
            return;
        }
        lead.rebuilt = true;
        if self.timing.no_rebuild || self.timing.no_grace {
            return;
        }
        let mut all = std::mem::take(&mut lead.reports);
        all.insert(self.me, mine);
        for (sid, t) in sm.sessions() {
            let t = Duration::from_millis(t as u64);
            let latest: BTreeMap<u64, Instant> = all.iter().map(|(m, r)| (*m, r.latest(sid))).collect();
            let Some(floor) = voters.quorum_floor(&latest) else { continue };
            let fresh = lead.since + t;
            let d = lead.deadlines.entry(sid).or_insert(fresh);
            // Never before what a quorum may have vouched for (floor + T);
            // and, for the clients of a failed leader that must first find
            // this one, never before half a timeout after this election.
            *d = (*d).min(floor + t).max(lead.since + t / 2);
        }
    }

    /// A round acknowledged by a quorum: answer what waited for it.
    fn complete(&mut self, r: Round, sm: &StateMachine) -> Vec<Effect> {
        let Some(lead) = self.lead.as_ref() else { return Vec::new() };
        let caught_up = sm.applied() >= lead.term_start;
        let planted = self.timing.not_yet_applied_expired;
        let verdict = |sid: u64| -> ErrorCode {
            let state = match sm.session_state(sid) {
                SessionState::NotYetApplied if planted => SessionState::Gone,
                s => s,
            };
            if !caught_up {
                ErrorCode::Busy
            } else if let Some(code) = not_live(state) {
                // NotYetApplied: a follower applied the NewSession entry
                // before this leader did (the leader applies only once its
                // own fsync is done). Not expired.
                code
            } else if lead.expiring.contains_key(&sid) {
                ErrorCode::Busy
            } else {
                ErrorCode::Ok
            }
        };
        let mut out = Vec::new();
        for (conn, id, sid) in r.local {
            let code = verdict(sid);
            let msg = match code {
                ErrorCode::Ok => String::new(),
                ErrorCode::SessionExpired => format!("session {sid:#x} expired"),
                _ => "the leader cannot vouch for this session now; retry".into(),
            };
            out.push(reply(conn, id, code, msg));
        }
        for (to, batch, ids) in r.forwards {
            let mut expired = Vec::new();
            let mut expiring = Vec::new();
            for sid in ids {
                match verdict(sid) {
                    ErrorCode::Ok => {}
                    ErrorCode::SessionExpired => expired.push(sid),
                    _ => expiring.push(sid),
                }
            }
            out.push(Effect::Send { to, out: PeerOut::TouchAck { batch, expired, expiring } });
        }
        out
    }

    /// End of a loop turn: send what is due. `leader`: the member this one
    /// follows (0: none known).
    pub fn flush(&mut self, leader: u64, voters: &Voters, sm: &StateMachine, now: Instant) -> Vec<Effect> {
        let me = self.me;
        let tick = self.timing.tick;
        let Some(lead) = self.lead.as_mut() else {
            // Follower: forward at once if a keepalive waits on this batch.
            let urgent = self.keepalives.iter().any(|k| k.batch == self.batch);
            // (`leader == me`: raft-rs already leads, this layer learns it
            // with the Ready's soft state; nothing to forward to.)
            if leader == 0 || leader == me || self.touched.is_empty() || !(urgent || now >= self.next_forward) {
                return Vec::new();
            }
            let ids: Vec<u64> = std::mem::take(&mut self.touched).into_iter().collect();
            let batch = self.batch;
            self.batch += 1;
            self.next_forward = now + tick * ROUND_EVERY_TICKS;
            return vec![Effect::Send { to: leader, out: PeerOut::Touch { ids, batch } }];
        };
        let due = now >= lead.last_round + tick * ROUND_EVERY_TICKS;
        if !(lead.open.urgent() || (due && !lead.open.ids.is_empty())) {
            return Vec::new();
        }
        let mut r = std::mem::take(&mut lead.open);
        r.want_report |= !lead.rebuilt;
        let number = lead.next_round;
        lead.next_round += 1;
        lead.last_round = now;
        r.acks.insert(me);
        r.started = Some(now);
        r.sent = Some(now);
        let mut out: Vec<Effect> = voters
            .others(me)
            .into_iter()
            .map(|to| Effect::Send {
                to,
                out: PeerOut::Sync {
                    term: lead.term,
                    round: number,
                    ids: r.ids.iter().copied().collect(),
                    want_report: r.want_report,
                },
            })
            .collect();
        if voters.has_quorum(&r.acks) {
            out.extend(self.complete(r, sm));
            self.maybe_rebuild(voters, sm);
        } else {
            lead.in_flight.insert(number, r);
        }
        out
    }

    /// Deliberate bug `keepalive-without-quorum`: complete every round at
    /// once, as a leader that trusted itself would.
    pub fn complete_all_now(&mut self, sm: &StateMachine) -> Vec<Effect> {
        let Some(lead) = self.lead.as_mut() else { return Vec::new() };
        let rounds: Vec<Round> = std::mem::take(&mut lead.in_flight).into_values().collect();
        let mut out = Vec::new();
        for r in rounds {
            out.extend(self.complete(r, sm));
        }
        out
    }

    /// Every tick: give up on old rounds and keepalives, resend rounds that
    /// wait, give sessions without a deadline a fresh one.
    /// `leader_alive`: this member heard from its leader within an
    /// election timeout (a follower's keepalives wait no longer than that).
    pub fn tick(&mut self, voters: &Voters, sm: &StateMachine, leader_alive: bool, now: Instant) -> Vec<Effect> {
        let give_up = self.timing.election * 2;
        // Records of sessions that ended without this member applying it
        // (a snapshot install) go now and then.
        self.ticks += 1;
        if self.ticks.is_multiple_of(PRUNE_EVERY_TICKS) {
            self.seen.retain(|sid, _| sm.session_exists(*sid));
        }
        let mut out = Vec::new();
        // A follower that lost its leader tells its clients at once, so
        // they look for the new one within its grace (T/2 after election).
        let (old, keep): (Vec<Waiting>, Vec<Waiting>) =
            self.keepalives.drain(..).partition(|k| !leader_alive || now.duration_since(k.since) > give_up);
        self.keepalives = keep;
        for k in old {
            out.push(reply(k.conn, k.id, ErrorCode::NoLeader, "the leader did not acknowledge in time; retry"));
        }
        let me = self.me;
        let no_grace = self.timing.no_grace;
        let tick = self.timing.tick;
        let Some(lead) = self.lead.as_mut() else { return out };
        let late: Vec<u64> = lead
            .in_flight
            .iter()
            .filter(|(_, r)| r.started.is_some_and(|s| now.duration_since(s) > give_up))
            .map(|(n, _)| *n)
            .collect();
        for n in late {
            if let Some(r) = lead.in_flight.remove(&n) {
                for (conn, id, _) in r.local {
                    out.push(reply(conn, id, ErrorCode::NoLeader, "no quorum confirmed this leader in time; retry"));
                }
            }
        }
        // Resend what a quorum has not acknowledged (a link may have
        // dropped it); duplicates are harmless.
        for (n, r) in lead.in_flight.iter_mut() {
            if r.sent.is_some_and(|s| now.duration_since(s) >= tick * ROUND_EVERY_TICKS) {
                r.sent = Some(now);
                for to in voters.others(me) {
                    if !r.acks.contains(&to) {
                        out.push(Effect::Send {
                            to,
                            out: PeerOut::Sync {
                                term: lead.term,
                                round: *n,
                                ids: r.ids.iter().copied().collect(),
                                want_report: r.want_report,
                            },
                        });
                    }
                }
            }
        }
        // Sessions this leader has no deadline for yet get a full timeout
        // from now (rule 2: never before this leader's election + T).
        for (sid, t) in sm.sessions() {
            let grace = if no_grace { Duration::ZERO } else { Duration::from_millis(t as u64) };
            lead.deadlines.entry(sid).or_insert(now + grace);
        }
        lead.deadlines.retain(|sid, _| sm.session_exists(*sid));
        lead.expiring.retain(|sid, _| sm.session_exists(*sid));
        // A new leader keeps asking for reports until a quorum has sent them.
        if !lead.rebuilt && lead.in_flight.values().all(|r| !r.want_report) {
            lead.open.want_report = true;
        }
        out
    }

    /// After a tick gap (this member was paused): restart every deadline
    /// from now rather than expire from stale ones (rule 3).
    pub fn restart_deadlines(&mut self, sm: &StateMachine, now: Instant) {
        if let Some(lead) = self.lead.as_mut() {
            for (sid, d) in lead.deadlines.iter_mut() {
                if let Some(t) = timeout_of(sm, *sid) {
                    *d = (*d).max(now + t);
                }
            }
        }
    }

    /// Sessions due for expiry (marked as expiring). The caller checks that
    /// it may expire at all (rule 3); `retry`: how long a proposed expiry
    /// waits before it is proposed again.
    pub fn due(&mut self, now: Instant, retry: Duration) -> Vec<u64> {
        let Some(lead) = self.lead.as_mut() else { return Vec::new() };
        let due: Vec<u64> = lead
            .deadlines
            .iter()
            .filter(|(sid, d)| **d <= now && lead.expiring.get(sid).is_none_or(|t| now.duration_since(*t) > retry))
            .map(|(sid, _)| *sid)
            .collect();
        for sid in &due {
            lead.expiring.insert(*sid, now);
        }
        due
    }

    /// The leader's first entry of its term is applied (rule 3's "knows
    /// every earlier expiry").
    pub fn caught_up(&self, applied: u64) -> bool {
        self.lead.as_ref().is_some_and(|l| applied >= l.term_start)
    }

    /// A session was created (applied): it is alive now.
    pub fn created(&mut self, sid: u64, timeout_ms: u32, now: Instant) {
        self.seen.insert(sid, now);
        if let Some(lead) = self.lead.as_mut() {
            lead.deadlines.insert(sid, now + Duration::from_millis(timeout_ms as u64));
        }
    }

    /// A session ended (applied): forget it.
    pub fn ended(&mut self, sid: u64) {
        self.seen.remove(&sid);
        self.touched.remove(&sid);
        if let Some(lead) = self.lead.as_mut() {
            lead.deadlines.remove(&sid);
            lead.expiring.remove(&sid);
        }
    }

    /// Forgets a closed connection's waiting keepalives.
    pub fn remove_conn(&mut self, conn: ConnId) {
        self.keepalives.retain(|k| k.conn != conn);
        if let Some(lead) = self.lead.as_mut() {
            for r in lead.in_flight.values_mut().chain(std::iter::once(&mut lead.open)) {
                r.local.retain(|(c, _, _)| *c != conn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_of_joint_configuration() {
        let v = Voters { incoming: vec![1, 2, 3], outgoing: vec![] };
        assert!(!v.has_quorum(&[1].into()));
        assert!(v.has_quorum(&[1, 3].into()));
        let j = Voters { incoming: vec![1, 2, 3], outgoing: vec![3, 4, 5] };
        assert!(!j.has_quorum(&[1, 2].into()));
        assert!(j.has_quorum(&[1, 3, 4].into()));
        assert_eq!(j.others(3), [1, 2, 4, 5].into());
    }

    fn timing() -> Timing {
        Timing {
            tick: Duration::from_millis(50),
            election: Duration::from_millis(500),
            no_grace: false,
            no_rebuild: false,
            not_yet_applied_expired: false,
        }
    }

    fn with_sessions(ids: &[u64]) -> StateMachine {
        use baton_proto::{command, Command, NewSession};
        let mut sm = StateMachine::new();
        for id in ids {
            let ns = NewSession { timeout_ms: 1000, secret: bytes::Bytes::from_static(b"s") };
            sm.apply(*id, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        }
        sm
    }

    /// The round of the `Sync` these effects send in `term`.
    fn sync_round(acts: &[Effect], term: u64) -> u64 {
        acts.iter()
            .find_map(|a| match a {
                Effect::Send { out: PeerOut::Sync { round, term: t, .. }, .. } if *t == term => Some(*round),
                _ => None,
            })
            .expect("a sync round")
    }

    fn answered(acts: &[Effect]) -> Vec<(u64, ErrorCode)> {
        acts.iter().filter_map(Effect::answered).collect()
    }

    /// Finding S6: a keepalive is answered only by the acknowledgement of
    /// the forward that carried it, never by a later one (its own may have
    /// been lost with a connection).
    #[test]
    fn a_follower_answers_a_keepalive_only_for_its_own_batch() {
        let t0 = Instant::now();
        let sm = with_sessions(&[1, 2]);
        let voters = Voters { incoming: vec![1, 2, 3], outgoing: vec![] };
        let mut s = Sessions::new(2, timing(), t0);
        s.keepalive(10, 100, 1, &sm, t0);
        let sent = s.flush(1, &voters, &sm, t0);
        assert!(matches!(&sent[..], [Effect::Send { to: 1, out: PeerOut::Touch { batch: 1, .. } }]), "{sent:?}");
        // Batch 1 is lost; session 2's keepalive goes in batch 2.
        s.keepalive(11, 200, 2, &sm, t0);
        let sent = s.flush(1, &voters, &sm, t0);
        assert!(matches!(&sent[..], [Effect::Send { to: 1, out: PeerOut::Touch { batch: 2, .. } }]), "{sent:?}");
        let acts = s.on_touch_ack(true, 2, &[], &[], &sm);
        assert_eq!(answered(&acts), vec![(200, ErrorCode::Ok)], "only batch 2's keepalive");
        // An ack from someone else than the leader answers nothing.
        assert!(s.on_touch_ack(false, 1, &[], &[], &sm).is_empty());
        // Batch 1's keepalive gives up with a retryable error, never OK.
        let acts = s.tick(&voters, &sm, true, t0 + Duration::from_secs(2));
        assert_eq!(answered(&acts), vec![(100, ErrorCode::NoLeader)]);
    }

    /// The leader answers a keepalive only once a quorum acknowledged the
    /// round that recorded it in its term.
    #[test]
    fn a_leader_answers_a_keepalive_after_a_quorum_recorded_it() {
        let t0 = Instant::now();
        let sm = with_sessions(&[1]);
        let voters = Voters { incoming: vec![1, 2, 3], outgoing: vec![] };
        let mut s = Sessions::new(1, timing(), t0);
        s.become_leader(5, 0, t0);
        s.keepalive(10, 100, 1, &sm, t0);
        let acts = s.flush(0, &voters, &sm, t0);
        assert!(answered(&acts).is_empty(), "not before a quorum: {acts:?}");
        let round = sync_round(&acts, 5);
        // An ack from an older term does not count.
        assert!(answered(&s.on_sync_ack(2, 4, round, None, &voters, &sm, t0)).is_empty());
        let acts = s.on_sync_ack(3, 5, round, None, &voters, &sm, t0);
        assert_eq!(answered(&acts), vec![(100, ErrorCode::Ok)]);
    }

    /// Not yet applied is not expired: a leader asked to vouch for a
    /// session above its applied index (a follower applied the NewSession
    /// entry first) answers BUSY; one at or below it that it does not hold
    /// is expired.
    #[test]
    fn a_session_not_yet_applied_is_busy_not_expired() {
        let t0 = Instant::now();
        let sm = with_sessions(&[1, 3]);
        assert_eq!(sm.session_state(1), SessionState::Live);
        assert_eq!(sm.session_state(2), SessionState::Gone);
        assert_eq!(sm.session_state(4), SessionState::NotYetApplied);
        let voters = Voters { incoming: vec![1, 2, 3], outgoing: vec![] };
        let mut s = Sessions::new(1, timing(), t0);
        s.become_leader(5, 0, t0);
        s.keepalive(10, 100, 1, &sm, t0);
        s.keepalive(11, 200, 2, &sm, t0);
        s.keepalive(12, 300, 4, &sm, t0);
        let acts = s.flush(0, &voters, &sm, t0);
        let round = sync_round(&acts, 5);
        let mut got = answered(&s.on_sync_ack(2, 5, round, None, &voters, &sm, t0));
        got.sort();
        assert_eq!(got, vec![(100, ErrorCode::Ok), (200, ErrorCode::SessionExpired), (300, ErrorCode::Busy)]);
        assert_eq!(not_live_msg(4, SessionState::NotYetApplied).map(|(c, _)| c), Some(ErrorCode::Busy));
    }

    /// A voter acknowledges a sync only in the sender's term, following it,
    /// but records the touches either way.
    #[test]
    fn a_voter_acks_only_its_leader_in_its_term() {
        let t0 = Instant::now();
        let mut s = Sessions::new(2, timing(), t0);
        assert!(s.on_sync(1, 5, 1, &[7], false, 6, 3, t0).is_none());
        assert!(s.on_sync(1, 5, 1, &[7], false, 5, 3, t0).is_none());
        assert!(s.on_sync(1, 5, 1, &[7], true, 5, 1, t0).is_some());
        let r = s.report(t0 + Duration::from_millis(30));
        assert_eq!(r.ages.len(), 1);
        assert_eq!(r.ages[0].age_ms, 30);
    }

    #[test]
    fn quorum_floor_is_the_best_quorums_latest_record() {
        let t0 = Instant::now();
        let at = |v: &[(u64, u64)]| -> BTreeMap<u64, Instant> {
            v.iter().map(|(m, s)| (*m, t0 + Duration::from_secs(*s))).collect()
        };
        let v = Voters { incoming: vec![1, 2, 3], outgoing: vec![] };
        // Member 3 restarted at 9: the quorum {1, 2} bounds it at 2.
        assert_eq!(v.quorum_floor(&at(&[(1, 1), (2, 2), (3, 9)])), Some(t0 + Duration::from_secs(2)));
        // Only two reports: the only quorum is those two.
        assert_eq!(v.quorum_floor(&at(&[(1, 1), (3, 9)])), Some(t0 + Duration::from_secs(9)));
        assert_eq!(v.quorum_floor(&at(&[(1, 1)])), None);
        let j = Voters { incoming: vec![1, 2, 3], outgoing: vec![3, 4, 5] };
        assert_eq!(j.quorum_floor(&at(&[(1, 1), (2, 2), (3, 3), (4, 7), (5, 8)])), Some(t0 + Duration::from_secs(7)));
    }
}
