//! Leader elections as contenders: a campaign is an acquire, a resignation a release, so the
//! election workloads (`workloads::handovers`, `workloads::crash_failovers`) drive them through
//! the same interface as the locks. dlock's `Election` on each backend; as peers, etcd's own
//! election API on etcd (`etcd-client`'s `campaign` / `resign`, with a lease kept alive) and on
//! ZooKeeper zookeeper-client's `Client::lock` with Curator's `LeaderLatch` node name
//! (`impls::ZkPeer` with `latch-`, built in `main.rs`). Redis has no Rust election peer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{AcquireOptions, Election, Leadership, LockName, Locker, Stats};
use etcd_client::ResignOptions;

use crate::impls::{Client, Dlock, Held, Impl, KeptLease, etcd_client};

fn err(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// dlock's `Election` on one backend.
pub struct DlockElection(pub Dlock);

/// The election, and the same locker as a `Locker` for its counters.
struct DlockElectionClient(Arc<dyn Election>, Arc<dyn Locker>);

#[async_trait]
impl Client for DlockElectionClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let name = LockName::new(name).map_err(|e| err("election name")(&e))?;
        let leading = self
            .0
            .campaign(&name, b"bench", AcquireOptions::forever())
            .await
            .map_err(|e| err("dlock campaign")(&e))?;
        Ok(Box::new(leading))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let leading = held
            .downcast::<Leadership>()
            .map_err(|_| "dlock resign: not a leadership".to_string())?;
        leading.resign().await.map_err(|e| err("dlock resign")(&e))
    }

    fn stats(&self) -> Option<Stats> {
        Some(self.1.stats())
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.0.ttl())
    }
}

#[async_trait]
impl Impl for DlockElection {
    fn name(&self) -> &'static str {
        "dlock"
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let (election, locker) = self.0.elector(ttl).await?;
        let client = DlockElectionClient(election, locker);
        // Open connections / sessions outside any measurement.
        let warm = client.acquire("warm-up").await?;
        client.release(warm).await?;
        Ok(Arc::new(client))
    }

    fn through(&self, addrs: &[SocketAddr]) -> Option<Arc<dyn Impl>> {
        Some(Arc::new(DlockElection(self.0.through(addrs))))
    }
}

/// etcd's election API through `etcd-client`, on a lease granted once and kept alive.
pub struct EtcdElectionPeer {
    pub endpoints: Vec<String>,
    pub prefix: String,
}

struct EtcdElectionClient {
    client: etcd_client::Client,
    lease: KeptLease,
    prefix: String,
}

#[async_trait]
impl Client for EtcdElectionClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let name = format!("{}{name}", self.prefix);
        let mut resp = self
            .client
            .clone()
            .campaign(name.as_str(), "bench", self.lease.id)
            .await
            .map_err(|e| err("etcd-client campaign")(&e))?;
        let leader = resp
            .take_leader()
            .ok_or("etcd-client campaign: no leader key")?;
        Ok(Box::new(leader))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let leader = held
            .downcast::<etcd_client::LeaderKey>()
            .map_err(|_| "etcd-client resign: not a leader key".to_string())?;
        self.client
            .clone()
            .resign(Some(ResignOptions::new().with_leader(*leader)))
            .await
            .map_err(|e| err("etcd-client resign")(&e))?;
        Ok(())
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.lease.ttl)
    }
}

#[async_trait]
impl Impl for EtcdElectionPeer {
    fn name(&self) -> &'static str {
        "etcd-client"
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let (client, lease) = etcd_client(&self.endpoints, ttl).await?;
        Ok(Arc::new(EtcdElectionClient {
            client,
            lease,
            prefix: self.prefix.clone(),
        }))
    }

    fn through(&self, addrs: &[SocketAddr]) -> Option<Arc<dyn Impl>> {
        Some(Arc::new(EtcdElectionPeer {
            endpoints: addrs.iter().map(|a| format!("http://{a}")).collect(),
            prefix: self.prefix.clone(),
        }))
    }
}
