//! Follow a configuration subtree with a tree cache, and react to changes.
//!
//!     cargo run --example cache -- /config &
//!     baton create /config/feature-x on --parents
//!     baton set /config/feature-x off
//!
//! Prints the subtree once, then every change until Ctrl-C.

use baton_client::{parse_endpoints, CacheEvent, Client, TreeCache, DEFAULT_ENDPOINTS};
use futures::StreamExt;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let root = std::env::args().nth(1).unwrap_or_else(|| "/config".into());
    let endpoints = std::env::var("BATON_ENDPOINTS").unwrap_or_else(|_| DEFAULT_ENDPOINTS.into());
    let client = Client::connect(parse_endpoints(&endpoints)).await?;

    let mut cache = TreeCache::start(&client, &root).await?;
    loop {
        let ev = tokio::select! {
            ev = cache.next_event() => ev,
            _ = tokio::signal::ctrl_c() => break,
        };
        match ev {
            Some(CacheEvent::Initialized) => {
                for (path, node) in cache.snapshot() {
                    println!("{path} = {}", String::from_utf8_lossy(&node.data));
                }
            }
            Some(CacheEvent::Created(p)) | Some(CacheEvent::Changed(p)) => {
                let value = cache.get(&p).map(|n| String::from_utf8_lossy(&n.data).into_owned());
                println!("{p} = {}", value.unwrap_or_default());
            }
            Some(CacheEvent::Deleted(p)) => println!("{p} deleted"),
            Some(CacheEvent::Stopped(why)) => anyhow::bail!("the cache stopped: {why:?}"),
            Some(other) => println!("{other:?}"),
            None => break,
        }
    }

    // A raw recursive watch is a `futures::Stream` too.
    let w = client.watch(&root, baton_client::WatchKind::Recursive, baton_client::WatchMode::Persistent).await?;
    let wait = std::time::Duration::from_millis(100);
    if let Ok(first) = tokio::time::timeout(wait, w.take(1).collect::<Vec<_>>()).await {
        for ev in first {
            println!("{} {}", ev.event_type.as_str(), ev.path);
        }
    }
    client.close().await?;
    Ok(())
}
