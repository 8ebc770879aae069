//! The `redis-cluster` topology: 3 masters (no replicas) on loopback, made a Redis Cluster with
//! `redis-cli --cluster create`, and its conformance backend.
//!
//! The nodes are the harness' Redis nodes started with [`cluster_options`] (cluster mode, the
//! bus on the node's second reserved port). A client reaching the nodes through fault proxies
//! maps each node's announced address to its proxy (`cluster_address_map`), so every
//! connection, also after a `MOVED`, goes through its proxy; the cluster bus stays direct.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
pub use dlock_conformance::servers::redis_cluster::form;
use dlock_conformance::servers::{Cluster, HarnessError, ServerKind, ServerOptions};
use dlock_conformance::{ClientOptions, ServerExpiry, TestBackend};
use dlock_core::{Error, FencingToken, LockName, Locker};
use dlock_redis::RedisLocker;

use super::{
    ClusterRef, audit_conn, backend_err, blocking, leftovers_on, lock_key, node_down,
    publish_calls, scenario,
};

/// Cluster mode (see the harness' [`redis_cluster::options`](dlock_conformance::servers::redis_cluster::options)).
pub fn cluster_options() -> ServerOptions {
    dlock_conformance::servers::redis_cluster::options()
}

/// Starts a private 3-master cluster (or takes the external provider's) and forms it.
pub fn start() -> Result<Cluster, HarnessError> {
    let cluster = Cluster::start_with(ServerKind::Redis, 3, &cluster_options())?;
    form(&cluster)?;
    Ok(cluster)
}

/// The Redis Cluster as a conformance backend (fair mode).
pub struct ClusterBackend {
    pub name: String,
    pub cluster: ClusterRef,
}

impl ClusterBackend {
    pub fn new(name: &str, cluster: ClusterRef) -> Self {
        ClusterBackend {
            name: name.into(),
            cluster,
        }
    }

    /// A cluster locker with the scenario's options: seeds and address map through `via`.
    pub async fn locker(&self, opts: &ClientOptions) -> Result<RedisLocker, Error> {
        let real = self.cluster.get().addrs();
        let seeds: Vec<String> = match &opts.via {
            Some(via) => via.iter().map(|a| format!("redis://{a}")).collect(),
            None => real.iter().map(|a| format!("redis://{a}")).collect(),
        };
        let mut b = scenario(RedisLocker::builder().cluster(seeds), opts);
        if let Some(via) = &opts.via {
            for (node, proxy) in real.iter().zip(via) {
                b = b.cluster_address_map(node.to_string(), proxy.to_string());
            }
        }
        b.build().await
    }

    /// Every node's URL with its index (a node that does not serve a key's slot answers
    /// `MOVED`, which the audits skip).
    fn node_urls(&self) -> Vec<(usize, String)> {
        self.cluster
            .get()
            .endpoints()
            .into_iter()
            .enumerate()
            .collect()
    }
}

/// Whether a node answered that another node serves the key's slot.
fn is_redirect(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("MOVED" | "ASK" | "CLUSTERDOWN" | "TRYAGAIN"))
}

#[async_trait]
impl TestBackend for ClusterBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn node_addrs(&self) -> Vec<SocketAddr> {
        self.cluster.get().addrs()
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Ok(Arc::new(self.locker(&opts).await?))
    }

    /// Live keys and queue entries under `namespace` on every master (each holds its slots'
    /// keys).
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let urls = self.cluster.get().endpoints();
        let clients = urls
            .iter()
            .map(|u| redis::Client::open(u.as_str()))
            .collect();
        leftovers_on(self.cluster.get(), urls, clients, namespace).await
    }

    /// Deletes the lock key on the master serving its slot; returns the holder's token (the
    /// fence counter the grant set). A fair-mode reservation (`r:…`) is no grant.
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error> {
        let key = lock_key(namespace, name);
        let take = redis::Script::new(
            "local v = redis.call('GET', KEYS[1]) \
             if not v then return false end \
             redis.call('DEL', KEYS[1]) \
             return {v, redis.call('GET', KEYS[2]) or '0'}",
        );
        let mut found = Vec::new();
        for (i, url) in self.node_urls() {
            if node_down(self.cluster.get(), i) {
                continue;
            }
            let Some(mut conn) = audit_conn(redis::Client::open(url.as_str())).await? else {
                continue;
            };
            dlock_conformance::history::deleting_now();
            let held: Result<Option<(String, String)>, _> = take
                .key(&key)
                .key(format!("{key}:fence"))
                .invoke_async(&mut conn)
                .await;
            match held {
                Ok(Some((owner, fence))) if !owner.starts_with("r:") => {
                    found.push(FencingToken(fence.parse().unwrap_or(0)));
                }
                Ok(_) => {}
                Err(e) if is_redirect(&e) => {}
                Err(e) => return Err(backend_err(&e)),
            }
        }
        if found.is_empty() {
            return Ok(None);
        }
        Ok(Some(found))
    }

    /// `PTTL` of the lock key on the master serving its slot.
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let key = lock_key(namespace, name);
        for (i, url) in self.node_urls() {
            if node_down(self.cluster.get(), i) {
                continue;
            }
            let client = redis::Client::open(url.as_str()).map_err(|e| backend_err(&e))?;
            let read = tokio::time::timeout(Duration::from_secs(2), async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PTTL")
                    .arg(&key)
                    .query_async::<i64>(&mut conn)
                    .await
            })
            .await;
            match read {
                Ok(Ok(-2)) => return Ok(ServerExpiry::NoHolder),
                Ok(Ok(ms)) if ms < 0 => return Ok(ServerExpiry::Never),
                Ok(Ok(ms)) => {
                    return Ok(ServerExpiry::Remaining {
                        remaining: Duration::from_millis(ms as u64),
                        resolution: Duration::from_millis(1),
                    });
                }
                Ok(Err(e)) if is_redirect(&e) => {}
                Ok(Err(e)) if e.is_io_error() || e.is_connection_refusal() => {}
                Ok(Err(e)) => return Err(backend_err(&e)),
                Err(_) => {}
            }
        }
        Err(Error::unavailable(
            format!("test audit: no node served the slot of {key}"),
            None,
        ))
    }

    /// The test servers run without persistence: a restart loses every lock.
    fn restart_keeps_locks(&self) -> bool {
        false
    }

    /// `PUBLISH` calls (from the scripts, on the master of the lock's slot) over every node: a
    /// message the cluster bus forwards to the other nodes is not counted again there.
    fn wake_signals(&self) -> Result<u64, String> {
        publish_calls(self.cluster.get(), self.cluster.get().len())
    }

    /// The endpoints of the three nodes (the child's factory finds them formed).
    fn child_env(&self) -> Vec<(String, String)> {
        self.cluster.get().external_env()
    }

    fn server_requests(&self) -> Option<u64> {
        let cluster = self.cluster.get();
        (0..cluster.len()).map(|i| cluster.node(i).requests()).sum()
    }

    fn logs(&self) -> String {
        self.cluster.get().logs()
    }

    fn topology(&self) -> Option<(ServerKind, usize)> {
        Some((ServerKind::Redis, self.cluster.get().len()))
    }

    /// The same backend over `cluster`, first restarted in cluster mode and formed.
    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        let run = || {
            cluster.reconfigure(&cluster_options())?;
            form(&cluster)
        };
        blocking(run)
            .unwrap_or_else(|e| panic!("cannot make the private cluster a Redis Cluster: {e}"));
        Some(Arc::new(ClusterBackend::new(
            &self.name,
            ClusterRef::Shared(cluster),
        )))
    }
}
