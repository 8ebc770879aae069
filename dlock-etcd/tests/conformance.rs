//! The shared conformance suite against real etcd: `etcd` (one server) and `etcd_cluster`
//! (a three-member cluster).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_conformance::{ClientOptions, Declared, ServerExpiry, TestBackend};
use dlock_core::{
    Election, Error, FencingStrength, FencingToken, LockName, Locker, RwLocker, Semaphore,
};
use dlock_etcd::EtcdLocker;
use dlock_etcd::etcd_client::{self, GetOptions, SortOrder, SortTarget};

/// An etcd topology under test.
struct EtcdBackend {
    name: &'static str,
    cluster: Arc<Cluster>,
}

fn etcd_error(what: &str, e: etcd_client::Error) -> Error {
    Error::backend(format!("{what}: {e}"), Some(Box::new(e) as _))
}

/// The holder's lease id (the key with the lowest create revision), or `None` without one.
async fn holder_lease(
    c: &mut etcd_client::Client,
    namespace: &str,
    name: &LockName,
) -> Result<Option<i64>, Error> {
    let range = format!("{namespace}/{}/", name.encoded());
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let resp = c
        .get(range, Some(first))
        .await
        .map_err(|e| etcd_error("read the holder", e))?;
    Ok(resp.kvs().first().map(|kv| kv.lease()))
}

impl EtcdBackend {
    /// A locker with the scenario's options (through its proxies when given).
    async fn locker(&self, opts: &ClientOptions) -> Result<EtcdLocker, Error> {
        let endpoints = match &opts.via {
            Some(addrs) => addrs.iter().map(|a| format!("http://{a}")).collect(),
            None => self.cluster.endpoints(),
        };
        EtcdLocker::builder()
            .endpoints(endpoints)
            .ttl(opts.ttl)
            .prefix(opts.namespace.clone())
            .request_timeout(opts.request_timeout.unwrap_or(Duration::from_secs(2)))
            .build()
            .await
    }

    /// A plain client for audits and server-side breaks (per call: each test has its own
    /// runtime, and a client's connection lives on the runtime that made it).
    async fn raw(&self) -> Result<etcd_client::Client, Error> {
        etcd_client::Client::connect(self.cluster.endpoints(), None)
            .await
            .map_err(|e| etcd_error("audit client", e))
    }
}

#[async_trait]
impl TestBackend for EtcdBackend {
    fn name(&self) -> &str {
        self.name
    }

    fn node_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.cluster.addrs()
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Ok(Arc::new(self.locker(&opts).await?))
    }

    async fn election(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Election>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts).await?)))
    }

    async fn rw(&self, opts: ClientOptions) -> Result<Option<Arc<dyn RwLocker>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts).await?)))
    }

    async fn semaphore(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Semaphore>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts).await?)))
    }

    /// Every key under the namespace (queue keys of waiters and holders). Keys of expired
    /// leases are deleted by etcd itself.
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let mut c = self.raw().await?;
        let resp = c
            .get(
                format!("{namespace}/"),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(|e| etcd_error("list the namespace", e))?;
        let mut keys: Vec<String> = resp
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Revokes the holder's lease (the key with the lowest create revision), as an operator
    /// would with `etcdctl lease revoke`.
    /// Revokes the lease of the range's first key (or deletes a key without one); returns that
    /// key's create revision, the fencing token of its grant.
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Vec<FencingToken>, Error> {
        let mut c = self.raw().await?;
        let range = format!("{namespace}/{}/", name.encoded());
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let resp = c
            .get(range, Some(first))
            .await
            .map_err(|e| etcd_error("read the holder", e))?;
        let Some(holder) = resp.kvs().first() else {
            return Err(Error::NotHeld {
                name: name.to_string(),
            });
        };
        if holder.lease() != 0 {
            c.lease_revoke(holder.lease())
                .await
                .map_err(|e| etcd_error("revoke the holder's lease", e))?;
        } else {
            c.delete(holder.key(), None)
                .await
                .map_err(|e| etcd_error("delete the holder's key", e))?;
        }
        Ok(u64::try_from(holder.create_revision())
            .ok()
            .map(FencingToken)
            .into_iter()
            .collect())
    }

    /// Deletes only the holder's key: its session lease carries the locker's other locks.
    async fn break_entry(&self, namespace: &str, name: &LockName) -> Result<(), Error> {
        let mut c = self.raw().await?;
        let range = format!("{namespace}/{}/", name.encoded());
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let resp = c
            .get(range, Some(first))
            .await
            .map_err(|e| etcd_error("read the holder", e))?;
        let Some(holder) = resp.kvs().first() else {
            return Err(Error::NotHeld {
                name: name.to_string(),
            });
        };
        c.delete(holder.key(), None)
            .await
            .map_err(|e| etcd_error("delete the holder's key", e))?;
        Ok(())
    }

    /// `LeaseTimeToLive` of the holder's lease: whole seconds, rounded down.
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let mut c = self.raw().await?;
        let Some(lease) = holder_lease(&mut c, namespace, name).await? else {
            return Ok(ServerExpiry::NoHolder);
        };
        if lease == 0 {
            return Ok(ServerExpiry::Never);
        }
        let ttl = c
            .lease_time_to_live(lease, None)
            .await
            .map_err(|e| etcd_error("read the holder's lease TTL", e))?
            .ttl();
        Ok(if ttl < 0 {
            ServerExpiry::NoHolder
        } else {
            ServerExpiry::Remaining {
                remaining: Duration::from_secs(ttl as u64),
                resolution: Duration::from_secs(1),
            }
        })
    }

    /// Watch events sent by the members (`etcd_debugging_mvcc_events_total` in `/metrics`).
    fn wake_signals(&self) -> Result<u64, String> {
        let mut total = 0;
        for addr in self.cluster.addrs() {
            let text = dlock_conformance::read_text(
                addr,
                b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
            )
            .ok_or_else(|| format!("etcd at {addr} did not answer /metrics"))?;
            total += dlock_conformance::sum_samples(&text, "etcd_debugging_mvcc_events_total")
                .ok_or_else(|| {
                    format!("etcd at {addr} reports no etcd_debugging_mvcc_events_total")
                })?;
        }
        Ok(total)
    }

    fn child_env(&self) -> Vec<(String, String)> {
        self.cluster.external_env()
    }

    fn logs(&self) -> String {
        self.cluster.logs()
    }

    fn topology(&self) -> Option<(ServerKind, usize)> {
        Some((ServerKind::Etcd, self.cluster.len()))
    }

    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        Some(Arc::new(EtcdBackend {
            name: self.name,
            cluster,
        }))
    }
}

fn backend(nodes: usize, name: &'static str) -> Arc<dyn TestBackend> {
    let cluster = Cluster::shared(ServerKind::Etcd, nodes)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    Arc::new(EtcdBackend { name, cluster })
}

fn etcd() -> Arc<dyn TestBackend> {
    static B: OnceLock<Arc<dyn TestBackend>> = OnceLock::new();
    Arc::clone(B.get_or_init(|| backend(1, "etcd")))
}

fn etcd_cluster() -> Arc<dyn TestBackend> {
    static B: OnceLock<Arc<dyn TestBackend>> = OnceLock::new();
    Arc::clone(B.get_or_init(|| backend(3, "etcd-cluster")))
}

/// A queue with one watcher per release; tokens from the store revision.
const ETCD: Declared = Declared {
    fair: true,
    herd_free: true,
    fencing: FencingStrength::Linearizable,
};

dlock_conformance::conformance_tests!(etcd, etcd(), declared = ETCD);
dlock_conformance::conformance_tests!(etcd_cluster, etcd_cluster(), declared = ETCD);
