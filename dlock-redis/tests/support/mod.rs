//! The Redis and Redlock topologies as conformance backends, shared by the test files, and the
//! ACL rules the README documents.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
use dlock_conformance::{ClientOptions, Declared, ServerExpiry, Slack, TestBackend};
use dlock_core::{Error, FencingStrength, FencingToken, LockName, Locker};
use dlock_redis::{RedisLocker, RedisLockerBuilder, RedlockLocker};

/// The Redis Cluster topology and its conformance backend.
pub mod cluster;
/// The Redis Sentinel deployment and its conformance backend.
pub mod sentinel;

/// The ACL rules the README documents, as `ACL SETUSER` / `user` directive arguments. The key
/// pattern (`~P dlock:*`) and the notification channel pattern (`&P dlock:notify:*`) for the
/// key prefix `P` come first ([`acl_rules`]).
pub mod acl {
    /// What the mutex needs (README, "ACL").
    pub const RULES: &[&str] = &[
        "+evalsha",
        "+eval",
        "+script|load",
        "+ping",
        "+subscribe",
        "+unsubscribe",
        "+set",
        "+get",
        "+del",
        "+pttl",
        "+pexpire",
        "+time",
        "+lindex",
        "+lpop",
        "+lrem",
        "+rpush",
        "+hget",
        "+hset",
        "+hdel",
        "+publish",
    ];

    /// What the read-write lock and the semaphore need on top of [`RULES`] (README).
    pub const FAMILY_RULES: &[&str] = &[
        "+zadd",
        "+zrem",
        "+zrange",
        "+zremrangebyscore",
        "+zcard",
        "+zscore",
        "+pexpireat",
        "+lrange",
    ];

    /// What the election needs on top of [`RULES`] (README): the announcement script's
    /// `HINCRBY` / `XADD`, the leader read's `HMGET` / `XREVRANGE`, observers' `XREAD`.
    pub const ELECTION_RULES: &[&str] = &["+hincrby", "+hmget", "+xadd", "+xrevrange", "+xread"];

    /// What `wait_for_replicas` needs on top of [`RULES`] (README): `WAIT` (its connection
    /// first publishes to the notification prefix, covered by `+publish`).
    pub const WAIT_RULES: &[&str] = &["+wait"];

    /// The user the `redis-acl` conformance row's lockers connect as.
    pub const CONFORMANCE_USER: &str = "dlock-conformance";
    /// Its password.
    pub const CONFORMANCE_PASSWORD: &str = "conformance-pw";

    /// `on >password ~P dlock:* &P dlock:notify:*` and `rules`, for keys under the prefix (or
    /// prefix pattern) `prefix`: what follows the user name in `ACL SETUSER` or `user`.
    pub fn acl_rules(password: &str, prefix: &str, rules: &[&[&str]]) -> Vec<String> {
        let mut out = vec![
            "on".to_string(),
            format!(">{password}"),
            format!("~{prefix}dlock:*"),
            format!("&{prefix}dlock:notify:*"),
        ];
        out.extend(rules.iter().flat_map(|r| r.iter()).map(|r| r.to_string()));
        out
    }
}

/// What the fair-mode rows (one node, ACL, TLS, Sentinel, Cluster) declare: a queue with one
/// wake-up per release; one counter per lock (in its slot on a cluster), raised to the server
/// clock on a new master.
pub const FAIR: Declared = Declared {
    fair: true,
    herd_free: true,
    fencing: FencingStrength::Linearizable,
    crash_release_slack: Slack::fixed(std::time::Duration::from_millis(250)),
};

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
    /// The user and password the lockers connect as (an ACL user); the default user when
    /// `None`. The scenarios' own helpers (audit, break, expiry) always use the default user.
    pub user: Option<(String, String)>,
    /// How the servers serve (TLS, ACL users): a private cluster a scenario starts is
    /// reconfigured so ([`Cluster::reconfigure`]) before the backend uses it.
    pub options: ServerOptions,
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
            user: None,
            options: ServerOptions::default(),
        }
    }

    /// Lockers connect as `user` with `password`.
    pub fn with_user(mut self, user: &str, password: &str) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// The servers serve as `options` say (the cluster must already; private clusters are
    /// reconfigured so).
    pub fn with_options(mut self, options: ServerOptions) -> Self {
        self.options = options;
        self
    }

    /// The CA bundle of a TLS cluster.
    fn ca_pem(&self) -> Option<Vec<u8>> {
        let tls = self.cluster.get().tls()?;
        Some(
            tls.ca_pem()
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", tls.ca().display())),
        )
    }

    /// The lockers' URLs: through `via` when given, with the user's credentials, `rediss://`
    /// for a TLS cluster.
    fn urls(&self, via: Option<&[SocketAddr]>) -> Vec<String> {
        let scheme = if self.cluster.get().tls().is_some() {
            "rediss"
        } else {
            "redis"
        };
        let auth = match &self.user {
            Some((user, password)) => format!("{user}:{password}@"),
            None => String::new(),
        };
        let addrs = match via {
            Some(addrs) => addrs.to_vec(),
            None => self.cluster.get().addrs(),
        };
        addrs
            .iter()
            .map(|a| format!("{scheme}://{auth}{a}"))
            .collect()
    }

    /// An administrative client of one node (the default user; the cluster's CA over TLS).
    fn admin(&self, url: &str) -> Result<redis::Client, redis::RedisError> {
        admin_client(url, self.ca_pem())
    }

    /// Node URLs the backend audits (node 0 only for the single-node lock).
    fn audit_urls(&self) -> Vec<String> {
        let all = self.cluster.get().endpoints();
        match self.kind {
            Kind::Single | Kind::Spin => all.into_iter().take(1).collect(),
            Kind::Redlock => all,
        }
    }
}

/// The lock key of `name` under `namespace`.
pub fn lock_key(namespace: &str, name: &LockName) -> String {
    format!("{namespace}/dlock:{{{}}}", name.as_str())
}

/// A client of `url` (`rediss://` trusting `ca` when given).
pub fn admin_client(url: &str, ca: Option<Vec<u8>>) -> Result<redis::Client, redis::RedisError> {
    match ca {
        None => redis::Client::open(url),
        Some(ca) => {
            // redis-rs builds its TLS configuration with the process' default crypto provider.
            let _ = rustls::crypto::ring::default_provider().install_default();
            redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca),
                },
            )
        }
    }
}

/// `PTTL` of `key` on one server.
async fn pttl(client: &redis::Client, key: &str) -> Result<i64, redis::RedisError> {
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
    leftovers_of(&redis::Client::open(url)?, url, namespace).await
}

/// [`server_leftovers`] through `client` (labelled `url`).
async fn leftovers_of(
    client: &redis::Client,
    url: &str,
    namespace: &str,
) -> Result<Vec<String>, redis::RedisError> {
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

/// [`leftovers_of`] over the nodes of `cluster` at `urls` (node `i` at `urls[i]`), through
/// `clients`: a node a test killed or paused holds nothing anyone can use.
pub async fn leftovers_on(
    cluster: &Cluster,
    urls: Vec<String>,
    clients: Vec<Result<redis::Client, redis::RedisError>>,
    namespace: &str,
) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for (i, (url, client)) in urls.iter().zip(clients).enumerate() {
        let node = cluster.node(i);
        let client = client.map_err(|e| backend_err(&e))?;
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            leftovers_of(&client, url, namespace),
        )
        .await;
        match read {
            Ok(Ok(found)) => out.extend(found),
            Ok(Err(e)) if (e.is_io_error() || e.is_connection_refusal()) && !node.is_running() => {}
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

impl RedisBackend {
    /// A single-node locker (fair unless this is the spin backend) with the scenario's options.
    async fn single(&self, opts: &ClientOptions) -> Result<RedisLocker, Error> {
        let url = self
            .urls(opts.via.as_deref())
            .into_iter()
            .next()
            .unwrap_or_default();
        let mut b = scenario(RedisLocker::builder().url(url), opts).fair(self.kind == Kind::Single);
        if let Some(ca) = self.ca_pem() {
            b = b.tls_root_certificates(ca);
        }
        b.build().await
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
            Kind::Single | Kind::Spin => Ok(Arc::new(self.single(&opts).await?)),
            // Redlock's per-node timeout derives from the TTL; it has no request timeout knob.
            Kind::Redlock => {
                let mut b = RedlockLocker::builder()
                    .nodes(urls)
                    .ttl(opts.ttl)
                    .namespace(&opts.namespace);
                if let Some(ca) = self.ca_pem() {
                    b = b.tls_root_certificates(ca);
                }
                Ok(Arc::new(b.build().await?))
            }
        }
    }

    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let urls = self.audit_urls();
        let clients = urls.iter().map(|url| self.admin(url)).collect();
        leftovers_on(self.cluster.get(), urls, clients, namespace).await
    }

    /// Breaks the holder: finds the owner value that most reachable nodes hold (the holder;
    /// a fair-mode reservation `r:…` is no grant), then deletes the lock key on every node
    /// where it still holds that owner value, and returns its token: the largest fence counter
    /// among those nodes (the grant set the counter to its token; Redlock writes the token back
    /// to its laggards).
    ///
    /// Only that owner's keys are deleted. An unconditional delete, node after node, also
    /// deleted the key of a lease granted while the break was under way (on the nodes it
    /// reached after the grant), and reported it under the counter that node held before the
    /// grant's write-back: a soak (r51, redlock, seed 329108) then judged the next grant an
    /// overlap with a lease the break had in fact broken ("Break token=420" twice, and token
    /// 421 granted 1.87 s before 421's promised deadline).
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error> {
        let key = lock_key(namespace, name);
        let mut conns = Vec::new();
        for (i, url) in self.audit_urls().iter().enumerate() {
            if node_down(self.cluster.get(), i) {
                continue;
            }
            conns.extend(audit_conn(self.admin(url)).await?);
        }
        // Who holds: the owner value on the most nodes.
        let mut owners: std::collections::BTreeMap<String, usize> =
            std::collections::BTreeMap::new();
        for conn in &mut conns {
            let owner: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(conn)
                .await
                .map_err(|e| backend_err(&e))?;
            if let Some(owner) = owner.filter(|o| !o.starts_with("r:")) {
                *owners.entry(owner).or_default() += 1;
            }
        }
        let Some((holder, _)) = owners.into_iter().max_by_key(|(_, nodes)| *nodes) else {
            return Ok(None);
        };
        let take = redis::Script::new(
            "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end \
             redis.call('DEL', KEYS[1]) \
             return redis.call('GET', KEYS[2]) or '0'",
        );
        let mut token: Option<u64> = None;
        dlock_conformance::history::deleting_now();
        for conn in &mut conns {
            let fence: Option<String> = take
                .key(&key)
                .key(format!("{key}:fence"))
                .arg(&holder)
                .invoke_async(conn)
                .await
                .map_err(|e| backend_err(&e))?;
            if let Some(fence) = fence {
                // The holder's token is the LEAST counter among the nodes that held its key: a
                // Redlock grant writes its token back to its whole majority before the lease is
                // handed out, and a later grant raises the nodes it found still holding the
                // old key to ITS token in the background (an old holder broken here meanwhile
                // shows the newer counter there).
                let fence = fence.parse().unwrap_or(0);
                token = Some(token.map_or(fence, |t| t.min(fence)));
            }
        }
        Ok(token.map(|t| vec![FencingToken(t)]))
    }

    /// `PTTL` of the lock key. For Redlock: the moment a majority of the reachable nodes no
    /// longer hold the key (the earliest anyone else could be granted).
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let key = lock_key(namespace, name);
        let urls = self.audit_urls();
        let mut remaining = Vec::with_capacity(urls.len());
        for (i, url) in urls.iter().enumerate() {
            if node_down(self.cluster.get(), i) {
                continue;
            }
            let client = self.admin(url).map_err(|e| backend_err(&e))?;
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(2), pttl(&client, &key)).await;
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

    /// `PUBLISH` calls (also from scripts) over the audited nodes, from `INFO commandstats`
    /// (over TLS on a TLS cluster).
    fn wake_signals(&self) -> Result<u64, String> {
        publish_calls(self.cluster.get(), self.node_addrs().len())
    }

    /// The endpoints, and for a TLS cluster the CA (the child's factory asks for the same
    /// [`ServerOptions`], so the external provider gives it the same servers).
    fn child_env(&self) -> Vec<(String, String)> {
        self.cluster.get().external_env()
    }

    /// Requests over the audited nodes (over TLS on a TLS cluster).
    fn server_requests(&self) -> Option<u64> {
        let cluster = self.cluster.get();
        (0..self.node_addrs().len())
            .map(|i| cluster.node(i).requests())
            .sum()
    }

    fn logs(&self) -> String {
        self.cluster.get().logs()
    }

    fn topology(&self) -> Option<(ServerKind, usize)> {
        Some((ServerKind::Redis, self.cluster.get().len()))
    }

    /// The same backend over `cluster`, first made to serve as this backend's servers do
    /// (TLS, ACL user).
    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        reconfigure(&cluster, &self.options);
        let mut b = RedisBackend::new(&self.name, self.kind, ClusterRef::Shared(cluster))
            .with_options(self.options.clone());
        b.user = self.user.clone();
        Some(Arc::new(b))
    }
}

/// An audit's connection through `client`; `None` when the node refuses connections (it is
/// down: the audits skip it).
pub async fn audit_conn(
    client: Result<redis::Client, redis::RedisError>,
) -> Result<Option<redis::aio::MultiplexedConnection>, Error> {
    let client = client.map_err(|e| backend_err(&e))?;
    match client.get_multiplexed_async_connection().await {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.is_connection_refusal() => Ok(None),
        Err(e) => Err(backend_err(&e)),
    }
}

/// `b` with a scenario's TTL, namespace and, when it sets one, request timeout: what every
/// backend's lockers take from [`ClientOptions`].
pub fn scenario(b: RedisLockerBuilder, opts: &ClientOptions) -> RedisLockerBuilder {
    let b = b.ttl(opts.ttl).namespace(&opts.namespace);
    match opts.request_timeout {
        Some(t) => b.request_timeout(t),
        None => b,
    }
}

/// Whether the audits skip node `i` of `cluster`: it is down (killed by the scenario), and
/// the cluster is not an external one (whose nodes the harness does not track).
pub fn node_down(cluster: &Cluster, i: usize) -> bool {
    !cluster.node(i).is_running() && !cluster.is_external()
}

/// Runs `f`, blocking work of the harness (starting servers), from wherever a backend is
/// called: through `block_in_place` on a multi-thread runtime's worker, directly elsewhere.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// `PUBLISH` calls (also from scripts) on the first `nodes` nodes of `cluster`, from their
/// `INFO commandstats`.
pub fn publish_calls(cluster: &Cluster, nodes: usize) -> Result<u64, String> {
    let mut total = 0;
    for i in 0..nodes {
        let node = cluster.node(i);
        let info = node
            .read_text(b"INFO commandstats\r\nQUIT\r\n")
            .ok_or_else(|| format!("redis at {} did not answer INFO", node.addr()))?;
        total += commandstat_calls(&info, "publish").unwrap_or(0);
    }
    Ok(total)
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

/// Makes `cluster` serve as `options` say; panics with the harness' error when it cannot.
pub fn reconfigure(cluster: &Cluster, options: &ServerOptions) {
    cluster
        .reconfigure(options)
        .unwrap_or_else(|e| panic!("cannot reconfigure the private cluster: {e}"));
}
