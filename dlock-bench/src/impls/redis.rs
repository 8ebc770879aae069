//! Redis contenders: the lock floor (one node, or every node of Redlock in parallel), the read
//! floor (single node) and rslock. No Rust crate offers an election or a read-write lock on
//! Redis, so those are compared with dlock's own mutex and the floor.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::{Client, Context, Held, Kind, unique};

/// rslock's retry settings for the contended workloads: `set_retry(count, delay)` sleeps a
/// uniformly random 0..delay between failed attempts (default 3 attempts, 200 ms); `acquire`
/// starts a new round of `count` attempts at once when one is exhausted. 10 ms (the delay
/// rslock's own contention tests use) instead of 200 ms: a waiter polls every 5 ms on average,
/// so a handoff no longer waits a ~100 ms sleep, for a few thousand cheap commands a second.
pub const RSLOCK_RETRY: (u32, Duration) = (3, Duration::from_millis(10));

const VALUE: &str = "owner-value-0123456789abcdef0123";
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// A multiplexed connection to `url` (response timeout 10 s: 1,000 requests in flight on one
/// connection must not time out on a busy machine).
pub async fn redis_conn(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    let mut c = redis::Client::open(url)
        .ctx("redis url")?
        .get_multiplexed_async_connection()
        .await
        .ctx("redis connect")?;
    c.set_response_timeout(Duration::from_secs(10));
    Ok(c)
}

/// The floors. Lock: `SET key value NX PX ttl` then the compare-and-delete script by EVALSHA,
/// on every node in parallel (one node, or the five of Redlock). Read: `ZADD holders NX
/// <expiry> <member>` (a shared holder set, one member per read; reply 1 = added) and `ZREM
/// holders <member>` (reply 1 = removed) on the first node: two plain commands, no writer
/// check, no queue, no fencing token, no expiry sweep.
pub struct RedisFloorClient {
    conns: Vec<redis::aio::MultiplexedConnection>,
    script: redis::Script,
    prefix: String,
    ttl_ms: u64,
    read: bool,
}

impl RedisFloorClient {
    pub async fn new(
        kind: Kind,
        urls: &[String],
        prefix: String,
        ttl: Duration,
    ) -> Result<Self, String> {
        let read = match kind {
            Kind::Floor => false,
            Kind::ReadFloor => true,
            other => return Err(format!("no {other:?} on Redis")),
        };
        let mut conns = Vec::new();
        for u in urls.iter().take(if read { 1 } else { urls.len() }) {
            conns.push(redis_conn(u).await?);
        }
        Ok(RedisFloorClient {
            conns,
            script: redis::Script::new(RELEASE),
            prefix,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            read,
        })
    }

    /// The read floor's one command on its node: the reply must be 1 (added, removed).
    async fn on_the_node(&self, cmd: &redis::Cmd, what: &str, at: &str) -> Result<(), String> {
        let mut c = self.conns.first().ok_or("no Redis node")?.clone();
        let n: i64 = cmd
            .query_async(&mut c)
            .await
            .ctx(&format!("read floor {what}"))?;
        if n != 1 {
            return Err(format!("read floor {what} changed nothing: {at}"));
        }
        Ok(())
    }
}

#[async_trait]
impl Client for RedisFloorClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let key = format!("{}{name}", self.prefix);
        if self.read {
            let member = unique();
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let expiry = now_ms.saturating_add(self.ttl_ms);
            let zadd = redis::cmd("ZADD")
                .arg(&key)
                .arg("NX")
                .arg(expiry)
                .arg(&member)
                .clone();
            self.on_the_node(&zadd, "ZADD", &format!("{member} in {key}"))
                .await?;
            return Ok(Box::new((key, member)));
        }
        let replies = futures::future::join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            let set = redis::cmd("SET")
                .arg(&key)
                .arg(VALUE)
                .arg("NX")
                .arg("PX")
                .arg(self.ttl_ms)
                .clone();
            async move { set.query_async::<Option<String>>(&mut c).await }
        }))
        .await;
        // A refused SET NX (nil reply) is an error: a floor that silently fails is not a floor.
        for r in replies {
            if r.ctx("floor SET")?.is_none() {
                return Err(format!("floor SET NX refused: {key} is held"));
            }
        }
        Ok(Box::new(key))
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let held = match held.downcast::<(String, String)>() {
            Ok(read) => {
                let (key, member) = *read;
                let zrem = redis::cmd("ZREM").arg(&key).arg(&member).clone();
                let at = format!("{member} was not in {key}");
                return self.on_the_node(&zrem, "ZREM", &at).await;
            }
            Err(held) => held,
        };
        let key = held
            .downcast::<String>()
            .map_err(|_| "floor release: not a key".to_string())?;
        let replies = futures::future::join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            let mut call = self.script.key(key.as_str());
            call.arg(VALUE);
            async move { call.invoke_async::<i64>(&mut c).await }
        }))
        .await;
        for r in replies {
            if r.ctx("floor EVALSHA")? != 1 {
                return Err(format!("floor release deleted nothing: {key} was not held"));
            }
        }
        Ok(())
    }
}

/// rslock 0.10 (`LockManager`) on one node or on five (Redlock), with [`RSLOCK_RETRY`].
pub struct RslockClient {
    mgr: rslock::LockManager,
    prefix: String,
    ttl: Duration,
}

impl RslockClient {
    pub fn new(urls: &[String], prefix: String, ttl: Duration) -> Self {
        let mut mgr = rslock::LockManager::new(urls.to_vec());
        mgr.set_retry(RSLOCK_RETRY.0, RSLOCK_RETRY.1);
        RslockClient { mgr, prefix, ttl }
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
