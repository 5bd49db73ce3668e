//! Fencing an external store: a SQL row guarded by the lock's token.
//!
//!     cargo run --example fenced_sql
//!
//! The pattern (Kleppmann, "How to do distributed locking"): every write the
//! lock protects carries the holder's fencing token, and the store refuses a
//! token lower than the highest it has already accepted:
//!
//!     UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2
//!
//! (`fence < $2` if each grant writes at most once.) Zero rows updated means
//! a newer holder has written since: this holder lost the lock, maybe while
//! paused, and must stop. The example plays it out with SQLite: holder A
//! takes the lock and stalls; its session ends; B takes the lock and writes;
//! then A wakes up and tries to write with its old token.

use baton_client::{parse_endpoints, Client, ClientConfig, DEFAULT_ENDPOINTS};
use rusqlite::{params, Connection};

fn fenced_update(db: &Connection, id: i64, balance: i64, token: u64) -> rusqlite::Result<bool> {
    let n = db.execute(
        "UPDATE accounts SET balance = ?1, fence = ?2 WHERE id = ?3 AND fence <= ?2",
        params![balance, token as i64, id],
    )?;
    Ok(n == 1)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoints = parse_endpoints(&std::env::var("BATON_ENDPOINTS").unwrap_or_else(|_| DEFAULT_ENDPOINTS.into()));
    let db = Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, fence INTEGER NOT NULL DEFAULT 0);
         INSERT INTO accounts (id, balance) VALUES (1, 100);",
    )?;

    let a = Client::connect_with(ClientConfig::new(endpoints.clone())).await?;
    let b = Client::connect_with(ClientConfig::new(endpoints)).await?;

    let ga = a.lock("account-1").await?;
    let token_a = ga.fencing_token();
    let balance: i64 = db.query_row("SELECT balance FROM accounts WHERE id = 1", [], |r| r.get(0))?;
    println!("A holds the lock (token {token_a}), reads balance {balance}, then stalls (GC pause, SIGSTOP...)");

    // A's session ends while it is stalled (here: closed; in life: expired).
    std::mem::forget(ga);
    a.close().await?;

    let gb = b.lock("account-1").await?;
    let token_b = gb.fencing_token();
    let ok = fenced_update(&db, 1, balance + 50, token_b)?;
    println!("B holds the lock (token {token_b}) and deposits 50: {}", if ok { "accepted" } else { "REFUSED" });

    let ok_a = fenced_update(&db, 1, balance - 30, token_a)?;
    println!(
        "A wakes up and withdraws 30 with token {token_a}: {}",
        if ok_a { "accepted (LOST UPDATE!)" } else { "refused by the fence" }
    );

    let (bal, fence): (i64, i64) =
        db.query_row("SELECT balance, fence FROM accounts WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    println!("final balance {bal}, fence {fence}");
    gb.release().await?;
    b.close().await?;
    anyhow::ensure!(ok && !ok_a && bal == balance + 50, "fencing did not hold");
    Ok(())
}
