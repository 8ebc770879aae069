//! The Redis and Redlock topologies as conformance backends, shared by the test files.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_conformance::{ClientOptions, ServerExpiry, TestBackend};
use dlock_core::{Election, Error, FencingToken, LockName, Locker, RwLocker, Semaphore};
use dlock_redis::{RedisLocker, RedlockLocker};

/// Which locker a backend builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `RedisLocker` on node 0 (fair mode).
    Single,
    /// `RedisLocker` on node 0 in spin mode (`fair(false)`).
    Spin,
    /// `RedlockLocker` over every node.
    Redlock,
}

/// A cluster (shared, or private for destructive tests) and the locker kind.
pub struct RedisBackend {
    pub name: String,
    pub kind: Kind,
    pub cluster: ClusterRef,
}

/// A shared cluster or one this backend owns.
pub enum ClusterRef {
    Shared(Arc<Cluster>),
    Owned(Cluster),
}

impl ClusterRef {
    pub fn get(&self) -> &Cluster {
        match self {
            ClusterRef::Shared(c) => c,
            ClusterRef::Owned(c) => c,
        }
    }
}

impl RedisBackend {
    pub fn new(name: &str, kind: Kind, cluster: ClusterRef) -> Self {
        RedisBackend {
            name: name.into(),
            kind,
            cluster,
        }
    }

    fn urls(&self, via: Option<&[SocketAddr]>) -> Vec<String> {
        match via {
            Some(addrs) => addrs.iter().map(|a| format!("redis://{a}")).collect(),
            None => self.cluster.get().endpoints(),
        }
    }

    /// Node URLs the backend audits (node 0 only for the single-node lock).
    fn audit_urls(&self) -> Vec<String> {
        let all = self.cluster.get().endpoints();
        match self.kind {
            Kind::Single | Kind::Spin => all.into_iter().take(1).collect(),
            Kind::Redlock => all,
        }
    }

    /// The lock key of `name` under `namespace`.
    fn key(namespace: &str, name: &LockName) -> String {
        format!("{namespace}/dlock:{{{}}}", name.as_str())
    }
}

/// `PTTL` of `key` on one server.
async fn pttl(url: &str, key: &str) -> Result<i64, redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    redis::cmd("PTTL").arg(key).query_async(&mut conn).await
}

fn backend_err(e: &redis::RedisError) -> Error {
    Error::backend(
        format!("test audit: {e}"),
        Some(Box::new(e.clone()) as dlock_core::BoxError),
    )
}

/// Live lock keys and live queue entries under `namespace` on one server. Fence counters are
/// permanent by design (tokens must keep increasing), so they are not leftovers.
pub async fn server_leftovers(
    url: &str,
    namespace: &str,
) -> Result<Vec<String>, redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let pattern = format!("{namespace}/dlock:*");
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
    let now_ms = secs * 1000 + micros / 1000;
    let mut out = Vec::new();
    for key in keys {
        // The fence counter and an election's leader record and change stream outlive their
        // holders by design (they keep tokens and observations consistent), like the fence.
        if key.ends_with(":fence")
            || key.ends_with(":qt")
            || key.ends_with(":leader")
            || key.ends_with(":changes")
            || key.contains("dlock:notify:")
        {
            continue;
        }
        if let Some(lock) = key.strip_suffix(":q") {
            let entries: Vec<String> = redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            for entry in entries {
                let deadline: Option<u64> = redis::cmd("HGET")
                    .arg(format!("{lock}:qt"))
                    .arg(&entry)
                    .query_async(&mut conn)
                    .await?;
                if deadline.is_some_and(|d| d > now_ms) {
                    out.push(format!("{url} queue {key} {entry}"));
                }
            }
        } else {
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut conn).await?;
            if pttl > 0 || pttl == -1 {
                out.push(format!("{url} lock {key}"));
            }
        }
    }
    Ok(out)
}

impl RedisBackend {
    /// A single-node locker (fair unless this is the spin backend) with the scenario's options.
    fn single(&self, opts: &ClientOptions) -> Result<RedisLocker, Error> {
        let url = self
            .urls(opts.via.as_deref())
            .into_iter()
            .next()
            .unwrap_or_default();
        let mut b = RedisLocker::builder()
            .url(url)
            .ttl(opts.ttl)
            .namespace(&opts.namespace)
            .fair(self.kind == Kind::Single);
        if let Some(t) = opts.request_timeout {
            b = b.request_timeout(t);
        }
        b.build()
    }
}

#[async_trait]
impl TestBackend for RedisBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn node_addrs(&self) -> Vec<SocketAddr> {
        match self.kind {
            Kind::Single | Kind::Spin => self.cluster.get().addrs().into_iter().take(1).collect(),
            Kind::Redlock => self.cluster.get().addrs(),
        }
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        let urls = self.urls(opts.via.as_deref());
        match self.kind {
            Kind::Single | Kind::Spin => Ok(Arc::new(self.single(&opts)?)),
            // Redlock's per-node timeout derives from the TTL; it has no request timeout knob.
            Kind::Redlock => Ok(Arc::new(
                RedlockLocker::builder()
                    .nodes(urls)
                    .ttl(opts.ttl)
                    .namespace(&opts.namespace)
                    .build()?,
            )),
        }
    }

    /// Election on the single node (fair or spin); Redlock has none.
    async fn election(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Election>>, Error> {
        match self.kind {
            Kind::Single | Kind::Spin => Ok(Some(Arc::new(self.single(&opts)?))),
            Kind::Redlock => Ok(None),
        }
    }

    /// The read-write lock on the single node (fair or spin); Redlock has none.
    async fn rw(&self, opts: ClientOptions) -> Result<Option<Arc<dyn RwLocker>>, Error> {
        match self.kind {
            Kind::Single | Kind::Spin => Ok(Some(Arc::new(self.single(&opts)?))),
            Kind::Redlock => Ok(None),
        }
    }

    /// The semaphore on the single node (fair or spin); Redlock has none.
    async fn semaphore(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Semaphore>>, Error> {
        match self.kind {
            Kind::Single | Kind::Spin => Ok(Some(Arc::new(self.single(&opts)?))),
            Kind::Redlock => Ok(None),
        }
    }

    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        for (i, url) in self.audit_urls().iter().enumerate() {
            let node = self.cluster.get().node(i);
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                server_leftovers(url, namespace),
            )
            .await;
            match read {
                Ok(Ok(found)) => out.extend(found),
                // A node a test killed or paused holds nothing anyone can use.
                Ok(Err(e))
                    if (e.is_io_error() || e.is_connection_refusal()) && !node.is_running() => {}
                Ok(Err(e)) => return Err(backend_err(&e)),
                Err(_) if node.is_paused() => {}
                Err(_) => {
                    return Err(Error::unavailable(
                        format!("test audit: {url} did not answer"),
                        None,
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Deletes the lock key on every reachable node. Returns the token of every owner value it
    /// deleted anywhere (on Redlock one deleted key can cost a holder its majority): the largest
    /// fence counter among the nodes that held that owner value (the grant set the counter to
    /// its token; Redlock writes the token back to its laggards). A fair-mode reservation
    /// (`r:…`) is no grant.
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Vec<FencingToken>, Error> {
        let key = format!("{namespace}/dlock:{{{}}}", name.as_str());
        let take = redis::Script::new(
            "local v = redis.call('GET', KEYS[1]) \
             if not v then return false end \
             redis.call('DEL', KEYS[1]) \
             return {v, redis.call('GET', KEYS[2]) or '0'}",
        );
        let mut found: Vec<(String, u64)> = Vec::new();
        for (i, url) in self.audit_urls().iter().enumerate() {
            if !self.cluster.get().node(i).is_running() && !self.cluster.get().is_external() {
                continue;
            }
            let client = redis::Client::open(url.as_str()).map_err(|e| backend_err(&e))?;
            let mut conn = match client.get_multiplexed_async_connection().await {
                Ok(c) => c,
                Err(e) if e.is_connection_refusal() => continue,
                Err(e) => return Err(backend_err(&e)),
            };
            let held: Option<(String, String)> = take
                .key(&key)
                .key(format!("{key}:fence"))
                .invoke_async(&mut conn)
                .await
                .map_err(|e| backend_err(&e))?;
            if let Some((owner, fence)) = held {
                if !owner.starts_with("r:") {
                    found.push((owner, fence.parse().unwrap_or(0)));
                }
            }
        }
        if found.is_empty() {
            return Err(Error::NotHeld {
                name: name.to_string(),
            });
        }
        let mut tokens: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
        for (owner, fence) in &found {
            let t = tokens.entry(owner.as_str()).or_default();
            *t = (*t).max(*fence);
        }
        Ok(tokens.into_values().map(FencingToken).collect())
    }

    /// `PTTL` of the lock key. For Redlock: the moment a majority of the reachable nodes no
    /// longer hold the key (the earliest anyone else could be granted).
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let key = Self::key(namespace, name);
        let urls = self.audit_urls();
        let mut remaining = Vec::with_capacity(urls.len());
        for (i, url) in urls.iter().enumerate() {
            let node = self.cluster.get().node(i);
            if !node.is_running() && !self.cluster.get().is_external() {
                continue;
            }
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(2), pttl(url, &key)).await;
            match read {
                Ok(Ok(-2)) => remaining.push(Some(0)),
                Ok(Ok(ms)) if ms < 0 => remaining.push(None),
                Ok(Ok(ms)) => remaining.push(Some(ms as u64)),
                Ok(Err(e)) if e.is_io_error() || e.is_connection_refusal() => {}
                Ok(Err(e)) => return Err(backend_err(&e)),
                Err(_) => {}
            }
        }
        let need = match self.kind {
            Kind::Single | Kind::Spin => 1,
            Kind::Redlock => urls.len() / 2 + 1,
        };
        // `None` (no TTL) sorts last: such a node is never free.
        remaining.sort_by_key(|r| r.unwrap_or(u64::MAX));
        Ok(match remaining.get(need - 1) {
            None | Some(None) => ServerExpiry::Never,
            Some(Some(0)) => ServerExpiry::NoHolder,
            Some(Some(ms)) => ServerExpiry::Remaining {
                remaining: std::time::Duration::from_millis(*ms),
                resolution: std::time::Duration::from_millis(1),
            },
        })
    }

    /// The test servers run without persistence: a restart loses every lock.
    fn restart_keeps_locks(&self) -> bool {
        false
    }

    /// `PUBLISH` calls (also from scripts) over the audited nodes, from `INFO commandstats`.
    fn wake_signals(&self) -> Result<u64, String> {
        let mut total = 0;
        for addr in self.node_addrs() {
            let info = dlock_conformance::read_text(addr, b"INFO commandstats\r\nQUIT\r\n")
                .ok_or_else(|| format!("redis at {addr} did not answer INFO"))?;
            total += info
                .lines()
                .find_map(|l| l.strip_prefix("cmdstat_publish:"))
                .and_then(|rest| {
                    rest.split(',')
                        .find_map(|kv| kv.strip_prefix("calls="))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .unwrap_or(0);
        }
        Ok(total)
    }

    fn child_env(&self) -> Vec<(String, String)> {
        self.cluster.get().external_env()
    }

    fn logs(&self) -> String {
        self.cluster.get().logs()
    }

    fn topology(&self) -> Option<(ServerKind, usize)> {
        Some((ServerKind::Redis, self.cluster.get().len()))
    }

    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        Some(Arc::new(RedisBackend::new(
            &self.name,
            self.kind,
            ClusterRef::Shared(cluster),
        )))
    }
}
