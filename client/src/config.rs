//! How a client connects: endpoints, timeouts, TLS, a password user, a
//! namespace, and the retry policy.
//!
//! Retry rule: a request answered "not now" (no leader, busy, shutting
//! down, leader changed, timeout) is sent again after
//! [`RetryPolicy::delay`] of its attempt number, until its deadline
//! (`op_timeout`); a member that cannot be reached is left for the next one
//! after the same delay of the number of failed dials in a row. Delays grow
//! exponentially from `base` to `max`, with jitter so that many clients do
//! not retry in step. The reconnect delay is also capped at a sixth of the
//! session timeout: a session must find the new leader in time to survive a
//! failover.

use std::sync::Arc;
use std::time::Duration;

/// Default client-side deadline for one operation.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(15);

/// How long to wait between attempts (see the module doc). Built with
/// [`RetryPolicy::exponential`] or [`RetryPolicy::fixed`]; the fields can
/// be read, not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// The first delay.
    pub base: Duration,
    /// The largest delay.
    pub max: Duration,
    /// Pick each delay at random in [d/2, d] instead of exactly d.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    /// 20 ms doubling up to 1 s, with jitter.
    fn default() -> Self {
        RetryPolicy { base: Duration::from_millis(20), max: Duration::from_secs(1), jitter: true }
    }
}

impl RetryPolicy {
    /// Doubling from `base` up to `max`, with jitter.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        RetryPolicy { base, max: max.max(base), jitter: true }
    }

    /// The same delays, each exactly as computed (no jitter).
    pub fn without_jitter(self) -> Self {
        RetryPolicy { jitter: false, ..self }
    }

    /// The same delay every time, no jitter.
    pub fn fixed(delay: Duration) -> Self {
        RetryPolicy { base: delay, max: delay, jitter: false }
    }

    /// The delay before attempt `attempt + 1` (attempt 0 is the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let d = self.base.saturating_mul(1u32 << attempt.min(20)).min(self.max);
        if !self.jitter || d.is_zero() {
            return d;
        }
        let half = d / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

/// How to connect: built with [`ClientConfig::new`] and its builder
/// methods (`ClientConfig::new(eps).session_timeout(..).tls(..)`); the
/// fields are private, so a new setting is never a breaking change.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of the members' client ports.
    pub(crate) endpoints: Vec<String>,
    /// Requested session timeout (the server clamps it to its min/max).
    pub(crate) session_timeout: Duration,
    /// Deadline for each operation, retries included.
    pub(crate) op_timeout: Duration,
    /// Deadline for one TCP connect (+ TLS handshake) to a member.
    pub(crate) connect_timeout: Duration,
    /// TLS to the members' client ports (None: plaintext).
    pub(crate) tls: Option<ClientTls>,
    /// User and password to `auth` with on every connection (identity
    /// `user:<name>`; see server/src/acl.rs). Use TLS: the password travels.
    pub(crate) auth: Option<(String, String)>,
    /// Every path is under this node ("" for none; see [`crate::namespace`]).
    pub(crate) namespace: String,
    /// Delays between retries and reconnects.
    pub(crate) retry: RetryPolicy,
    /// Events one watcher may hold unread before it is ended with
    /// [`crate::WatchEnd::Overflow`] (the client never blocks on a slow
    /// reader and never buffers without bound).
    pub(crate) watch_buffer: usize,
    /// Open a new session after one expires (renew.rs).
    pub(crate) renew_session: bool,
}

/// TLS settings for the client port: the CA that signed the members'
/// certificates and, when members require client certificates, this
/// client's certificate and key (PEM files). A member is verified for the
/// host of its endpoint (a DNS name or an IP address in its certificate).
#[derive(Clone)]
pub struct ClientTls {
    pub(crate) config: Arc<baton_proto::tls::rustls::ClientConfig>,
}

impl ClientTls {
    /// Loads the CA and, optionally, this client's certificate and key.
    pub fn load(
        ca: &std::path::Path,
        cert_key: Option<(&std::path::Path, &std::path::Path)>,
    ) -> std::result::Result<Self, baton_proto::tls::TlsError> {
        Ok(ClientTls { config: baton_proto::tls::client_config(ca, cert_key)? })
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientConfig {
    /// Defaults: 10 s sessions, 15 s operations, 2 s connects, plaintext.
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            session_timeout: Duration::from_secs(10),
            op_timeout: DEFAULT_OP_TIMEOUT,
            connect_timeout: Duration::from_secs(2),
            tls: None,
            auth: None,
            namespace: String::new(),
            retry: RetryPolicy::default(),
            watch_buffer: 1024,
            renew_session: false,
        }
    }
    /// Authenticate as a password user on every connection.
    pub fn auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Some((user.into(), password.into()));
        self
    }
    /// Use TLS (`None`: plaintext, the default).
    pub fn tls(mut self, tls: impl Into<Option<ClientTls>>) -> Self {
        self.tls = tls.into();
        self
    }
    /// The session timeout to ask for.
    pub fn session_timeout(mut self, d: Duration) -> Self {
        self.session_timeout = d;
        self
    }
    /// The deadline of each operation, retries included.
    pub fn op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = d;
        self
    }
    /// The deadline of one connect to one member.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }
    /// Every path under `ns` (chroot).
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }
    /// Delays between retries and reconnects.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }
    /// After the session expires, open a new one instead of failing every
    /// call from then on (default: off). What the old session held stays
    /// lost; the rules are in `renew.rs` and docs/recipes.md.
    pub fn renew_session(mut self, on: bool) -> Self {
        self.renew_session = on;
        self
    }
    /// The endpoints this configuration connects to.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
    /// Events a watcher may hold unread.
    pub fn watch_buffer(mut self, n: usize) -> Self {
        self.watch_buffer = n.max(1);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_jitter_stays_within_half() {
        let p = RetryPolicy::exponential(Duration::from_millis(10), Duration::from_millis(70)).without_jitter();
        let d: Vec<u128> = (0..5).map(|a| p.delay(a).as_millis()).collect();
        assert_eq!(d, [10, 20, 40, 70, 70]);
        let j = RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..100 {
            let d = j.delay(1);
            assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(200), "{d:?}");
        }
        assert_eq!(RetryPolicy::fixed(Duration::from_millis(40)).delay(9), Duration::from_millis(40));
        assert!(RetryPolicy::default().delay(u32::MAX) <= Duration::from_secs(1));
    }
}
