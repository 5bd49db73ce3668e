//! Run a job each time this process leads, then let the others have a turn
//! (Curator's LeaderSelector with auto-requeue).
//!
//!     cargo run --example selector -- worker-a &
//!     cargo run --example selector -- worker-b
//!
//! Each term prints its fencing token; tokens only grow.

use std::time::Duration;

use baton_client::{parse_endpoints, Client, LeaderSelector, DEFAULT_ENDPOINTS};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let me = std::env::args().nth(1).unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let endpoints = std::env::var("BATON_ENDPOINTS").unwrap_or_else(|_| DEFAULT_ENDPOINTS.into());
    let client = Client::connect(parse_endpoints(&endpoints)).await?;

    let name = me.clone();
    let selector = LeaderSelector::start(&client, "example-selector", me.clone(), move |term| {
        let name = name.clone();
        async move {
            // Dropped at once if leadership comes into doubt: fence what it
            // writes with `term.token`.
            println!("{name}: term {} leads with token {}", term.number, term.fencing_token);
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!("{name}: done, requeueing");
        }
    });
    tokio::time::sleep(Duration::from_secs(6)).await;
    println!("{me}: led {} terms", selector.terms());
    selector.close().await;
    client.close().await?;
    Ok(())
}
