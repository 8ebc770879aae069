//! Leader elections as contenders: a campaign is an acquire, a resignation a release, so the
//! waiters workload measures the leadership handoff (a leader resigns → the next campaign in
//! line leads) the same way it measures a lock handoff. dlock's `Election` on each backend;
//! on etcd, etcd's own election API (`etcd-client`'s `campaign` / `resign`, with a lease kept
//! alive) as the peer.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{AcquireOptions, Election, Leadership, LockName};
use etcd_client::ResignOptions;

use crate::impls::{Client, Dlock, Held, Impl, KeptLease, etcd_client};

fn err(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// dlock's `Election` on one backend.
pub struct DlockElection(pub Dlock);

struct DlockElectionClient(Arc<dyn Election>);

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
}

#[async_trait]
impl Impl for DlockElection {
    fn name(&self) -> &'static str {
        "dlock"
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let election = self.0.elector(ttl).await?;
        let client = DlockElectionClient(election);
        // Open connections / sessions outside any measurement.
        let warm = client.acquire("warm-up").await?;
        client.release(warm).await?;
        Ok(Arc::new(client))
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
}
