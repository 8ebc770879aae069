//! The contenders: dlock, the raw floor and each peer library behind one small interface, so
//! every workload runs the same code against all of them. A contender is one row of a table
//! ([`Impl`]: which server, which kind, where, under which prefix); the clients of each server
//! family are in `impls/redis.rs`, `impls/etcd.rs` and `impls/zk.rs`.

mod etcd;
mod redis;
mod zk;

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{AcquireOptions, Election, Leadership, Lease, LockName, Locker, RwLocker, Stats};
use dlock_etcd::EtcdLocker;
use dlock_redis::{RedisLocker, RedlockLocker};
use dlock_zk::ZkLocker;

#[cfg(test)]
pub use etcd::etcd_client;
pub use redis::{RSLOCK_RETRY, redis_conn};

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

/// `result` with its error as text, prefixed with `what`.
pub trait Context<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// A read's member or key suffix no other read of this process uses.
fn unique() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The servers a contender talks to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Server {
    /// One Redis node (dlock: `RedisLocker`, fair mode).
    Redis,
    /// Independent Redis nodes (dlock: `RedlockLocker`; the floor and rslock on every node).
    Redlock,
    /// A Redis Cluster, seeded with its nodes (dlock: `RedisLocker::builder().cluster(…)`).
    RedisCluster,
    /// etcd (dlock: `EtcdLocker`).
    Etcd,
    /// ZooKeeper (dlock: `ZkLocker`).
    Zk,
}

/// What a contender does on its server.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// dlock's mutex: `Locker::acquire`, `Lease::release`.
    Lock,
    /// dlock's read lease: `RwLocker::read` (Redis single-node, etcd, ZooKeeper).
    Read,
    /// dlock's election: a campaign is an acquire, a resignation a release.
    Elect,
    /// The raw server round trips one acquire + release needs at the least.
    Floor,
    /// The same for one shared (read) acquire + release.
    ReadFloor,
    /// The peer library's lock: rslock, etcd-client `lock`, zookeeper-client `Client::lock`.
    Peer,
    /// The peer's election: etcd-client `campaign` / `resign`, zookeeper-client's lock with
    /// Curator's `LeaderLatch` node name.
    PeerElection,
}

/// A contender: makes clients.
#[derive(Clone, Debug)]
pub struct Impl {
    /// `dlock`, `floor`, the peer crate's name, or `dlock-mutex` (dlock's mutex beside its read
    /// lock in one workload).
    pub name: &'static str,
    pub server: Server,
    pub kind: Kind,
    /// The nodes: Redis URLs, etcd endpoints, ZooKeeper `host:port`s.
    pub at: Vec<String>,
    /// dlock's namespace, a key prefix (Redis, etcd) or a base path (ZooKeeper).
    pub prefix: String,
}

impl Impl {
    /// The contender `kind` on `server`, named by what it is.
    pub fn new(server: Server, kind: Kind, at: Vec<String>, prefix: String) -> Impl {
        let name = match kind {
            Kind::Lock | Kind::Read | Kind::Elect => "dlock",
            Kind::Floor | Kind::ReadFloor => "floor",
            Kind::Peer | Kind::PeerElection => crate::report::peer_of(match server {
                Server::Etcd => "etcd",
                Server::Zk => "zk",
                _ => "redis",
            }),
        };
        Impl {
            name,
            server,
            kind,
            at,
            prefix,
        }
    }

    /// Whether it queues waiters (the floor does not: it only runs uncontended workloads).
    pub fn contends(&self) -> bool {
        self.name != "floor"
    }

    /// The same contender with its clients connecting to these addresses (one per server node,
    /// in node order: proxies in front of them) instead. A cluster names its nodes itself:
    /// seeds through `addrs` alone would not keep the other connections there.
    pub fn through(&self, addrs: &[SocketAddr]) -> Impl {
        let scheme = match self.server {
            Server::Etcd => "http://",
            Server::Zk => "",
            _ => "redis://",
        };
        Impl {
            at: addrs.iter().map(|a| format!("{scheme}{a}")).collect(),
            ..self.clone()
        }
    }

    /// A dlock locker of this server (one connection / session) under the namespace.
    pub async fn locker(&self, ttl: Duration) -> Result<Arc<dyn Locker>, String> {
        let what = format!("dlock on {:?}", self.server);
        // Every backend's builder takes the TTL and the namespace the same way.
        macro_rules! build {
            ($builder:expr) => {
                Arc::new(
                    $builder
                        .ttl(ttl)
                        .namespace(&self.prefix)
                        .build()
                        .await
                        .ctx(&what)?,
                )
            };
        }
        let (nodes, first) = (self.at.clone(), self.at.first().map_or("", String::as_str));
        Ok(match self.server {
            Server::Redis => build!(RedisLocker::builder().url(first)),
            Server::RedisCluster => build!(RedisLocker::builder().cluster(nodes)),
            Server::Redlock => build!(RedlockLocker::builder().nodes(nodes)),
            Server::Etcd => build!(EtcdLocker::builder().endpoints(nodes)),
            Server::Zk => build!(ZkLocker::builder().connect_string(nodes.join(","))),
        })
    }

    /// A new client whose leases live `ttl`. dlock's clients (opening their connections and
    /// sessions), the Redis floor (loading its script: EVALSHA falls back to EVAL once) and
    /// rslock take and release a `warm-up` lock first, outside any measurement.
    pub async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let (at, prefix) = (&self.at, self.prefix.clone());
        let client: Arc<dyn Client> = match (self.server, self.kind) {
            (_, Kind::Lock) => Arc::new(DlockClient::Lock(self.locker(ttl).await?)),
            (server, Kind::Read) => Arc::new(DlockClient::Read(
                self.locker(ttl)
                    .await?
                    .into_rw_locker()
                    .ok_or(format!("{server:?} has no read-write lock"))?,
            )),
            (server, Kind::Elect) => Arc::new(DlockClient::Elect(
                self.locker(ttl)
                    .await?
                    .into_election()
                    .ok_or(format!("{server:?} has no election"))?,
            )),
            (Server::Etcd, kind) => Arc::new(etcd::EtcdClient::new(kind, at, prefix, ttl).await?),
            (Server::Zk, kind) => Arc::new(zk::ZkClient::new(kind, at, prefix, ttl).await?),
            (_, Kind::Peer) => Arc::new(redis::RslockClient::new(at, prefix, ttl)),
            (_, kind) => Arc::new(redis::RedisFloorClient::new(kind, at, prefix, ttl).await?),
        };
        let redis = !matches!(self.server, Server::Etcd | Server::Zk);
        let warm_up = match self.kind {
            Kind::Lock | Kind::Read | Kind::Elect => true,
            Kind::Floor | Kind::Peer => redis,
            Kind::ReadFloor | Kind::PeerElection => false,
        };
        if warm_up {
            let warm = client.acquire("warm-up").await?;
            client.release(warm).await?;
        }
        Ok(client)
    }
}

/// A dlock locker of any backend as a `Client`, through the primitive measured.
enum DlockClient {
    Lock(Arc<dyn Locker>),
    Read(Arc<dyn RwLocker>),
    Elect(Arc<dyn Election>),
}

#[async_trait]
impl Client for DlockClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let name = LockName::new(name).ctx("lock name")?;
        let forever = AcquireOptions::forever();
        Ok(match self {
            DlockClient::Lock(l) => Box::new(l.acquire(&name, forever).await.ctx("dlock acquire")?),
            DlockClient::Read(l) => Box::new(l.read(&name, forever).await.ctx("dlock read")?),
            DlockClient::Elect(l) => Box::new(
                l.campaign(&name, b"bench", forever)
                    .await
                    .ctx("dlock campaign")?,
            ),
        })
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        match held.downcast::<Lease>() {
            Ok(lease) => lease.release().await.ctx("dlock release"),
            Err(held) => held
                .downcast::<Leadership>()
                .map_err(|_| "dlock release: neither a lease nor a leadership".to_string())?
                .resign()
                .await
                .ctx("dlock resign"),
        }
    }

    fn stats(&self) -> Option<Stats> {
        Some(self.locker().stats())
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.locker().ttl())
    }
}

impl DlockClient {
    fn locker(&self) -> &dyn Locker {
        match self {
            DlockClient::Lock(l) => l.as_ref(),
            DlockClient::Read(l) => l.as_ref(),
            DlockClient::Elect(l) => l.as_ref(),
        }
    }
}

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
