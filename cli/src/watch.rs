//! `baton watch`: print changes to a node and its children until Ctrl-C.
//!
//! Kept as it was when the CLI was split into modules: it is to be
//! reworked together with server-side changes.

use baton_client::{Client, WatchKind};
use clap::Args;
use serde_json::json;

use crate::output::Out;

/// Print changes to a node and its children until Ctrl-C.
#[derive(Args, Debug)]
pub struct Watch {
    /// The node's path.
    path: String,
}

impl Watch {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        let (path, j) = (self.path, out.json);
        let mut node = c.watch(&path, WatchKind::Exists, true).await?;
        let mut kids = c.watch(&path, WatchKind::Children, true).await?;
        if !j {
            eprintln!("watching {path} (Ctrl-C to stop)");
        }
        loop {
            let ev = tokio::select! {
                e = node.next() => e,
                e = kids.next() => e,
                _ = tokio::signal::ctrl_c() => return Ok(()),
            };
            let Some(ev) = ev else { anyhow::bail!("watch ended: session expired") };
            let ty = baton_client::EventType::try_from(ev.r#type).map(|t| t.as_str_name()).unwrap_or("UNKNOWN");
            if j {
                println!("{}", json!({"type": ty, "path": ev.path, "zxid": ev.zxid}));
            } else {
                println!("{ty} {} zxid={}", ev.path, ev.zxid);
            }
        }
    }
}
