//! ZooKeeper's four-letter words on the ZooKeeper port: a connection whose
//! first four bytes are lowercase letters gets one text answer and is
//! closed, as ZooKeeper does. Only the words in `--zk-4lw-whitelist` are
//! answered (ZooKeeper's default is `srvr` alone); any other gets
//! ZooKeeper's refusal text.
//!
//! | word | answer |
//! |---|---|
//! | `ruok` | `imok` |
//! | `isro` | `rw` (Baton has no read-only mode) |
//! | `srvr`, `stat` | version, latency min/avg/max, received, sent, connections, outstanding (this port's, stats.rs), zxid (the applied index), mode (`leader`/`follower`/`standalone`), node count; `stat` adds the `Clients:` list |
//! | `mntr` | `zk_version`, `zk_server_state`, `zk_znode_count`, `zk_ephemerals_count`, `zk_zxid`, this port's `zk_avg/max/min_latency`, `zk_packets_received/sent`, `zk_num_alive_connections`, `zk_outstanding_requests`, and `zk_followers`/`zk_synced_followers` on the leader |
//! | `conf` | `clientPort`, `serverId`, `minSessionTimeout`, `maxSessionTimeout`, `tickTime` |
//! | `envi` | `zookeeper.version`, `host.name`, `os.name` |
//! | `cons` | one line per open connection of this port: ZooKeeper's fields (`queued`, `recved`, `sent`, `sid`, `lop`, `est`, `to`, `lcxid`, `lzxid`, `lresp`, `llat`, `minlat`, `avglat`, `maxlat`) |
//!
//! `srvr`, `stat` and `mntr` ask the driver for its status (role, term,
//! applied index) like `baton status`; if it does not answer in 2 s the
//! word gets no answer.

use std::time::Duration;

use baton_proto::tls::BoxStream;
use baton_proto::{request, response, server_frame, StatusReq, StatusResp};
use tokio::io::AsyncWriteExt;

use super::stats::Stats;
use super::ZkSettings;
use crate::config::Config;
use crate::message::{ConnTx, Input, InputTx};
use crate::view::{read, SharedState};

/// Every word this port knows.
pub const WORDS: &[&str] = &["ruok", "isro", "srvr", "stat", "mntr", "conf", "envi", "cons"];

/// The version string ZooKeeper's tools parse (`3.8.0-...`).
fn version() -> String {
    format!("3.8.0-baton-{}, built on unknown", env!("CARGO_PKG_VERSION"))
}

pub(super) async fn answer(
    mut stream: BoxStream,
    word: &str,
    input: &InputTx,
    cfg: &Config,
    zk: &ZkSettings,
    stats: &Stats,
    state: &SharedState,
) {
    let text = if !WORDS.contains(&word) {
        return; // not a word: a bad connect frame; close
    } else if !zk.allows(word) {
        format!("{word} is not executed because it is not in the whitelist.\n")
    } else {
        match text_of(word, input, cfg, stats, state).await {
            Some(t) => t,
            None => return,
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.write_all(text.as_bytes())).await;
    let _ = stream.shutdown().await;
}

async fn text_of(word: &str, input: &InputTx, cfg: &Config, stats: &Stats, state: &SharedState) -> Option<String> {
    let (nodes, ephemerals, applied) = {
        let sm = read(state);
        (sm.node_count(), sm.ephemeral_count(), sm.applied())
    };
    Some(match word {
        "ruok" => "imok".into(),
        "isro" => "rw".into(),
        "conf" => format!(
            "clientPort={}\nserverId={}\nminSessionTimeout={}\nmaxSessionTimeout={}\ntickTime={}\n",
            cfg.client_addr.rsplit(':').next().unwrap_or(""),
            cfg.id,
            cfg.min_session_ms,
            cfg.max_session_ms,
            cfg.tick_ms
        ),
        "envi" => format!(
            "Environment:\nzookeeper.version={}\nhost.name={}\nos.name={}\n",
            version(),
            cfg.advertise_client_addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(""),
            std::env::consts::OS
        ),
        "cons" => format!("{}\n", stats.conn_lines(true)),
        _ => {
            let s = status(input).await?;
            let mode = match (s.role.as_str(), s.voters.len()) {
                (_, 1) => "standalone",
                ("leader", _) => "leader",
                _ => "follower",
            };
            match word {
                "mntr" => {
                    let mut t = format!(
                        "zk_version\t{}\nzk_server_state\t{mode}\nzk_znode_count\t{nodes}\nzk_ephemerals_count\t{ephemerals}\nzk_zxid\t{applied:#x}\n{}",
                        version(),
                        stats.mntr_lines()
                    );
                    if mode == "leader" {
                        let followers = s.voters.len().saturating_sub(1) + s.learners.len();
                        t.push_str(&format!(
                            "zk_followers\t{followers}\nzk_synced_followers\t{}\n",
                            s.voters.len().saturating_sub(1)
                        ));
                    }
                    t
                }
                _ => {
                    let clients =
                        if word == "stat" { format!("Clients:\n{}\n", stats.conn_lines(false)) } else { String::new() };
                    format!(
                        "Zookeeper version: {}\n{clients}{}Zxid: {applied:#x}\nMode: {mode}\nNode count: {nodes}\n",
                        version(),
                        stats.srvr_lines()
                    )
                }
            }
        }
    })
}

/// The driver's status, through a connection of its own.
async fn status(input: &InputTx) -> Option<StatusResp> {
    let conn = crate::accept::next_conn();
    let (tx, mut rx) = ConnTx::new(1 << 20);
    input.send(Input::ConnOpened { conn, tx }).ok()?;
    let req = baton_proto::Request { id: 1, body: Some(request::Body::Status(StatusReq {})), ..Default::default() };
    input.send(Input::Client { conn, req }).ok()?;
    let got = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await;
    let _ = input.send(Input::ConnClosed { conn });
    match got.ok()??.frame {
        Some(server_frame::Frame::Response(r)) => match r.body {
            Some(response::Body::Status(s)) => Some(s),
            _ => None,
        },
        _ => None,
    }
}
