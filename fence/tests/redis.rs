//! The Redis fence against a real redis-server (started privately:
//! baton_kit::stores::Redis; `make store-deps` installs it).

use baton_fence::redis::{RedisFence, Write};
use baton_fence::FenceError;
use baton_kit::stores::Redis;
use redis::aio::MultiplexedConnection;
use redis::Value;

async fn setup() -> (Redis, MultiplexedConnection) {
    let r = tokio::task::spawn_blocking(|| Redis::start(false)).await.expect("join").expect("redis starts");
    let client = redis::Client::open(r.url()).expect("url");
    let conn = client.get_multiplexed_async_connection().await.expect("connect");
    (r, conn)
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.expect("GET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_loses_an_update_unless_fenced() {
    let (_r, mut conn) = setup().await;
    let fence = RedisFence::new();
    let set = |n: i64| Write::new(["SET".to_string(), "stock".into(), n.to_string()]);
    let _: () = redis::cmd("SET").arg("stock").arg(100).query_async(&mut conn).await.expect("SET");
    // Unfenced (the control): A reads 100 and pauses, B writes 99, A writes 99.
    let a_read: i64 = 100;
    let _: () = redis::cmd("SET").arg("stock").arg(99).query_async(&mut conn).await.expect("B");
    let _: () = redis::cmd("SET").arg("stock").arg(a_read - 1).query_async(&mut conn).await.expect("A");
    assert_eq!(get(&mut conn, "stock").await.as_deref(), Some("99"), "two decrements, one applied");

    // Fenced: B (token 8) writes 98; A (token 5) wakes with 98 read earlier.
    let replies = fence.fenced(&mut conn, "stock", 8, &[set(98)]).await.expect("B, fenced");
    assert_eq!(replies, vec![Value::Okay]);
    let err = fence.fenced(&mut conn, "stock", 5, &[set(98), Write::new(["DEL", "stock"])]).await.expect_err("A");
    assert!(matches!(err, FenceError::Stale { token: 5, current: 8, .. }), "{err:?}");
    assert_eq!(get(&mut conn, "stock").await.as_deref(), Some("98"), "A's writes (both) did not run");
    assert_eq!(fence.current(&mut conn, "stock").await.expect("current"), Some(8));
    // The same grant again, with several writes and their replies.
    let replies = fence
        .fenced(&mut conn, "stock", 8, &[Write::new(["DECR", "stock"]), Write::new(["GET", "stock"])])
        .await
        .expect("same token");
    assert_eq!(replies, vec![Value::Int(97), Value::BulkString(b"97".to_vec())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_compare_as_numbers_not_strings() {
    let (_r, mut conn) = setup().await;
    let fence = RedisFence::with_prefix("f:");
    let w = [Write::new(["INCR", "n"])];
    fence.fenced(&mut conn, "r", 9, &w).await.expect("9");
    fence.fenced(&mut conn, "r", 10, &w).await.expect("10 > 9 (though \"10\" < \"9\")");
    assert!(fence.fenced(&mut conn, "r", 9, &w).await.expect_err("9 < 10").is_stale());
    fence.fenced(&mut conn, "r", u64::MAX, &w).await.expect("the largest token");
    let err = fence.fenced(&mut conn, "r", u64::MAX - 1, &w).await.expect_err("beyond 2^53 still exact");
    assert!(err.is_stale(), "{err:?}");
    assert_eq!(get(&mut conn, "n").await.as_deref(), Some("3"));
    assert_eq!(get(&mut conn, "f:r").await, Some(u64::MAX.to_string()));
    assert_eq!(fence.current(&mut conn, "other").await.expect("current"), None);
    assert!(matches!(
        fence.fenced(&mut conn, "r", u64::MAX, &[Write::new(Vec::<&str>::new())]).await,
        Err(FenceError::Invalid(_))
    ));
    // No writes: only the token is recorded.
    assert_eq!(fence.fenced(&mut conn, "z", 4, &[]).await.expect("no writes"), Vec::<Value>::new());
    assert_eq!(fence.current(&mut conn, "z").await.expect("current"), Some(4));
}
