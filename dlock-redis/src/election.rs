//! [`Election`] on one Redis server: the lock with a value.
//!
//! A campaign acquires the name's lock (fair queue or spin, as the locker is set), then
//! ANNOUNCES itself in the same hash tag, in one script that first checks the lock key still
//! holds its owner value: `<lock>:leader` (a hash: owner, term, value, and `n`, the number of
//! announcements so far) and one entry in the stream `<lock>:changes` (`n`, term, value). A
//! leadership is visible from its announcement on: `leader` reports the hash only while the
//! lock key holds the hash's owner. A proclamation is another announcement, accepted only
//! from the announced owner that still holds the lock.
//!
//! Observers read the hash and the stream's last id in one script, then follow the stream with
//! `XREAD BLOCK` on a connection of their own; every entry's `n` must follow the last one seen,
//! so entries trimmed away or lost with the keys fail the observation instead of being skipped.
//! Both keys live for the fence lifetime after the last announcement.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{ElectionBackend, Proclaim, leadership};
use dlock_core::{
    AcquireOptions, Error, FencingToken, Leader, LeaderChanges, Leadership, Lease, LockName,
    LossReason,
};
use redis::Script;
use redis::streams::StreamReadReply;

use crate::acquire;
use crate::conn::{self, millis};
use crate::keys::Keys;
use crate::locker::{Inner, RedisLocker};
use crate::scripts::FENCE_LIFETIME;

/// Announces `owner` (term, value), if the lock key still holds `owner`; for a
/// proclamation (`ARGV[6]` = `proclaim`) only if `owner` is also the announced leader.
/// KEYS: lock, leader, changes. ARGV: owner, term, value, lifetime ms, stream length, mode,
/// request id (random, one per call).
/// Returns the announcement's `n`, or -1 when `owner` does not (or no longer) lead.
///
/// The hash keeps the request id of the last announcement: a request sent again after it ran
/// (Redis Cluster's client re-sends after a dropped connection) finds its own id there and
/// answers the same `n` without announcing twice.
const ANNOUNCE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local last = redis.call('HMGET', KEYS[2], 'owner', 'req', 'n')
if last[1] == ARGV[1] and last[2] == ARGV[7] then return tonumber(last[3]) end
if ARGV[6] == 'proclaim' and last[1] ~= ARGV[1] then return -1 end
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'term', ARGV[2], 'value', ARGV[3], 'req', ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'n', n, 'term', ARGV[2], 'value', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return n
"#;

/// The announced leader, when the lock key holds its owner; and for an observer the number of
/// announcements so far and the stream's last id. KEYS: lock, leader, changes.
/// Returns `{leads (0/1), term, value, n, last id}`.
const READ: &str = r#"
local h = redis.call('HMGET', KEYS[2], 'owner', 'term', 'value', 'n')
local holder = redis.call('GET', KEYS[1])
local leads = 0
if holder and h[1] and holder == h[1] then leads = 1 end
local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
local id = '0-0'
if #last > 0 then id = last[1][1] end
return {leads, h[2] or '0', h[3] or '', h[4] or '0', id}
"#;

static ANNOUNCE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ANNOUNCE));
static READ_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(READ));

/// How many announcements a stream keeps (about; `MAXLEN ~`). An observer further behind
/// than that fails instead of skipping.
const STREAM_LENGTH: u64 = 1000;
/// How long one `XREAD` blocks before it is sent again.
const BLOCK: Duration = Duration::from_secs(1);

fn keys(inner: &Inner, name: &LockName) -> (Keys, String, String) {
    let keys = Keys::new(&inner.prefix, name);
    let leader = format!("{}:leader", keys.lock);
    let changes = format!("{}:changes", keys.lock);
    (keys, leader, changes)
}

fn not_leading(name: &LockName) -> Error {
    Error::Lost(LossReason::Gone(format!(
        "{name}: the Redis lock key no longer holds this leader"
    )))
}

/// Runs [`ANNOUNCE`]: `Ok(true)` when announced.
async fn announce(
    inner: &Inner,
    name: &LockName,
    owner: &str,
    term: u64,
    value: &[u8],
    mode: &str,
) -> Result<bool, Error> {
    let (keys, leader, changes) = keys(inner, name);
    let mut inv = ANNOUNCE_SCRIPT.prepare_invoke();
    inv.key(&keys.lock)
        .key(&leader)
        .key(&changes)
        .arg(owner)
        .arg(term)
        .arg(value)
        .arg(millis(FENCE_LIFETIME))
        .arg(STREAM_LENGTH)
        .arg(mode)
        .arg(crate::keys::random_id());
    let n: i64 = inner
        .backend
        .node
        .invoke("announce", &inv, inner.request_timeout, &inner.counters)
        .await?;
    Ok(n > 0)
}

/// A leader as [`READ`] returned it, with the announcement count and the stream's last id.
struct Read {
    leader: Option<Leader>,
    n: u64,
    last_id: String,
}

async fn read(inner: &Inner, name: &LockName) -> Result<Read, Error> {
    let (keys, leader, changes) = keys(inner, name);
    let mut inv = READ_SCRIPT.prepare_invoke();
    inv.key(&keys.lock).key(&leader).key(&changes);
    let (leads, term, value, n, last_id): (i64, u64, Vec<u8>, u64, String) = inner
        .backend
        .node
        .invoke("leader read", &inv, inner.request_timeout, &inner.counters)
        .await?;
    Ok(Read {
        leader: (leads == 1).then_some(Leader {
            term: FencingToken(term),
            value,
        }),
        n,
        last_id,
    })
}

/// Writes a leader's value through [`ANNOUNCE`].
struct RedisProclaim {
    inner: Arc<Inner>,
    owner: String,
}

#[async_trait]
impl Proclaim for RedisProclaim {
    async fn proclaim(&self, lease: &Lease, value: &[u8]) -> Result<(), Error> {
        let term = lease.token().get();
        if announce(
            &self.inner,
            lease.name(),
            &self.owner,
            term,
            value,
            "proclaim",
        )
        .await?
        {
            Ok(())
        } else {
            Err(not_leading(lease.name()))
        }
    }
}

/// One observation: the stream from the last id seen, on a connection of its own.
struct RedisChanges {
    conn: conn::Conn,
    node: Arc<str>,
    stream: String,
    last_id: String,
    /// Announcements seen so far (the `n` the next entry must carry, minus one).
    n: u64,
    first: Option<Leader>,
    budget: Duration,
}

#[async_trait]
impl LeaderChanges for RedisChanges {
    async fn next(&mut self) -> Result<Leader, Error> {
        if let Some(first) = self.first.take() {
            return Ok(first);
        }
        loop {
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(millis(BLOCK))
                .arg("STREAMS")
                .arg(&self.stream)
                .arg(&self.last_id);
            let conn = &mut self.conn;
            let reply: Option<StreamReadReply> =
                conn::bounded(&self.node, "election watch", self.budget, async move {
                    cmd.query_async(conn).await
                })
                .await?;
            let Some(entry) = reply
                .and_then(|r| r.keys.into_iter().next())
                .and_then(|k| k.ids.into_iter().next())
            else {
                continue;
            };
            let n: u64 = entry.get("n").unwrap_or(0);
            if n != self.n + 1 {
                return Err(Error::unavailable(
                    format!(
                        "election watch on {}: announcement {n} follows {}; changes were missed",
                        self.node, self.n
                    ),
                    None,
                ));
            }
            self.n = n;
            self.last_id = entry.id.clone();
            let term: u64 = entry.get("term").unwrap_or(0);
            let value: Vec<u8> = entry.get("value").unwrap_or_default();
            return Ok(Leader {
                term: FencingToken(term),
                value,
            });
        }
    }
}

#[async_trait]
impl ElectionBackend for RedisLocker {
    async fn run_campaign(
        &self,
        name: &LockName,
        value: &[u8],
        opts: AcquireOptions,
    ) -> Result<Leadership, Error> {
        let (lease, owner) = acquire::acquire(&self.inner, name, opts.wait).await?;
        let term = lease.token().get();
        match announce(&self.inner, name, &owner, term, value, "campaign").await {
            Ok(true) => {}
            Ok(false) => {
                let _ = lease.release().await;
                return Err(not_leading(name));
            }
            Err(e) => {
                let _ = lease.release().await;
                return Err(e);
            }
        }
        let proclaim = RedisProclaim {
            inner: Arc::clone(&self.inner),
            owner,
        };
        Ok(leadership(lease, Arc::new(proclaim)))
    }

    async fn read_leader(&self, name: &LockName) -> Result<Option<Leader>, Error> {
        Ok(read(&self.inner, name).await?.leader)
    }

    async fn follow(&self, name: &LockName) -> Result<Box<dyn LeaderChanges>, Error> {
        let inner = &self.inner;
        let node = Arc::clone(&inner.backend.node.display);
        let conn = inner
            .backend
            .node
            .own_connection(inner.request_timeout)
            .await?;
        let Read { leader, n, last_id } = read(inner, name).await?;
        let (_, _, stream) = keys(inner, name);
        Ok(Box::new(RedisChanges {
            conn,
            node,
            stream,
            last_id,
            n,
            first: leader,
            budget: BLOCK + inner.request_timeout,
        }))
    }
}
