//! Take a lock, do fenced work, release it.
//!
//!     batond cluster --nodes 3 --data-dir /tmp/baton &
//!     cargo run --example lock -- my-job
//!
//! Endpoints come from BATON_ENDPOINTS (default: the local cluster).

use std::time::Duration;

use baton_client::{parse_endpoints, Client, CreateOptions, Op, DEFAULT_ENDPOINTS};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "example-job".into());
    let endpoints = std::env::var("BATON_ENDPOINTS").unwrap_or_else(|_| DEFAULT_ENDPOINTS.into());
    let client = Client::connect(parse_endpoints(&endpoints)).await?;

    let guard = client.lock(&name).await?;
    println!("holding {name} with fencing token {}", guard.fencing_token());

    // The protected resource: a counter node. `fenced` adds check_fence, so a
    // holder paused past its session (and replaced) cannot write late.
    let path = format!("/examples/{name}/runs");
    match client.create(&path, "0", CreateOptions::persistent().with_parents()).await {
        Err(e) if !e.is_node_exists() => return Err(e.into()),
        _ => {}
    }
    let (data, stat) = client.get(&path).await?;
    let runs: u64 = String::from_utf8_lossy(&data).parse().unwrap_or(0);
    let write = [Op::Set { path: path.clone(), data: (runs + 1).to_string().into(), version: Some(stat.version) }];
    tokio::select! {
        r = guard.fenced(&name, &write) => {
            r?;
            println!("run #{} recorded", runs + 1);
        }
        state = guard.lost() => anyhow::bail!("lock lost ({state:?}) before the write"),
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    guard.release().await?;
    client.close().await?;
    Ok(())
}
