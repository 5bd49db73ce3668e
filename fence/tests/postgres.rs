//! The PostgreSQL fence against a real PostgreSQL (a private cluster the
//! test starts: baton_kit::stores::Postgres; `make store-deps` installs it).

use std::time::Duration;

use baton_fence::postgres::PgFence;
use baton_fence::FenceError;
use baton_kit::stores::Postgres;
use tokio_postgres::{Client, NoTls};

async fn connect(pg: &Postgres) -> Client {
    let (client, conn) = tokio_postgres::connect(&pg.conn_str(), NoTls).await.expect("connect to postgres");
    tokio::spawn(conn);
    client
}

/// A private PostgreSQL with the fence installed and a stock of 100.
async fn setup() -> (Postgres, Client) {
    let pg = tokio::task::spawn_blocking(Postgres::start).await.expect("join").expect("postgres starts");
    let mut c = connect(&pg).await;
    PgFence::new().install(&mut c).await.expect("install");
    PgFence::new().install(&mut c).await.expect("install is idempotent");
    c.batch_execute(
        "CREATE TABLE stock (item text PRIMARY KEY, n int NOT NULL); INSERT INTO stock VALUES ('widget', 100);",
    )
    .await
    .expect("stock table");
    (pg, c)
}

async fn stock(c: &Client) -> i32 {
    c.query_one("SELECT n FROM stock WHERE item = 'widget'", &[]).await.expect("read stock").get(0)
}

/// One fenced decrement from a value read earlier (what a holder that
/// paused between its read and its write does).
async fn decrement_from(c: &mut Client, fence: Option<&PgFence>, token: u64, read: i32) -> Result<(), FenceError> {
    let tx = c.transaction().await?;
    tx.execute("UPDATE stock SET n = $1 WHERE item = 'widget'", &[&(read - 1)]).await?;
    if let Some(f) = fence {
        f.fenced(&tx, "stock/widget", token).await?;
    }
    tx.commit().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_loses_an_update_unless_fenced() {
    let (_pg, mut c) = setup().await;
    let fence = PgFence::new();
    // Unfenced (the control): A (token 5) reads, pauses; B (token 8) reads
    // and decrements; A wakes and writes its stale value. Two decrements
    // acknowledged, one applied: the lost update the fence exists for.
    let a_read = stock(&c).await;
    {
        let read = stock(&c).await;
        decrement_from(&mut c, None, 8, read)
    }
    .await
    .expect("B");
    decrement_from(&mut c, None, 5, a_read).await.expect("A, unfenced, lands");
    assert_eq!(stock(&c).await, 99, "without a fence the second decrement overwrote the first");

    // Fenced: the same interleaving, A is refused and writes nothing.
    let a_read = stock(&c).await;
    {
        let read = stock(&c).await;
        decrement_from(&mut c, Some(&fence), 8, read)
    }
    .await
    .expect("B, fenced");
    let err = decrement_from(&mut c, Some(&fence), 5, a_read).await.expect_err("A's stale write");
    assert!(
        matches!(&err, FenceError::Stale { resource, token: 5, current: 8 } if resource == "stock/widget"),
        "{err:?}"
    );
    assert_eq!(stock(&c).await, 98, "B's decrement stands; A's update (made before its check) rolled back");
    assert_eq!(fence.current(&c, "stock/widget").await.expect("current"), Some(8));
    // The same grant writes again; a newer one too; the stale one never.
    {
        let read = stock(&c).await;
        decrement_from(&mut c, Some(&fence), 8, read)
    }
    .await
    .expect("same token again");
    {
        let read = stock(&c).await;
        decrement_from(&mut c, Some(&fence), 12, read)
    }
    .await
    .expect("a newer token");
    assert!(decrement_from(&mut c, Some(&fence), 8, 0).await.expect_err("now stale").is_stale());
    assert_eq!(stock(&c).await, 96);
    assert_eq!(fence.current(&c, "stock/widget").await.expect("current"), Some(12));
}

/// The read a write depends on belongs inside the fenced transaction,
/// after `fenced`: a newer holder that read first can be overtaken by an
/// older holder's write (its token still the newest applied) and then
/// overwrite it from its stale read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_before_the_fence_can_be_overtaken_a_read_after_it_cannot() {
    let (pg, mut newer) = setup().await;
    let mut older = connect(&pg).await;
    let fence = PgFence::new();
    // Read before the fence: A (token 5) read 100 and paused; B (token 8),
    // granted after A's lease ran out, reads 100; A wakes and writes 99
    // (nothing newer has written: it passes); B writes 99. Both
    // acknowledged, one applied.
    let a_read = stock(&older).await;
    let b_read = stock(&newer).await;
    decrement_from(&mut older, Some(&fence), 5, a_read).await.expect("A passes: no newer write yet");
    decrement_from(&mut newer, Some(&fence), 8, b_read).await.expect("B passes: 8 > 5");
    assert_eq!(stock(&newer).await, 99, "two fenced decrements acknowledged, one applied");

    // Read after the fence, in its transaction: B (token 12) fences, then
    // reads; A (token 10) wakes in between and its check waits on the row
    // B's fence locked, then is refused once B commits.
    let tx_b = newer.transaction().await.expect("begin B");
    fence.fenced(&tx_b, "stock/widget", 12).await.expect("B's fence");
    let b_read: i32 = tx_b.query_one("SELECT n FROM stock WHERE item = 'widget'", &[]).await.expect("B reads").get(0);
    let f = fence.clone();
    let mut a = tokio::spawn(async move {
        let tx = older.transaction().await.expect("begin A");
        match f.fenced(&tx, "stock/widget", 10).await {
            Ok(()) => {
                let n: i32 = tx.query_one("SELECT n FROM stock WHERE item = 'widget'", &[]).await?.get(0);
                tx.execute("UPDATE stock SET n = $1 WHERE item = 'widget'", &[&(n - 1)]).await?;
                tx.commit().await.map_err(FenceError::from)
            }
            Err(e) => Err(e),
        }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut a).await.is_err(),
        "A's check waits for B's transaction"
    );
    tx_b.execute("UPDATE stock SET n = $1 WHERE item = 'widget'", &[&(b_read - 1)]).await.expect("B writes");
    tx_b.commit().await.expect("B commits");
    let r = tokio::time::timeout(Duration::from_secs(10), a).await.expect("bounded").expect("join");
    assert!(matches!(r, Err(FenceError::Stale { token: 10, current: 12, .. })), "{r:?}");
    assert_eq!(stock(&newer).await, 98, "B's decrement stands, nothing lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_transaction_commits_nothing_even_if_the_error_is_ignored() {
    let (_pg, mut c) = setup().await;
    let fence = PgFence::new();
    decrement_from(&mut c, Some(&fence), 20, 100).await.expect("token 20");
    let tx = c.transaction().await.expect("begin");
    tx.execute("UPDATE stock SET n = 0 WHERE item = 'widget'", &[]).await.expect("update");
    assert!(fence.fenced(&tx, "stock/widget", 19).await.expect_err("stale").is_stale());
    // The transaction is aborted on the server: later statements fail and
    // COMMIT rolls back.
    assert!(tx.execute("UPDATE stock SET n = 1 WHERE item = 'widget'", &[]).await.is_err());
    let _ = tx.commit().await;
    assert_eq!(stock(&c).await, 99);
    assert_eq!(fence.current(&c, "stock/widget").await.expect("current"), Some(20));
    // Other resources have fences of their own.
    decrement_from(&mut c, Some(&fence), 3, 99).await.expect_err("same resource, older");
    let tx = c.transaction().await.expect("begin");
    fence.fenced(&tx, "another", 3).await.expect("another resource starts fresh");
    tx.commit().await.expect("commit");
    assert_eq!(fence.current(&c, "another").await.expect("current"), Some(3));
    assert_eq!(fence.current(&c, "never").await.expect("current"), None);
    let tx = c.transaction().await.expect("begin");
    assert!(matches!(fence.fenced(&tx, "x", u64::MAX).await, Err(FenceError::Invalid(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_token_waits_for_a_newer_one_and_is_refused_only_if_it_commits() {
    let (pg, mut newer) = setup().await;
    let mut older = connect(&pg).await;
    let fence = PgFence::new();
    for commit_newer in [true, false] {
        let (new_tok, old_tok) = if commit_newer { (40, 30) } else { (60, 50) };
        let tx_new = newer.transaction().await.expect("begin");
        fence.fenced(&tx_new, "r", new_tok).await.expect("newer token");
        // The older holder's check waits on the row the newer one locked.
        let f = fence.clone();
        let mut waiting = tokio::spawn(async move {
            let r = {
                let tx = older.transaction().await.expect("begin");
                match f.fenced(&tx, "r", old_tok).await {
                    Ok(()) => tx.commit().await.map_err(FenceError::from),
                    Err(e) => Err(e),
                }
            };
            (older, r)
        });
        assert!(
            tokio::time::timeout(Duration::from_millis(500), &mut waiting).await.is_err(),
            "the older check must wait for the newer transaction"
        );
        if commit_newer {
            tx_new.commit().await.expect("commit newer");
        } else {
            tx_new.rollback().await.expect("roll back newer");
        }
        let (o, r) = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("bounded").expect("join");
        older = o;
        if commit_newer {
            assert!(matches!(r, Err(FenceError::Stale { token: 30, current: 40, .. })), "{r:?}");
            assert_eq!(fence.current(&newer, "r").await.expect("current"), Some(40));
        } else {
            // A rolled-back newer transaction touched nothing: 50 > 40 passes.
            r.expect("the older token passes once the newer one rolled back");
            assert_eq!(fence.current(&newer, "r").await.expect("current"), Some(50));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_holders_never_apply_an_older_token_after_a_newer_one() {
    let (pg, c) = setup().await;
    c.batch_execute("CREATE TABLE applied (seq serial PRIMARY KEY, token bigint NOT NULL)").await.expect("table");
    let fence = PgFence::with_table("public.race_fence").expect("name");
    let mut admin = connect(&pg).await;
    fence.install(&mut admin).await.expect("install");
    // 8 writers, 25 fenced inserts each, tokens shuffled across writers.
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let mut client = connect(&pg).await;
        let f = fence.clone();
        tasks.push(tokio::spawn(async move {
            let mut accepted = 0;
            for i in 0..25u64 {
                let token = 1 + ((i * 8 + w) * 7919) % 200;
                let tx = client.transaction().await.expect("begin");
                match f.fenced(&tx, "log", token).await {
                    Ok(()) => {
                        tx.execute("INSERT INTO applied (token) VALUES ($1)", &[&(token as i64)])
                            .await
                            .expect("insert");
                        tx.commit().await.expect("commit");
                        accepted += 1;
                    }
                    Err(e) if e.is_stale() => {}
                    Err(e) => panic!("writer {w}: {e}"),
                }
            }
            accepted
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += tokio::time::timeout(Duration::from_secs(60), t).await.expect("bounded").expect("join");
    }
    let rows = c.query("SELECT token FROM applied ORDER BY seq", &[]).await.expect("read");
    let tokens: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(tokens.len(), accepted);
    assert!(tokens.windows(2).all(|w| w[0] <= w[1]), "commit order broke token order: {tokens:?}");
    assert!((1..200).contains(&accepted), "some accepted, some refused: {accepted}");
}
