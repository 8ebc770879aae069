//! Read-write locks as contenders: dlock's `RwLocker::read` on each backend that has one
//! (Redis single-node, etcd, ZooKeeper; not Redlock), and each backend's read floor: the raw
//! server round trips one shared acquire + release must make, checked as the lock floors are.
//! No Rust peer offers a read-write lock on Redis or etcd; on ZooKeeper zookeeper-client has
//! none either (Curator's `InterProcessReadWriteLock` is Java), so the comparisons are with
//! dlock's own mutex and with the floor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use dlock_core::{AcquireOptions, Lease, LockName, Locker, RwLocker, Stats};
use etcd_client::{GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use zookeeper_client as zk;

use crate::impls::{Client, Dlock, Held, Impl, KeptLease, etcd_client, redis_conn, zk_client};

fn err(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// A member / key suffix no other read of this process uses.
fn unique() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

// ---------------------------------------------------------------------------------------------
// dlock

/// dlock's read lease (`RwLocker::read`) on one backend.
pub struct DlockRead(pub Dlock);

/// The read-write locker, and the same locker as a `Locker` for its counters.
struct DlockReadClient(Arc<dyn RwLocker>, Arc<dyn Locker>);

#[async_trait]
impl Client for DlockReadClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let name = LockName::new(name).map_err(|e| err("lock name")(&e))?;
        let lease = self
            .0
            .read(&name, AcquireOptions::forever())
            .await
            .map_err(|e| err("dlock read")(&e))?;
        Ok(Box::new(lease))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let lease = held
            .downcast::<Lease>()
            .map_err(|_| "dlock read release: not a lease".to_string())?;
        lease
            .release()
            .await
            .map_err(|e| err("dlock read release")(&e))
    }

    fn stats(&self) -> Option<Stats> {
        Some(self.1.stats())
    }
}

#[async_trait]
impl Impl for DlockRead {
    fn name(&self) -> &'static str {
        "dlock"
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let (rw, locker) = self.0.rw(ttl).await?;
        let client = DlockReadClient(rw, locker);
        // Open connections / sessions outside any measurement.
        let warm = client.acquire("warm-up").await?;
        client.release(warm).await?;
        Ok(Arc::new(client))
    }
}

// ---------------------------------------------------------------------------------------------
// Redis

/// The Redis read floor: `ZADD holders NX <expiry> <member>` (a shared holder set, one member
/// per read; reply 1 = added) and `ZREM holders <member>` (reply 1 = removed). Two plain
/// commands: no writer check, no queue, no fencing token, no expiry sweep.
pub struct RedisReadFloor {
    pub url: String,
    pub prefix: String,
}

struct RedisReadFloorClient {
    conn: redis::aio::MultiplexedConnection,
    prefix: String,
    ttl_ms: u64,
}

#[async_trait]
impl Impl for RedisReadFloor {
    fn name(&self) -> &'static str {
        "floor"
    }

    fn contends(&self) -> bool {
        false
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        Ok(Arc::new(RedisReadFloorClient {
            conn: redis_conn(&self.url).await?,
            prefix: self.prefix.clone(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        }))
    }
}

#[async_trait]
impl Client for RedisReadFloorClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let key = format!("{}{name}", self.prefix);
        let member = unique();
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let added: i64 = redis::cmd("ZADD")
            .arg(&key)
            .arg("NX")
            .arg(now_ms.saturating_add(self.ttl_ms))
            .arg(&member)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| err("read floor ZADD")(&e))?;
        if added != 1 {
            return Err(format!("read floor ZADD added nothing: {member} in {key}"));
        }
        Ok(Box::new((key, member)))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let (key, member) = *held
            .downcast::<(String, String)>()
            .map_err(|_| "read floor release: not a member".to_string())?;
        let removed: i64 = redis::cmd("ZREM")
            .arg(&key)
            .arg(&member)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| err("read floor ZREM")(&e))?;
        if removed != 1 {
            return Err(format!(
                "read floor release removed nothing: {member} was not in {key}"
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// etcd

/// The etcd read floor: one txn that puts the reader's own key (with the client's lease) under
/// `<name>/read/` and counts the keys under `<name>/write/` (more than 0 is an error: a writer
/// holds or waits), then a delete of the reader's key (deleting nothing is an error). No
/// revision guard, no queue order among the readers' keys, no watch.
pub struct EtcdReadFloor {
    pub endpoints: Vec<String>,
    pub prefix: String,
}

struct EtcdReadFloorClient {
    client: etcd_client::Client,
    lease: KeptLease,
    prefix: String,
}

#[async_trait]
impl Impl for EtcdReadFloor {
    fn name(&self) -> &'static str {
        "floor"
    }

    fn contends(&self) -> bool {
        false
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        let (client, lease) = etcd_client(&self.endpoints, ttl).await?;
        Ok(Arc::new(EtcdReadFloorClient {
            client,
            lease,
            prefix: self.prefix.clone(),
        }))
    }
}

#[async_trait]
impl Client for EtcdReadFloorClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let key = format!("{}{name}/read/{}", self.prefix, unique());
        let writers = format!("{}{name}/write/", self.prefix);
        let txn = Txn::new().and_then([
            TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(self.lease.id)),
            ),
            TxnOp::get(
                writers.as_str(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ]);
        let resp = self
            .client
            .clone()
            .txn(txn)
            .await
            .map_err(|e| err("read floor txn")(&e))?;
        let writing = resp.op_responses().iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.count()),
            _ => None,
        });
        match writing {
            Some(0) => Ok(Box::new(key)),
            Some(n) => Err(format!("read floor: {n} writer key(s) under {writers}")),
            None => Err("read floor txn: no count of the writers".to_string()),
        }
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let key = held
            .downcast::<String>()
            .map_err(|_| "read floor release: not a key".to_string())?;
        let deleted = self
            .client
            .clone()
            .delete(key.as_str(), None)
            .await
            .map_err(|e| err("read floor delete")(&e))?
            .deleted();
        if deleted != 1 {
            return Err(format!(
                "read floor release deleted nothing: {key} was not held"
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// ZooKeeper

/// The ZooKeeper read floor: create EPHEMERAL_SEQUENTIAL `<name>/read-`, getChildren of the
/// parent (a `write-` child is an error: a writer holds or waits), delete. The lock floor's
/// three requests; no watch, no `sync`.
pub struct ZkReadFloor {
    pub connect: String,
    pub base: String,
}

struct ZkReadFloorClient {
    client: zk::Client,
    base: String,
}

#[async_trait]
impl Impl for ZkReadFloor {
    fn name(&self) -> &'static str {
        "floor"
    }

    fn contends(&self) -> bool {
        false
    }

    async fn client(&self, ttl: Duration) -> Result<Arc<dyn Client>, String> {
        Ok(Arc::new(ZkReadFloorClient {
            client: zk_client(&self.connect, ttl).await?,
            base: self.base.clone(),
        }))
    }
}

#[async_trait]
impl Client for ZkReadFloorClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let dir = format!("{}/{name}", self.base);
        let prefix = format!("{dir}/read-");
        let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let seq = match self.client.create(&prefix, b"", &opts).await {
            Ok((_, seq)) => seq,
            Err(zk::Error::NoNode) => {
                // First use of this name: make the parent, then retry.
                let parent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                match self.client.mkdir(&dir, &parent).await {
                    Ok(()) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(err("read floor mkdir")(&e)),
                }
                self.client
                    .create(&prefix, b"", &opts)
                    .await
                    .map_err(|e| err("read floor create")(&e))?
                    .1
            }
            Err(e) => return Err(err("read floor create")(&e)),
        };
        let children = self
            .client
            .list_children(&dir)
            .await
            .map_err(|e| err("read floor getChildren")(&e))?;
        if let Some(w) = children.iter().find(|c| c.starts_with("write-")) {
            return Err(format!("read floor: writer {dir}/{w}"));
        }
        Ok(Box::new(format!("{prefix}{seq}")))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let path = held
            .downcast::<String>()
            .map_err(|_| "read floor release: not a path".to_string())?;
        self.client
            .delete(&path, None)
            .await
            .map_err(|e| err("read floor delete")(&e))
    }
}
