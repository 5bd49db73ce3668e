//! Campaign for leadership, lead for a while, resign; and watch who leads.
//!
//!     cargo run --example election -- alice 5 &
//!     cargo run --example election -- bob 5
//!
//! The second waits until the first resigns (or dies), then leads.

use std::time::Duration;

use baton_client::{parse_endpoints, Client, DEFAULT_ENDPOINTS};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let me = std::env::args().nth(1).unwrap_or_else(|| format!("candidate-{}", std::process::id()));
    let secs: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let endpoints = std::env::var("BATON_ENDPOINTS").unwrap_or_else(|_| DEFAULT_ENDPOINTS.into());
    let client = Client::connect(parse_endpoints(&endpoints)).await?;

    // Observe from the start: the current leader, then every change.
    let mut obs = client.observe("example-election").await?;
    tokio::spawn(async move {
        while let Some(l) = obs.next().await {
            match l {
                Some(l) => {
                    println!("[observer] leader: {} (token {})", String::from_utf8_lossy(&l.value), l.fencing_token)
                }
                None => println!("[observer] no leader"),
            }
        }
    });

    println!("{me}: campaigning");
    let lead = client.campaign("example-election", me.clone()).await?;
    println!("{me}: I lead (token {})", lead.fencing_token());
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(secs)) => {
            lead.resign().await?;
            println!("{me}: resigned");
        }
        state = lead.lost() => println!("{me}: leadership lost ({state:?})"),
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.close().await?;
    Ok(())
}
