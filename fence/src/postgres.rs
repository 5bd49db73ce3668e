//! PostgreSQL, fenced: a transaction calls [`PgFence::fenced`] with its
//! grant's token, and commits only if no higher token has touched the
//! resource.
//!
//! [`PgFence::install`] makes a table (one row per resource: the highest
//! token accepted) and a function that checks and records a token. With the
//! default name `baton_fence`, the SQL is:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS baton_fence (
//!     resource text PRIMARY KEY,
//!     token bigint NOT NULL CHECK (token >= 0));
//! CREATE OR REPLACE FUNCTION baton_fence_check(p_resource text, p_token bigint)
//! RETURNS void LANGUAGE plpgsql AS $$
//! DECLARE cur bigint;
//! BEGIN
//!   INSERT INTO baton_fence AS f (resource, token) VALUES (p_resource, p_token)
//!   ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
//!     WHERE f.token <= EXCLUDED.token
//!   RETURNING f.token INTO cur;
//!   IF NOT FOUND THEN
//!     SELECT f.token INTO cur FROM baton_fence f WHERE f.resource = p_resource;
//!     RAISE EXCEPTION USING ERRCODE = 'BF001',
//!       MESSAGE = format('fence %s: token %s is stale', p_resource, p_token),
//!       DETAIL = cur::text;
//!   END IF;
//! END $$;
//! ```
//!
//! and a fenced write is `SELECT baton_fence_check($1, $2)` in the writer's
//! transaction, before or after its own statements (any language can call
//! it). Why it is safe:
//! - `INSERT ... ON CONFLICT DO UPDATE` locks the resource's row whether or
//!   not its `WHERE` passes, until the transaction ends. A second fenced
//!   transaction on the resource waits for the first to commit or roll back,
//!   then checks against the token that is committed by then (read
//!   committed re-reads the newest row; under repeatable read or
//!   serializable PostgreSQL raises a serialization failure instead, and
//!   the transaction is retried or given up).
//! - A stale token raises SQLSTATE `BF001`: the transaction is aborted, so
//!   none of its statements commit, those before the check included, even if
//!   the caller ignores the error ([`FenceError::Stale`] here).
//! - The recorded token only grows, and a rolled-back transaction records
//!   nothing: "touched" means committed.
//! - What the write depends on is read in the same transaction, after the
//!   check (or the write computes it, as `n = n - 1` does). A value read
//!   before the check, or outside the transaction, can be overtaken: an
//!   older holder whose token is still the newest applied writes in
//!   between, and the newer holder then overwrites that write from its
//!   stale read (the test `a_read_before_the_fence_can_be_overtaken_a_read_after_it_cannot`
//!   shows both orders).
//!
//! With a Baton lock (docs/recipes.md shows the same):
//!
//! ```no_run
//! # async fn run(client: &baton_client::Client, db: &mut baton_fence::postgres::tokio_postgres::Client)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use baton_fence::postgres::PgFence;
//! let guard = client.lock("stock").await?;
//! let tx = db.transaction().await?;
//! PgFence::new().fenced(&tx, "stock/widget", guard.fencing_token()).await?; // FenceError::Stale: stop
//! tx.execute("UPDATE stock SET n = n - 1 WHERE item = 'widget'", &[]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

pub use tokio_postgres;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Transaction};

use crate::{parse_token, FenceError};

/// The SQLSTATE a stale token raises.
pub const STALE_SQLSTATE: &str = "BF001";

/// A fence table and its check function.
#[derive(Debug, Clone)]
pub struct PgFence {
    table: String,
}

impl Default for PgFence {
    fn default() -> Self {
        PgFence { table: "baton_fence".into() }
    }
}

impl PgFence {
    /// The fence named `baton_fence` (function `baton_fence_check`).
    pub fn new() -> PgFence {
        PgFence::default()
    }

    /// A fence table of another name: a lower-case SQL identifier
    /// (`[a-z_][a-z0-9_]*`, at most 40 bytes), optionally one schema
    /// qualifier (`schema.table`).
    pub fn with_table(name: &str) -> Result<PgFence, FenceError> {
        let ident = |s: &str| {
            !s.is_empty()
                && s.len() <= 40
                && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        let parts: Vec<&str> = name.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|p| ident(p)) {
            return Err(FenceError::Invalid(format!(
                "{name:?} is not a fence table name ([a-z_][a-z0-9_]*, at most 40 bytes, optionally schema.table)"
            )));
        }
        Ok(PgFence { table: name.into() })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The check function's name (`<table>_check`).
    pub fn function(&self) -> String {
        format!("{}_check", self.table)
    }

    /// The SQL [`PgFence::install`] runs (the module doc shows it for the
    /// default name).
    pub fn install_sql(&self) -> String {
        let (t, f) = (&self.table, self.function());
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n    resource text PRIMARY KEY,\n    token bigint NOT NULL CHECK (token >= 0));\n\
             CREATE OR REPLACE FUNCTION {f}(p_resource text, p_token bigint)\n\
             RETURNS void LANGUAGE plpgsql AS $$\n\
             DECLARE cur bigint;\n\
             BEGIN\n\
             \x20 INSERT INTO {t} AS f (resource, token) VALUES (p_resource, p_token)\n\
             \x20 ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token\n\
             \x20   WHERE f.token <= EXCLUDED.token\n\
             \x20 RETURNING f.token INTO cur;\n\
             \x20 IF NOT FOUND THEN\n\
             \x20   SELECT f.token INTO cur FROM {t} f WHERE f.resource = p_resource;\n\
             \x20   RAISE EXCEPTION USING ERRCODE = '{STALE_SQLSTATE}',\n\
             \x20     MESSAGE = format('fence %s: token %s is stale', p_resource, p_token),\n\
             \x20     DETAIL = cur::text;\n\
             \x20 END IF;\n\
             END $$;\n"
        )
    }

    /// Creates the table and the function if missing (idempotent). Runs in
    /// one transaction holding an advisory lock, so concurrent installs do
    /// not trip over each other.
    pub async fn install(&self, client: &mut Client) -> Result<(), FenceError> {
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1)::bigint)", &[&self.table]).await?;
        tx.batch_execute(&self.install_sql()).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Checks and records `token` for `resource` inside `tx` (the rule in
    /// the crate doc). On [`FenceError::Stale`] the transaction is aborted:
    /// roll it back (dropping it does) and stop writing.
    pub async fn fenced(&self, tx: &Transaction<'_>, resource: &str, token: u64) -> Result<(), FenceError> {
        let t = i64::try_from(token).map_err(|_| FenceError::Invalid(format!("token {token} is above 2^63-1")))?;
        let sql = format!("SELECT {}($1, $2)", self.function());
        match tx.execute(&sql, &[&resource, &t]).await {
            Ok(_) => Ok(()),
            Err(e) => Err(stale_or(e, resource, token)),
        }
    }

    /// The highest token `resource` has accepted (committed); None if none.
    pub async fn current(
        &self,
        client: &impl tokio_postgres::GenericClient,
        resource: &str,
    ) -> Result<Option<u64>, FenceError> {
        let sql = format!("SELECT token::text FROM {} WHERE resource = $1", self.table);
        let row = client.query_opt(&sql, &[&resource]).await?;
        match row {
            None => Ok(None),
            Some(r) => parse_token(resource, &r.try_get::<_, String>(0)?).map(Some),
        }
    }
}

/// [`FenceError::Stale`] if `e` is the check function's refusal.
fn stale_or(e: tokio_postgres::Error, resource: &str, token: u64) -> FenceError {
    let Some(db) = e.as_db_error() else { return e.into() };
    if db.code() != &SqlState::from_code(STALE_SQLSTATE) {
        return e.into();
    }
    match db.detail().map(|d| parse_token(resource, d)) {
        Some(Ok(current)) => FenceError::Stale { resource: resource.into(), token, current },
        _ => FenceError::Invalid(format!("the fence refused token {token} for {resource:?} without its current token")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for good in ["baton_fence", "app.fences", "_f1"] {
            PgFence::with_table(good).expect(good);
        }
        for bad in ["", "Fence", "a;drop table x", "a.b.c", "1abc", "a b", &"x".repeat(41)] {
            assert!(matches!(PgFence::with_table(bad), Err(FenceError::Invalid(_))), "{bad:?}");
        }
        assert_eq!(PgFence::with_table("app.fences").expect("name").function(), "app.fences_check");
    }
}
