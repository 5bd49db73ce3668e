//! `baton lock NAME -- COMMAND`: run a command while holding a lock, like
//! `flock` or `consul lock`, with a fencing token in BATON_FENCE_TOKEN.
//!
//! Three kinds, from the client library's recipes, each its own lock with
//! its own nodes (a plain lock and a `--shared` one of the same NAME do
//! not exclude each other):
//! - plain: the mutex (`Client::lock`, `/_baton/locks/NAME`), or with
//!   `--path PATH` instead of NAME the mutex whose queue is PATH's
//!   children (`Client::mutex`): the same lock as Curator's
//!   `InterProcessMutex` or kazoo's `Lock` at PATH through the ZooKeeper
//!   port, and as a Rust `client.mutex(PATH)` (docs/zookeeper.md,
//!   "Recipes that interoperate");
//! - `--shared` / `--write`: a read-write lock (`Client::read_lock` /
//!   `write_lock`, `/_baton/rwlocks/NAME`): readers together, a writer alone;
//! - `--limit N`: a semaphore of N permits (`Client::semaphore`,
//!   `/_baton/semaphores/NAME`, Curator's semaphore protocol under it);
//!   every holder must pass the same N.
//!
//! Waiting: forever, up to `--timeout`, or not at all (`--nonblock`); a
//! lock not acquired exits [`EXIT_NOT_ACQUIRED`] without running the
//! command. SIGINT and SIGTERM end the wait. Every exit closes the session,
//! so a waiter's node or a hold goes at once rather than after a session
//! timeout. `--nonblock` is each recipe's `try_*` call; the checks after
//! the command (`verify`) and `--on-suspend wait` (`may_be_taken`) are the
//! guards' own.

use std::time::Duration;

use baton_client::{Client, LockGuard, Permit, RwGuard, SessionState};
use clap::Args;

use crate::conn::Conn;
use crate::signal::Interrupts;
use crate::supervise::{OnSuspend, Supervised};
use crate::{parse_duration, Fail};

/// How long releasing may take once the command ended (the session is
/// closed right after anyway).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

const LOCK_HELP: &str = "\
A plain lock, a read-write lock (--shared, --write) and a semaphore (--limit) are separate
locks even with the same NAME: a plain `baton lock NAME` does not exclude --shared holders;
use --write for the exclusive side of a read-write lock.

--path PATH (a plain lock only) takes the lock whose queue is PATH's children instead of
/_baton/locks/NAME: the lock a Curator InterProcessMutex, a kazoo Lock or client.mutex(PATH)
at PATH takes.

The command gets BATON_FENCE_TOKEN (pass it to what it writes: `baton set --fence`),
BATON_LOCK_NAME (NAME, or PATH with --path) and BATON_ENDPOINTS.

Exit: the command's code; 7 if the lock was not acquired (--nonblock, --timeout);
75 if the lock was lost while the command ran; 130/143 if interrupted while waiting.";

/// Run a command while holding lock NAME (exclusive, shared, or one of N).
#[derive(Args, Debug)]
#[command(after_help = LOCK_HELP)]
pub struct Lock {
    /// The lock's name (1 to 512 bytes, no `/`).
    #[arg(required_unless_present = "path")]
    name: Option<String>,
    /// A plain lock at any path instead of a name: its queue is PATH's
    /// children (Curator's and kazoo's layout; created on demand).
    #[arg(long, value_parser = parse_queue_path, conflicts_with_all = ["name", "shared", "write", "limit"])]
    path: Option<String>,
    /// A shared (read) hold of read-write lock NAME: any number of --shared
    /// holders at once, none while a --write holder holds or waits.
    #[arg(long, conflicts_with_all = ["write", "limit"])]
    shared: bool,
    /// The exclusive (write) hold of read-write lock NAME: excludes
    /// --shared holders and other writers.
    #[arg(long, conflicts_with = "limit")]
    write: bool,
    /// One of N permits of semaphore NAME: at most N holders at once
    /// (every holder must pass the same N).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// Fail at once, with exit code 7, if the lock is not free now (like
    /// `flock -n`).
    #[arg(short = 'n', long, conflicts_with = "timeout")]
    nonblock: bool,
    /// Give up, with exit code 7, if the lock is not acquired within this
    /// time (0s: like --nonblock).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    timeout: Option<Duration>,
    #[command(flatten)]
    run: Supervised,
}

/// Which recipe a `Lock` uses.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Mutex,
    /// `--path`: the "name" is the queue's path.
    MutexAt,
    Read,
    Write,
    Permits(usize),
}

impl Kind {
    /// Waits for a hold.
    async fn acquire(self, c: &Client, name: &str) -> baton_client::Result<Guard> {
        Ok(match self {
            Kind::Mutex => Guard::Mutex(c.lock(name).await?),
            Kind::MutexAt => Guard::Mutex(c.mutex(name)?.lock().await?),
            Kind::Read => Guard::Rw(c.read_lock(name).await?),
            Kind::Write => Guard::Rw(c.write_lock(name).await?),
            Kind::Permits(n) => Guard::Permit(c.semaphore(name, n).acquire().await?),
        })
    }

    /// A hold if one is free now (nothing is left queued otherwise).
    async fn try_acquire(self, c: &Client, name: &str) -> baton_client::Result<Option<Guard>> {
        Ok(match self {
            Kind::Mutex => c.try_lock(name).await?.map(Guard::Mutex),
            Kind::MutexAt => c.mutex(name)?.try_lock().await?.map(Guard::Mutex),
            Kind::Read => c.try_read_lock(name).await?.map(Guard::Rw),
            Kind::Write => c.try_write_lock(name).await?.map(Guard::Rw),
            Kind::Permits(n) => c.semaphore(name, n).try_acquire().await?.map(Guard::Permit),
        })
    }

    fn describe(self, name: &str) -> String {
        match self {
            Kind::Mutex => format!("lock {name}"),
            Kind::MutexAt => format!("the lock at {name}"),
            Kind::Read => format!("read lock {name}"),
            Kind::Write => format!("write lock {name}"),
            Kind::Permits(n) => format!("a permit of semaphore {name} (limit {n})"),
        }
    }
}

/// A held lock of any kind.
enum Guard {
    Mutex(LockGuard),
    Rw(RwGuard),
    Permit(Permit),
}

impl Guard {
    fn token(&self) -> u64 {
        match self {
            Guard::Mutex(g) => g.fencing_token(),
            Guard::Rw(g) => g.fencing_token(),
            Guard::Permit(p) => p.fencing_token(),
        }
    }

    /// Resolves when the hold must be given up under `policy`.
    async fn lost(&self, policy: OnSuspend) -> SessionState {
        match (policy, self) {
            (OnSuspend::Kill, Guard::Mutex(g)) => g.lost().await,
            (OnSuspend::Kill, Guard::Rw(g)) => g.lost().await,
            (OnSuspend::Kill, Guard::Permit(p)) => p.lost().await,
            (OnSuspend::Wait, Guard::Mutex(g)) => g.may_be_taken().await,
            (OnSuspend::Wait, Guard::Rw(g)) => g.may_be_taken().await,
            (OnSuspend::Wait, Guard::Permit(p)) => p.may_be_taken().await,
        }
    }

    /// Asks the cluster whether this session still holds.
    async fn verify(&self) -> baton_client::Result<bool> {
        match self {
            Guard::Mutex(g) => g.verify().await,
            Guard::Rw(g) => g.verify().await,
            Guard::Permit(p) => p.verify().await,
        }
    }

    async fn release(self) -> baton_client::Result<()> {
        match self {
            Guard::Mutex(g) => g.release().await,
            Guard::Rw(g) => g.release().await,
            Guard::Permit(p) => p.release().await,
        }
    }
}

impl Lock {
    fn kind(&self) -> Kind {
        match (self.shared, self.write, self.limit) {
            _ if self.path.is_some() => Kind::MutexAt,
            (true, _, _) => Kind::Read,
            (_, true, _) => Kind::Write,
            (_, _, Some(n)) => Kind::Permits(n as usize),
            _ => Kind::Mutex,
        }
    }

    /// Acquires, runs the command, releases; the exit code. The session is
    /// closed whatever happens.
    pub async fn run(self, conn: &Conn) -> anyhow::Result<i32> {
        conn.session(Some(self.run.session_timeout), async |c| self.hold_and_run(c, conn).await).await
    }

    /// NAME, or PATH with `--path` (clap requires one of them).
    fn target(&self) -> &str {
        self.path.as_deref().or(self.name.as_deref()).unwrap_or_default()
    }

    async fn hold_and_run(&self, c: &Client, conn: &Conn) -> anyhow::Result<i32> {
        let (kind, what) = (self.kind(), self.kind().describe(self.target()));
        let hold = self.acquire(c, kind, &what).await?;
        let token = hold.token();
        eprintln!("baton: holding {what} (token {token})");
        let env = [("BATON_FENCE_TOKEN", token.to_string()), ("BATON_LOCK_NAME", self.target().to_string())];
        let code = self.run.run(&env, &conn.endpoints, hold.lost(self.run.on_suspend), hold.verify(), &what).await?;
        // After a loss the session may be gone: bounded, best-effort release.
        let _ = tokio::time::timeout(RELEASE_TIMEOUT, hold.release()).await;
        Ok(code)
    }

    /// Waits as the flags say; SIGINT or SIGTERM end the wait.
    async fn acquire(&self, c: &Client, kind: Kind, what: &str) -> anyhow::Result<Guard> {
        let wait = if self.nonblock { Some(Duration::ZERO) } else { self.timeout };
        let mut interrupts = Interrupts::new()?;
        let guard = tokio::select! {
            g = acquire_within(c, kind, self.target(), wait) => g?,
            e = interrupts.fail(format!("while waiting for {what}")) => return Err(e),
        };
        let Some(guard) = guard else {
            let why = match wait {
                Some(t) if !t.is_zero() => format!("{what} not acquired within {}", crate::human(t)),
                _ => format!("{what} is not free (--nonblock)"),
            };
            return Err(Fail::NotAcquired(why).into());
        };
        Ok(guard)
    }
}

/// `--path`: a valid path other than `/` (a lock's queue is its own node).
fn parse_queue_path(s: &str) -> Result<String, String> {
    let p = crate::parse_path(s)?;
    if p == "/" {
        return Err("a lock's queue cannot be the root: give it a path of its own".into());
    }
    Ok(p)
}

/// A hold within `wait` (None: no limit; zero: only if free now); None if
/// not acquired. A wait given up deletes its queue node (the recipes'
/// cancellation), and the caller closes the session anyway.
async fn acquire_within(c: &Client, kind: Kind, name: &str, wait: Option<Duration>) -> anyhow::Result<Option<Guard>> {
    match (wait, kind) {
        (None, _) => Ok(Some(kind.acquire(c, name).await?)),
        (Some(t), _) if t.is_zero() => Ok(kind.try_acquire(c, name).await?),
        (Some(t), _) => match tokio::time::timeout(t, kind.acquire(c, name)).await {
            Ok(g) => Ok(Some(g?)),
            Err(_) => Ok(None),
        },
    }
}
