//! What the ZooKeeper port counts, for the four-letter words (`srvr`,
//! `stat`, `mntr`, `cons`): per connection and for the port, as
//! ZooKeeper's `ServerStats` and `ServerCnxn` count them.
//!
//! - **Received** and **sent** count frames: every request (pings too) in,
//!   every reply, ping answer and notification out.
//! - **Latency** is a request's time from its frame being read to its reply
//!   being written, in ms (pings and the connect request are not counted);
//!   min, average and max since the member started, and per connection.
//! - **Outstanding** is requests read and not yet answered.
//! - A connection is listed from its handshake's answer until it closes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Min, sum, count and max of latencies in ms.
#[derive(Debug, Default, Clone, Copy)]
struct Latency {
    min: u64,
    sum: u64,
    count: u64,
    max: u64,
}

impl Latency {
    fn add(&mut self, ms: u64) {
        self.min = if self.count == 0 { ms } else { self.min.min(ms) };
        self.max = self.max.max(ms);
        self.sum += ms;
        self.count += 1;
    }

    fn avg(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }
}

/// One connection's counters.
#[derive(Debug)]
pub struct Conn {
    peer: SocketAddr,
    established_ms: u64,
    timeout_ms: u64,
    session: AtomicU64,
    received: AtomicU64,
    sent: AtomicU64,
    outstanding: AtomicU64,
    /// Last request: opcode name, xid, zxid of its reply, when, its latency.
    last: Mutex<(&'static str, i64, u64, u64, u64)>,
    latency: Mutex<Latency>,
}

/// The port's counters and its open connections.
#[derive(Debug, Default)]
pub struct Stats {
    received: AtomicU64,
    sent: AtomicU64,
    latency: Mutex<Latency>,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Stats {
    /// Lists a connection (after its handshake) until the returned guard drops.
    pub fn open(self: &Arc<Self>, id: u64, peer: SocketAddr, session: u64, timeout_ms: u64) -> Opened {
        let conn = Arc::new(Conn {
            peer,
            established_ms: now_ms(),
            timeout_ms,
            session: AtomicU64::new(session),
            received: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            outstanding: AtomicU64::new(0),
            last: Mutex::new(("NA", -1, 0, 0, 0)),
            latency: Mutex::new(Latency::default()),
        });
        lock(&self.conns).insert(id, conn.clone());
        Opened { stats: self.clone(), id, conn }
    }

    pub fn connections(&self) -> usize {
        lock(&self.conns).len()
    }

    pub fn outstanding(&self) -> u64 {
        lock(&self.conns).values().map(|c| c.outstanding.load(Relaxed)).sum()
    }

    /// `srvr`'s and `stat`'s counter lines.
    pub fn srvr_lines(&self) -> String {
        let l = *lock(&self.latency);
        format!(
            "Latency min/avg/max: {}/{:.4}/{}\nReceived: {}\nSent: {}\nConnections: {}\nOutstanding: {}\n",
            l.min,
            l.avg(),
            l.max,
            self.received.load(Relaxed),
            self.sent.load(Relaxed),
            self.connections(),
            self.outstanding()
        )
    }

    /// `mntr`'s counter lines.
    pub fn mntr_lines(&self) -> String {
        let l = *lock(&self.latency);
        format!(
            "zk_avg_latency\t{:.4}\nzk_max_latency\t{}\nzk_min_latency\t{}\nzk_packets_received\t{}\nzk_packets_sent\t{}\nzk_num_alive_connections\t{}\nzk_outstanding_requests\t{}\n",
            l.avg(),
            l.max,
            l.min,
            self.received.load(Relaxed),
            self.sent.load(Relaxed),
            self.connections(),
            self.outstanding()
        )
    }

    /// One line per open connection: `stat`'s short form or `cons`'s long
    /// one, ZooKeeper's layout.
    pub fn conn_lines(&self, long: bool) -> String {
        let conns: Vec<Arc<Conn>> = lock(&self.conns).values().cloned().collect();
        let mut out = String::new();
        for c in conns {
            let (recved, sent, queued) = (c.received.load(Relaxed), c.sent.load(Relaxed), c.outstanding.load(Relaxed));
            out.push_str(&format!(" /{}[1](queued={queued},recved={recved},sent={sent}", c.peer));
            if long {
                let (lop, lcxid, lzxid, lresp, llat) = *lock(&c.last);
                let l = *lock(&c.latency);
                out.push_str(&format!(
                    ",sid={:#x},lop={lop},est={},to={},lcxid={lcxid:#x},lzxid={lzxid:#x},lresp={lresp},llat={llat},minlat={},avglat={:.0},maxlat={}",
                    c.session.load(Relaxed),
                    c.established_ms,
                    c.timeout_ms,
                    l.min,
                    l.avg(),
                    l.max
                ));
            }
            out.push_str(")\n");
        }
        out
    }
}

/// A listed connection; unlisted when dropped.
pub struct Opened {
    stats: Arc<Stats>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Opened {
    fn drop(&mut self) {
        lock(&self.stats.conns).remove(&self.id);
    }
}

impl Opened {
    /// A frame read: a request (`ping` too).
    pub fn received(&self) {
        self.conn.received.fetch_add(1, Relaxed);
        self.stats.received.fetch_add(1, Relaxed);
    }

    /// A request now waiting for its reply.
    pub fn queued(&self) {
        self.conn.outstanding.fetch_add(1, Relaxed);
    }

    /// A frame written: a notification or a ping's answer.
    pub fn sent(&self) {
        self.conn.sent.fetch_add(1, Relaxed);
        self.stats.sent.fetch_add(1, Relaxed);
    }

    /// A request's reply written, `took` after its frame was read.
    pub fn replied(&self, op: &'static str, xid: i32, zxid: u64, took: Duration) {
        self.sent();
        let _ = self.conn.outstanding.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(1)));
        let ms = took.as_millis() as u64;
        *lock(&self.conn.last) = (op, xid as i64, zxid, now_ms(), ms);
        lock(&self.conn.latency).add(ms);
        lock(&self.stats.latency).add(ms);
    }
}

/// ZooKeeper's short name of an opcode, as `cons` shows the last one.
pub fn op_name(op: i32) -> &'static str {
    use baton_proto::jute::op as o;
    match op {
        o::CREATE | o::CREATE2 | o::CREATE_CONTAINER | o::CREATE_TTL => "CREA",
        o::DELETE => "DELE",
        o::EXISTS => "EXIS",
        o::GET_DATA => "GETD",
        o::SET_DATA => "SETD",
        o::GET_ACL => "GETA",
        o::SET_ACL => "SETA",
        o::GET_CHILDREN | o::GET_CHILDREN2 => "GETC",
        o::SYNC => "SYNC",
        o::PING => "PING",
        o::CHECK => "CHEC",
        o::MULTI => "MULT",
        o::MULTI_READ => "MLTR",
        o::CHECK_WATCHES => "CHKW",
        o::REMOVE_WATCHES => "REMW",
        o::SET_WATCHES | o::SET_WATCHES2 => "SETW",
        o::GET_EPHEMERALS => "GETE",
        o::GET_ALL_CHILDREN_NUMBER => "GETACN",
        o::ADD_WATCH => "ADDW",
        o::WHO_AM_I => "HOMI",
        o::CLOSE_SESSION => "CLOS",
        o::AUTH => "AUTH",
        _ => "UNKN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_lists_connections() {
        let stats = Arc::new(Stats::default());
        let peer: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let c = stats.open(7, peer, 0x42, 6000);
        c.received();
        c.queued();
        c.replied("GETD", 1, 9, Duration::from_millis(3));
        c.received();
        c.queued();
        assert_eq!((stats.connections(), stats.outstanding()), (1, 1));
        let srvr = stats.srvr_lines();
        assert!(
            srvr.contains("Latency min/avg/max: 3/3.0000/3\nReceived: 2\nSent: 1\nConnections: 1\nOutstanding: 1"),
            "{srvr}"
        );
        let cons = stats.conn_lines(true);
        assert!(cons.starts_with(" /127.0.0.1:4000[1](queued=1,recved=2,sent=1,sid=0x42,lop=GETD,"), "{cons}");
        assert!(cons.contains("lzxid=0x9") && cons.contains("maxlat=3)"), "{cons}");
        drop(c);
        assert_eq!(stats.connections(), 0);
        assert!(stats.mntr_lines().contains("zk_packets_received\t2\n"));
    }
}
