//! `RedisLocker`, the lock on one Redis server (a Sentinel-managed master or a Redis Cluster),
//! and its `LockBackend` impl.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Counters, LockBackend, RenewalDriver};
use dlock_core::{
    AcquireOptions, Capabilities, Error, FencingStrength, HolderState, Lease, LockName, LockState,
    Primitives, Stats,
};

use crate::acquire::{self, grant, hints, notify::Notifier};
use crate::inspect;
use crate::keys;
use crate::renew::SingleBackend;

/// A lock on one Redis server (or one Redis Cluster slot owner).
///
/// - A lock `name` lives in the key `<prefix>dlock:{name}` (a plain string holding a random
///   128-bit owner value, with a TTL), next to `<prefix>dlock:{name}:fence` (the fencing
///   counter) and, in fair mode, `<prefix>dlock:{name}:q` / `:qt` (the waiter queue and its
///   deadlines). The braces make them one hash tag, one cluster slot.
/// - An acquire's first attempt is one round trip (a small script: `SET NX PX`, and only when
///   that granted, the next token; a refused attempt writes nothing): the token arrives with
///   the grant. A token is the fence counter + 1, raised to at least the server's clock in
///   microseconds, so tokens keep increasing when the counter is lost (a restart without
///   persistence, a failover to a lagging replica, an evicted fence key). Release is a compare-and-delete. Every
///   lease the locker holds is renewed in ONE round trip every TTL/3 (on a Redis Cluster, one
///   per master: see [`RedisLockerBuilder::cluster`](crate::RedisLockerBuilder::cluster)).
/// - Fair mode (the default) keeps a FIFO queue per name. Each waiter's entry carries a
///   deadline (server clock) that the scripts purge, so a crashed waiter cannot block the
///   queue for long. A release with waiters queued grants the lock to the head in the same
///   script (nobody can barge in) and sends ONLY that waiter its token, over the locker's
///   single pub/sub connection (a head of an older client gets a reservation instead); a
///   timer (the holder's remaining TTL) covers a lost message or a crashed holder. Only after a
///   holder's key expired (a crash) may a newcomer get the lock before the queued head.
///   Non-fair mode retries after randomized, jittered delays.
///
/// # Cancel safety
/// Dropping a pending `acquire` withdraws its queue entry in the background (and passes the
/// baton when it was the head); an `acquire` that times out withdraws before it returns (waiting
/// at most 100 ms for a hung server). A grant whose reply was never seen is deleted by owner
/// value, so nothing is left behind.
///
/// It also implements [`RwLocker`](dlock_core::RwLocker) and
/// [`Semaphore`](dlock_core::Semaphore): holders in the sorted set `<prefix>dlock:{name}:holders`
/// with a FIFO queue across modes (in fair and spin mode alike), renewed in the same round trip
/// as the mutex leases; see the crate README's "Read-write lock and semaphore".
///
/// Every client of one name must use the same mode: a non-fair client ignores the queue.
/// Other clients that lock the same key with a plain `SET key value NX PX` exclude and are
/// excluded by dlock.
///
/// ```no_run
/// use std::time::Duration;
/// use dlock_core::{AcquireOptions, LockName, Locker};
/// use dlock_redis::RedisLocker;
/// # async fn demo() -> Result<(), dlock_core::Error> {
/// let locker = RedisLocker::builder()
///     .url("redis://127.0.0.1:6379")
///     .ttl(Duration::from_secs(10))
///     .namespace("billing")
///     .build()
///     .await?;
/// let lease = locker.acquire(&LockName::new("invoice/42")?, AcquireOptions::wait(Duration::from_secs(5))).await?;
/// println!("token {}", lease.token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLocker {
    pub(crate) inner: Arc<Inner>,
}

/// The locker's state, shared by its clones.
pub(crate) struct Inner {
    pub(crate) backend: Arc<SingleBackend>,
    pub(crate) driver: RenewalDriver<SingleBackend>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) prefix: String,
    pub(crate) ttl: Duration,
    pub(crate) fair: bool,
    pub(crate) request_timeout: Duration,
    pub(crate) retry_delay: Duration,
    pub(crate) replicas: Option<(usize, Duration)>,
    /// `WAIT`'s connections (see `grant::WaitConns`).
    pub(crate) wait_conns: grant::WaitConns,
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) locker_id: String,
    pub(crate) seq: AtomicU64,
    pub(crate) contended: hints::Contended,
}

impl std::fmt::Debug for RedisLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLocker")
            .field("node", &self.inner.backend.node.display)
            .field("prefix", &self.inner.prefix)
            .field("ttl", &self.inner.ttl)
            .field("fair", &self.inner.fair)
            .finish_non_exhaustive()
    }
}

impl RedisLocker {
    /// The prefix of every key this locker writes: the raw
    /// [`prefix`](crate::RedisLockerBuilder::prefix), then `<namespace>/`.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Whether the locker queues waiters fairly.
    pub fn is_fair(&self) -> bool {
        self.inner.fair
    }

    /// How many leases the locker holds and renews now.
    pub fn held(&self) -> usize {
        self.inner.driver.len()
    }
}

#[async_trait]
impl LockBackend for RedisLocker {
    fn closed(&self) -> bool {
        self.inner.driver.is_closed()
    }

    fn live_counters(&self) -> Option<&Counters> {
        Some(&self.inner.counters)
    }

    async fn lock(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        Ok(acquire::acquire(&self.inner, name, opts.wait).await?.0)
    }

    async fn try_lock(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        Ok(acquire::try_acquire(&self.inner, name)
            .await?
            .map(|(lease, _)| lease))
    }

    /// One read-only script on the name's server (its master; its slot's master on a
    /// cluster): the lock key's owner value and `PTTL`, the fence counter and, in fair mode,
    /// the live queue entries. A lock reserved for the queue's head shows no holder.
    ///
    /// The token shown is the fence counter: a grant sets the lock key and the counter in one
    /// script, and no other grant of the name can raise the counter while the key holds that
    /// owner (the read-write lock and semaphore share the counter, but a name is one primitive).
    async fn state(&self, name: &LockName) -> Result<LockState, Error> {
        let inner = &self.inner;
        let keys = keys::Keys::new(&inner.prefix, name);
        let node = &inner.backend.node;
        let view = inspect::read(
            node,
            &keys,
            inner.fair,
            inner.request_timeout,
            &inner.counters,
        )
        .await?;
        let holder = view.holder.map(|owner| {
            HolderState::new(
                view.fence,
                keys.lock,
                String::from_utf8_lossy(&owner),
                view.pttl,
            )
        });
        Ok(LockState::new(holder, inner.fair.then_some(view.waiting)))
    }

    fn lease_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Ends every lease and deletes its key (one guarded delete each, all at once); the
    /// connections close when the last clone of the locker is dropped.
    async fn shutdown(&self) -> Result<(), Error> {
        self.inner.driver.close().await
    }

    fn guarantees(&self) -> Capabilities {
        Capabilities::new(self.inner.ttl)
            .with_fair_queue(self.inner.fair, self.inner.fair)
            .with_fencing(FencingStrength::Linearizable)
            .with_crash_release_slack(Duration::from_millis(250))
            .with_primitives(Primitives::ALL)
    }

    fn counters(&self) -> Stats {
        self.inner.counters.snapshot()
    }

    fn election(self: Arc<Self>) -> Option<Arc<dyn dlock_core::Election>> {
        Some(self)
    }

    fn rw(self: Arc<Self>) -> Option<Arc<dyn dlock_core::RwLocker>> {
        Some(self)
    }

    fn semaphore(self: Arc<Self>) -> Option<Arc<dyn dlock_core::Semaphore>> {
        Some(self)
    }
}
