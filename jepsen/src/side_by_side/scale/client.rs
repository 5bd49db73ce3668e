//! The few operations the dimensions need, on one session of either
//! service: batched creates, ephemeral nodes, a one-shot watch, a read
//! that only a caught-up member answers.
//!
//! Reads are linearizable (Baton's default ReadIndex; ZooKeeper `sync` +
//! `getData`): a member that has not caught up cannot answer one, which
//! is what the restart and catch-up timings rely on.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use baton_client::{ClientConfig, CreateOptions, ErrorKind, Op};
use zookeeper_client as zk;

use crate::side_by_side::targets::Kind;

/// A watch that has been registered; resolves when it fires (or its
/// session ends).
pub type Fired = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One session.
pub enum Sc {
    Baton(baton_client::Client),
    Zk(zk::Client),
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
            Kind::Etcd | Kind::BatonZk => anyhow::bail!("scale runs baton and zookeeper"),
        })
    }

    /// Creates `path` and its missing parents (persistent, empty).
    pub async fn ensure(&self, path: &str) -> anyhow::Result<()> {
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
            }
        }
        Ok(())
    }

    /// Creates every path in one multi (persistent, `data` each).
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
        }
    }

    /// The children's names.
    pub async fn children(&self, path: &str) -> anyhow::Result<Vec<String>> {
        Ok(match self {
            Sc::Baton(c) => c.children(path).await?,
            Sc::Zk(c) => c.list_children(path).await?,
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
        })
    }

    pub async fn close(self) {
        match self {
            Sc::Baton(c) => {
                let _ = tokio::time::timeout(Duration::from_secs(5), c.close()).await;
            }
            Sc::Zk(c) => drop(c),
        }
    }
}
