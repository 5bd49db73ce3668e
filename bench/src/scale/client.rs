//! The few operations the dimensions need, on one session of any
//! service: batched creates, ephemeral nodes, a one-shot watch, a read
//! that only a caught-up member answers.
//!
//! Reads are linearizable (Baton's default ReadIndex; ZooKeeper `sync` +
//! `getData`; etcd's default range, `serializable=false`, which a member
//! answers only once it has applied the leader's commit index at the
//! time of the read): a member that has not caught up cannot answer one,
//! which is what the restart and catch-up timings rely on.
//!
//! etcd has no tree, sessions or one-shot watches: an [`Sc::Etcd`] is one
//! gRPC client of one member at a time (it moves to the next member on a
//! transport error, as the benchmark's etcd client does), "creates"
//! are puts of flat keys (a batch is one txn), parents need no creating.
//! Its session is what etcd's own `concurrency.Session` is: a lease,
//! granted with the first ephemeral (TTL = the session timeout in whole
//! seconds) and kept alive every TTL/3 on a keepalive stream; an
//! "ephemeral node" is a key put under that lease, which goes when the
//! lease expires or is revoked (on close). It has no one-shot watch (the
//! dimensions that need one do not run on etcd: [`super::not_measured`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use baton_client::{ClientConfig, CreateOptions, ErrorKind, Op};
use etcd_client::{GetOptions, PutOptions, Txn, TxnOp};
use zookeeper_client as zk;

use crate::targets::etcd::{connect_with, member_trouble, POLITE_KEEPALIVE};
use crate::targets::Kind;

/// Longest one etcd request may take before the client gives it up and
/// moves to the next member (a catching-up member holds a linearizable
/// read until it has applied up to the read's index: seconds at 1M keys).
const ETCD_OP_TIMEOUT: Duration = Duration::from_secs(30);

/// A watch that has been registered; resolves when it fires (or its
/// session ends).
pub type Fired = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One session (etcd: one client and, once an ephemeral needs one, a lease).
pub enum Sc {
    Baton(baton_client::Client),
    Zk(zk::Client),
    /// Boxed: an etcd client is ~3.6 KB, the others ~100 bytes.
    Etcd(Box<EtcdSc>),
}

/// An etcd client of one member at a time, starting with the first listed.
pub struct EtcdSc {
    endpoints: Vec<String>,
    /// The member talked to and its client (cloned per request: a clone
    /// shares the channel).
    conn: Mutex<(usize, etcd_client::Client)>,
    /// The session timeout: the lease's TTL.
    ttl: Duration,
    /// The lease, once the first ephemeral needed one.
    lease: tokio::sync::OnceCell<i64>,
    /// Its keepalive task (aborted on close and drop).
    keepalive: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Longest a lease is kept alive (a `scale-sessions` child holds its
/// sessions at most an hour).
const LEASE_LIFETIME: Duration = Duration::from_secs(3700);

impl EtcdSc {
    async fn connect(endpoints: &[String], ttl: Duration) -> anyhow::Result<EtcdSc> {
        let first = endpoints.first().context("no etcd endpoint")?;
        let client = connect_with(first, POLITE_KEEPALIVE).await?;
        Ok(EtcdSc {
            endpoints: endpoints.to_vec(),
            conn: Mutex::new((0, client)),
            ttl,
            lease: tokio::sync::OnceCell::new(),
            keepalive: Mutex::new(None),
        })
    }

    /// The session's lease, granted (and its keepalive started) on first use.
    async fn lease(&self) -> anyhow::Result<i64> {
        let id = self
            .lease
            .get_or_try_init(|| async {
                // etcd's TTLs are whole seconds.
                let secs = self.ttl.as_secs().max(1) as i64;
                let g = self.call(|mut c| async move { c.lease_grant(secs, None).await }).await?;
                let (_, client) = self.current();
                let every = (self.ttl / 3).max(Duration::from_millis(100));
                let task = tokio::spawn(keep_lease(client, g.id(), every));
                *self.keepalive.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
                anyhow::Ok(g.id())
            })
            .await?;
        Ok(*id)
    }

    fn stop_keepalive(&self) {
        if let Some(t) = self.keepalive.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }

    fn current(&self) -> (usize, etcd_client::Client) {
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        (c.0, c.1.clone())
    }

    /// Runs `op` on the current member's client, bounded by
    /// [`ETCD_OP_TIMEOUT`]; on a transport error or a timeout moves to the
    /// next member (for the caller's next try) and returns the error.
    async fn call<T, F, Fut>(&self, op: F) -> anyhow::Result<T>
    where
        F: FnOnce(etcd_client::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let (member, client) = self.current();
        let err = match tokio::time::timeout(ETCD_OP_TIMEOUT, op(client)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => {
                let moving = member_trouble(&e);
                (anyhow::Error::from(e), moving)
            }
            Err(_) => (anyhow::anyhow!("etcd request took over {ETCD_OP_TIMEOUT:?}"), true),
        };
        if err.1 && self.endpoints.len() > 1 {
            let next = (member + 1) % self.endpoints.len();
            if let Ok(client) = connect_with(&self.endpoints[next], POLITE_KEEPALIVE).await {
                let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
                if c.0 == member {
                    *c = (next, client);
                }
            }
        }
        Err(err.0.context(format!("etcd member {}", self.endpoints[member])))
    }
}

impl Drop for EtcdSc {
    fn drop(&mut self) {
        self.stop_keepalive();
    }
}

/// Sends a keepalive for `lease` every `every` on one keepalive stream
/// (opened again after an error), as etcd's Go client does at TTL/3;
/// ends after [`LEASE_LIFETIME`] or when aborted.
async fn keep_lease(mut client: etcd_client::Client, lease: i64, every: Duration) {
    let until = tokio::time::Instant::now() + LEASE_LIFETIME;
    let mut stream = None;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(every).await;
        if stream.is_none() {
            // Opening the stream sends a keepalive and waits for its answer.
            if let Ok(Ok(s)) = tokio::time::timeout(every, client.lease_keep_alive(lease)).await {
                stream = Some(s);
            }
            continue;
        }
        let Some((keeper, responses)) = stream.as_mut() else { continue };
        let answered = keeper.keep_alive().await.is_ok()
            && matches!(tokio::time::timeout(every, responses.message()).await, Ok(Ok(Some(r))) if r.ttl() > 0);
        if !answered {
            stream = None;
        }
    }
}

fn zk_persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

fn zk_ephemeral() -> zk::CreateOptions<'static> {
    zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())
}

impl Sc {
    /// A session on `endpoints` (the first listed is tried first by Baton;
    /// ZooKeeper's client shuffles), with timeout `ttl`.
    pub async fn connect(kind: Kind, endpoints: &[String], ttl: Duration) -> anyhow::Result<Sc> {
        Ok(match kind {
            Kind::Baton => {
                let cfg = ClientConfig::new(endpoints.to_vec())
                    .session_timeout(ttl)
                    .connect_timeout(Duration::from_secs(5))
                    .op_timeout(Duration::from_secs(30));
                Sc::Baton(baton_client::Client::connect_with(cfg).await?)
            }
            // The crate pings every 3/8 of its connection timeout, which it
            // allows up to 3/5 of the session's: the longest, 0.225 x TTL,
            // is the nearest to Baton's TTL/3.
            Kind::Zookeeper => Sc::Zk(
                zk::Client::connector()
                    .with_session_timeout(ttl)
                    .with_connection_timeout(ttl * 3 / 5)
                    .with_fail_eagerly()
                    .connect(&endpoints.join(","))
                    .await?,
            ),
            Kind::Etcd => Sc::Etcd(Box::new(EtcdSc::connect(endpoints, ttl).await?)),
            Kind::BatonZk => anyhow::bail!("scale runs baton, zookeeper and etcd"),
        })
    }

    /// Creates `path` and its missing parents (persistent, empty; etcd:
    /// nothing, its keys have no parents).
    pub async fn ensure(&self, path: &str) -> anyhow::Result<()> {
        if let Sc::Etcd(_) = self {
            return Ok(());
        }
        let mut at = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            at.push('/');
            at.push_str(part);
            match self {
                Sc::Baton(c) => match c.create(&at, Vec::new(), CreateOptions::persistent()).await {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::NodeExists => {}
                    Err(e) => return Err(e.into()),
                },
                Sc::Zk(c) => match c.create(&at, &[], &zk_persistent()).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(e.into()),
                },
                Sc::Etcd(_) => {}
            }
        }
        Ok(())
    }

    /// Creates every path in one multi (persistent, `data` each; etcd: a
    /// txn of puts, at most `--max-txn-ops`, 128 by default).
    pub async fn create_batch(&self, paths: &[String], data: &[u8]) -> anyhow::Result<()> {
        match self {
            Sc::Baton(c) => {
                let ops: Vec<Op> = paths
                    .iter()
                    .map(|p| Op::Create {
                        path: p.clone(),
                        data: data.to_vec().into(),
                        options: CreateOptions::persistent(),
                    })
                    .collect();
                c.multi(&ops).await?;
            }
            Sc::Zk(c) => {
                let mut w = c.new_multi_writer();
                for p in paths {
                    w.add_create(p, data, &zk_persistent())?;
                }
                w.commit().await.map_err(|e| anyhow::anyhow!("multi: {e}"))?;
            }
            Sc::Etcd(c) => {
                let puts: Vec<TxnOp> = paths.iter().map(|p| TxnOp::put(p.as_str(), data.to_vec(), None)).collect();
                c.call(|mut c| async move { c.txn(Txn::new().and_then(puts)).await }).await?;
            }
        }
        Ok(())
    }

    pub async fn create_ephemeral(&self, path: &str) -> anyhow::Result<()> {
        match self {
            Sc::Baton(c) => {
                c.create(path, Vec::new(), CreateOptions::ephemeral()).await?;
            }
            Sc::Zk(c) => {
                c.create(path, &[], &zk_ephemeral()).await?;
            }
            Sc::Etcd(c) => {
                let lease = c.lease().await?;
                let path = path.to_string();
                let opts = PutOptions::new().with_lease(lease);
                c.call(|mut c| async move { c.put(path, Vec::new(), Some(opts)).await }).await?;
            }
        }
        Ok(())
    }

    pub async fn set(&self, path: &str, data: &[u8]) -> anyhow::Result<()> {
        match self {
            Sc::Baton(c) => {
                c.set(path, data.to_vec(), None).await?;
            }
            Sc::Zk(c) => {
                c.set_data(path, data, None).await?;
            }
            Sc::Etcd(c) => {
                let (path, data) = (path.to_string(), data.to_vec());
                c.call(|mut c| async move { c.put(path, data, None).await }).await?;
            }
        }
        Ok(())
    }

    /// Linearizable: does `path` exist?
    pub async fn read(&self, path: &str) -> anyhow::Result<bool> {
        match self {
            Sc::Baton(c) => match c.get(path).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == ErrorKind::NoNode => Ok(false),
                Err(e) => Err(e.into()),
            },
            Sc::Zk(c) => {
                c.sync(path).await?;
                match c.get_data(path).await {
                    Ok(_) => Ok(true),
                    Err(zk::Error::NoNode) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Sc::Etcd(c) => {
                let path = path.to_string();
                let r =
                    c.call(|mut c| async move { c.get(path, Some(GetOptions::new().with_count_only())).await }).await?;
                Ok(r.count() > 0)
            }
        }
    }

    /// The children's names (etcd: the keys under `path/`, relative).
    pub async fn children(&self, path: &str) -> anyhow::Result<Vec<String>> {
        Ok(match self {
            Sc::Baton(c) => c.children(path).await?,
            Sc::Zk(c) => c.list_children(path).await?,
            Sc::Etcd(c) => {
                let prefix = format!("{}/", path.trim_end_matches('/'));
                let p2 = prefix.clone();
                let r = c
                    .call(
                        |mut c| async move { c.get(p2, Some(GetOptions::new().with_prefix().with_keys_only())).await },
                    )
                    .await?;
                r.kvs().iter().filter_map(|kv| kv.key_str().ok()?.strip_prefix(&prefix).map(str::to_string)).collect()
            }
        })
    }

    /// A one-shot exists-watch on `path` (which may not exist).
    pub async fn watch(&self, path: &str) -> anyhow::Result<Fired> {
        Ok(match self {
            Sc::Baton(c) => {
                let (_, mut w) = c.exists_watch(path).await?;
                Box::pin(async move {
                    let _ = w.next().await;
                })
            }
            Sc::Zk(c) => {
                let (_, w) = c.check_and_watch_stat(path).await?;
                Box::pin(async move {
                    let _ = w.changed().await;
                })
            }
            Sc::Etcd(_) => anyhow::bail!("etcd has no one-shot watches (its watches are streams; not measured here)"),
        })
    }

    pub async fn close(self) {
        match self {
            Sc::Baton(c) => {
                let _ = tokio::time::timeout(Duration::from_secs(5), c.close()).await;
            }
            Sc::Zk(c) => drop(c),
            // Revoking the lease deletes its keys, as closing a session does.
            Sc::Etcd(c) => {
                c.stop_keepalive();
                if let Some(&lease) = c.lease.get() {
                    let revoke = c.call(|mut c| async move { c.lease_revoke(lease).await });
                    let _ = tokio::time::timeout(Duration::from_secs(5), revoke).await;
                }
            }
        }
    }
}
