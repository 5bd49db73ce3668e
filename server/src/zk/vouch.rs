//! When a ZooKeeper connection may speak: the port's session rule, the
//! ZooKeeper-client counterpart of sessions.rs's (finding Z1).
//!
//! # Why the port needs its own rule
//! A native client counts only keepalives a quorum vouched for as contact
//! (client/src/liveness.rs). A ZooKeeper client cannot be taught that: the
//! Java client (`ClientCnxn`), kazoo and `zookeeper-client` reset their
//! read timeout on *any* packet and ping only when idle. So a member that
//! answers a client's reads from its own state keeps that client
//! `CONNECTED` for as long as it answers, even when the member is cut off
//! from its peers and the leader has expired the session and granted its
//! lock to someone else (the review saw 11 s of two holders). The member
//! must therefore decide, for every packet it writes, whether the client
//! may still believe in its session when it reads it.
//!
//! # The rule
//! The gateway sends its own keepalives for the connection's session and
//! keeps `v`, the instant it *sent* the latest one answered OK (answered
//! only once a quorum recorded the touch in the leader's term:
//! sessions.rs). It writes a packet (reply, notification, ping answer) at
//! `p` only while `p <= v + W` ([`window`]); otherwise the packet is held,
//! in order, until a newer keepalive is vouched for. Something held for
//! `T/3` closes the connection (the client reconnects elsewhere, at once,
//! instead of timing out): so no ping or reply is left hanging.
//!
//! # The margin (docs/guarantees.md states it beside the native one)
//! A ZooKeeper client that read a packet at `p + d` (delivery `d`) stays
//! `CONNECTED` at most `2T/3` of its clock after it, plus its reaction
//! `r` (Java: `readTimeout = 2/3 * negotiatedSessionTimeout`, reset on
//! every packet received; kazoo: a ping after `T/3` of silence and a drop
//! when the next `T/3` brings no answer; `zookeeper-client` 0.11: a drop
//! `2T/5` after the last packet, its connect timeout of 8 ticks of
//! `T/20`, when none is configured). No leader commits the expiry before `v + T` of its clock
//! (sessions.rs, rules 1-2). With clock rates within ρ = 10%:
//! `p + d + (2T/3)(1 + ρ) + r <= v + T / (1 + ρ)` holds when
//! `p - v <= T (1/1.1 - 2.2/3) - d - r = 0.1757 T - 40 ms` (d = r = 20 ms on
//! loopback and a LAN). At the 1 s minimum timeout that is 135 ms; at 4 s,
//! 663 ms; at 30 s, 5.2 s.
//!
//! # Keepalives
//! So that an idle but live client is never held up, the gateway renews
//! `v` every `W/3` ([`period`]) while the client has been heard from (any
//! packet) within `T/2`, and at once when something is held. A client that
//! is silent for `T/2` (paused, or gone) gets no keepalives from the
//! gateway, so its session expires as ZooKeeper's would, at most `T/2`
//! later than from its last packet. A keepalive refused (no leader, busy)
//! is retried after `W/3`; `SESSION_EXPIRED` closes the connection.
//!
//! Pure bookkeeping: time comes in as arguments, the connection acts on
//! the answers.

use std::time::{Duration, Instant};

/// Clock-rate difference between client and leader allowed for (10%).
const RHO: f64 = 0.10;
/// Delivery delay plus the client's reaction to its timer.
const SLACK: Duration = Duration::from_millis(40);
/// The shortest gap between two keepalives of one connection.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// How long after sending a keepalive that was vouched for a packet may
/// still be written (the module doc's `W`).
pub fn window(t: Duration) -> Duration {
    let f = 1.0 / (1.0 + RHO) - (2.0 / 3.0) * (1.0 + RHO);
    t.mul_f64(f).saturating_sub(SLACK)
}

/// How often the gateway renews its keepalive for a live client.
pub fn period(t: Duration) -> Duration {
    (window(t) / 3).max(MIN_PERIOD)
}

/// What a keepalive's answer means for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Vouched for: packets may go out until the new deadline.
    Vouched,
    /// Not vouched for (no leader, busy, a timeout): retried later.
    Refused,
    /// The session is gone: close.
    Expired,
}

/// One connection's keepalive state.
#[derive(Debug)]
pub struct Vouch {
    t: Duration,
    window: Duration,
    period: Duration,
    /// Send time of the latest keepalive answered OK.
    vouched: Option<Instant>,
    /// The client's latest packet.
    heard: Instant,
    /// The keepalive in flight: its id and send time.
    in_flight: Option<(u64, Instant)>,
    /// No keepalive before this (after a refusal).
    retry_at: Option<Instant>,
    /// Since when something has waited to be written.
    held_since: Option<Instant>,
}

impl Vouch {
    /// A connection whose session has timeout `t`, opened at `now`.
    pub fn new(t: Duration, now: Instant) -> Vouch {
        Vouch {
            t,
            window: window(t),
            period: period(t),
            vouched: None,
            heard: now,
            in_flight: None,
            retry_at: None,
            held_since: None,
        }
    }

    /// True when a packet may be written at `now`.
    pub fn may_send(&self, now: Instant) -> bool {
        self.vouched.is_some_and(|v| now <= v + self.window)
    }

    /// The client sent a packet at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.heard = now;
    }

    /// True when a keepalive should be sent at `now`: none is in flight,
    /// none was refused just now, the client was heard from within `T/2`,
    /// and the last vouched one is a period old, or something is held.
    pub fn due(&self, now: Instant) -> bool {
        self.in_flight.is_none()
            && self.retry_at.is_none_or(|r| now >= r)
            && now <= self.heard + self.t / 2
            && (self.vouched.is_none_or(|v| now >= v + self.period)
                || (self.held_since.is_some() && !self.may_send(now)))
    }

    /// Keepalive `id` was sent at `now`.
    pub fn sent(&mut self, id: u64, now: Instant) {
        self.in_flight = Some((id, now));
    }

    /// True when `id` is the keepalive in flight.
    pub fn is_mine(&self, id: u64) -> bool {
        self.in_flight.is_some_and(|(k, _)| k == id)
    }

    /// The answer to the keepalive in flight arrived at `now`.
    pub fn answered(&mut self, answer: Answer, now: Instant) {
        let Some((_, sent)) = self.in_flight.take() else { return };
        match answer {
            Answer::Vouched => {
                self.vouched = Some(self.vouched.map_or(sent, |v| v.max(sent)));
                self.retry_at = None;
            }
            Answer::Refused | Answer::Expired => self.retry_at = Some(now + self.period),
        }
    }

    /// Whether something waits to be written at `now`.
    pub fn holding(&mut self, held: bool, now: Instant) {
        match (held, self.held_since) {
            (true, None) => self.held_since = Some(now),
            (false, _) => self.held_since = None,
            _ => {}
        }
    }

    /// True when the connection must close: something has been held for
    /// `T/3` without a keepalive vouched for.
    pub fn must_close(&self, now: Instant) -> bool {
        self.held_since.is_some_and(|h| now >= h + self.t / 3)
    }

    /// When to look again: the next keepalive, the end of the window
    /// while something is held, or the close.
    /// Only instants still ahead count: one already past was acted on at
    /// the top of the loop (or cannot be, as a silent client's renewal),
    /// and must not make the connection spin.
    pub fn next_wake(&self, now: Instant) -> Instant {
        let candidates =
            [self.vouched.map(|v| v + self.period), self.retry_at, self.held_since.map(|h| h + self.t / 3)];
        candidates
            .into_iter()
            .flatten()
            .filter(|at| *at > now)
            .fold(now + self.period.max(Duration::from_millis(50)), Instant::min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(4);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_window_keeps_the_clients_timeout_inside_the_leaders() {
        for t in [1_000u64, 4_000, 10_000, 30_000, 60_000] {
            let t = ms(t);
            let w = window(t);
            // The module doc's inequality, in real time.
            let client_end = w + SLACK + t.mul_f64(2.0 / 3.0 * (1.0 + RHO));
            let leader_earliest = t.mul_f64(1.0 / (1.0 + RHO));
            assert!(client_end <= leader_earliest + ms(1), "T = {t:?}: {client_end:?} > {leader_earliest:?}");
            assert!(period(t) < w, "T = {t:?}: renewals slower than the window");
        }
        assert_eq!(window(ms(1000)).as_millis(), 135);
        assert_eq!(window(T).as_millis(), 663);
    }

    #[test]
    fn nothing_goes_out_before_a_keepalive_is_vouched_for_nor_after_its_window() {
        let t0 = Instant::now();
        let mut v = Vouch::new(T, t0);
        assert!(!v.may_send(t0));
        assert!(v.due(t0));
        v.sent(1, t0);
        assert!(!v.due(t0 + ms(5)), "one keepalive in flight at a time");
        v.answered(Answer::Vouched, t0 + ms(30));
        assert!(v.may_send(t0 + ms(30)));
        assert!(v.may_send(t0 + window(T)));
        assert!(!v.may_send(t0 + window(T) + ms(1)), "the window counts from the keepalive's send");
    }

    #[test]
    fn a_refused_keepalive_vouches_for_nothing_and_is_retried_after_a_period() {
        let t0 = Instant::now();
        let mut v = Vouch::new(T, t0);
        v.sent(1, t0);
        v.answered(Answer::Refused, t0 + ms(10));
        assert!(!v.may_send(t0 + ms(10)));
        assert!(!v.due(t0 + ms(20)));
        assert!(v.due(t0 + ms(10) + period(T)));
    }

    #[test]
    fn a_silent_client_gets_no_keepalives_after_half_its_timeout() {
        let t0 = Instant::now();
        let mut v = Vouch::new(T, t0);
        v.sent(1, t0);
        v.answered(Answer::Vouched, t0);
        assert!(v.due(t0 + period(T)));
        assert!(!v.due(t0 + T / 2 + ms(1)), "the gateway kept a silent client's session alive");
        v.heard(t0 + T);
        assert!(v.due(t0 + T));
    }

    #[test]
    fn a_silent_clients_connection_sleeps_instead_of_spinning() {
        let t0 = Instant::now();
        let mut v = Vouch::new(T, t0);
        v.sent(1, t0);
        v.answered(Answer::Vouched, t0);
        // Long after: no renewal is due (the client is silent), and the
        // next look is a period away, not at once.
        let later = t0 + T * 3;
        assert!(!v.due(later));
        assert!(v.next_wake(later) >= later + period(T).min(Duration::from_millis(50)));
    }

    #[test]
    fn something_held_asks_for_a_keepalive_and_closes_after_a_third_of_the_timeout() {
        let t0 = Instant::now();
        let mut v = Vouch::new(T, t0);
        v.sent(1, t0);
        v.answered(Answer::Vouched, t0);
        let late = t0 + window(T) + ms(1);
        v.heard(late);
        v.holding(true, late);
        assert!(v.due(late));
        v.sent(2, late);
        assert!(!v.must_close(late + T / 3 - ms(1)));
        assert!(v.must_close(late + T / 3));
        // Vouched in time: the held packets go, nothing closes.
        v.answered(Answer::Vouched, late + ms(20));
        assert!(v.may_send(late + ms(20)));
        v.holding(false, late + ms(20));
        assert!(!v.must_close(late + T));
    }
}
