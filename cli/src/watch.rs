//! `baton watch PATH`: print every change to a node and its children (with
//! `--recursive`, to everything below it) until SIGINT or SIGTERM (exit 0).
//!
//! Rules:
//! - One recursive watch, so each change is printed once, naming the node
//!   that changed: a child's create or delete is that child's own event
//!   (`NODE_CREATED /app/b`), never a nameless "children changed".
//! - Without `--recursive`, changes deeper than PATH's children are left
//!   out.
//! - Created and data-changed events carry the node's value, read right
//!   after the event (linearizable): it is the value at that read, which
//!   may already be newer than the event; `zxid` is the event's.
//! - The watch follows the client across members and reconnects: after a
//!   gap it reports what it missed, including `NODE_CHILDREN_CHANGED` for a
//!   node whose children changed meanwhile (re-list it).
//! - The session expiring ends the watch with an error (exit 1).

use baton_client::{Client, EventType, WatchEvent, WatchKind};
use clap::Args;
use serde_json::json;

use crate::output::{Encoding, Out};
use crate::signal::Interrupts;

/// Print changes to a node and its children (or, with --recursive, its
/// whole subtree) until SIGINT or SIGTERM.
#[derive(Args, Debug)]
pub struct Watch {
    /// The node's path (it need not exist yet).
    #[arg(value_parser = crate::parse_path)]
    path: String,
    /// Every node below PATH, not only its children.
    #[arg(long, short = 'r')]
    recursive: bool,
    #[command(flatten)]
    enc: Encoding,
}

impl Watch {
    /// Watches until a signal (exit 0) or the watch ends (an error).
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        let mut stop = Interrupts::new()?;
        let mut w = c.watch(&self.path, WatchKind::Recursive, baton_client::WatchMode::Persistent).await?;
        // On stderr also with --json: stdout is the events only. Printed
        // once the watch is registered, so a script can wait for it.
        eprintln!("watching {} (Ctrl-C to stop)", self.path);
        loop {
            let ev = tokio::select! {
                e = w.next() => e,
                _ = stop.recv() => return Ok(()),
            };
            let Some(ev) = ev else {
                anyhow::bail!("watch on {} ended: {:?}", self.path, w.end_reason());
            };
            if self.recursive || depth_below(&self.path, &ev.path) <= 1 {
                self.print(c, &ev, out).await?;
            }
        }
    }

    async fn print(&self, c: &Client, ev: &WatchEvent, out: Out) -> anyhow::Result<()> {
        let ty = ev.event_type.as_str();
        let value = match ev.event_type {
            EventType::NodeCreated | EventType::NodeDataChanged => match c.get(&ev.path).await {
                Ok((data, _)) => Some(data),
                Err(e) if e.is_no_node() => None,
                Err(e) => return Err(e.into()),
            },
            _ => None,
        };
        let fields = json!({"type": ty, "path": ev.path, "zxid": ev.zxid});
        match value {
            Some(data) if out.json => println!("{}", self.enc.json_with(&data, fields)),
            Some(data) => {
                let shown = String::from_utf8_lossy(&self.enc.encode(&data)).into_owned();
                println!("{ty} {} zxid={} {shown}", ev.path, ev.zxid)
            }
            None => out.emit(fields, format!("{ty} {} zxid={}", ev.path, ev.zxid)),
        }
        Ok(())
    }
}

/// How many levels `path` is below `top` (0 for `top` itself).
fn depth_below(top: &str, path: &str) -> usize {
    let rest = if top == "/" { path } else { path.strip_prefix(top).unwrap_or(path) };
    rest.split('/').filter(|s| !s.is_empty()).count()
}

#[cfg(test)]
mod tests {
    use super::depth_below;

    #[test]
    fn depth_counts_levels_below_the_watched_node() {
        assert_eq!(depth_below("/a", "/a"), 0);
        assert_eq!(depth_below("/a", "/a/b"), 1);
        assert_eq!(depth_below("/a", "/a/b/c"), 2);
        assert_eq!(depth_below("/", "/x"), 1);
        assert_eq!(depth_below("/", "/"), 0);
    }
}
