//! The contenders: dlock, the raw floor and each peer library behind one small interface, so
//! every workload runs the same code against all of them.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{AcquireOptions, Election, Lease, LockName, Locker, RwLocker, Stats};
use dlock_etcd::EtcdLocker;
use dlock_redis::{RedisLocker, RedlockLocker};
use dlock_zk::ZkLocker;
use etcd_client::{Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};
use zookeeper_client as zk;

/// What an acquire hands back to its release.
pub type Held = Box<dyn Any + Send>;

/// One client: its own connection, session or lease, as a user process would have.
#[async_trait]
pub trait Client: Send + Sync {
    /// Takes the lock `name`, waiting as long as it takes.
    async fn acquire(&self, name: &str) -> Result<Held, String>;
    /// Releases what `acquire` returned.
    async fn release(&self, held: Held) -> Result<(), String>;
    /// dlock's own counters (`None` for the floor and the peers).
    fn stats(&self) -> Option<Stats> {
        None
    }
    /// The TTL the server granted this client's leases or session, where the contender says.
    fn ttl(&self) -> Option<Duration> {
        None
    }
}

/// A contender: makes clients.
#[async_trait]
pub trait Impl: Send + Sync {
    /// `dlock`, `floor` or the peer crate's name.
    fn name(&self) -> &'static str;
    /// Whether it queues waiters (the floor does not: it only runs uncontended workloads).
    fn contends(&self) -> bool {
        true
    }
    /// A new client whose leases live `ttl`.
    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String>;
    /// The same contender with its clients connecting to these addresses (one per server node,
    /// in node order: proxies in front of them) instead; `None` where not supported.
    fn through(&self, _addrs: &[SocketAddr]) -> Option<Arc<dyn Impl>> {
        None
    }
}

/// A contender under another name (dlock's mutex beside its read lock in one workload).
pub struct Named {
    pub name: &'static str,
    pub inner: Arc<dyn Impl>,
}

#[async_trait]
impl Impl for Named {
    fn name(&self) -> &'static str {
        self.name
    }

    fn contends(&self) -> bool {
        self.inner.contends()
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        self.inner.client(ttl).await
    }
}

fn err(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |e| format!("{what}: {e}")
}

// ---------------------------------------------------------------------------------------------
// dlock

/// Which dlock backend and where.
#[derive(Clone)]
pub enum DlockKind {
    /// `RedisLocker` (fair mode) on one node.
    Redis(String),
    /// `RedlockLocker` over these nodes.
    Redlock(Vec<String>),
    /// `RedisLocker` (fair mode) on a Redis Cluster, seeded with these nodes.
    RedisCluster(Vec<String>),
    /// `EtcdLocker`.
    Etcd(Vec<String>),
    /// `ZkLocker`.
    Zk(String),
}

/// dlock on one backend; every client is its own locker under `namespace`.
#[derive(Clone)]
pub struct Dlock {
    pub kind: DlockKind,
    pub namespace: String,
}

/// A dlock locker of any backend as a `Client`.
pub struct DlockClient<L: Locker>(pub L);

#[async_trait]
impl<L: Locker> Client for DlockClient<L> {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let name = LockName::new(name).map_err(|e| err("lock name")(&e))?;
        let lease = self
            .0
            .acquire(&name, AcquireOptions::forever())
            .await
            .map_err(|e| err("dlock acquire")(&e))?;
        Ok(Box::new(lease))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let lease = held
            .downcast::<Lease>()
            .map_err(|_| "dlock release: not a lease".to_string())?;
        lease.release().await.map_err(|e| err("dlock release")(&e))
    }

    fn stats(&self) -> Option<Stats> {
        Some(self.0.stats())
    }
}

/// One built dlock locker of any backend.
enum Built {
    Redis(RedisLocker),
    Redlock(RedlockLocker),
    Etcd(EtcdLocker),
    Zk(ZkLocker),
}

impl Dlock {
    /// A locker of this backend (one connection / session).
    async fn build(&self, ttl: Duration) -> Result<Built, String> {
        let ns = self.namespace.as_str();
        Ok(match &self.kind {
            DlockKind::Redis(url) => Built::Redis(
                RedisLocker::builder()
                    .url(url)
                    .ttl(ttl)
                    .namespace(ns)
                    .build()
                    .await
                    .map_err(|e| err("RedisLocker")(&e))?,
            ),
            DlockKind::RedisCluster(urls) => Built::Redis(
                RedisLocker::builder()
                    .cluster(urls.clone())
                    .ttl(ttl)
                    .namespace(ns)
                    .build()
                    .await
                    .map_err(|e| err("RedisLocker (cluster)")(&e))?,
            ),
            DlockKind::Redlock(urls) => Built::Redlock(
                RedlockLocker::builder()
                    .nodes(urls.clone())
                    .ttl(ttl)
                    .namespace(ns)
                    .build()
                    .await
                    .map_err(|e| err("RedlockLocker")(&e))?,
            ),
            DlockKind::Etcd(endpoints) => Built::Etcd(
                EtcdLocker::builder()
                    .endpoints(endpoints.clone())
                    .ttl(ttl)
                    .namespace(ns)
                    .build()
                    .await
                    .map_err(|e| err("EtcdLocker")(&e))?,
            ),
            DlockKind::Zk(connect) => Built::Zk(
                ZkLocker::builder()
                    .connect_string(connect)
                    .ttl(ttl)
                    .namespace(ns)
                    .build()
                    .await
                    .map_err(|e| err("ZkLocker")(&e))?,
            ),
        })
    }

    /// A locker (one connection / session) as a `Locker`.
    pub async fn locker(&self, ttl: Duration) -> Result<Arc<dyn Locker>, String> {
        Ok(match self.build(ttl).await? {
            Built::Redis(l) => Arc::new(l),
            Built::Redlock(l) => Arc::new(l),
            Built::Etcd(l) => Arc::new(l),
            Built::Zk(l) => Arc::new(l),
        })
    }

    /// A locker as an `Election`, and as a `Locker` for its counters (Redlock has no
    /// election).
    pub async fn elector(
        &self,
        ttl: Duration,
    ) -> Result<(Arc<dyn Election>, Arc<dyn Locker>), String> {
        fn both<L: Election + Locker>(l: L) -> (Arc<dyn Election>, Arc<dyn Locker>) {
            let l = Arc::new(l);
            (Arc::clone(&l) as Arc<dyn Election>, l as Arc<dyn Locker>)
        }
        match self.build(ttl).await? {
            Built::Redis(l) => Ok(both(l)),
            Built::Etcd(l) => Ok(both(l)),
            Built::Zk(l) => Ok(both(l)),
            Built::Redlock(_) => Err("Redlock has no election".into()),
        }
    }

    /// A locker as an `RwLocker`, and as a `Locker` for its counters (Redlock has no
    /// read-write lock).
    pub async fn rw(&self, ttl: Duration) -> Result<(Arc<dyn RwLocker>, Arc<dyn Locker>), String> {
        fn both<L: RwLocker + Locker>(l: L) -> (Arc<dyn RwLocker>, Arc<dyn Locker>) {
            let l = Arc::new(l);
            (Arc::clone(&l) as Arc<dyn RwLocker>, l as Arc<dyn Locker>)
        }
        match self.build(ttl).await? {
            Built::Redis(l) => Ok(both(l)),
            Built::Etcd(l) => Ok(both(l)),
            Built::Zk(l) => Ok(both(l)),
            Built::Redlock(_) => Err("Redlock has no read-write lock".into()),
        }
    }

    /// The same lockers connecting to `addrs` (one per node, in node order) instead.
    pub fn through(&self, addrs: &[SocketAddr]) -> Dlock {
        let kind = match &self.kind {
            DlockKind::Redis(_) => DlockKind::Redis(
                addrs
                    .first()
                    .map_or(String::new(), |a| format!("redis://{a}")),
            ),
            DlockKind::Redlock(_) => {
                DlockKind::Redlock(addrs.iter().map(|a| format!("redis://{a}")).collect())
            }
            // The cluster names its nodes itself: seeds through `addrs` alone would not keep
            // the other connections there.
            DlockKind::RedisCluster(_) => {
                DlockKind::RedisCluster(addrs.iter().map(|a| format!("redis://{a}")).collect())
            }
            DlockKind::Etcd(_) => {
                DlockKind::Etcd(addrs.iter().map(|a| format!("http://{a}")).collect())
            }
            DlockKind::Zk(_) => DlockKind::Zk(
                addrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        };
        Dlock {
            kind,
            namespace: self.namespace.clone(),
        }
    }
}

#[async_trait]
impl Impl for Dlock {
    fn name(&self) -> &'static str {
        "dlock"
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let locker = self.locker(ttl).await?;
        let client = DlockClient(locker);
        // Open connections / sessions outside any measurement.
        let warm = client.acquire("warm-up").await?;
        client.release(warm).await?;
        Ok(Arc::new(client))
    }
}

// ---------------------------------------------------------------------------------------------
// Redis: floor and rslock

const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The Redis floor: `SET key value NX PX ttl` then the compare-and-delete script by EVALSHA,
/// on every node in parallel (one node, or the five of Redlock).
pub struct RedisFloor {
    pub urls: Vec<String>,
    pub prefix: String,
}

struct RedisFloorClient {
    conns: Vec<redis::aio::MultiplexedConnection>,
    script: redis::Script,
    prefix: String,
    ttl_ms: u64,
}

/// A multiplexed connection to `url` (response timeout 10 s: 1,000 requests in flight on one
/// connection must not time out on a busy machine).
pub async fn redis_conn(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    let mut c = redis::Client::open(url)
        .map_err(|e| err("redis url")(&e))?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| err("redis connect")(&e))?;
    c.set_response_timeout(Duration::from_secs(10));
    Ok(c)
}

#[async_trait]
impl Impl for RedisFloor {
    fn name(&self) -> &'static str {
        "floor"
    }

    fn contends(&self) -> bool {
        false
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let mut conns = Vec::new();
        for u in &self.urls {
            conns.push(redis_conn(u).await?);
        }
        let c = RedisFloorClient {
            conns,
            script: redis::Script::new(RELEASE),
            prefix: self.prefix.clone(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        };
        // Loads the script (EVALSHA falls back to EVAL once).
        let h = c.acquire("warm-up").await?;
        c.release(h).await?;
        Ok(Arc::new(c))
    }
}

#[async_trait]
impl Client for RedisFloorClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let key = format!("{}{name}", self.prefix);
        let value = "owner-value-0123456789abcdef0123";
        let ttl = self.ttl_ms;
        let replies = futures::future::join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            let key = key.clone();
            async move {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl)
                    .query_async::<Option<String>>(&mut c)
                    .await
            }
        }))
        .await;
        // A refused SET NX (nil reply) is an error: a floor that silently fails is not a floor.
        for r in replies {
            if r.map_err(|e| err("floor SET")(&e))?.is_none() {
                return Err(format!("floor SET NX refused: {key} is held"));
            }
        }
        Ok(Box::new(key))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let key = held
            .downcast::<String>()
            .map_err(|_| "floor release: not a key".to_string())?;
        let replies = futures::future::join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            let key = key.clone();
            let script = &self.script;
            async move {
                script
                    .key(key.as_str())
                    .arg("owner-value-0123456789abcdef0123")
                    .invoke_async::<i64>(&mut c)
                    .await
            }
        }))
        .await;
        for r in replies {
            if r.map_err(|e| err("floor EVALSHA")(&e))? != 1 {
                return Err(format!("floor release deleted nothing: {key} was not held"));
            }
        }
        Ok(())
    }
}

/// rslock's retry settings for the contended workloads: `set_retry(count, delay)` sleeps a
/// uniformly random 0..delay between failed attempts (default 3 attempts, 200 ms); `acquire`
/// starts a new round of `count` attempts at once when one is exhausted. 10 ms (the delay
/// rslock's own contention tests use) instead of 200 ms: a waiter polls every 5 ms on average,
/// so a handoff no longer waits a ~100 ms sleep, for a few thousand cheap commands a second.
pub const RSLOCK_RETRY: (u32, Duration) = (3, Duration::from_millis(10));

/// The peers' settings, for the report's header.
pub fn peer_settings(ttl: Duration) -> String {
    format!(
        "rslock `set_retry({}, {:?})` (default 3, 200 ms); etcd-client `lock` with a {:?} lease \
         kept alive every TTL/3; zookeeper-client `Client::lock` (Curator prefix) with a {:?} \
         session; elections: etcd-client `campaign` / `resign`, each client on its own lease \
         kept alive the same way, and zookeeper-client `Client::lock` with Curator's \
         `LeaderLatch` node name (`latch-`); no Rust peer offers a read-write lock on Redis, \
         etcd or ZooKeeper, nor an election on Redis",
        RSLOCK_RETRY.0, RSLOCK_RETRY.1, ttl, ttl,
    )
}

/// rslock 0.10 (`LockManager`) on one node or on five (Redlock), with [`RSLOCK_RETRY`].
pub struct Rslock {
    pub urls: Vec<String>,
    pub prefix: String,
}

struct RslockClient {
    mgr: rslock::LockManager,
    prefix: String,
    ttl: Duration,
}

#[async_trait]
impl Impl for Rslock {
    fn name(&self) -> &'static str {
        "rslock"
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let mut mgr = rslock::LockManager::new(self.urls.clone());
        mgr.set_retry(RSLOCK_RETRY.0, RSLOCK_RETRY.1);
        let c = RslockClient {
            mgr,
            prefix: self.prefix.clone(),
            ttl,
        };
        let h = c.acquire("warm-up").await?;
        c.release(h).await?;
        Ok(Arc::new(c))
    }
}

#[async_trait]
impl Client for RslockClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let resource = format!("{}{name}", self.prefix);
        // Loops (with rslock's own retry sleeps) until granted.
        let lock = self
            .mgr
            .acquire_no_guard(resource.as_bytes(), self.ttl)
            .await
            .map_err(|e| format!("rslock: {e:?}"))?;
        Ok(Box::new(lock))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let lock = held
            .downcast::<rslock::Lock>()
            .map_err(|_| "rslock release: not a lock".to_string())?;
        self.mgr.unlock(&lock).await;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// etcd: floor and etcd-client's lock API

/// A lease kept alive by a background task every TTL/3 (as etcd's own Go client does for a
/// `concurrency.Session`), until dropped.
pub(crate) struct KeptLease {
    pub(crate) id: i64,
    /// The TTL etcd granted.
    pub(crate) ttl: Duration,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// A client with its own lease of `ttl` (the same TTL as dlock's leases), granted once before
/// any measurement and kept alive.
pub(crate) async fn etcd_client(
    endpoints: &[String],
    ttl: Duration,
) -> Result<(etcd_client::Client, KeptLease), String> {
    let mut c = etcd_client::Client::connect(endpoints, None)
        .await
        .map_err(|e| err("etcd connect")(&e))?;
    let secs = i64::try_from(ttl.as_secs()).unwrap_or(60).max(2);
    let granted = c
        .lease_grant(secs, None)
        .await
        .map_err(|e| err("etcd lease grant")(&e))?;
    let id = granted.id();
    let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
    let (mut keeper, mut replies) = c
        .lease_keep_alive(id)
        .await
        .map_err(|e| err("etcd lease keep-alive")(&e))?;
    let period = Duration::from_secs(u64::try_from(secs).unwrap_or(2)) / 3;
    let keeper = tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            let sent = keeper.keep_alive().await;
            match (sent, replies.message().await) {
                (Ok(()), Ok(Some(r))) if r.ttl() > 0 => {}
                (sent, reply) => {
                    // The peer's locks go with its lease: say so, the figures are suspect.
                    eprintln!("  etcd lease {id} keep-alive failed: {sent:?} / {reply:?}");
                    return;
                }
            }
        }
    });
    Ok((c, KeptLease { id, ttl, keeper }))
}

/// The etcd floor: the create-if-absent txn (put with the lease) and a delete.
pub struct EtcdFloor {
    pub endpoints: Vec<String>,
    pub prefix: String,
}

struct EtcdFloorClient {
    client: etcd_client::Client,
    lease: KeptLease,
    prefix: String,
}

#[async_trait]
impl Impl for EtcdFloor {
    fn name(&self) -> &'static str {
        "floor"
    }

    fn contends(&self) -> bool {
        false
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let (client, lease) = etcd_client(&self.endpoints, ttl).await?;
        Ok(Arc::new(EtcdFloorClient {
            client,
            lease,
            prefix: self.prefix.clone(),
        }))
    }
}

#[async_trait]
impl Client for EtcdFloorClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let key = format!("{}{name}", self.prefix);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(self.lease.id)),
            )]);
        let granted = self
            .client
            .clone()
            .txn(txn)
            .await
            .map_err(|e| err("floor txn")(&e))?
            .succeeded();
        if !granted {
            return Err(format!("floor txn compare failed: {key} is held"));
        }
        Ok(Box::new(key))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let key = held
            .downcast::<String>()
            .map_err(|_| "floor release: not a key".to_string())?;
        let deleted = self
            .client
            .clone()
            .delete(key.as_str(), None)
            .await
            .map_err(|e| err("floor delete")(&e))?
            .deleted();
        if deleted != 1 {
            return Err(format!("floor release deleted nothing: {key} was not held"));
        }
        Ok(())
    }
}

/// etcd-client's server-side `lock` / `unlock`, one pre-granted lease per client, kept alive.
pub struct EtcdPeer {
    pub endpoints: Vec<String>,
    pub prefix: String,
}

#[async_trait]
impl Impl for EtcdPeer {
    fn name(&self) -> &'static str {
        "etcd-client"
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let (client, lease) = etcd_client(&self.endpoints, ttl).await?;
        Ok(Arc::new(EtcdPeerClient {
            client,
            lease,
            prefix: self.prefix.clone(),
        }))
    }
}

struct EtcdPeerClient {
    client: etcd_client::Client,
    lease: KeptLease,
    prefix: String,
}

#[async_trait]
impl Client for EtcdPeerClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let name = format!("{}{name}", self.prefix);
        let key = self
            .client
            .clone()
            .lock(
                name.as_str(),
                Some(LockOptions::new().with_lease(self.lease.id)),
            )
            .await
            .map_err(|e| err("etcd-client lock")(&e))?
            .key()
            .to_vec();
        Ok(Box::new(key))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let key = held
            .downcast::<Vec<u8>>()
            .map_err(|_| "etcd-client unlock: not a key".to_string())?;
        self.client
            .clone()
            .unlock(*key)
            .await
            .map_err(|e| err("etcd-client unlock")(&e))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// ZooKeeper: floor and zookeeper-client's lock recipe

pub(crate) async fn zk_client(connect: &str, ttl: Duration) -> Result<zk::Client, String> {
    zk::Client::connector()
        .with_session_timeout(ttl)
        .connect(connect)
        .await
        .map_err(|e| err("zk connect")(&e))
}

fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

/// The ZooKeeper floor: create EPHEMERAL_SEQUENTIAL, getChildren of the parent, delete.
pub struct ZkFloor {
    pub connect: String,
    pub base: String,
}

struct ZkFloorClient {
    client: zk::Client,
    base: String,
}

#[async_trait]
impl Impl for ZkFloor {
    fn name(&self) -> &'static str {
        "floor"
    }

    fn contends(&self) -> bool {
        false
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let client = zk_client(&self.connect, ttl).await?;
        Ok(Arc::new(ZkFloorClient {
            client,
            base: self.base.clone(),
        }))
    }
}

#[async_trait]
impl Client for ZkFloorClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let dir = format!("{}/{name}", self.base);
        let prefix = format!("{dir}/n-");
        let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let seq = match self.client.create(&prefix, b"", &opts).await {
            Ok((_, seq)) => seq,
            Err(zk::Error::NoNode) => {
                // First use of this name: make the parent (as the recipe does), then retry.
                match self.client.mkdir(&dir, &persistent()).await {
                    Ok(()) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(err("floor mkdir")(&e)),
                }
                self.client
                    .create(&prefix, b"", &opts)
                    .await
                    .map_err(|e| err("floor create")(&e))?
                    .1
            }
            Err(e) => return Err(err("floor create")(&e)),
        };
        self.client
            .list_children(&dir)
            .await
            .map_err(|e| err("floor getChildren")(&e))?;
        Ok(Box::new(format!("{prefix}{seq}")))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let path = held
            .downcast::<String>()
            .map_err(|_| "floor release: not a path".to_string())?;
        self.client
            .delete(&path, None)
            .await
            .map_err(|e| err("floor delete")(&e))
    }
}

/// zookeeper-client's `Client::lock` with `LockPrefix::new_curator`; release is an explicit
/// delete (dropping the `LockClient` would delete in the background, unmeasured).
#[derive(Clone)]
pub struct ZkPeer {
    pub connect: String,
    pub base: String,
    /// The Curator node name: `lock-` (`InterProcessMutex`) or `latch-` (`LeaderLatch`,
    /// zookeeper-client's election).
    pub node: &'static str,
}

struct ZkPeerClient {
    client: zk::Client,
    base: String,
    node: &'static str,
}

#[async_trait]
impl Impl for ZkPeer {
    fn name(&self) -> &'static str {
        "zookeeper-client"
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let client = zk_client(&self.connect, ttl).await?;
        Ok(Arc::new(ZkPeerClient {
            client,
            base: self.base.clone(),
            node: self.node,
        }))
    }

    fn through(&self, addrs: &[SocketAddr]) -> Option<Arc<dyn Impl>> {
        let connect = addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        Some(Arc::new(ZkPeer {
            connect,
            ..self.clone()
        }))
    }
}

#[async_trait]
impl Client for ZkPeerClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let dir = format!("{}/{name}", self.base);
        let prefix =
            zk::LockPrefix::new_curator(&dir, self.node).map_err(|e| err("lock prefix")(&e))?;
        let options = zk::LockOptions::new(zk::Acls::anyone_all())
            .with_ancestor_options(persistent())
            .map_err(|e| err("lock options")(&e))?;
        let lock = self
            .client
            .lock(prefix, b"", options)
            .await
            .map_err(|e| err("zookeeper-client lock")(&e))?;
        let path = lock.lock_path().to_string();
        std::mem::forget(lock);
        Ok(Box::new(path))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let path = held
            .downcast::<String>()
            .map_err(|_| "zookeeper-client release: not a path".to_string())?;
        self.client
            .delete(&path, None)
            .await
            .map_err(|e| err("zookeeper-client delete")(&e))
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.client.session_timeout())
    }
}
