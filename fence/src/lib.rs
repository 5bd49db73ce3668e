//! Fences the protected store checks itself (seed 002, Kleppmann's half of
//! the Redlock debate): a lock cannot stop a holder that was paused past
//! its session from writing when it wakes up; only the resource can refuse
//! it. Baton gives every grant a fencing token (the Raft index that made the
//! holder's node: unique, strictly increasing across grants). This crate
//! makes the store compare it, inside the store's own atomic step.
//!
//! # The rule
//! For a resource `R` (any name the writers agree on), a write fenced with
//! token `t` takes effect only if no fenced write with a token greater than
//! `t` has taken effect for `R`; when it does, `R`'s recorded token becomes
//! `t`. The recorded token never decreases. Equal tokens pass (one grant may
//! write many times). The check, the record and the write are one atomic
//! step of the store:
//! - [`postgres`]: one row per resource in a fence table, checked and
//!   updated by a function called inside the writer's transaction; the row
//!   stays locked until that transaction ends, so fenced transactions on one
//!   resource are serialized and a stale one is refused and aborted.
//! - [`redis`]: one key per resource, checked and set by a server-side
//!   script that runs the writes in the same script.
//! - [`dir`]: a token file per resource, checked and replaced under an
//!   exclusive `flock`, then the data written to a temporary file and
//!   renamed over the resource's file.
//!
//! A refused write is [`FenceError::Stale`]: it definitely did not happen
//! (and in PostgreSQL the transaction is aborted, so nothing else in it
//! commits either). Any other error from the store keeps the store's own
//! meaning (a lost connection during a commit may have committed).
//!
//! # What a fence does not do
//! - Writes that bypass it (plain SQL, a plain `SET`, another program
//!   writing the file) are not checked and can overwrite a fenced write.
//!   Every writer of a resource must go through the fence.
//! - It orders holders, it does not exclude them: two writes with the same
//!   token both pass, and a write from an older holder that lands before any
//!   newer holder's write passes too (it was first, so nothing newer is
//!   lost). What it guarantees is that no write from an older grant lands
//!   after a newer grant's write to the same resource.
//! - The recorded tokens are only as durable as the store: a Redis that
//!   loses its data on restart loses its fences with it.

pub mod dir;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;

/// Why a fenced write did not happen (or may not have).
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// Definitely did not happen: `resource` already accepted `current`,
    /// higher than `token`. The writer's grant is over; stop writing.
    #[error("fence on {resource:?}: token {token} is stale, {current} was already accepted")]
    Stale { resource: String, token: u64, current: u64 },
    /// A bad argument (resource or table name, a token out of range);
    /// nothing was sent to the store.
    #[error("fence: {0}")]
    Invalid(String),
    /// The store's own error, with the store's meaning.
    #[cfg(feature = "postgres")]
    #[error("fence (postgres): {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[cfg(feature = "redis")]
    #[error("fence (redis): {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("fence (files): {0}")]
    Io(#[from] std::io::Error),
}

impl FenceError {
    /// True for [`FenceError::Stale`]: a newer holder has written.
    pub fn is_stale(&self) -> bool {
        matches!(self, FenceError::Stale { .. })
    }
}

/// Parses a recorded token; a record that is not one is an error, never a
/// pass.
fn parse_token(resource: &str, text: &str) -> Result<u64, FenceError> {
    text.trim().parse().map_err(|_| FenceError::Invalid(format!("the recorded token for {resource:?} is {text:?}")))
}
