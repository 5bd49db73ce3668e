//! `baton`: the command-line client.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_client::{
    admin, parse_endpoints, Client, ClientConfig, ClientTls, CreateOptions, Error, Stat, WatchKind, DEFAULT_ENDPOINTS,
};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(name = "baton", version, about = "Command-line client for a Baton cluster")]
struct Cli {
    /// Members' client addresses, comma-separated.
    #[arg(long, env = "BATON_ENDPOINTS", default_value = DEFAULT_ENDPOINTS, global = true)]
    endpoints: String,
    /// One JSON object per line.
    #[arg(long, global = true)]
    json: bool,
    /// TLS: the CA that signed the members' certificates (PEM). Turns TLS on.
    #[arg(long, env = "BATON_CACERT", global = true)]
    cacert: Option<std::path::PathBuf>,
    /// TLS: this client's certificate (PEM), for members that require one.
    #[arg(long, env = "BATON_CERT", global = true, requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// TLS: the private key of --cert (PEM).
    #[arg(long, env = "BATON_KEY", global = true, requires = "cert")]
    key: Option<std::path::PathBuf>,
    /// Authenticate as this password user (identity `user:NAME`).
    #[arg(long, env = "BATON_USER", global = true, requires = "password")]
    user: Option<String>,
    /// The password of --user (prefer the environment variable).
    #[arg(long, env = "BATON_PASSWORD", global = true, hide_env_values = true)]
    password: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum SnapshotCmd {
    /// Save the whole state, as of now (every acknowledged write), to FILE.
    Save { file: std::path::PathBuf },
}

#[derive(Subcommand, Debug)]
enum MemberCmd {
    /// Id, addresses, voter or learner, and (from the leader) match index
    /// and lag.
    List,
    /// Add a member (start it with `batond --join` after this). It joins as
    /// a learner and the leader promotes it to voter once it has caught up.
    Add {
        id: u64,
        /// Where the other members reach its peer port (HOST:PORT).
        #[arg(long)]
        peer_addr: String,
        /// Where clients reach it (HOST:PORT).
        #[arg(long)]
        client_addr: String,
        /// Keep it a learner (no vote) until `member promote`.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a member (the leader hands over leadership first if it is
    /// the one removed). Its id can never be used again.
    Remove { id: u64 },
    /// Make a caught-up learner a voter.
    Promote { id: u64 },
    /// Hand leadership to a caught-up voter (waits until it leads).
    MoveLeader { id: u64 },
    /// Swap voter OLD for caught-up learner NEW in one joint-consensus
    /// change (add NEW with --learner first).
    Replace { old: u64, new: u64 },
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create a node.
    Create {
        path: String,
        #[arg(default_value = "")]
        data: String,
        /// Deleted when this command's session ends (right after it exits).
        #[arg(long)]
        ephemeral: bool,
        #[arg(long)]
        sequential: bool,
        /// Create missing parents.
        #[arg(long)]
        parents: bool,
        /// ACL, e.g. `user:alice:rwcda,world:anyone:r` (default: the parent's).
        #[arg(long)]
        acl: Option<String>,
    },
    /// Read or change a node's ACL.
    Acl {
        #[command(subcommand)]
        cmd: AclCmd,
    },
    /// Password users (superusers only) and this client's identities.
    Auth {
        #[command(subcommand)]
        cmd: AuthCmd,
    },
    /// Print a node's data.
    Get {
        path: String,
        /// Serve from the member's local state (no ReadIndex).
        #[arg(long)]
        stale: bool,
    },
    /// Set a node's data.
    Set {
        path: String,
        data: String,
        /// Only if the node is at this version.
        #[arg(long)]
        version: Option<i32>,
        /// RESOURCE=TOKEN: apply only if no higher token was used on
        /// RESOURCE (e.g. --fence counter=$BATON_FENCE_TOKEN).
        #[arg(long)]
        fence: Option<String>,
    },
    /// Delete a node.
    Rm {
        path: String,
        #[arg(long)]
        version: Option<i32>,
    },
    /// List a node's children.
    Ls { path: String },
    /// Print a node's stat.
    Stat { path: String },
    /// Print changes to a node and its children until Ctrl-C.
    Watch { path: String },
    /// Every member's role, term, indexes, sessions, nodes, version, uptime
    /// and database size (members are discovered from any endpoint). Exits
    /// 1 when there is no leader or a member is unreachable.
    Status {
        /// Exit 0 as long as one member answers.
        #[arg(long)]
        partial: bool,
    },
    /// Each member's health (like etcdctl endpoint health): it sees a
    /// leader and has applied what is committed. Exits 1 if any is not.
    Health,
    /// The cluster's members: list, add, remove, promote.
    #[command(subcommand)]
    Member(MemberCmd),
    /// Backups: `snapshot save FILE` (restore with `batond restore`).
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Run a command while holding lock NAME; its token is in BATON_FENCE_TOKEN.
    Lock {
        name: String,
        /// Give up if the lock is not acquired within this time (0s: only
        /// if it is free now).
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// Session timeout: how long after this process dies the lock frees.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        session_timeout: Duration,
        /// After SIGTERM on lock loss, wait this long before SIGKILL.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        grace: Duration,
        /// When the session is suspended (no recent proof it is alive, e.g.
        /// its member restarts): `wait` keeps the command running until the
        /// session expires or a whole session timeout passes without proof
        /// (someone else may hold the lock from then on); `kill` stops it at
        /// once.
        #[arg(long, value_enum, default_value = "wait")]
        on_suspend: OnSuspend,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run a command only while leader of election NAME.
    Elect {
        name: String,
        /// The value others see as the leader's (default: hostname:pid).
        #[arg(long)]
        value: Option<String>,
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        session_timeout: Duration,
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        grace: Duration,
        /// As for `lock`: `wait` rides out a suspended session until another
        /// candidate may lead; `kill` stops the command at once.
        #[arg(long, value_enum, default_value = "wait")]
        on_suspend: OnSuspend,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Print the current leader of election NAME (and, with --watch, changes).
    Leader {
        name: String,
        #[arg(long)]
        watch: bool,
    },
    /// Measure throughput and latency.
    Bench {
        #[arg(value_enum)]
        workload: Workload,
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// e.g. 10s, 500ms, 1m
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Bytes of data per write.
        #[arg(long, default_value_t = 64)]
        size: usize,
    },
}

#[derive(Subcommand, Debug)]
enum AclCmd {
    /// Print a node's ACL, one entry per line (ID:PERMS, perms of rwcda).
    Get { path: String },
    /// Replace a node's ACL, e.g. `user:alice:rwcda,world:anyone:r`.
    Set {
        path: String,
        acl: String,
        /// Only if the ACL is at this version (stat aversion).
        #[arg(long)]
        version: Option<i32>,
    },
}

#[derive(Subcommand, Debug)]
enum AuthCmd {
    /// Add a password user; the password comes from BATON_NEW_PASSWORD or
    /// the first line of stdin.
    AddUser { name: String },
    /// Remove a password user.
    RemoveUser { name: String },
    /// List password users.
    ListUsers,
    /// Print this client's identities.
    Whoami,
}

/// What `baton lock` / `baton elect` do with the command while the session
/// is suspended (Curator's connection-state error policies).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum OnSuspend {
    /// Keep running until the session expires or goes a whole timeout
    /// without proof of life (session-based policy).
    Wait,
    /// Stop the command at the first doubt (standard policy).
    Kill,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
enum Workload {
    /// Create persistent sequential nodes.
    Create,
    /// Set one node per client.
    Set,
    /// Linearizable reads of one node per client.
    Get,
    /// Acquire + release one lock in a loop (use --clients 1).
    LockUncontended,
    /// Every client on one lock: grants/s, and the wait for a grant.
    LockContended,
    /// Every client on its own lock.
    LockIndependent,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

fn stat_json(s: &Stat) -> serde_json::Value {
    json!({
        "czxid": s.czxid, "mzxid": s.mzxid, "pzxid": s.pzxid, "ctime": s.ctime, "mtime": s.mtime,
        "version": s.version, "cversion": s.cversion, "ephemeral_owner": s.ephemeral_owner,
        "data_length": s.data_length, "num_children": s.num_children,
    })
}

fn stat_text(s: &Stat) -> String {
    format!(
        "czxid = {}\nmzxid = {}\npzxid = {}\nctime = {}\nmtime = {}\nversion = {}\ncversion = {}\nephemeral_owner = {:#x}\ndata_length = {}\nnum_children = {}",
        s.czxid, s.mzxid, s.pzxid, s.ctime, s.mtime, s.version, s.cversion, s.ephemeral_owner, s.data_length, s.num_children
    )
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let code = match run(cli).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("baton: {e:#}");
            match e.downcast_ref::<Error>() {
                Some(err) if err.is_ambiguous() => 3,
                _ => 1,
            }
        }
    };
    std::process::exit(code);
}

/// TLS settings from --cacert/--cert/--key, set once at start.
static TLS: std::sync::OnceLock<Option<ClientTls>> = std::sync::OnceLock::new();
/// --user and --password, set once at start.
static AUTH: std::sync::OnceLock<Option<(String, String)>> = std::sync::OnceLock::new();

fn tls() -> Option<&'static ClientTls> {
    TLS.get().and_then(Option::as_ref)
}

/// A client configuration for `endpoints` with the command line's TLS.
fn config(endpoints: &[String]) -> ClientConfig {
    let mut cfg = ClientConfig::new(endpoints.to_vec());
    cfg.tls = tls().cloned();
    cfg.auth = AUTH.get().cloned().flatten();
    cfg
}

fn load_tls(cli: &Cli) -> anyhow::Result<Option<ClientTls>> {
    let cert_key = cli.cert.as_deref().zip(cli.key.as_deref());
    match (&cli.cacert, cert_key) {
        (Some(ca), ck) => Ok(Some(ClientTls::load(ca, ck)?)),
        (None, Some(_)) => anyhow::bail!("--cert needs --cacert (the CA that signed the members' certificates)"),
        (None, None) => Ok(None),
    }
}

async fn connect(endpoints: &[String]) -> anyhow::Result<Client> {
    Ok(Client::connect_with(config(endpoints).op_timeout(Duration::from_secs(10))).await?)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let endpoints = parse_endpoints(&cli.endpoints);
    if endpoints.is_empty() {
        anyhow::bail!("no endpoints (use --endpoints or BATON_ENDPOINTS)");
    }
    let j = cli.json;
    let _ = TLS.set(load_tls(&cli)?);
    let _ = AUTH.set(cli.user.clone().zip(cli.password.clone()));
    match cli.cmd {
        Cmd::Status { partial } => return status(&endpoints, j, partial).await,
        Cmd::Health => return health(&endpoints, j).await,
        Cmd::Member(m) => return member(&endpoints, j, m).await,
        Cmd::Snapshot(SnapshotCmd::Save { file }) => {
            let (bytes, index) = admin::snapshot_save(&config(&endpoints)).await?;
            // Written beside, then renamed: a crash never leaves half a backup.
            let tmp = file.with_extension("partial");
            std::fs::write(&tmp, &bytes)?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &file)?;
            if j {
                println!("{}", json!({"file": file, "index": index, "bytes": bytes.len()}));
            } else {
                println!("saved {} ({} bytes) at index {index}", file.display(), bytes.len());
            }
            return Ok(());
        }
        Cmd::Bench { workload, clients, duration, size } => {
            return bench(&endpoints, workload, clients, duration, size).await
        }
        Cmd::Lock { name, timeout, session_timeout, grace, on_suspend, command } => {
            let c = Client::connect_with(config(&endpoints).session_timeout(session_timeout)).await?;
            let r = run_locked(&c, &name, timeout, grace, on_suspend, &command, &endpoints).await;
            // Every exit closes the session: its nodes (a held lock, or a
            // waiter's queue node after a timeout or Ctrl-C) go at once
            // instead of blocking others for a session timeout.
            let _ = tokio::time::timeout(Duration::from_secs(2), c.close()).await;
            std::process::exit(r?);
        }
        Cmd::Elect { name, value, session_timeout, grace, on_suspend, command } => {
            let c = Client::connect_with(config(&endpoints).session_timeout(session_timeout)).await?;
            let r = run_elected(&c, &name, value, grace, on_suspend, &command, &endpoints).await;
            let _ = tokio::time::timeout(Duration::from_secs(2), c.close()).await;
            std::process::exit(r?);
        }
        _ => {}
    }
    let c = connect(&endpoints).await?;
    let result = one(&c, cli.cmd, j).await;
    let _ = c.close().await;
    result
}

async fn one(c: &Client, cmd: Cmd, j: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Create { path, data, ephemeral, sequential, parents, acl } => {
            let opts = CreateOptions { ephemeral, sequential, parents };
            let acl = match acl {
                Some(a) => baton_client::acl::parse(&a).map_err(|e| anyhow::anyhow!("--acl: {e}"))?,
                None => Vec::new(),
            };
            let (p, s) = c.create_with_acl(&path, data.into_bytes(), opts, acl).await?;
            if j {
                println!("{}", json!({"path": p, "stat": stat_json(&s)}));
            } else {
                println!("{p}");
            }
        }
        Cmd::Acl { cmd: AclCmd::Get { path } } => {
            let (acl, s) = c.get_acl(&path).await?;
            let entries: Vec<String> = acl.iter().map(baton_client::acl::format).collect();
            if j {
                println!("{}", json!({"path": path, "acl": entries, "aversion": s.aversion}));
            } else if entries.is_empty() {
                println!("world:anyone:rwcda (open: no ACL)");
            } else {
                for e in entries {
                    println!("{e}");
                }
            }
        }
        Cmd::Acl { cmd: AclCmd::Set { path, acl, version } } => {
            let acl = baton_client::acl::parse(&acl).map_err(|e| anyhow::anyhow!("ACL: {e}"))?;
            let s = c.set_acl(&path, acl, version).await?;
            println!("aversion {}", s.aversion);
        }
        Cmd::Auth { cmd: AuthCmd::AddUser { name } } => {
            let password = match std::env::var("BATON_NEW_PASSWORD") {
                Ok(p) => p,
                Err(_) => {
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line)?;
                    line.trim_end_matches(['\r', '\n']).to_string()
                }
            };
            if password.is_empty() {
                anyhow::bail!("no password (BATON_NEW_PASSWORD or a line on stdin)");
            }
            c.add_user(&name, &password).await?;
            println!("user {name} added");
        }
        Cmd::Auth { cmd: AuthCmd::RemoveUser { name } } => {
            c.remove_user(&name).await?;
            println!("user {name} removed");
        }
        Cmd::Auth { cmd: AuthCmd::ListUsers } => {
            for u in c.list_users().await? {
                println!("{u}");
            }
        }
        Cmd::Auth { cmd: AuthCmd::Whoami } => {
            for i in c.whoami().await? {
                println!("{i}");
            }
        }
        Cmd::Get { path, stale } => {
            let (d, s) = c.get_opts(&path, stale).await?;
            if j {
                println!("{}", json!({"path": path, "data": String::from_utf8_lossy(&d), "stat": stat_json(&s)}));
            } else {
                println!("{}", String::from_utf8_lossy(&d));
            }
        }
        Cmd::Set { path, data, version, fence } => {
            let s = match fence {
                None => c.set(&path, data.into_bytes(), version).await?,
                Some(f) => {
                    let (resource, token) =
                        f.rsplit_once('=').ok_or_else(|| anyhow::anyhow!("--fence wants RESOURCE=TOKEN"))?;
                    let token: u64 =
                        token.parse().map_err(|_| anyhow::anyhow!("--fence token {token:?} is not a number"))?;
                    let ops = [
                        baton_client::Op::CheckFence { resource: resource.to_string(), token },
                        baton_client::Op::Set { path: path.clone(), data: data.into_bytes().into(), version },
                    ];
                    c.multi(&ops).await?.pop().and_then(|r| r.stat).unwrap_or_default()
                }
            };
            if j {
                println!("{}", json!({"path": path, "stat": stat_json(&s)}));
            } else {
                println!("version {}", s.version);
            }
        }
        Cmd::Rm { path, version } => {
            c.delete(&path, version).await?;
            if j {
                println!("{}", json!({"deleted": path}));
            }
        }
        Cmd::Ls { path } => {
            let kids = c.children(&path).await?;
            if j {
                println!("{}", json!({"path": path, "children": kids}));
            } else {
                for k in kids {
                    println!("{k}");
                }
            }
        }
        Cmd::Stat { path } => {
            let s = c.exists(&path).await?.ok_or_else(|| anyhow::anyhow!("NoNode: {path} does not exist"))?;
            if j {
                println!("{}", json!({"path": path, "stat": stat_json(&s)}));
            } else {
                println!("{}", stat_text(&s));
            }
        }
        Cmd::Watch { path } => {
            let mut node = c.watch(&path, WatchKind::Exists, true).await?;
            let mut kids = c.watch(&path, WatchKind::Children, true).await?;
            if !j {
                eprintln!("watching {path} (Ctrl-C to stop)");
            }
            loop {
                let ev = tokio::select! {
                    e = node.next() => e,
                    e = kids.next() => e,
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                };
                let Some(ev) = ev else { anyhow::bail!("watch ended: session expired") };
                let ty = ev.event_type.as_str();
                if j {
                    println!("{}", json!({"type": ty, "path": ev.path, "zxid": ev.zxid}));
                } else {
                    println!("{ty} {} zxid={}", ev.path, ev.zxid);
                }
            }
        }
        Cmd::Leader { name, watch } => {
            let print = |l: Option<baton_client::LeaderInfo>| match l {
                Some(l) if j => println!(
                    "{}",
                    json!({"leader": String::from_utf8_lossy(&l.value), "token": l.token, "path": l.path})
                ),
                Some(l) => println!("{} (token {})", String::from_utf8_lossy(&l.value), l.token),
                None if j => println!("{}", json!({"leader": null})),
                None => println!("(no leader)"),
            };
            if !watch {
                print(c.leader(&name).await?);
                return Ok(());
            }
            let mut obs = c.observe(&name).await?;
            loop {
                tokio::select! {
                    l = obs.next() => match l {
                        Some(l) => print(l),
                        None => anyhow::bail!("observer ended: session expired"),
                    },
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
            }
        }
        Cmd::Status { .. }
        | Cmd::Health
        | Cmd::Member(_)
        | Cmd::Snapshot(_)
        | Cmd::Bench { .. }
        | Cmd::Lock { .. }
        | Cmd::Elect { .. } => {}
    }
    Ok(())
}

/// `baton lock`: acquire (or give up), run the command, release. Returns
/// the exit code; the caller closes the session whatever happens.
async fn run_locked(
    c: &Client,
    name: &str,
    timeout: Option<Duration>,
    grace: Duration,
    on_suspend: OnSuspend,
    command: &[String],
    endpoints: &[String],
) -> anyhow::Result<i32> {
    let guard = tokio::select! {
        g = async {
            match timeout {
                Some(t) => c
                    .lock_with_timeout(name, t)
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("lock {name} not acquired within {t:?}")),
                None => Ok(c.lock(name).await?),
            }
        } => g?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted while waiting for lock {name}"),
    };
    let token = guard.fencing_token();
    eprintln!("baton: holding lock {name} (token {token})");
    let env = [("BATON_FENCE_TOKEN", token.to_string()), ("BATON_LOCK_NAME", name.to_string())];
    let what = format!("lock {name}");
    let lost = async {
        match on_suspend {
            OnSuspend::Kill => guard.lost().await,
            OnSuspend::Wait => guard.may_be_taken().await,
        }
    };
    let code = supervise(command, &env, endpoints, lost, guard.verify(), grace, &what).await?;
    // After a loss the session may be gone: bounded, best-effort release.
    let _ = tokio::time::timeout(Duration::from_secs(2), guard.release()).await;
    Ok(code)
}

/// `baton elect`: campaign, run the command while leader, resign.
async fn run_elected(
    c: &Client,
    name: &str,
    value: Option<String>,
    grace: Duration,
    on_suspend: OnSuspend,
    command: &[String],
    endpoints: &[String],
) -> anyhow::Result<i32> {
    let value = value.unwrap_or_else(|| format!("{}:{}", hostname(), std::process::id()));
    let lead = tokio::select! {
        l = c.campaign(name, value.into_bytes()) => l?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted while campaigning in {name}"),
    };
    let token = lead.token();
    eprintln!("baton: leader of {name} (token {token})");
    let env = [("BATON_FENCE_TOKEN", token.to_string()), ("BATON_ELECTION_NAME", name.to_string())];
    let what = format!("leadership of {name}");
    let lost = async {
        match on_suspend {
            OnSuspend::Kill => lead.lost().await,
            OnSuspend::Wait => lead.may_be_replaced().await,
        }
    };
    let code = supervise(command, &env, endpoints, lost, lead.verify(), grace, &what).await?;
    let _ = tokio::time::timeout(Duration::from_secs(2), lead.resign()).await;
    Ok(code)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Exit code for "the lock was lost while the command ran" (EX_TEMPFAIL).
const EXIT_LOST: i32 = 75;

/// Runs `command` in its own process group; stops it (SIGTERM, then SIGKILL
/// after `grace`) if `lost` resolves first. After the command ends on its
/// own, `verify` asks the cluster whether the hold survived; if not, the
/// command may have run on past it (e.g. paused), and the exit code says so.
async fn supervise(
    command: &[String],
    env: &[(&str, String)],
    endpoints: &[String],
    lost: impl std::future::Future<Output = baton_client::SessionState>,
    verify: impl std::future::Future<Output = baton_client::Result<bool>>,
    grace: Duration,
    what: &str,
) -> anyhow::Result<i32> {
    let code = run_until_lost(command, env, endpoints, lost, grace, what).await?;
    if code != EXIT_LOST
        && !tokio::time::timeout(Duration::from_secs(5), verify).await.is_ok_and(|r| r.unwrap_or(false))
    {
        eprintln!("baton: {what} was lost while the command ran (its session expired)");
        return Ok(EXIT_LOST);
    }
    Ok(code)
}

async fn run_until_lost(
    command: &[String],
    env: &[(&str, String)],
    endpoints: &[String],
    lost: impl std::future::Future<Output = baton_client::SessionState>,
    grace: Duration,
    what: &str,
) -> anyhow::Result<i32> {
    use std::os::unix::process::ExitStatusExt;
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]).process_group(0).env("BATON_ENDPOINTS", endpoints.join(","));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().map_err(|e| anyhow::anyhow!("cannot run {:?}: {e}", command[0]))?;
    let pgid = child.id().unwrap_or(0) as i32;
    let signal_group = |sig: i32| {
        if pgid > 0 {
            // SAFETY: kill(2) on the process group of a child we spawned.
            unsafe {
                libc::kill(-pgid, sig);
            }
        }
    };
    let code = |s: std::process::ExitStatus| s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::pin!(lost);
    tokio::select! {
        s = child.wait() => Ok(code(s?)),
        state = &mut lost => {
            eprintln!("baton: {what} lost (session {state:?}); stopping the command");
            signal_group(libc::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                eprintln!("baton: command still running after {grace:?}; killing it");
                signal_group(libc::SIGKILL);
                let _ = child.wait().await;
            }
            Ok(EXIT_LOST)
        }
        _ = tokio::signal::ctrl_c() => {
            signal_group(libc::SIGINT);
            Ok(code(child.wait().await?))
        }
        _ = term.recv() => {
            signal_group(libc::SIGTERM);
            Ok(code(child.wait().await?))
        }
    }
}

/// Every member's client address: the ones given and the ones the cluster
/// records (so one endpoint is enough).
async fn discover(endpoints: &[String]) -> Vec<String> {
    let cfg = config(endpoints);
    let known = admin::members(&cfg).await.ok();
    admin::all_endpoints(endpoints, known.as_ref())
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        s if s >= 86400 => format!("{}d{}h", s / 86400, s % 86400 / 3600),
        s if s >= 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

async fn status(endpoints: &[String], j: bool, partial: bool) -> anyhow::Result<()> {
    let cfg = config(endpoints);
    let all = discover(endpoints).await;
    if !j {
        println!(
            "{:<22} {:>3} {:<13} {:>5} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8} {:>9} {:>7}",
            "endpoint",
            "id",
            "role",
            "term",
            "commit",
            "applied",
            "leader",
            "sessions",
            "nodes",
            "uptime",
            "db",
            "version"
        );
    }
    let (mut reachable, mut unreachable, mut leaders) = (0, 0, BTreeSet::new());
    let mut voters = BTreeSet::new();
    for e in &all {
        match admin::status(&cfg, e).await {
            Ok(s) => {
                reachable += 1;
                if s.leader_id != 0 {
                    leaders.insert(s.leader_id);
                }
                voters.extend(s.voters.iter().copied());
                if j {
                    println!(
                        "{}",
                        json!({"endpoint": e, "id": s.id, "role": s.role, "term": s.term, "commit_index": s.commit_index,
                               "applied_index": s.applied_index, "leader_id": s.leader_id, "first_index": s.first_index,
                               "sessions": s.sessions, "nodes": s.nodes, "voters": s.voters, "learners": s.learners,
                               "uptime_ms": s.uptime_ms, "db_bytes": s.db_bytes, "version": s.version,
                               "cluster_id": s.cluster_id})
                    );
                } else {
                    let role = if s.learners.contains(&s.id) { "learner".to_string() } else { s.role.clone() };
                    println!(
                        "{:<22} {:>3} {:<13} {:>5} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8} {:>9} {:>7}",
                        e,
                        s.id,
                        role,
                        s.term,
                        s.commit_index,
                        s.applied_index,
                        s.leader_id,
                        s.sessions,
                        s.nodes,
                        human_ms(s.uptime_ms),
                        human_bytes(s.db_bytes),
                        s.version
                    );
                }
            }
            Err(err) => {
                unreachable += 1;
                if j {
                    println!("{}", json!({"endpoint": e, "error": err.to_string()}));
                } else {
                    println!("{e:<22} unreachable: {err}");
                }
            }
        }
    }
    if !j {
        println!("voters: {voters:?}");
    }
    if reachable == 0 {
        anyhow::bail!("no member reachable");
    }
    if !partial {
        if leaders.is_empty() {
            anyhow::bail!("no member sees a leader");
        }
        if unreachable > 0 {
            anyhow::bail!("{unreachable} of {} members unreachable (--partial to accept)", all.len());
        }
    }
    Ok(())
}

async fn health(endpoints: &[String], j: bool) -> anyhow::Result<()> {
    let cfg = config(endpoints);
    let mut bad = 0;
    let all = discover(endpoints).await;
    for e in &all {
        let t = Instant::now();
        let verdict = admin::status(&cfg, e).await.map_err(|e| e.to_string()).and_then(|s| admin::healthy(&s));
        let took = t.elapsed();
        bad += verdict.is_err() as usize;
        match (&verdict, j) {
            (Ok(()), false) => println!("{e} is healthy: took = {took:?}"),
            (Err(why), false) => println!("{e} is unhealthy: {why}"),
            (v, true) => println!(
                "{}",
                json!({"endpoint": e, "health": v.is_ok(), "took_ms": took.as_millis() as u64,
                       "error": v.as_ref().err()})
            ),
        }
    }
    if bad > 0 {
        anyhow::bail!("{bad} of {} members unhealthy", all.len());
    }
    Ok(())
}

async fn member(endpoints: &[String], j: bool, cmd: MemberCmd) -> anyhow::Result<()> {
    let cfg = config(endpoints).op_timeout(Duration::from_secs(30));
    let m = match cmd {
        MemberCmd::List => admin::members(&cfg).await?,
        MemberCmd::Add { id, peer_addr, client_addr, learner } => {
            admin::member_add(&cfg, id, &peer_addr, &client_addr, !learner).await?
        }
        MemberCmd::Remove { id } => admin::member_remove(&cfg, id).await?,
        MemberCmd::Promote { id } => admin::member_promote(&cfg, id).await?,
        MemberCmd::MoveLeader { id } => admin::member_move_leader(&cfg, id).await?,
        MemberCmd::Replace { old, new } => admin::member_replace(&cfg, old, new).await?,
    };
    let from_leader = m.leader_id != 0 && m.answered_by == m.leader_id;
    if j {
        for i in &m.members {
            println!(
                "{}",
                json!({"id": i.id, "peer_addr": i.peer_addr, "client_addr": i.client_addr, "role": admin::role(i),
                       "leader": i.id == m.leader_id, "matched": from_leader.then_some(i.matched),
                       "lag": from_leader.then_some(i.lag), "auto_promote": i.auto_promote})
            );
        }
        return Ok(());
    }
    println!("{:>3} {:<8} {:<24} {:<24} {:>10} {:>8}", "id", "role", "peer", "client", "matched", "lag");
    for i in &m.members {
        let (matched, lag) =
            if from_leader { (i.matched.to_string(), i.lag.to_string()) } else { ("?".into(), "?".into()) };
        let mut role = admin::role(i).to_string();
        if i.id == m.leader_id {
            role.push('*');
        }
        println!("{:>3} {:<8} {:<24} {:<24} {:>10} {:>8}", i.id, role, i.peer_addr, i.client_addr, matched, lag);
    }
    println!(
        "cluster {} term {}, leader {} (*), answered by member {}",
        m.cluster_id, m.term, m.leader_id, m.answered_by
    );
    Ok(())
}

async fn bench(
    endpoints: &[String],
    w: Workload,
    clients: usize,
    duration: Duration,
    size: usize,
) -> anyhow::Result<()> {
    let run_id: u32 = rand::random();
    let root = format!("/bench-{run_id:08x}");
    let setup = connect(endpoints).await?;
    setup.create(&root, Vec::new(), CreateOptions::persistent()).await?;
    let data = vec![b'x'; size];
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..clients.max(1) {
        // Spread clients over the members as a real fleet would be.
        let mut eps = endpoints.to_vec();
        eps.rotate_left(i % endpoints.len());
        let c = connect(&eps).await?;
        let key = format!("{root}/k{i}");
        c.create(&key, data.clone(), CreateOptions::persistent()).await?;
        let (stop, data, root) = (stop.clone(), data.clone(), root.clone());
        if matches!(w, Workload::LockUncontended) && clients > 1 {
            anyhow::bail!("lock-uncontended runs one client (--clients 1)");
        }
        tasks.push(tokio::spawn(async move {
            let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("static bounds");
            let mut errors = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = match w {
                    Workload::Create => c
                        .create(&format!("{root}/n-"), data.clone(), CreateOptions::persistent().sequential())
                        .await
                        .map(|_| ()),
                    Workload::Set => c.set(&key, data.clone(), None).await.map(|_| ()),
                    Workload::Get => c.get(&key).await.map(|_| ()),
                    Workload::LockUncontended | Workload::LockIndependent | Workload::LockContended => {
                        let name = match w {
                            Workload::LockContended => format!("bench-{run_id:08x}"),
                            _ => format!("bench-{run_id:08x}-{i}"),
                        };
                        match c.lock(&name).await {
                            // Contended: the figure is the wait for a grant.
                            Ok(g) => {
                                let waited = t.elapsed();
                                let r = g.release().await;
                                if matches!(w, Workload::LockContended) {
                                    let _ = hist.record(waited.as_micros().max(1) as u64);
                                    if r.is_err() {
                                        errors += 1;
                                    }
                                    continue;
                                }
                                r
                            }
                            Err(e) => Err(e),
                        }
                    }
                };
                match r {
                    Ok(()) => {
                        let _ = hist.record(t.elapsed().as_micros().max(1) as u64);
                    }
                    Err(_) => errors += 1,
                }
            }
            let _ = c.close().await;
            (hist, errors)
        }));
    }
    eprintln!("running {w:?} with {clients} clients for {duration:?}...");
    let start = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await?;
        hist.add(&h)?;
        errors += e;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{w:?}: {} ops in {secs:.1}s = {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, errors {errors}",
        hist.len(),
        hist.len() as f64 / secs,
        hist.value_at_quantile(0.5) as f64 / 1000.0,
        hist.value_at_quantile(0.99) as f64 / 1000.0,
        hist.max() as f64 / 1000.0,
    );
    let _ = setup.close().await;
    Ok(())
}
