//! The stores a lock protects, and the lock services the lock comparison
//! runs, started privately for tests and the harness: a PostgreSQL
//! cluster, a Redis server and a MariaDB server, each on a free loopback
//! port with its own data directory, killed when dropped.
//!
//! All come from Debian (`make store-deps` installs what is missing; see
//! scripts/store-deps.sh). PostgreSQL's `initdb` refuses to run as root, so
//! when this process is root the data directory is given to the `postgres`
//! user and `initdb` and `postgres` run as that user. Authentication is
//! `trust` for user `baton` over TCP on 127.0.0.1 only; fsync stays on.
//! MariaDB likewise runs as the `mysql` user when this process is root;
//! it skips its grant tables (user `root`, no password, 127.0.0.1 only)
//! and keeps InnoDB's flush at every commit.
//!
//! A Redis or a MariaDB can be killed -9 and started again on its port
//! ([`Redis::kill`], [`Redis::restart`], [`Mariadb::kill`],
//! [`Mariadb::restart`]), for the lock comparison's kill fault.
//!
//! Invariants: every wait is bounded (start-up: 30 s); the store listens on
//! 127.0.0.1 only; dropping the handle stops the server (an immediate
//! shutdown: SIGQUIT, then SIGKILL after 5 s) and removes its directory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::ports::free_port;

/// How long a store may take to accept connections.
const START_LIMIT: Duration = Duration::from_secs(30);

/// Where Debian puts PostgreSQL's server binaries (`/usr/lib/postgresql/<v>/bin`),
/// the newest version first.
fn pg_bin_dir() -> anyhow::Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql: run `make store-deps`")?
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("postgres").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).context("no PostgreSQL server binaries: run `make store-deps`")
}

/// The uid and gid of `user`, from /etc/passwd.
fn user_ids(user: &str) -> anyhow::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").context("reading /etc/passwd")?;
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() > 3 && f[0] == user {
            return Ok((f[2].parse().context("uid")?, f[3].parse().context("gid")?));
        }
    }
    bail!("no user {user:?} (Debian's postgresql package makes it: run `make store-deps`)")
}

/// A process the store handle owns: immediate shutdown on drop.
struct Owned(Option<Child>);

impl Owned {
    fn stop(&mut self, signal: i32) {
        let Some(mut child) = self.0.take() else { return };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) on a pid this handle started and has not reaped.
            unsafe { libc::kill(pid, signal) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }
}

/// Waits until `port` accepts a TCP connection, or the process exits, or
/// [`START_LIMIT`] passes.
fn wait_listening(proc: &mut Owned, port: u16, what: &str, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_LIMIT;
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Some(st) = proc.exited() {
            bail!("{what} exited ({st}) before listening on {port}:\n{}", tail(log));
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on {port} within {START_LIMIT:?}:\n{}", tail(log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last lines of a log file, for an error message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A private PostgreSQL cluster (one server) on 127.0.0.1.
pub struct Postgres {
    proc: Owned,
    port: u16,
    dir: tempfile::TempDir,
}

impl Postgres {
    /// Makes a fresh cluster (`initdb`, user `baton`, trust auth) and
    /// starts it on a free port. Blocking (up to ~30 s).
    pub fn start() -> anyhow::Result<Postgres> {
        let bin = pg_bin_dir()?;
        let dir = tempfile::Builder::new().prefix("baton-pg-").tempdir().context("tempdir")?;
        let data = dir.path().join("data");
        let log = dir.path().join("postgres.log");
        let ids = if unsafe { libc::geteuid() } == 0 { Some(user_ids("postgres")?) } else { None };
        if let Some((uid, gid)) = ids {
            chown(dir.path(), uid, gid)?;
        }
        let as_owner = |cmd: &mut Command| {
            if let Some((uid, gid)) = ids {
                cmd.uid(uid).gid(gid).env("HOME", "/var/lib/postgresql");
            }
            cmd.current_dir(dir.path());
        };
        let mut initdb = Command::new(bin.join("initdb"));
        initdb.arg("-D").arg(&data).args(["-U", "baton", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"]);
        as_owner(&mut initdb);
        let out = initdb.output().context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        let port = free_port();
        let log_file = std::fs::File::create(&log).context("postgres log")?;
        if let Some((uid, gid)) = ids {
            chown(&log, uid, gid)?;
        }
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1", "-c"])
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            .args(["-c", "fsync=on", "-c", "max_connections=200", "-c", "shared_buffers=32MB"])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        as_owner(&mut cmd);
        let mut proc = Owned(Some(cmd.spawn().context("starting postgres")?));
        wait_listening(&mut proc, port, "postgres", &log)?;
        // Listening is not yet accepting sessions ("the database system is
        // starting up"): pg_isready says when it does (bounded).
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string(), "-U", "baton", "-d", "postgres"])
                .status()
                .context("running pg_isready")?;
            if ready.success() {
                break;
            }
            if let Some(st) = proc.exited() {
                bail!("postgres exited ({st}) while starting:\n{}", tail(&log));
            }
            if Instant::now() > deadline {
                bail!("postgres on {port} was not ready within {START_LIMIT:?}:\n{}", tail(&log));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Postgres { proc, port, dir })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq/tokio-postgres connection string for database `postgres`.
    pub fn conn_str(&self) -> String {
        format!("host=127.0.0.1 port={} user=baton dbname=postgres connect_timeout=10", self.port)
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGQUIT: PostgreSQL's immediate shutdown (the backends go too).
        self.proc.stop(libc::SIGQUIT);
    }
}

fn chown(path: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).with_context(|| format!("chown {}", path.display()))
}

/// A private Redis server on 127.0.0.1, no persistence unless asked.
pub struct Redis {
    // Before `dir`: the server is killed before its directory goes.
    server: Restartable,
    dir: tempfile::TempDir,
}

impl Redis {
    /// Starts `redis-server` on a free port. `appendfsync_always`: an
    /// append-only file synced on every write (what a fence needs to
    /// survive a Redis restart); otherwise nothing is persisted.
    pub fn start(appendfsync_always: bool) -> anyhow::Result<Redis> {
        let dir = tempfile::Builder::new().prefix("baton-redis-").tempdir().context("tempdir")?;
        let log = dir.path().join("redis.log");
        let port = free_port();
        let mut args = vec![
            "--port".to_string(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--dir".into(),
            dir.path().display().to_string(),
            "--logfile".into(),
            log.display().to_string(),
            "--daemonize".into(),
            "no".into(),
        ];
        if appendfsync_always {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
        } else {
            args.extend(["--appendonly", "no"].map(String::from));
        }
        let bin = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .into_iter()
            .find(|b| Path::new(b).is_file())
            .context("no redis-server: run `make store-deps`")?;
        let server = Restartable::start(bin, "redis-server", args, port, log, ping)?;
        Ok(Redis { server, dir })
    }

    /// kill -9 (what is not persisted is lost).
    pub fn kill(&self) {
        self.server.kill();
    }

    /// Starts it again on the same port, with the same settings (after
    /// [`Redis::kill`]; a no-op while it runs).
    pub fn restart(&self) -> anyhow::Result<()> {
        self.server.restart()
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.server.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A server process that can be killed -9 and started again with the same
/// command line (its port and data kept); killed when dropped.
struct Restartable {
    proc: std::sync::Mutex<Owned>,
    bin: &'static str,
    what: &'static str,
    args: Vec<String>,
    port: u16,
    log: PathBuf,
    serving: fn(u16) -> bool,
}

impl Restartable {
    /// Starts it and waits (bounded) until it listens on `port` and
    /// `serving(port)` says it answers.
    fn start(
        bin: &'static str,
        what: &'static str,
        args: Vec<String>,
        port: u16,
        log: PathBuf,
        serving: fn(u16) -> bool,
    ) -> anyhow::Result<Restartable> {
        let proc = spawn_serving(Command::new(bin).args(&args), what, port, &log, serving)?;
        Ok(Restartable { proc: std::sync::Mutex::new(proc), bin, what, args, port, log, serving })
    }

    fn kill(&self) {
        self.proc.lock().unwrap_or_else(|p| p.into_inner()).stop(libc::SIGKILL);
    }

    /// A no-op while it runs; otherwise as [`Restartable::start`].
    fn restart(&self) -> anyhow::Result<()> {
        let mut proc = self.proc.lock().unwrap_or_else(|p| p.into_inner());
        if proc.0.is_some() && proc.exited().is_none() {
            return Ok(());
        }
        *proc = spawn_serving(Command::new(self.bin).args(&self.args), self.what, self.port, &self.log, self.serving)?;
        Ok(())
    }
}

impl Drop for Restartable {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Spawns `cmd` (output discarded: the server logs to `log`) and waits
/// (bounded) until it listens on `port` and `serving(port)` says it
/// answers.
fn spawn_serving(
    cmd: &mut Command,
    what: &str,
    port: u16,
    log: &Path,
    serving: fn(u16) -> bool,
) -> anyhow::Result<Owned> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let mut proc = Owned(Some(child));
    wait_listening(&mut proc, port, what, log)?;
    // Listening is not yet serving: wait for an answer (bounded).
    let deadline = Instant::now() + START_LIMIT;
    while !serving(port) {
        if let Some(st) = proc.exited() {
            bail!("{what} exited ({st}) while starting:\n{}", tail(log));
        }
        if Instant::now() > deadline {
            bail!("{what} on {port} did not answer within {START_LIMIT:?}:\n{}", tail(log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(proc)
}

/// One PING over RESP, with a short timeout.
fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A private MariaDB server on 127.0.0.1 (for `GET_LOCK`), user `root`
/// with no password.
pub struct Mariadb {
    // Before `dir`: the server is killed before its directory goes.
    server: Restartable,
    dir: tempfile::TempDir,
}

/// Debian's MariaDB server binary.
const MARIADBD: &str = "/usr/sbin/mariadbd";

impl Mariadb {
    /// Makes a fresh data directory (`mariadb-install-db`) and starts the
    /// server on a free port. Blocking (up to ~30 s).
    pub fn start() -> anyhow::Result<Mariadb> {
        if !Path::new(MARIADBD).is_file() {
            bail!("no {MARIADBD}: run `make store-deps`");
        }
        let dir = tempfile::Builder::new().prefix("baton-mariadb-").tempdir().context("tempdir")?;
        let data = dir.path().join("data");
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            let (uid, gid) = user_ids("mysql")?;
            chown(dir.path(), uid, gid)?;
        }
        let mut install = Command::new("/usr/bin/mariadb-install-db");
        install.arg("--no-defaults").arg(format!("--datadir={}", data.display())).args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
        ]);
        if root {
            install.arg("--user=mysql");
        }
        let out = install.current_dir(dir.path()).output().context("running mariadb-install-db")?;
        if !out.status.success() {
            bail!(
                "mariadb-install-db failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let port = free_port();
        let mut args = vec![
            "--no-defaults".to_string(),
            format!("--datadir={}", data.display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--socket={}", dir.path().join("mariadb.sock").display()),
            format!("--pid-file={}", dir.path().join("mariadb.pid").display()),
            format!("--log-error={}", dir.path().join("mariadb.log").display()),
            "--skip-grant-tables".into(),
            "--skip-name-resolve".into(),
            "--innodb-flush-log-at-trx-commit=1".into(),
            "--innodb-buffer-pool-size=32M".into(),
            "--max-connections=300".into(),
        ];
        if root {
            args.push("--user=mysql".into());
        }
        let log = dir.path().join("mariadb.log");
        let server = Restartable::start(MARIADBD, "mariadbd", args, port, log, greets)?;
        Ok(Mariadb { server, dir })
    }

    /// kill -9 (its named locks go with it).
    pub fn kill(&self) {
        self.server.kill();
    }

    /// Starts it again on the same port and data (after [`Mariadb::kill`];
    /// a no-op while it runs). Blocks until it serves (InnoDB recovers).
    pub fn restart(&self) -> anyhow::Result<()> {
        self.server.restart()
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// `mysql://root@127.0.0.1:<port>/` (no database selected).
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/", self.server.port)
    }

    /// The server's error log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mariadb.log")).unwrap_or_default()
    }
}

/// Whether a MySQL-protocol server on `port` sends its handshake (protocol
/// version 10) on a new connection.
fn greets(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut head = [0u8; 5];
    s.read_exact(&mut head).is_ok() && head[4] == 10
}
