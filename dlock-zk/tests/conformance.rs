//! The shared conformance suite against real ZooKeeper: `zk` (one server) and `zk_cluster`
//! (a three-server ensemble).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_conformance::{ClientOptions, Declared, ServerExpiry, TestBackend};
use dlock_core::{
    Election, Error, FencingStrength, FencingToken, LockName, Locker, RwLocker, Semaphore,
};
use dlock_zk::{DEFAULT_ROOT, ZkLocker};
use zookeeper_client as zkc;

/// A ZooKeeper topology under test.
struct ZkBackend {
    name: &'static str,
    cluster: Arc<Cluster>,
}

impl ZkBackend {
    fn connect(&self) -> String {
        self.cluster.endpoints().join(",")
    }

    fn base(namespace: &str) -> String {
        format!("{DEFAULT_ROOT}/{namespace}")
    }

    /// A locker for `opts` (through the proxies of `opts.via` when set).
    async fn locker(&self, opts: &ClientOptions) -> Result<ZkLocker, Error> {
        let connect = match &opts.via {
            Some(addrs) => addrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            None => self.connect(),
        };
        ZkLocker::builder(connect)
            .ttl(opts.ttl)
            .namespace(opts.namespace.clone())
            .build()
            .await
    }

    /// A short-lived plain session for audits and server-side breaks.
    async fn raw(&self) -> Result<zkc::Client, Error> {
        zkc::Client::connector()
            .with_session_timeout(Duration::from_secs(5))
            .connect(&self.connect())
            .await
            .map_err(|e| Error::unavailable(format!("audit session: {e}"), Some(Box::new(e) as _)))
    }
}

fn backend_error(what: &str, e: zkc::Error) -> Error {
    Error::backend(format!("{what}: {e}"), Some(Box::new(e) as _))
}

async fn children(z: &zkc::Client, path: &str) -> Result<Vec<String>, Error> {
    match z.list_children(path).await {
        Ok(c) => Ok(c),
        Err(zkc::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(backend_error(&format!("list {path}"), e)),
    }
}

#[async_trait]
impl TestBackend for ZkBackend {
    fn name(&self) -> &str {
        self.name
    }

    fn node_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.cluster.addrs()
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Ok(Arc::new(self.locker(&opts).await?))
    }

    /// A locker built exactly as [`ZkBackend::client`] builds one, as an [`Election`].
    async fn election(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Election>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts).await?)))
    }

    /// A locker built exactly as [`ZkBackend::client`] builds one, as a [`RwLocker`].
    async fn rw(&self, opts: ClientOptions) -> Result<Option<Arc<dyn RwLocker>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts).await?)))
    }

    /// A locker built exactly as [`ZkBackend::client`] builds one, as a [`Semaphore`].
    async fn semaphore(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Semaphore>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts).await?)))
    }

    /// Every contender node under the namespace (`<lock parent>/<node>`, and a semaphore's
    /// `<lock parent>/locks/<node>` and `<lock parent>/leases/<node>`). Empty lock parents
    /// (and a semaphore's `locks` and `leases`) are container nodes the server reaps by
    /// itself, so they do not count.
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let z = self.raw().await?;
        let base = Self::base(namespace);
        let mut out = Vec::new();
        for parent in children(&z, &base).await? {
            for node in children(&z, &format!("{base}/{parent}")).await? {
                if node == "locks" || node == "leases" {
                    for sub in children(&z, &format!("{base}/{parent}/{node}")).await? {
                        out.push(format!("{parent}/{node}/{sub}"));
                    }
                    continue;
                }
                out.push(format!("{parent}/{node}"));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Deletes the holder's node (the lowest sequence), as an operator would.
    /// Deletes the first queue node; returns its czxid, the fencing token of its grant.
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Vec<FencingToken>, Error> {
        let z = self.raw().await?;
        let parent = format!("{}/{}", Self::base(namespace), name.encoded());
        let mut nodes: Vec<(i64, String)> = children(&z, &parent)
            .await?
            .into_iter()
            .filter_map(|n| {
                let seq = n.rsplit_once("lock-")?.1.parse().ok()?;
                Some((seq, n))
            })
            .collect();
        nodes.sort();
        let Some((_, holder)) = nodes.first() else {
            return Err(Error::NotHeld {
                name: name.to_string(),
            });
        };
        let path = format!("{parent}/{holder}");
        let stat = match z.check_stat(&path).await {
            Ok(Some(stat)) => stat,
            // Gone before we could read it (released or expired meanwhile): nothing broken.
            Ok(None) => {
                return Err(Error::NotHeld {
                    name: name.to_string(),
                });
            }
            Err(e) => return Err(backend_error("read the holder's node", e)),
        };
        match z.delete(&path, Some(stat.version)).await {
            Ok(()) => Ok(u64::try_from(stat.czxid)
                .ok()
                .map(FencingToken)
                .into_iter()
                .collect()),
            Err(zkc::Error::NoNode) => Err(Error::NotHeld {
                name: name.to_string(),
            }),
            Err(e) => Err(backend_error("delete the holder's node", e)),
        }
    }

    /// A session's remaining time is known to the server only: no client request reads it.
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let _ = (namespace, name);
        Ok(ServerExpiry::Unreadable(
            "ZooKeeper exposes no request that reads another session's remaining time".into(),
        ))
    }

    /// Watch notifications sent: the `zk_sum_node_*_watch_count` summaries of `mntr`.
    fn wake_signals(&self) -> Result<u64, String> {
        let mut total = 0;
        for addr in self.cluster.addrs() {
            let text = dlock_conformance::read_text(addr, b"mntr")
                .ok_or_else(|| format!("zookeeper at {addr} did not answer mntr"))?;
            let mut seen = false;
            for kind in ["created", "deleted", "changed", "children"] {
                if let Some(n) = dlock_conformance::sum_samples(
                    &text,
                    &format!("zk_sum_node_{kind}_watch_count"),
                ) {
                    total += n;
                    seen = true;
                }
            }
            if !seen {
                return Err(format!(
                    "zookeeper at {addr} reports no zk_sum_node_*_watch_count in mntr"
                ));
            }
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
        Some((ServerKind::Zk, self.cluster.len()))
    }

    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        Some(Arc::new(ZkBackend {
            name: self.name,
            cluster,
        }))
    }
}

fn shared(nodes: usize) -> Arc<Cluster> {
    Cluster::shared(ServerKind::Zk, nodes)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn zk() -> Arc<dyn TestBackend> {
    static B: OnceLock<Arc<dyn TestBackend>> = OnceLock::new();
    Arc::clone(B.get_or_init(|| {
        Arc::new(ZkBackend {
            name: "zk",
            cluster: shared(1),
        })
    }))
}

fn zk_cluster() -> Arc<dyn TestBackend> {
    static B: OnceLock<Arc<dyn TestBackend>> = OnceLock::new();
    Arc::clone(B.get_or_init(|| {
        Arc::new(ZkBackend {
            name: "zk-cluster",
            cluster: shared(3),
        })
    }))
}

/// Curator's recipe: a queue with one watcher per release; tokens from the zxid.
const ZK: Declared = Declared {
    fair: true,
    herd_free: true,
    fencing: FencingStrength::Linearizable,
};

dlock_conformance::conformance_tests!(zk, zk(), declared = ZK);
dlock_conformance::conformance_tests!(zk_cluster, zk_cluster(), declared = ZK);
