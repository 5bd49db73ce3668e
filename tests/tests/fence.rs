//! Kleppmann's scenario end to end (seed 002): a Baton lock holder is
//! paused past its session, a newer holder takes the lock and writes, the
//! paused one wakes and writes with its old token. PostgreSQL refuses it
//! through the fence (baton_fence::postgres), against a real 3-member
//! cluster and a real PostgreSQL (`make store-deps`).

use std::time::Duration;

use baton_client::{Client, ClientConfig, SessionState};
use baton_fence::postgres::tokio_postgres::{self, NoTls};
use baton_fence::postgres::PgFence;
use baton_fence::FenceError;
use baton_kit::stores::Postgres;
use baton_tests::{Cluster, LinkId};

const SESSION: Duration = Duration::from_secs(2);

async fn pg_client(pg: &Postgres) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&pg.conn_str(), NoTls).await.expect("connect to postgres");
    tokio::spawn(conn);
    client
}

async fn stock(db: &tokio_postgres::Client) -> i32 {
    db.query_one("SELECT n FROM stock WHERE item = 'widget'", &[]).await.expect("read stock").get(0)
}

/// Writes `read - 1` as the stock, fenced with `token`.
async fn fenced_decrement(db: &mut tokio_postgres::Client, token: u64, read: i32) -> Result<(), FenceError> {
    let tx = db.transaction().await?;
    PgFence::new().fenced(&tx, "stock/widget", token).await?;
    tx.execute("UPDATE stock SET n = $1 WHERE item = 'widget'", &[&(read - 1)]).await?;
    tx.commit().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_a_paused_holders_late_write_is_refused_by_the_database() {
    let pg = tokio::task::spawn_blocking(Postgres::start).await.expect("join").expect("postgres starts");
    let mut db_a = pg_client(&pg).await;
    let mut db_b = pg_client(&pg).await;
    PgFence::new().install(&mut db_a).await.expect("install the fence");
    db_a.batch_execute(
        "CREATE TABLE stock (item text PRIMARY KEY, n int NOT NULL); INSERT INTO stock VALUES ('widget', 100);",
    )
    .await
    .expect("stock");

    let c = Cluster::start_proxied(3, 1, &[]).await;
    c.wait_leader(Duration::from_secs(20)).await;
    // A reaches the cluster only through client slot 0 (next to member 1).
    let ep = c.proxies().addr(LinkId::Client { slot: 0, home: 1, to: 1 }).expect("slot link").to_string();
    let a = Client::connect_with(ClientConfig::new(vec![ep]).session_timeout(SESSION)).await.expect("A connects");
    let guard_a = a.lock("stock").await.expect("A locks");
    let token_a = guard_a.fencing_token();
    let a_read = stock(&db_a).await;

    // A pauses (its links stall: no keepalives) past its session timeout.
    c.proxies().stall_slot(0, true);
    let b = c.client().await;
    let guard_b = tokio::time::timeout(Duration::from_secs(20), b.lock("stock"))
        .await
        .expect("B is granted the lock once A's session expires")
        .expect("B locks");
    let token_b = guard_b.fencing_token();
    assert!(token_b > token_a, "tokens grow: A {token_a}, B {token_b}");
    let b_read = stock(&db_b).await;
    fenced_decrement(&mut db_b, token_b, b_read).await.expect("B's fenced write");

    // A wakes and, not having looked at its guard, writes what it computed.
    c.proxies().stall_slot(0, false);
    let err = fenced_decrement(&mut db_a, token_a, a_read).await.expect_err("A's stale write");
    assert!(
        matches!(err, FenceError::Stale { token, current, .. } if token == token_a && current == token_b),
        "{err:?}"
    );
    assert_eq!(stock(&db_b).await, 99, "one decrement acknowledged, one applied");
    // The lock knew too, too late for a paused process: A's guard is lost.
    let state = tokio::time::timeout(Duration::from_secs(10), guard_a.lost()).await.expect("A learns");
    assert_ne!(state, SessionState::Connected);
    guard_b.release().await.expect("B releases");
}
