//! ZooKeeper contenders, each client on its own session: the lock floor (create
//! EPHEMERAL_SEQUENTIAL, getChildren of the parent, delete), the read floor (the same three
//! requests on `<name>/read-`; a `write-` child is an error: a writer holds or waits; no watch,
//! no `sync`), and zookeeper-client's `Client::lock` with `LockPrefix::new_curator`: the
//! `lock-` node name of Curator's `InterProcessMutex`, or `latch-` of its `LeaderLatch` (the
//! election peer). The peer's release is an explicit delete (dropping the `LockClient` would
//! delete in the background, unmeasured). zookeeper-client has no read-write lock (Curator's
//! `InterProcessReadWriteLock` is Java).

use std::time::Duration;

use async_trait::async_trait;
use zookeeper_client as zk;

use super::{Client, Context, Held, Kind};

/// One ZooKeeper client of any contender kind, its nodes under `base`.
pub struct ZkClient {
    client: zk::Client,
    base: String,
    kind: Kind,
}

impl ZkClient {
    pub async fn new(
        kind: Kind,
        nodes: &[String],
        base: String,
        ttl: Duration,
    ) -> Result<Self, String> {
        let client = zk::Client::connector()
            .with_session_timeout(ttl)
            .connect(&nodes.join(","))
            .await
            .ctx("zk connect")?;
        Ok(ZkClient { client, base, kind })
    }

    fn who(&self) -> &'static str {
        match self.kind {
            Kind::Floor => "floor",
            Kind::ReadFloor => "read floor",
            _ => "zookeeper-client",
        }
    }
}

fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

#[async_trait]
impl Client for ZkClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let (dir, who) = (format!("{}/{name}", self.base), self.who());
        let node = match self.kind {
            Kind::Floor => "n-",
            Kind::ReadFloor => "read-",
            kind => {
                let node = if kind == Kind::Peer {
                    "lock-"
                } else {
                    "latch-"
                };
                let prefix = zk::LockPrefix::new_curator(&dir, node).ctx("lock prefix")?;
                let options = zk::LockOptions::new(zk::Acls::anyone_all())
                    .with_ancestor_options(persistent())
                    .ctx("lock options")?;
                let lock = self.client.lock(prefix, b"", options).await;
                let lock = lock.ctx("zookeeper-client lock")?;
                let path = lock.lock_path().to_string();
                std::mem::forget(lock);
                return Ok(Box::new(path));
            }
        };
        let prefix = format!("{dir}/{node}");
        let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let seq = match self.client.create(&prefix, b"", &opts).await {
            Ok((_, seq)) => seq,
            Err(zk::Error::NoNode) => {
                // First use of this name: make the parent (as the recipe does), then retry.
                match self.client.mkdir(&dir, &persistent()).await {
                    Ok(()) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(format!("{who} mkdir: {e}")),
                }
                let created = self.client.create(&prefix, b"", &opts).await;
                created.ctx(&format!("{who} create"))?.1
            }
            Err(e) => return Err(format!("{who} create: {e}")),
        };
        let children = self.client.list_children(&dir).await;
        let children = children.ctx(&format!("{who} getChildren"))?;
        if self.kind == Kind::ReadFloor
            && let Some(w) = children.iter().find(|c| c.starts_with("write-"))
        {
            return Err(format!("read floor: writer {dir}/{w}"));
        }
        Ok(Box::new(format!("{prefix}{seq}")))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let who = self.who();
        let path = held
            .downcast::<String>()
            .map_err(|_| format!("{who} release: not a path"))?;
        let deleted = self.client.delete(&path, None).await;
        deleted.ctx(&format!("{who} delete"))
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.client.session_timeout())
    }
}
