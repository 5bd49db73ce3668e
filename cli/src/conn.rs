//! How the CLI reaches the cluster: endpoints, TLS, a password user, the
//! dial and command timeouts, connecting, and saying why nothing answered.
//!
//! Fail fast and clearly:
//! - a malformed address (not `HOST:PORT`, a bad port, a scheme) is a usage
//!   error before anything is dialled;
//! - [`Conn::reach`] dials every endpoint at once (TCP only, within
//!   `--dial-timeout`) before a command starts: when none accepts, the
//!   error lists each endpoint and why, instead of retrying until the
//!   command timeout;
//! - when the cluster could not serve in time later on ([`Error::Unavailable`],
//!   which names only the last member the client library tried),
//!   [`Conn::explain`] asks every endpoint for its status and lists the
//!   answers;
//! - while a session is being opened (every write, `lock`, `elect`), a
//!   quorum watch ([`Conn::quorum_lost`]) looks at the cluster after
//!   [`QUORUM_GRACE`] and then every [`QUORUM_LOOK`]: when two looks in a
//!   row find that the members that answer are fewer than a majority of
//!   the voters they name and none of them sees a leader, the command
//!   stops with exit 5 ("no quorum", each member and what it said) instead
//!   of waiting out `--command-timeout`. Nothing was applied: no session
//!   existed, so no request was sent. Once a session exists the watch is
//!   over; a write that then gets no answer is ambiguous (exit 3), as
//!   before. A linearizable sessionless read (`get`, `ls`, `stat` without
//!   `--stale`) runs under the same watch for its whole life ([`Conn::read`]):
//!   it writes nothing, so stopping it is always safe.
//!
//! It does not retry on its own: the client library does, within
//! `--command-timeout`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use baton_client::{admin, member_status_with, Client, ClientConfig, ClientTls, Error, Reader, DEFAULT_ENDPOINTS};
use clap::Args;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::{parse_duration, Fail};

/// `--command-timeout` when not given: each operation's deadline, retries
/// included.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// `--command-timeout` when not given, for membership changes (a change
/// waits for a learner to catch up or a joint configuration to be left).
pub const DEFAULT_CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long closing the session may take at exit (best effort: the session
/// expires on its own otherwise).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// The quorum watch's first look, after an election's worth of time.
pub const QUORUM_GRACE: Duration = Duration::from_secs(1);
/// Between the quorum watch's looks.
pub const QUORUM_LOOK: Duration = Duration::from_millis(500);

/// The flags every command takes.
#[derive(Args, Debug)]
#[command(next_help_heading = "Global options")]
pub struct ConnFlags {
    /// Members' client addresses, HOST:PORT, comma-separated (host names
    /// and [IPv6] addresses work); one is enough to find the others.
    #[arg(long, env = "BATON_ENDPOINTS", default_value = DEFAULT_ENDPOINTS, global = true,
          value_parser = parse_endpoints, value_name = "HOST:PORT,...")]
    endpoints: Endpoints,
    /// How long connecting to one member may take (TCP, TLS and the
    /// session's creation), and how long a member has to answer `status`,
    /// `health` and `member list` (all are asked at once).
    #[arg(long, default_value = "2s", value_parser = parse_duration, global = true, value_name = "DURATION")]
    dial_timeout: Duration,
    /// Deadline of each operation, retries included [default: 10s; 30s for
    /// membership changes].
    #[arg(long, value_parser = parse_duration, global = true, value_name = "DURATION")]
    command_timeout: Option<Duration>,
    /// TLS: the CA that signed the members' certificates (PEM). Turns TLS on.
    #[arg(long, env = "BATON_CACERT", global = true, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// TLS: this client's certificate (PEM), for members that require one.
    #[arg(long, env = "BATON_CERT", global = true, requires = "key", value_name = "FILE")]
    cert: Option<PathBuf>,
    /// TLS: the private key of --cert (PEM).
    #[arg(long, env = "BATON_KEY", global = true, requires = "cert", value_name = "FILE")]
    key: Option<PathBuf>,
    /// Authenticate as this password user (identity `user:NAME`).
    #[arg(long, env = "BATON_USER", global = true, requires = "password", value_name = "NAME")]
    user: Option<String>,
    /// The password of --user (prefer the environment variable).
    #[arg(long, env = "BATON_PASSWORD", global = true, hide_env_values = true)]
    password: Option<String>,
}

/// A checked, non-empty list of `HOST:PORT` addresses.
#[derive(Debug, Clone)]
pub struct Endpoints(Vec<String>);

/// `--endpoints`: comma-separated addresses, each checked by [`parse_addr`].
fn parse_endpoints(s: &str) -> Result<Endpoints, String> {
    let list: Vec<String> = baton_client::parse_endpoints(s).iter().map(|e| parse_addr(e)).collect::<Result<_, _>>()?;
    if list.is_empty() {
        return Err("no endpoints (give HOST:PORT,...)".into());
    }
    Ok(Endpoints(list))
}

/// One `HOST:PORT` address: a host name, an IPv4 address or a bracketed
/// IPv6 address, and a port from 1 to 65535.
pub fn parse_addr(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.contains("://") {
        return Err(format!("`{s}`: drop the scheme, the address is HOST:PORT (e.g. localhost:7101)"));
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("`{s}` is not HOST:PORT (e.g. localhost:7101)"));
    };
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let host_ok = match bare {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)),
    };
    if !host_ok {
        let hint = if host.contains(':') { " (an IPv6 address goes in brackets: [::1]:7101)" } else { "" };
        return Err(format!("`{s}`: bad host `{host}`{hint}"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(s.to_string()),
        _ => Err(format!("`{s}`: bad port `{port}` (a number from 1 to 65535)")),
    }
}

/// Everything needed to reach the cluster, from the global flags.
pub struct Conn {
    pub endpoints: Vec<String>,
    tls: Option<ClientTls>,
    auth: Option<(String, String)>,
    pub dial_timeout: Duration,
    /// None: [`DEFAULT_COMMAND_TIMEOUT`] (or [`DEFAULT_CHANGE_TIMEOUT`]).
    command_timeout: Option<Duration>,
}

impl Conn {
    /// Loads the TLS files once.
    pub fn new(f: &ConnFlags) -> anyhow::Result<Conn> {
        let cert_key = f.cert.as_deref().zip(f.key.as_deref());
        let tls = match (&f.cacert, cert_key) {
            (Some(ca), ck) => {
                Some(ClientTls::load(ca, ck).map_err(|e| anyhow::anyhow!("TLS (--cacert, --cert, --key): {e}"))?)
            }
            (None, Some(_)) => {
                return Err(crate::usage("--cert needs --cacert (the CA that signed the members' certificates)"))
            }
            (None, None) => None,
        };
        Ok(Conn {
            endpoints: f.endpoints.0.clone(),
            tls,
            auth: f.user.clone().zip(f.password.clone()),
            dial_timeout: f.dial_timeout,
            command_timeout: f.command_timeout,
        })
    }

    /// The client configuration for these endpoints (`endpoints` reordered
    /// or narrowed by the caller if it likes).
    pub fn config_for(&self, endpoints: Vec<String>) -> ClientConfig {
        let cfg = ClientConfig::new(endpoints)
            .op_timeout(self.command_timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT))
            .connect_timeout(self.dial_timeout)
            .tls(self.tls.clone());
        match &self.auth {
            Some((user, password)) => cfg.auth(user, password),
            None => cfg,
        }
    }

    pub fn config(&self) -> ClientConfig {
        self.config_for(self.endpoints.clone())
    }

    /// For membership changes: a longer default deadline.
    pub fn change_config(&self) -> ClientConfig {
        self.config().op_timeout(self.command_timeout.unwrap_or(DEFAULT_CHANGE_TIMEOUT))
    }

    /// Runs `f` on a new session (with `timeout`, if given: how long after
    /// this process dies its locks are freed), then closes the session
    /// whatever `f` returned: its ephemeral nodes (a held lock, a waiter's
    /// queue node) go at once instead of after a session timeout.
    pub async fn session<T>(
        &self,
        timeout: Option<Duration>,
        f: impl AsyncFnOnce(&Client) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let mut cfg = self.config();
        if let Some(t) = timeout {
            cfg = cfg.session_timeout(t);
        }
        let c = tokio::select! {
            c = Client::connect_with(cfg) => c?,
            lost = self.quorum_lost() => return Err(lost),
        };
        // The cluster keeps session timeouts within its bounds: say so when
        // it changed the one asked for.
        if let Some(asked) = timeout {
            let granted = c.session_timeout();
            if granted.as_millis() != asked.as_millis() {
                eprintln!(
                    "baton: --session-timeout {} was clamped to {} by the cluster (its --min-session-ms and --max-session-ms)",
                    crate::human(asked),
                    crate::human(granted)
                );
            }
        }
        let r = f(&c).await;
        close(&c).await;
        r
    }

    /// Runs a sessionless read under the quorum watch (a linearizable read
    /// without a quorum stops like a session command, exit 5, instead of
    /// waiting out `--command-timeout` on a member that hangs); a `--stale`
    /// read needs no quorum and runs alone.
    pub async fn read<T>(
        &self,
        stale: bool,
        read: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        if stale {
            return read.await;
        }
        tokio::select! {
            r = read => r,
            lost = self.quorum_lost() => Err(lost),
        }
    }

    /// Sessionless reads (`get`, `ls`, `stat`) with these flags.
    pub fn reader(&self) -> anyhow::Result<Reader> {
        Ok(Reader::new(self.config())?)
    }

    /// Ok as soon as one endpoint accepts a TCP connection; otherwise every
    /// endpoint and why it did not, after at most `--dial-timeout`.
    pub async fn reach(&self) -> anyhow::Result<()> {
        let dial = self.dial_timeout;
        let mut probes: FuturesUnordered<_> = self
            .endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| async move { (i, tokio::time::timeout(dial, baton_proto::net::connect(e.as_str())).await) })
            .collect();
        let mut tried = Vec::new();
        while let Some((i, r)) = probes.next().await {
            let why = match r {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no connection within {} (--dial-timeout)", crate::human(dial)),
            };
            tried.push((i, why));
        }
        tried.sort();
        let summary = format!("no member answered ({} endpoints tried):", tried.len());
        let endpoints = tried.into_iter().map(|(i, why)| (self.endpoints[i].clone(), why)).collect();
        Err(Fail::Unavailable { summary, endpoints }.into())
    }

    /// Resolves, with the error to show, once two looks in a row find no
    /// quorum (module doc); never otherwise.
    pub async fn quorum_lost(&self) -> anyhow::Error {
        tokio::time::sleep(QUORUM_GRACE).await;
        let mut lost_before = false;
        loop {
            let cfg = self.config();
            let known = admin::members(&cfg).await.ok();
            let all = admin::all_endpoints(&self.endpoints, known.as_ref());
            let answers = admin::statuses(&cfg, &all).await;
            let (mut answered, mut voters, mut leader) = (BTreeSet::new(), BTreeSet::new(), false);
            for s in answers.iter().flatten() {
                answered.insert(s.id);
                voters.extend(s.voters.iter().copied());
                leader |= s.leader_id != 0;
            }
            let live = voters.iter().filter(|v| answered.contains(*v)).count();
            let lost = !leader && !voters.is_empty() && live < voters.len() / 2 + 1;
            if lost && lost_before {
                let summary = format!(
                    "no quorum: {live} of {} voters answer and none sees a leader (nothing was applied)",
                    voters.len()
                );
                let whys = all.iter().zip(&answers).map(|(ep, r)| match r {
                    Ok(s) => format!("answers (member {}, {}), sees no leader", s.id, s.role),
                    Err(Error::Unavailable(why)) => why.strip_prefix(&format!("{ep}: ")).unwrap_or(why).to_string(),
                    Err(e) => e.to_string(),
                });
                return Fail::Unavailable { summary, endpoints: all.iter().cloned().zip(whys).collect() }.into();
            }
            lost_before = lost;
            tokio::time::sleep(QUORUM_LOOK).await;
        }
    }

    /// `e`, with every endpoint's status when it says the cluster could not
    /// serve (the library names only the last member it tried).
    pub async fn explain(&self, e: anyhow::Error) -> anyhow::Error {
        if !matches!(e.downcast_ref::<Error>(), Some(Error::Unavailable(_))) {
            return e;
        }
        let summary = format!("{e:#}\neach endpoint now:");
        let answers = futures::future::join_all(self.endpoints.iter().map(|ep| async move {
            match member_status_with(ep, self.dial_timeout, self.tls.as_ref()).await {
                Ok(s) if s.leader_id == 0 => format!("answers (member {}, {}), sees no leader", s.id, s.role),
                Ok(s) => format!("answers (member {}, {}, leader {})", s.id, s.role, s.leader_id),
                Err(Error::Unavailable(why)) => why.strip_prefix(&format!("{ep}: ")).unwrap_or(&why).to_string(),
                Err(other) => other.to_string(),
            }
        }))
        .await;
        let endpoints = self.endpoints.iter().cloned().zip(answers).collect();
        Fail::Unavailable { summary, endpoints }.into()
    }
}

/// Closes `c`'s session (its ephemeral nodes go at once), bounded.
pub async fn close(c: &Client) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, c.close()).await;
}
