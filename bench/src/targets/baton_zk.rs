//! Baton through its ZooKeeper port (`--zk-addr`, docs/zookeeper.md) as a
//! target: the same `batond` cluster as the `baton` target, every member
//! with its ZooKeeper port open, driven by the ZooKeeper target's client
//! (`zookeeper-client`) and lock recipe. Next to `baton` it shows what the
//! compatibility layer costs; next to `zookeeper`, the same client code on
//! both servers.
//!
//! Leader, kill and pause go through the Baton cluster (the native status
//! names the leader).

use std::path::Path;
use std::time::Duration;

use super::baton::{BatonOpts, BatonTarget};
use super::zookeeper::ZkClient;
use super::{Kind, Target};

pub struct BatonZkTarget {
    baton: BatonTarget,
    zk: Vec<String>,
}

impl BatonZkTarget {
    pub async fn start(dir: &Path) -> anyhow::Result<BatonZkTarget> {
        Self::start_opts(dir, BatonOpts::default()).await
    }

    /// With `o`'s binary, links and flags (`zk` is always on).
    pub async fn start_opts(dir: &Path, o: BatonOpts) -> anyhow::Result<BatonZkTarget> {
        let baton = BatonTarget::start_opts(dir, BatonOpts { zk: true, ..o }).await?;
        let zk = baton.zk_endpoints();
        anyhow::ensure!(zk.len() == baton.members(), "every member needs a ZooKeeper port: {zk:?}");
        Ok(BatonZkTarget { baton, zk })
    }
}

impl Target for BatonZkTarget {
    type Client = ZkClient;

    fn kind(&self) -> Kind {
        Kind::BatonZk
    }

    /// The ZooKeeper ports (what a client of this target connects to).
    fn endpoints(&self) -> Vec<String> {
        self.zk.clone()
    }

    async fn connect(&self, member: usize, ttl: Duration) -> anyhow::Result<ZkClient> {
        ZkClient::connect_to(self.zk.clone(), member, ttl).await
    }

    async fn leader(&self) -> anyhow::Result<usize> {
        self.baton.leader().await
    }

    fn kill(&self, member: usize) -> anyhow::Result<()> {
        self.baton.kill(member)
    }

    fn pause(&self, member: usize, paused: bool) -> anyhow::Result<()> {
        self.baton.pause(member, paused)
    }

    fn stop(&self) {
        self.baton.stop()
    }

    fn member_pids(&self) -> Vec<i32> {
        self.baton.member_pids()
    }

    fn restart_supported(&self) -> bool {
        true
    }

    fn restart(&self, member: usize) -> anyhow::Result<bool> {
        self.baton.restart(member)
    }

    fn isolate(&self, member: usize, cut: bool) -> anyhow::Result<bool> {
        self.baton.isolate(member, cut)
    }
}
