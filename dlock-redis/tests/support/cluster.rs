//! The `redis-cluster` topology: 3 masters (no replicas) on loopback, made a Redis Cluster with
//! `redis-cli --cluster create`, and its conformance backend.
//!
//! The nodes are the harness' Redis nodes started with [`cluster_options`] (cluster mode, the
//! bus on the node's second reserved port). A client reaching the nodes through fault proxies
//! maps each node's announced address to its proxy (`cluster_address_map`), so every
//! connection, also after a `MOVED`, goes through its proxy; the cluster bus stays direct.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_conformance::servers::{Cluster, HarnessError, ServerKind, ServerOptions};
use dlock_conformance::{ClientOptions, ServerExpiry, TestBackend};
use dlock_core::{Election, Error, FencingToken, LockName, Locker, RwLocker, Semaphore};
use dlock_redis::RedisLocker;

use super::{ClusterRef, backend_err, leftovers_of};

/// How long a cluster may take to agree on its slots after `--cluster create` or a restart.
pub const FORM_TIMEOUT: Duration = Duration::from_secs(60);

/// Cluster mode: nodes.conf in the node's data dir (kept across restarts, so a restarted node
/// rejoins with its slots), a node timeout well above a test's pauses of the client links, and
/// the slots of a failed master simply unavailable (no replicas to fail over to) while the
/// others keep serving.
pub fn cluster_options() -> ServerOptions {
    ServerOptions::default().with_args([
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "5000",
        "--cluster-require-full-coverage",
        "no",
    ])
}

/// One line `field:value` of `CLUSTER INFO` on `addr` (plain text over a fresh connection).
fn cluster_info(addr: SocketAddr, field: &str) -> Option<String> {
    let text = dlock_conformance::read_text(addr, b"CLUSTER INFO\r\nQUIT\r\n")?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// Whether every node reports `cluster_state:ok`, knows every node and sees every slot served.
pub fn is_formed(cluster: &Cluster) -> bool {
    let n = cluster.len().to_string();
    cluster.addrs().into_iter().all(|a| {
        cluster_info(a, "cluster_state").as_deref() == Some("ok")
            && cluster_info(a, "cluster_known_nodes").as_deref() == Some(n.as_str())
            && cluster_info(a, "cluster_slots_assigned").as_deref() == Some("16384")
    })
}

/// Waits until [`is_formed`], at most `timeout`.
pub fn wait_formed(cluster: &Cluster, timeout: Duration) -> Result<(), HarnessError> {
    let until = Instant::now() + timeout;
    while !is_formed(cluster) {
        if Instant::now() >= until {
            return Err(HarnessError::Io(format!(
                "the Redis Cluster at {:?} did not reach cluster_state:ok within {timeout:?}",
                cluster.addrs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Makes the (cluster-mode) nodes of `cluster` one Redis Cluster, each master with a third of
/// the slots, unless they already are (or the servers are external: then they must be), and
/// waits until every node agrees.
pub fn form(cluster: &Cluster) -> Result<(), HarnessError> {
    if cluster.is_external() || is_formed(cluster) {
        return wait_formed(cluster, FORM_TIMEOUT);
    }
    let mut cmd = Command::new("redis-cli");
    cmd.arg("--cluster").arg("create");
    for a in cluster.addrs() {
        cmd.arg(a.to_string());
    }
    cmd.args(["--cluster-replicas", "0", "--cluster-yes"]);
    let out = cmd
        .output()
        .map_err(|e| HarnessError::Io(format!("cannot run redis-cli --cluster create: {e}")))?;
    if !out.status.success() {
        return Err(HarnessError::Io(format!(
            "redis-cli --cluster create failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    wait_formed(cluster, FORM_TIMEOUT)
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
    pub fn locker(&self, opts: &ClientOptions) -> Result<RedisLocker, Error> {
        let real = self.cluster.get().addrs();
        let seeds: Vec<String> = match &opts.via {
            Some(via) => via.iter().map(|a| format!("redis://{a}")).collect(),
            None => real.iter().map(|a| format!("redis://{a}")).collect(),
        };
        let mut b = RedisLocker::builder()
            .cluster(seeds)
            .ttl(opts.ttl)
            .namespace(&opts.namespace);
        if let Some(via) = &opts.via {
            for (node, proxy) in real.iter().zip(via) {
                b = b.cluster_address_map(node.to_string(), proxy.to_string());
            }
        }
        if let Some(t) = opts.request_timeout {
            b = b.request_timeout(t);
        }
        b.build()
    }

    fn key(namespace: &str, name: &LockName) -> String {
        format!("{namespace}/dlock:{{{}}}", name.as_str())
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
        Ok(Arc::new(self.locker(&opts)?))
    }

    async fn election(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Election>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts)?)))
    }

    async fn rw(&self, opts: ClientOptions) -> Result<Option<Arc<dyn RwLocker>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts)?)))
    }

    async fn semaphore(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Semaphore>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts)?)))
    }

    /// Live keys and queue entries under `namespace` on every master (each holds its slots'
    /// keys).
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        for (i, url) in self.node_urls() {
            let node = self.cluster.get().node(i);
            let client = redis::Client::open(url.as_str()).map_err(|e| backend_err(&e))?;
            let read = tokio::time::timeout(
                Duration::from_secs(2),
                leftovers_of(&client, &url, namespace),
            )
            .await;
            match read {
                Ok(Ok(found)) => out.extend(found),
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

    /// Deletes the lock key on the master serving its slot; returns the holder's token (the
    /// fence counter the grant set). A fair-mode reservation (`r:…`) is no grant.
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Vec<FencingToken>, Error> {
        let key = Self::key(namespace, name);
        let take = redis::Script::new(
            "local v = redis.call('GET', KEYS[1]) \
             if not v then return false end \
             redis.call('DEL', KEYS[1]) \
             return {v, redis.call('GET', KEYS[2]) or '0'}",
        );
        let mut found = Vec::new();
        for (i, url) in self.node_urls() {
            if !self.cluster.get().node(i).is_running() && !self.cluster.get().is_external() {
                continue;
            }
            let client = redis::Client::open(url.as_str()).map_err(|e| backend_err(&e))?;
            let mut conn = match client.get_multiplexed_async_connection().await {
                Ok(c) => c,
                Err(e) if e.is_connection_refusal() => continue,
                Err(e) => return Err(backend_err(&e)),
            };
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
            return Err(Error::NotHeld {
                name: name.to_string(),
            });
        }
        Ok(found)
    }

    /// `PTTL` of the lock key on the master serving its slot.
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let key = Self::key(namespace, name);
        for (i, url) in self.node_urls() {
            if !self.cluster.get().node(i).is_running() && !self.cluster.get().is_external() {
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
        let mut total = 0;
        for (i, addr) in self.node_addrs().into_iter().enumerate() {
            let info = self
                .cluster
                .get()
                .node(i)
                .read_text(b"INFO commandstats\r\nQUIT\r\n")
                .ok_or_else(|| format!("redis at {addr} did not answer INFO"))?;
            total += commandstat_calls(&info, "publish").unwrap_or(0);
        }
        Ok(total)
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
        let done = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
            _ => run(),
        };
        done.unwrap_or_else(|e| panic!("cannot make the private cluster a Redis Cluster: {e}"));
        Some(Arc::new(ClusterBackend::new(
            &self.name,
            ClusterRef::Shared(cluster),
        )))
    }
}

/// `calls=` of `cmdstat_<command>` in an `INFO commandstats` reply (`script|load` for a
/// subcommand).
pub fn commandstat_calls(info: &str, command: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
}
