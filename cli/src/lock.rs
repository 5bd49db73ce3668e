//! `baton lock NAME -- COMMAND`: run a command while holding a lock, like
//! `flock` or `consul lock`, with a fencing token in BATON_FENCE_TOKEN.
//!
//! Three kinds, from the client library's recipes, each its own lock with
//! its own nodes (a plain lock and a `--shared` one of the same NAME do
//! not exclude each other):
//! - plain: the mutex (`Client::lock`, `/_baton/locks/NAME`);
//! - `--shared` / `--write`: a read-write lock (`Client::read_lock` /
//!   `write_lock`, `/_baton/rwlocks/NAME`): readers together, a writer alone;
//! - `--limit N`: a semaphore of N permits (`Client::acquire_permit`,
//!   `/_baton/semaphores/NAME`); every holder must pass the same N.
//!
//! Waiting: forever, up to `--timeout`, or not at all (`--nonblock`); a
//! lock not acquired exits [`EXIT_NOT_ACQUIRED`] without running the
//! command. SIGINT and SIGTERM end the wait. Every exit closes the session,
//! so a waiter's node or a hold goes at once rather than after a session
//! timeout.
//!
//! Stopgaps until the client library has them (see `Hold`): the library
//! has no non-blocking or verifying calls for read-write locks and
//! semaphores, so `--nonblock` with `--shared`/`--write`/`--limit` reads the
//! queue (the rules in docs/recipes.md) and `verify` looks for this
//! session's node; `--on-suspend wait` uses the session state directly.

use std::time::Duration;

use baton_client::recipes::RECIPE_ROOT;
use baton_client::{Client, LockGuard, Permit, RwGuard, SessionState, Stat};
use clap::Args;

use crate::conn::Conn;
use crate::node::stats_of;
use crate::signal::Interrupts;
use crate::supervise::{OnSuspend, Supervised};
use crate::{parse_duration, Fail};

/// How long releasing may take once the command ended (the session is
/// closed right after anyway).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);
/// `--nonblock` on a queue recipe: how often, and how many times, to look
/// for this session's node while its creation is under way.
const PROBE_PAUSE: Duration = Duration::from_millis(20);
const PROBE_TRIES: usize = 500;

const LOCK_HELP: &str = "\
A plain lock, a read-write lock (--shared, --write) and a semaphore (--limit) are separate
locks even with the same NAME: a plain `baton lock NAME` does not exclude --shared holders;
use --write for the exclusive side of a read-write lock.

The command gets BATON_FENCE_TOKEN (pass it to what it writes: `baton set --fence`),
BATON_LOCK_NAME and BATON_ENDPOINTS.

Exit: the command's code; 7 if the lock was not acquired (--nonblock, --timeout);
75 if the lock was lost while the command ran; 130/143 if interrupted while waiting.";

/// Run a command while holding lock NAME (exclusive, shared, or one of N).
#[derive(Args, Debug)]
#[command(after_help = LOCK_HELP)]
pub struct Lock {
    /// The lock's name (1 to 512 bytes, no `/`).
    name: String,
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
    Read,
    Write,
    Permits(usize),
}

impl Kind {
    /// Where the recipe queues its nodes.
    fn dir(self, name: &str) -> String {
        let kind = match self {
            Kind::Mutex => "locks",
            Kind::Read | Kind::Write => "rwlocks",
            Kind::Permits(_) => "semaphores",
        };
        format!("{RECIPE_ROOT}/{kind}/{name}")
    }

    /// Waits for a hold.
    async fn acquire(self, c: &Client, name: &str) -> baton_client::Result<Guard> {
        Ok(match self {
            Kind::Mutex => Guard::Mutex(c.lock(name).await?),
            Kind::Read => Guard::Rw(c.read_lock(name).await?),
            Kind::Write => Guard::Rw(c.write_lock(name).await?),
            Kind::Permits(n) => Guard::Permit(c.acquire_permit(name, n).await?),
        })
    }

    /// Whether the node at `me` in the sorted queue must wait (the rules of
    /// docs/recipes.md).
    fn blocked(self, queue: &[String], me: usize) -> bool {
        match self {
            Kind::Mutex | Kind::Write => me > 0,
            Kind::Read => queue[..me].iter().any(|n| n.starts_with("write-")),
            Kind::Permits(n) => me >= n,
        }
    }

    fn describe(self, name: &str) -> String {
        match self {
            Kind::Mutex => format!("lock {name}"),
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

/// A held lock, with what is needed to check it.
struct Hold {
    guard: Guard,
    client: Client,
    dir: String,
}

impl Hold {
    fn token(&self) -> u64 {
        match &self.guard {
            Guard::Mutex(g) => g.fencing_token(),
            Guard::Rw(g) => g.fencing_token(),
            Guard::Permit(p) => p.fencing_token(),
        }
    }

    /// Resolves when the hold must be given up under `policy`.
    async fn lost(&self, policy: OnSuspend) -> SessionState {
        match (policy, &self.guard) {
            (OnSuspend::Kill, Guard::Mutex(g)) => g.lost().await,
            (OnSuspend::Kill, Guard::Rw(g)) => g.lost().await,
            (OnSuspend::Kill, Guard::Permit(p)) => p.lost().await,
            (OnSuspend::Wait, Guard::Mutex(g)) => g.may_be_taken().await,
            (OnSuspend::Wait, _) => may_be_taken(&self.client).await,
        }
    }

    /// Asks the cluster whether this session still holds.
    async fn verify(&self) -> baton_client::Result<bool> {
        match &self.guard {
            Guard::Mutex(g) => g.verify().await,
            _ => holds_in_queue(&self.client, &self.dir, self.token()).await,
        }
    }

    async fn release(self) -> baton_client::Result<()> {
        match self.guard {
            Guard::Mutex(g) => g.release().await,
            Guard::Rw(g) => g.release().await,
            Guard::Permit(p) => p.release().await,
        }
    }
}

impl Lock {
    fn kind(&self) -> Kind {
        match (self.shared, self.write, self.limit) {
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

    async fn hold_and_run(&self, c: &Client, conn: &Conn) -> anyhow::Result<i32> {
        let (kind, what) = (self.kind(), self.kind().describe(&self.name));
        let hold = self.acquire(c, kind, &what).await?;
        let token = hold.token();
        eprintln!("baton: holding {what} (token {token})");
        let env = [("BATON_FENCE_TOKEN", token.to_string()), ("BATON_LOCK_NAME", self.name.clone())];
        let code = self.run.run(&env, &conn.endpoints, hold.lost(self.run.on_suspend), hold.verify(), &what).await?;
        // After a loss the session may be gone: bounded, best-effort release.
        let _ = tokio::time::timeout(RELEASE_TIMEOUT, hold.release()).await;
        Ok(code)
    }

    /// Waits as the flags say; SIGINT or SIGTERM end the wait.
    async fn acquire(&self, c: &Client, kind: Kind, what: &str) -> anyhow::Result<Hold> {
        let wait = if self.nonblock { Some(Duration::ZERO) } else { self.timeout };
        let mut interrupts = Interrupts::new()?;
        let guard = tokio::select! {
            g = acquire_within(c, kind, &self.name, wait) => g?,
            e = interrupts.fail(format!("while waiting for {what}")) => return Err(e),
        };
        let Some(guard) = guard else {
            let why = match wait {
                Some(t) if !t.is_zero() => format!("{what} not acquired within {t:?}"),
                _ => format!("{what} is not free (--nonblock)"),
            };
            return Err(Fail::NotAcquired(why).into());
        };
        Ok(Hold { guard, client: c.clone(), dir: kind.dir(&self.name) })
    }
}

/// A hold within `wait` (None: no limit; zero: only if free now); None if
/// not acquired. A wait given up deletes its queue node (the recipes'
/// cancellation), and the caller closes the session anyway.
async fn acquire_within(c: &Client, kind: Kind, name: &str, wait: Option<Duration>) -> anyhow::Result<Option<Guard>> {
    match (wait, kind) {
        (None, _) => Ok(Some(kind.acquire(c, name).await?)),
        (Some(t), Kind::Mutex) if t.is_zero() => Ok(c.try_lock(name).await?.map(Guard::Mutex)),
        (Some(t), _) if t.is_zero() => {
            let dir = kind.dir(name);
            tokio::select! {
                g = kind.acquire(c, name) => Ok(Some(g?)),
                blocked = wait_blocked(c, kind, &dir) => blocked.map(|()| None),
            }
        }
        (Some(t), _) => match tokio::time::timeout(t, kind.acquire(c, name)).await {
            Ok(g) => Ok(Some(g?)),
            Err(_) => Ok(None),
        },
    }
}

/// Resolves once this session's node is in `dir`'s queue behind a node it
/// must wait for; never resolves if it is not (the acquire then completes).
async fn wait_blocked(c: &Client, kind: Kind, dir: &str) -> anyhow::Result<()> {
    for _ in 0..PROBE_TRIES {
        let queue = queue(c, dir).await?;
        if let Some(me) = queue.iter().position(|(_, s)| s.ephemeral_owner == c.session_id()) {
            let names: Vec<String> = queue.into_iter().map(|(n, _)| n).collect();
            if kind.blocked(&names, me) {
                return Ok(());
            }
            return std::future::pending().await;
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    anyhow::bail!("this session's node did not appear in {dir}")
}

/// `dir`'s queue in order (sequence number), each node with its name and
/// stat; nodes gone meanwhile left out.
async fn queue(c: &Client, dir: &str) -> baton_client::Result<Vec<(String, Stat)>> {
    let mut names = match c.children(dir).await {
        Ok(k) => k,
        Err(e) if e.is_no_node() => Vec::new(),
        Err(e) => return Err(e),
    };
    // `<prefix><attempt>-<10-digit sequence number>`
    names.sort_by_key(|n| (n.get(n.len().saturating_sub(10)..).and_then(|s| s.parse::<u64>().ok()), n.clone()));
    let nodes = stats_of(c, dir, names).await?;
    Ok(nodes.into_iter().map(|n| (n.path.rsplit('/').next().unwrap_or_default().to_string(), n.stat)).collect())
}

/// Whether this session's node with creation index `token` is still in
/// `dir` (linearizable reads).
async fn holds_in_queue(c: &Client, dir: &str, token: u64) -> baton_client::Result<bool> {
    if *c.state().borrow() == SessionState::Expired {
        return Ok(false);
    }
    let q = queue(c, dir).await?;
    Ok(q.iter().any(|(_, s)| s.czxid == token && s.ephemeral_owner == c.session_id()))
}

/// Resolves when another session may hold what this one holds: it expired,
/// or stayed suspended for as long as the cluster may take to expire it
/// (what the library's `LockGuard::may_be_taken` does, for the guards that
/// lack it).
async fn may_be_taken(c: &Client) -> SessionState {
    let mut st = c.state();
    loop {
        let now = *st.borrow_and_update();
        let expiry = match now {
            SessionState::Expired => return now,
            SessionState::Connected => None,
            SessionState::Suspended => Some(tokio::time::Instant::from_std(c.may_be_lost_at().await)),
        };
        let expired = async {
            match expiry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = st.changed() => if changed.is_err() {
                return SessionState::Expired;
            },
            () = expired => {
                let s = *st.borrow();
                if s != SessionState::Connected {
                    return s;
                }
            }
        }
    }
}
