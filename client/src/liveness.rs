//! When a client may call itself `Connected`: the client half of the
//! session rule (the server half is `server/src/sessions.rs`).
//!
//! # The rule
//! - Only a keepalive answered OK proves the session alive: the server
//!   answers it only after a quorum recorded the touch in the current
//!   leader's term. Nothing else counts: not stale reads, status, watch
//!   registrations, watch events or an attach, which a member can answer
//!   from its own state while cut off from the leader; not writes or
//!   linearizable reads either (they prove a leader, not that the session's
//!   deadline moved).
//! - The proof dates from when the keepalive was *sent* (the server cannot
//!   have recorded it earlier), and lasts [`CONNECTED_FRACTION`] of the
//!   session timeout `T`: `Connected` ends at `sent + 2T/3`.
//! - No leader expires the session before `sent + T` (server rule), so the
//!   client is `Suspended` for at least `T/3` before the cluster can commit
//!   the expiry. That margin absorbs clock-rate differences between the
//!   client and the leader (docs/guarantees.md derives the bound: up to 10%
//!   with the 1,000 ms minimum session timeout) and the client's reaction
//!   time.
//! - From `sent + 2T/3` on, another session may hold what this one holds:
//!   on one clock the expiry cannot commit before `sent + T`, but a client
//!   clock up to 10% slow against a leader's up to 10% fast closes most of
//!   that gap. So anything that rides out a `Suspended` session (a lock's
//!   `may_be_taken`, `baton lock --on-suspend wait`) stops there too
//!   ([`Liveness::connected_until`]), never at `sent + T`, which on the
//!   client's clock can come after the expiry in real time.
//! - With no proof for a whole `T`, the session may be expired (a leader may
//!   have expired it) even on one clock ([`Liveness::presumed_lost`]). The
//!   client still reports `Suspended`,
//!   not `Expired`, until a member says so, or none answers anything for
//!   [`GIVE_UP_TIMEOUTS`] timeouts: a new leader gives sessions at least `T/2`
//!   after its election, so a slow failover may well have kept it, and
//!   declaring it dead early only loses it.
//!
//! Pure arithmetic on instants; the session actor and the simulator's
//! client both use it.

use std::time::{Duration, Instant};

/// `Connected` lasts this fraction of the session timeout after the send
/// time of the last vouched keepalive (numerator, denominator).
pub const CONNECTED_FRACTION: (u32, u32) = (2, 3);

/// A keepalive goes out every `T / KEEPALIVE_FRACTION` (seed 000: TTL/3).
pub const KEEPALIVE_FRACTION: u32 = 3;

/// With no answer of any kind from any member for this many session
/// timeouts (and no proof for longer than one), the client gives the
/// session up as `Expired` on its own.
pub const GIVE_UP_TIMEOUTS: u32 = 3;

/// What one client knows about its session's life.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    timeout: Duration,
    /// Send time of the latest request the cluster vouched for.
    proven: Instant,
}

impl Liveness {
    /// A session just created: the create request was sent at `sent` (the
    /// leader started the session's deadline when it applied it, later).
    pub fn new(timeout: Duration, sent: Instant) -> Self {
        Liveness { timeout, proven: sent }
    }

    /// The session timeout the server granted.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A keepalive sent at `sent` was answered OK.
    pub fn vouched(&mut self, sent: Instant) {
        self.proven = self.proven.max(sent);
    }

    /// The send time of the latest vouched keepalive.
    pub fn proven(&self) -> Instant {
        self.proven
    }

    /// `Connected` until this instant.
    pub fn connected_until(&self) -> Instant {
        self.proven + self.timeout * CONNECTED_FRACTION.0 / CONNECTED_FRACTION.1
    }

    /// True before [`Liveness::connected_until`].
    pub fn connected(&self, now: Instant) -> bool {
        now < self.connected_until()
    }

    /// Half the timeout without proof: the member in use cannot vouch
    /// (cut off, or no leader); try another.
    pub fn should_switch(&self, now: Instant) -> bool {
        now >= self.switch_at()
    }

    /// When [`Liveness::should_switch`] becomes true.
    pub fn switch_at(&self) -> Instant {
        self.proven + self.timeout / 2
    }

    /// A whole timeout without proof: the cluster may have expired it.
    pub fn presumed_lost(&self, now: Instant) -> bool {
        now >= self.proven + self.timeout
    }

    /// Give the session up: no proof for a whole timeout, and no member
    /// has answered anything since `heard` for [`GIVE_UP_TIMEOUTS`] timeouts.
    pub fn give_up(&self, heard: Instant, now: Instant) -> bool {
        now >= self.give_up_at(heard)
    }

    /// When [`Liveness::give_up`] becomes true if nothing is heard after `heard`.
    pub fn give_up_at(&self, heard: Instant) -> Instant {
        (self.proven + self.timeout).max(heard + self.timeout * GIVE_UP_TIMEOUTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connected_for_two_thirds_of_the_timeout_after_the_send() {
        let t0 = Instant::now();
        let t = Duration::from_millis(3000);
        let mut l = Liveness::new(t, t0);
        assert!(l.connected(t0 + Duration::from_millis(1999)));
        assert!(!l.connected(t0 + Duration::from_millis(2000)));
        // Vouched later: extended from the send time, not the answer's.
        l.vouched(t0 + Duration::from_millis(1000));
        assert_eq!(l.connected_until(), t0 + Duration::from_millis(3000));
        // An older proof never shortens it.
        l.vouched(t0 + Duration::from_millis(500));
        assert_eq!(l.connected_until(), t0 + Duration::from_millis(3000));
        assert!(!l.should_switch(t0 + Duration::from_millis(2400)));
        assert!(l.should_switch(t0 + Duration::from_millis(2500)));
        assert!(!l.presumed_lost(t0 + Duration::from_millis(3999)));
        assert!(l.presumed_lost(t0 + Duration::from_millis(4000)));
    }
}
