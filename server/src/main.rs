//! `batond`: run one Baton member, or (`batond cluster`) a local cluster of
//! real member processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use baton_kit::member::{stop_all, Join, MemberSpec, Process};
use baton_kit::supervise;
use baton_server::certs::{Authority, CertFiles};
use baton_server::config::{check_addr, parse_peers, Config, Limits};
use baton_server::kv::RocksKv;

/// mimalloc instead of glibc's malloc: a write allocates and frees many
/// small buffers on several threads, and glibc malloc and free were 8-10% of a
/// member's CPU under load (docs/perf/README.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

unsafe extern "C" {
    /// mimalloc's own: frees what it can and returns free pages to the OS
    /// (`force`). Linked from the mimalloc the allocator above is.
    fn mi_collect(force: bool);
}

/// What `baton_server::memory::release` calls (memory.rs).
fn collect_free_pages() {
    // SAFETY: mi_collect takes no pointers and may be called from any
    // thread at any time; mimalloc is this process's allocator.
    unsafe { mi_collect(true) }
}
use baton_server::member;
use baton_server::transport::PeerTls;
use clap::{Args, Parser, Subcommand};
use tracing::error;

#[derive(Parser, Debug)]
#[command(name = "batond", version, about = "A Baton member: Raft-replicated coordination service")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    /// Log format: text, or json (one object per line).
    #[arg(long, value_enum, default_value = "text", global = true, env = "BATON_LOG_FORMAT")]
    log_format: LogFormat,
    /// A TOML file of settings: keys are the long flag names
    /// (`data-dir = "/var/lib/baton"`). Flags and BATON_* variables win
    /// over it (docs/operations.md).
    #[arg(long, env = "BATON_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Option<Sub>,
    #[command(flatten)]
    member: MemberArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Start a local cluster of N member processes, wait until each
    /// serves, and keep it up until Ctrl-C or SIGTERM; a member that fails
    /// is reported and started again (exit 1 if one cannot start or keeps
    /// failing).
    Cluster(ClusterArgs),
    /// Build a new one-member cluster's data dir from a backup (`baton
    /// snapshot save`); start it with `batond --id ID --peers ID=ADDR ...`
    /// and grow it with `baton member add`.
    Restore(RestoreArgs),
}

#[derive(Args, Debug, Clone)]
struct Timing {
    /// Raft tick length (ms).
    #[arg(long, default_value_t = 50, env = "BATON_TICK_MS")]
    tick_ms: u64,
    /// Election timeout in ticks (each countdown is randomized in [n, 2n)).
    #[arg(long, default_value_t = 10, env = "BATON_ELECTION_TICKS")]
    election_ticks: usize,
    /// Heartbeat interval in ticks.
    #[arg(long, default_value_t = 2, env = "BATON_HEARTBEAT_TICKS")]
    heartbeat_ticks: usize,
    /// Threads for client and peer connections (TLS, framing) and the Raft
    /// driver (one task among them); the storage writer has a thread of its
    /// own. Default:
    /// half the machine's cores, at least 1 and at most 8 (on 2 cores, 1:
    /// fewer threads switching on a small machine; docs/perf/README.md).
    #[arg(long, env = "BATON_IO_THREADS")]
    io_threads: Option<usize>,
    /// Applied entries between snapshots (log compaction threshold).
    #[arg(long, default_value_t = 20_000, env = "BATON_SNAPSHOT_ENTRIES")]
    snapshot_entries: u64,
    /// Largest client frame accepted (bytes).
    #[arg(long, default_value_t = baton_proto::DEFAULT_MAX_FRAME, env = "BATON_MAX_FRAME")]
    max_frame: usize,
    /// Smallest session timeout granted (ms).
    #[arg(long, default_value_t = 1000, env = "BATON_MIN_SESSION_MS")]
    min_session_ms: u32,
    /// Largest session timeout granted (ms).
    #[arg(long, default_value_t = 120_000, env = "BATON_MAX_SESSION_MS")]
    max_session_ms: u32,
    /// How long a request may wait for commit or ReadIndex (ms).
    #[arg(long, default_value_t = 8000, env = "BATON_REQUEST_TIMEOUT_MS")]
    request_timeout_ms: u64,
    /// Client connections open at once.
    #[arg(long, default_value_t = Limits::default().max_connections, env = "BATON_MAX_CONNECTIONS")]
    max_connections: usize,
    /// Requests one connection may have without a response.
    #[arg(long, default_value_t = Limits::default().max_inflight, env = "BATON_MAX_INFLIGHT")]
    max_inflight: usize,
    /// Bytes of responses and events queued for one connection before it
    /// is closed (its client stopped reading).
    #[arg(long, default_value_t = Limits::default().max_queued_bytes, env = "BATON_MAX_QUEUED_BYTES")]
    max_queued_bytes: usize,
    /// Live sessions (new ones are refused BUSY past it).
    #[arg(long, default_value_t = Limits::default().max_sessions, env = "BATON_MAX_SESSIONS")]
    max_sessions: usize,
    /// Watches one connection may hold.
    #[arg(long, default_value_t = Limits::default().max_watches, env = "BATON_MAX_WATCHES")]
    max_watches: usize,
    /// Operations in one multi.
    #[arg(long, default_value_t = Limits::default().max_multi_ops, env = "BATON_MAX_MULTI_OPS")]
    max_multi_ops: usize,
    /// Largest response (bytes); larger ones are answered TOO_LARGE.
    #[arg(long, default_value_t = Limits::default().max_reply_bytes, env = "BATON_MAX_REPLY_BYTES")]
    max_reply_bytes: usize,
    /// Log requests slower than this (ms) as warnings; 0: never.
    #[arg(long, default_value_t = 1000, env = "BATON_SLOW_REQUEST_MS")]
    slow_request_ms: u64,
    /// An identity that may do everything: x509:NAME (a client
    /// certificate's common name), user:NAME, or digest:NAME:HASH
    /// (ZooKeeper's superDigest: HASH = base64(SHA-1("NAME:PASSWORD")))
    /// (repeatable).
    #[arg(long = "superuser", env = "BATON_SUPERUSER", value_delimiter = ',')]
    superusers: Vec<String>,
    /// With no --superuser: let every client take backups (every node) and
    /// change the membership. For a local development cluster only
    /// (`batond cluster` sets it); logged as a warning at start. Without
    /// it, and without a superuser, those operations are refused.
    #[arg(long = "insecure-open-admin", env = "BATON_INSECURE_OPEN_ADMIN", num_args = 0..=1,
          default_missing_value = "true", value_name = "BOOL")]
    open_admin: Option<bool>,
    /// Switch on a deliberate bug (harness tests only): one of the names in
    /// server/src/faults.rs (`NAMES`), e.g. stale-reads, ack-before-commit,
    /// no-fence-check, lenient-storage.
    #[cfg(feature = "fault-injection")]
    #[arg(long = "server-fault", env = "BATON_SERVER_FAULT", value_delimiter = ',')]
    server_fault: Vec<String>,
}

/// The member flags (`Timing`) given to `batond cluster` on its command
/// line or in its `--config` file, for each member's command line, as
/// given: a flag is written once, in `Timing`, and reaches the members
/// whatever it is. Flags from BATON_* variables reach them through the
/// environment they inherit.
fn given_member_flags(args: &[String]) -> Vec<String> {
    use clap::parser::ValueSource;
    use clap::CommandFactory;
    let Ok(all) = Cli::command().try_get_matches_from(args) else { return Vec::new() };
    let Some(("cluster", m)) = all.subcommand() else { return Vec::new() };
    let mut out = Vec::new();
    for arg in Timing::augment_args(clap::Command::new("timing")).get_arguments() {
        let (id, Some(long)) = (arg.get_id().as_str(), arg.get_long()) else { continue };
        if m.value_source(id) != Some(ValueSource::CommandLine) {
            continue;
        }
        for v in m.get_raw(id).into_iter().flatten() {
            out.push(format!("--{long}={}", v.to_string_lossy()));
        }
    }
    out
}

/// `--io-threads`, or half the cores (1 to 8).
fn io_threads(flag: Option<usize>) -> usize {
    match flag {
        Some(n) => n.clamp(1, 64),
        None => (std::thread::available_parallelism().map_or(2, |n| n.get()) / 2).clamp(1, 8),
    }
}

impl Timing {
    fn faults(&self) -> anyhow::Result<baton_server::faults::Faults> {
        #[cfg(feature = "fault-injection")]
        return baton_server::faults::Faults::parse(&self.server_fault).map_err(|e| anyhow::anyhow!(e));
        #[cfg(not(feature = "fault-injection"))]
        Ok(Default::default())
    }
}

#[derive(Args, Debug)]
struct MemberArgs {
    /// This member's id (1..).
    #[arg(long, env = "BATON_ID")]
    id: Option<u64>,
    /// Where this member keeps its RocksDB.
    #[arg(long, env = "BATON_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address the client port listens on (HOST:PORT; a host name is
    /// resolved).
    #[arg(long, env = "BATON_CLIENT_ADDR")]
    client_addr: Option<String>,
    /// Address the peer port listens on.
    #[arg(long, env = "BATON_PEER_ADDR")]
    peer_addr: Option<String>,
    /// The client address other machines reach this member at (default:
    /// --client-addr; required when that is 0.0.0.0 or [::]).
    #[arg(long, env = "BATON_ADVERTISE_CLIENT_ADDR")]
    advertise_client_addr: Option<String>,
    /// The peer address other members reach this member at (default:
    /// --peer-addr; required when that is 0.0.0.0 or [::]).
    #[arg(long, env = "BATON_ADVERTISE_PEER_ADDR")]
    advertise_peer_addr: Option<String>,
    /// A new cluster's founding members, this one included:
    /// ID=HOST:PORT,... (their peer addresses). Only read when the data dir
    /// is new; afterwards the configuration lives in the log.
    #[arg(long, conflicts_with = "join", env = "BATON_PEERS")]
    peers: Option<String>,
    /// Join a running cluster (after `baton member add`): the peer
    /// addresses of some of its members, ID=HOST:PORT,... This member
    /// learns the configuration from the leader's snapshot.
    #[arg(long, env = "BATON_JOIN")]
    join: Option<String>,
    /// Serve GET /metrics, /health and /ready over HTTP here (off when
    /// not given; docs/operations.md).
    #[arg(long, env = "BATON_HTTP_ADDR")]
    http_addr: Option<String>,
    /// Also speak ZooKeeper's protocol (jute, 3.6-3.8 clients) here, on the
    /// same state (off when not given; docs/zookeeper.md).
    #[arg(long, env = "BATON_ZK_ADDR")]
    zk_addr: Option<String>,
    /// Serve every read on the ZooKeeper port through ReadIndex
    /// (linearizable) instead of ZooKeeper's member-local reads.
    #[arg(long, env = "BATON_ZK_LINEARIZABLE_READS")]
    zk_linearizable_reads: bool,
    /// Four-letter words the ZooKeeper port answers, comma-separated (`*`:
    /// all of ruok, isro, srvr, stat, mntr, conf, envi, cons).
    #[arg(long, default_value = "srvr", env = "BATON_ZK_4LW_WHITELIST")]
    zk_4lw_whitelist: String,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    timing: Timing,
}

/// TLS files (PEM). See docs/security.md. The client-port ones have no
/// `BATON_*` variable: `BATON_CERT` and `BATON_KEY` are the `baton` CLI's
/// client certificate, and a shell that runs both must not mix them up.
#[derive(Args, Debug)]
struct TlsArgs {
    /// Client port: this member's certificate (chain). With --key, the
    /// client port speaks TLS only.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Client port: the private key of --cert.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Client port: clients must present a certificate signed by this CA.
    #[arg(long, requires = "cert")]
    ca: Option<PathBuf>,
    /// Peer port: this member's certificate, naming it `member-<id>.baton`.
    #[arg(long, requires_all = ["peer_key", "peer_ca"], env = "BATON_PEER_CERT")]
    peer_cert: Option<PathBuf>,
    /// Peer port: the private key of --peer-cert.
    #[arg(long, requires_all = ["peer_cert", "peer_ca"], env = "BATON_PEER_KEY")]
    peer_key: Option<PathBuf>,
    /// Peer port: the CA every member's certificate is signed by (mutual
    /// TLS: a member proves it is one).
    #[arg(long, requires_all = ["peer_cert", "peer_key"], env = "BATON_PEER_CA")]
    peer_ca: Option<PathBuf>,
}

impl TlsArgs {
    fn client(&self) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else { return Ok(None) };
        Ok(Some(baton_proto::tls::server_config(cert, key, self.ca.as_deref())?.into()))
    }

    fn peer(&self) -> anyhow::Result<Option<PeerTls>> {
        let (Some(cert), Some(key), Some(ca)) = (&self.peer_cert, &self.peer_key, &self.peer_ca) else {
            return Ok(None);
        };
        Ok(Some(PeerTls::load(cert, key, ca)?))
    }
}

/// The address others reach this member at: `given`, or the listen
/// address when it names one machine.
fn advertised(what: &str, listen: &str, given: Option<String>) -> anyhow::Result<String> {
    let addr = given.unwrap_or_else(|| listen.to_string());
    check_addr(&addr).map_err(|e| anyhow::anyhow!("--{what}-addr: {e}"))?;
    if addr.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_unspecified()) {
        anyhow::bail!("--{what}-addr {addr} listens on every interface: say --advertise-{what}-addr HOST:PORT");
    }
    Ok(addr)
}

#[derive(Args, Debug)]
struct RestoreArgs {
    /// The backup file.
    file: PathBuf,
    /// The new member's data dir (must not exist or be empty).
    #[arg(long)]
    data_dir: PathBuf,
    /// The new member's id.
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// The new cluster's id (default: a random one; never the old one's,
    /// so members of the old cluster are refused).
    #[arg(long)]
    cluster_id: Option<String>,
}

fn run_restore(r: RestoreArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&r.file).with_context(|| format!("reading {}", r.file.display()))?;
    let file = baton_server::backup::decode(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", r.file.display()))?;
    if r.id == 0 {
        anyhow::bail!("--id 0 is reserved");
    }
    std::fs::create_dir_all(&r.data_dir)?;
    let kv = RocksKv::open(&r.data_dir.join("db")).with_context(|| format!("opening {}", r.data_dir.display()))?;
    let id = baton_server::backup::restore(&kv, &file, r.id, r.cluster_id)?;
    println!(
        "restored index {} of cluster {} into {} as member {} of new cluster {id}; start it with: \
         batond --id {} --data-dir {} --peers {}=PEER_ADDR ...",
        file.index,
        file.cluster_id,
        r.data_dir.display(),
        r.id,
        r.id,
        r.data_dir.display(),
        r.id
    );
    Ok(())
}

#[derive(Args, Debug)]
struct ClusterArgs {
    /// Number of members.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Parent folder of the members' data dirs (and their logs).
    #[arg(long)]
    data_dir: PathBuf,
    /// Client ports are base+1.., peer ports base+101.., HTTP (metrics,
    /// health) base+201..
    #[arg(long, default_value_t = 7100)]
    base_port: u16,
    /// TLS on both ports with a throwaway CA and certificates made in
    /// <data-dir>/tls (clients need a certificate too; printed at start).
    /// A CA and certificates already there are kept.
    #[arg(long)]
    tls: bool,
    /// With --tls: make a new CA and new certificates, replacing those in
    /// <data-dir>/tls (clients holding the old ones are refused).
    #[arg(long, requires = "tls")]
    new_certs: bool,
    /// Also open a ZooKeeper port per member, base+301.. (docs/zookeeper.md).
    #[arg(long)]
    zk: bool,
    #[command(flatten)]
    timing: Timing,
}

/// A config file's path and the flags it added to the command line.
type FromFile = (String, Vec<String>);

/// The command line with `--config`'s settings added (config_file.rs), and
/// the file with the flags it added.
fn args_with_config() -> Result<(Vec<String>, Option<FromFile>), String> {
    use clap::CommandFactory;
    let args: Vec<String> = std::env::args().collect();
    let env = |k: &str| std::env::var(k).ok();
    let Some(path) = baton_server::config_file::config_path(&args, &env) else { return Ok((args, None)) };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("--config {path}: {e}"))?;
    let known: Vec<String> = Cli::command().get_arguments().filter_map(|a| a.get_long()).map(str::to_string).collect();
    let given = args.len();
    let all = baton_server::config_file::merge(args, Path::new(&path), &text, &known, &env)?;
    let added = all[given..].to_vec();
    Ok((all, Some((path, added))))
}

/// Parses the command line; a bad value that came from the config file is
/// reported with the file and the key it came from.
fn parse_cli(args: &[String], config: Option<&FromFile>) -> Cli {
    match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = e.exit_code();
            let text = e.render().to_string();
            eprint!("{text}");
            let keys = config.into_iter().flat_map(|(path, added)| {
                added.iter().filter_map(move |a| {
                    let key = a.trim_start_matches("--").split('=').next()?.to_string();
                    Some((path.clone(), key))
                })
            });
            for (path, key) in keys {
                if text.contains(&format!("--{key}")) {
                    eprintln!("batond: the value of `{key}` comes from the config file {path}");
                    break;
                }
            }
            std::process::exit(code);
        }
    }
}

pub fn main() {
    let (args, config) = args_with_config().unwrap_or_else(|e| {
        eprintln!("batond: {e}");
        std::process::exit(1);
    });
    let cli = parse_cli(&args, config.as_ref());
    let json_logs = cli.log_format == LogFormat::Json;
    baton_server::logging::init(cli.log_format == LogFormat::Json);
    baton_server::memory::set_release(collect_free_pages);
    let member_mode = cli.cmd.is_none();
    let result = match cli.cmd {
        Some(Sub::Cluster(c)) => run_cluster(c, given_member_flags(&args)),
        Some(Sub::Restore(r)) => run_restore(r),
        None => run_member(cli.member),
    };
    // An error is printed once: a JSON log line with JSON logs (like every
    // other line), a plain line otherwise.
    let report = |text: &str| match json_logs {
        true => error!("{text}"),
        false => eprintln!("batond: {text}"),
    };
    if let Err(e) = result {
        let text = format!("{e:#}");
        report(&text);
        if member_mode && text.contains(baton_server::node::REMOVED) {
            // As a wiped member: a supervisor must not restart it as is.
            std::process::exit(2);
        }
        if member_mode && text.contains("corrupt") {
            // kv.rs: a damaged data dir is never served or voted from.
            let msg = "this member's data dir is damaged: it will not serve or vote from it. Remove the member \
                       (baton member remove ID), wipe its data dir and add the machine back with a new id \
                       (docs/operations.md, Replace a dead machine)";
            report(msg);
            std::process::exit(3);
        }
        std::process::exit(1);
    }
}

fn run_member(a: MemberArgs) -> anyhow::Result<()> {
    let need = |what: &str| anyhow::anyhow!("missing --{what} (see batond --help)");
    // Every missing flag at once.
    let missing: Vec<&str> = [
        ("id", a.id.is_none()),
        ("data-dir", a.data_dir.is_none()),
        ("client-addr", a.client_addr.is_none()),
        ("peer-addr", a.peer_addr.is_none()),
        ("peers (a new cluster) or --join (a running one)", a.peers.is_none() && a.join.is_none()),
    ]
    .into_iter()
    .filter_map(|(flag, absent)| absent.then_some(flag))
    .collect();
    if !missing.is_empty() {
        return Err(need(&missing.join(", --")));
    }
    let id = a.id.ok_or_else(|| need("id"))?;
    let data_dir = a.data_dir.ok_or_else(|| need("data-dir"))?;
    let client_addr = a.client_addr.ok_or_else(|| need("client-addr"))?;
    let peer_addr = a.peer_addr.ok_or_else(|| need("peer-addr"))?;
    let advertise_client_addr = advertised("client", &client_addr, a.advertise_client_addr)?;
    let advertise_peer_addr = advertised("peer", &peer_addr, a.advertise_peer_addr)?;
    let (founding, list) = match (a.peers, a.join) {
        (Some(p), None) => (true, p),
        (None, Some(j)) => (false, j),
        _ => return Err(need("peers (a new cluster) or --join (a running one)")),
    };
    let flag = if founding { "--peers" } else { "--join" };
    let mut peers = parse_peers(&list).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
    if founding && !peers.contains_key(&id) {
        anyhow::bail!("--peers must include this member ({id})");
    }
    if !founding {
        peers.insert(id, advertise_peer_addr.clone());
    }
    let client_tls = a.tls.client()?;
    let peer_tls = a.tls.peer()?;
    let t = a.timing;
    let mut cfg = Config {
        id,
        data_dir,
        client_addr,
        peer_addr,
        advertise_client_addr,
        advertise_peer_addr,
        peers,
        founding,
        tick_ms: t.tick_ms,
        election_ticks: t.election_ticks,
        heartbeat_ticks: t.heartbeat_ticks,
        snapshot_entries: t.snapshot_entries,
        max_frame: t.max_frame,
        min_session_ms: t.min_session_ms,
        max_session_ms: t.max_session_ms,
        request_timeout_ms: t.request_timeout_ms,
        limits: Limits {
            max_connections: t.max_connections,
            max_inflight: t.max_inflight,
            max_queued_bytes: t.max_queued_bytes,
            max_sessions: t.max_sessions,
            max_watches: t.max_watches,
            max_multi_ops: t.max_multi_ops,
            max_reply_bytes: t.max_reply_bytes,
        },
        superusers: t.superusers.clone(),
        open_admin: t.open_admin.unwrap_or(false),
        slow_request_ms: t.slow_request_ms,
        faults: t.faults()?,
    };
    cfg.validate().map_err(|e| anyhow::anyhow!(e))?;
    if let Some(bad) =
        cfg.superusers.iter().find(|s| *s == baton_server::acl::ANYONE || !baton_server::acl::valid_identity(s))
    {
        anyhow::bail!("--superuser {bad:?}: not x509:CN, user:NAME or digest:NAME:HASH (docs/security.md)");
    }
    if cfg.open_admin && cfg.superusers.is_empty() {
        tracing::warn!(
            "--insecure-open-admin: every client that reaches a client port may take a backup (every node) and \
             change the membership; for a local development cluster only"
        );
    } else if cfg.superusers.is_empty() {
        tracing::info!(
            "no --superuser: backups and membership changes are refused (docs/operations.md, The first admin)"
        );
    }
    let zk = baton_server::zk::ZkSettings {
        linearizable_reads: a.zk_linearizable_reads,
        words: a.zk_4lw_whitelist.split(',').map(|w| w.trim().to_string()).filter(|w| !w.is_empty()).collect(),
    };
    let opts = member::Options {
        cfg,
        http_addr: a.http_addr,
        zk_addr: a.zk_addr,
        zk,
        client_tls,
        peer_tls,
        io_threads: io_threads(t.io_threads),
    };
    let m = member::start(opts)?;
    let stop = m.stopper();
    m.spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        stop.stop();
    });
    m.run()
}

/// How long `batond cluster` waits for its members after SIGTERM before
/// SIGKILL.
const MEMBERS_STOP_BOUND: Duration = Duration::from_secs(5);

/// `flags`: the member flags to pass on (`given_member_flags`).
fn run_cluster(c: ClusterArgs, flags: Vec<String>) -> anyhow::Result<()> {
    if c.nodes == 0 || c.nodes > 9 {
        anyhow::bail!("--nodes must be 1..9");
    }
    std::fs::create_dir_all(&c.data_dir)?;
    let exe = std::env::current_exe()?;
    let port = |i: u64, off: u64| SocketAddr::from(([127, 0, 0, 1], (c.base_port as u64 + off + i) as u16));
    let peers: Vec<String> = (1..=c.nodes).map(|i| format!("{i}={}", port(i, 100))).collect();
    let peers = peers.join(",");
    let (tls, client_tls) = if c.tls { cluster_certs(&c.data_dir, c.nodes, c.new_certs)? } else { (Vec::new(), None) };
    // Who may run admin operations (backups, membership changes): the
    // --superuser given; on a TLS cluster, the client certificate it prints
    // (x509:admin); on a plaintext one, every client (local development).
    let (admin_args, admin_line): (Vec<String>, String) = if !c.timing.superusers.is_empty() {
        (Vec::new(), format!("admin: --superuser {}", c.timing.superusers.join(",")))
    } else if c.tls {
        (vec!["--superuser=x509:admin".into()], "admin: x509:admin (the client certificate below)".into())
    } else if c.timing.open_admin == Some(false) {
        (Vec::new(), "admin: none (backups and membership changes are refused)".into())
    } else {
        // Given on the command line, it is passed on with the other flags.
        let open = if c.timing.open_admin.is_none() { vec!["--insecure-open-admin".into()] } else { Vec::new() };
        (
            open,
            "admin: every client (--insecure-open-admin: a local development cluster; give --superuser or --tls \
             to close it)"
                .into(),
        )
    };
    let specs: Vec<MemberSpec> = (1..=c.nodes)
        .map(|i| MemberSpec {
            id: i,
            data_dir: c.data_dir.join(format!("member-{i}")),
            log: log_path(&c.data_dir, i),
            client_addr: port(i, 0),
            peer_addr: port(i, 100),
            http_addr: Some(port(i, 200)),
            join: Join::Peers(peers.clone()),
            tls_args: tls.get(i as usize - 1).cloned().unwrap_or_default(),
            extra: {
                let mut e = flags.clone();
                e.extend(admin_args.iter().cloned());
                if c.zk {
                    e.push(format!("--zk-addr={}", port(i, 300)));
                }
                e
            },
            env: Vec::new(),
        })
        .collect();
    // Every port free first; then every member serving its client port
    // (kit's supervise.rs). On an error, the members already started are
    // killed as they drop.
    let mut ports: Vec<(u64, &str, SocketAddr)> = Vec::new();
    for m in &specs {
        ports.extend([(m.id, "client", m.client_addr), (m.id, "peer", m.peer_addr), (m.id, "http", port(m.id, 200))]);
        if c.zk {
            ports.push((m.id, "ZooKeeper", port(m.id, 300)));
        }
    }
    supervise::ports_free(&ports)?;
    // SIGTERM and Ctrl-C are ours before the first member starts: left at
    // their default until the loop below, one that came while members
    // started (or while the banner printed) killed this process at once
    // and left its members running with no one to stop them. Now it is
    // held and acted on as soon as the start is over (START_BOUND).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut term, mut int) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _in = rt.enter();
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?)
    };
    let members = supervise::start_all(&specs, &exe)?;
    let endpoints: Vec<String> = specs.iter().map(|m| m.client_addr.to_string()).collect();
    let member_line = |m: &MemberSpec, pid: u32| {
        format!(
            "member {}: pid {} client {} peer {} http {} log {}",
            m.id,
            pid,
            m.client_addr,
            m.peer_addr,
            port(m.id, 200),
            m.log.display()
        )
    };
    for (m, p) in specs.iter().zip(&members) {
        println!("{}", member_line(m, p.pid()));
    }
    println!("endpoints: {}", endpoints.join(","));
    println!("{admin_line}");
    if c.zk {
        let zk: Vec<String> = specs.iter().map(|m| port(m.id, 300).to_string()).collect();
        println!("zookeeper: {}", zk.join(","));
    }
    if let Some(files) = client_tls {
        println!(
            "tls: --cacert {} --cert {} --key {}",
            files.0.display(),
            files.1.cert.display(),
            files.1.key.display()
        );
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();

    let mut watched: Vec<supervise::Supervised> =
        specs.into_iter().zip(members).map(|(s, p)| supervise::Supervised::new(s, p)).collect();
    let outcome = rt.block_on(async {
        let mut tick = tokio::time::interval(supervise::CHECK_EVERY);
        loop {
            tokio::select! {
                _ = term.recv() => return anyhow::Ok(()),
                _ = int.recv() => return anyhow::Ok(()),
                _ = tick.tick() => {}
            }
            for w in &mut watched {
                let Some(event) = w.check(&exe) else { continue };
                let id = w.spec.id;
                match event {
                    supervise::Event::Restarted { status, pid } => {
                        println!("member {id} exited ({status}); started again:");
                        println!("{}", member_line(&w.spec, pid));
                    }
                    supervise::Event::Stopped { status } => {
                        println!("member {id} exited ({status}); not started again (a clean stop, removed, or its data dir lost)");
                    }
                    supervise::Event::GaveUp { why } => {
                        anyhow::bail!("member {id} keeps failing ({why}); see {}", w.spec.log.display());
                    }
                }
                let _ = std::io::stdout().flush();
            }
            if !watched.iter().any(supervise::Supervised::is_running) {
                anyhow::bail!("no member is running");
            }
        }
    });
    let members: Vec<Process> = watched.into_iter().filter_map(|w| w.process).collect();
    println!("stopping {} members", members.len());
    stop_all(members, MEMBERS_STOP_BOUND);
    outcome
}

fn log_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("member-{id}.log"))
}

/// The CA file and a client certificate, for the cluster's clients.
type ClientFiles = (PathBuf, CertFiles);

/// A throwaway CA in `<dir>/tls` (the one there, unless `fresh`), each
/// member's TLS flags (its certificate on both ports, client certificates
/// required), and one client certificate.
fn cluster_certs(dir: &Path, nodes: u64, fresh: bool) -> anyhow::Result<(Vec<Vec<String>>, Option<ClientFiles>)> {
    let (tls, name) = (dir.join("tls"), "baton cluster throwaway CA");
    let ca = if fresh { Authority::create(&tls, name)? } else { Authority::open_or_create(&tls, name)? };
    let out = (1..=nodes).map(|i| ca.member_args(i)).collect::<anyhow::Result<Vec<_>>>()?;
    let client = ca.client("admin")?;
    Ok((out, Some((ca.ca.clone(), client))))
}
