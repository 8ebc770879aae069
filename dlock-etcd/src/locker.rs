//! [`EtcdLocker`] and its [`LockBackend`] impl: the lock on etcd (core implements the user
//! traits over it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Counters, LockBackend, RenewalDriver};
use dlock_core::{
    AcquireOptions, Capabilities, Election, Error, Lease, LockName, Primitives, RwLocker,
    Semaphore, Stats,
};
use etcd_client::Client;
use tokio::time::Instant;

use crate::builder::{Config, EtcdLockerBuilder};
use crate::conn::Etcd;
use crate::conn::Members;
use crate::error;
use crate::keys;
use crate::queue::Queue;
use crate::renew::Backend;
use crate::session::Session;
use crate::slots::Slots;

/// A distributed mutex on etcd, compatible with etcd's own `concurrency.Mutex` and
/// `etcdctl lock`.
///
/// One locker holds one etcd lease (its session) and renews it with one keep-alive stream,
/// however many locks it holds. A lock named `n` is the key range `<prefix>/<n encoded>/`;
/// each contender puts one key `<prefix>/<n encoded>/<lease id in hex>` and the key with the
/// lowest create revision holds the lock. Waiters watch only the key just ahead of them, so
/// a release wakes exactly one waiter, in FIFO order. The fencing token is the key's create
/// revision. See the crate documentation for the full algorithm.
///
/// The same locker is an [`Election`](dlock_core::Election), a
/// [`RwLocker`](dlock_core::RwLocker) and a [`Semaphore`](dlock_core::Semaphore) on the same
/// session (crate documentation, "Read-write lock and semaphore"); use one name for one of
/// them only.
///
/// Cloning is cheap and shares the session.
#[derive(Clone)]
pub struct EtcdLocker {
    pub(crate) inner: Arc<Inner>,
}

/// The state shared by clones of one locker.
pub(crate) struct Inner {
    pub(crate) etcd: Etcd,
    pub(crate) cfg: Config,
    pub(crate) driver: RenewalDriver<Backend>,
    /// The driver's own counters (its grants include the session sentinels).
    pub(crate) driver_counters: Arc<Counters>,
    pub(crate) session: tokio::sync::Mutex<Option<Arc<Session>>>,
    pub(crate) slots: Slots,
    /// The TTL etcd granted the last session lease, in seconds (the asked TTL rounded up until
    /// the first grant). etcd raises short TTLs to its minimum (1.5 × the election timeout).
    pub(crate) granted_ttl_secs: AtomicU64,
}

impl std::fmt::Debug for EtcdLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLocker")
            .field("endpoints", &self.inner.cfg.endpoints)
            .field("prefix", &self.inner.cfg.prefix)
            .field("ttl", &self.inner.cfg.ttl)
            .finish_non_exhaustive()
    }
}

impl EtcdLocker {
    /// A builder; see [`EtcdLockerBuilder`].
    pub fn builder() -> EtcdLockerBuilder {
        EtcdLockerBuilder::default()
    }

    pub(crate) async fn connect(
        cfg: Config,
        opts: etcd_client::ConnectOptions,
        authenticates: bool,
    ) -> Result<Self, Error> {
        let started = Instant::now();
        let members = Members::new(&cfg.endpoints, opts.clone());
        let client = match tokio::time::timeout(
            cfg.request_timeout,
            Client::connect(&cfg.endpoints, Some(opts)),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(error::map("connect", e)),
            Err(_) => return Err(error::no_reply("connect", started.elapsed())),
        };
        Ok(Self::start(cfg, members, client, authenticates))
    }

    /// A locker over the application's own client (no I/O): every request goes through it.
    /// Its credentials are its own; a stale auth token is refreshed with them.
    pub(crate) fn with_client(cfg: Config, client: Client) -> Self {
        Self::start(cfg, Members::from_client(client.clone()), client, true)
    }

    fn start(cfg: Config, members: Members, client: Client, authenticates: bool) -> Self {
        let members = Arc::new(members);
        // One attempt of a request: a third of the request timeout; with several members also at
        // most a sixth of the TTL, so that a keep-alive round can try two other members after
        // one that hangs.
        let mut attempt_cap = cfg.request_timeout / 3;
        if members.len() > 1 {
            attempt_cap = attempt_cap.min(cfg.ttl / 6);
        }
        let attempt_cap = attempt_cap.max(Duration::from_millis(100));
        let counters = Arc::new(Counters::labelled("etcd", &cfg.common));
        let driver_counters = Arc::new(Counters::labelled("etcd", &cfg.common));
        let etcd = Etcd {
            client,
            members,
            request_timeout: cfg.request_timeout,
            attempt_cap,
            counters,
            authenticates,
            last_reply: Arc::default(),
            deletes: Arc::default(),
        };
        let slots = Slots::default();
        let asked_secs = cfg.ttl.as_secs();
        let backend = Arc::new(Backend {
            etcd: etcd.clone(),
            slots: slots.clone(),
            prefix: cfg.prefix.clone(),
        });
        let driver = RenewalDriver::new(backend, cfg.ttl, Arc::clone(&driver_counters));
        EtcdLocker {
            inner: Arc::new(Inner {
                etcd,
                cfg,
                driver,
                driver_counters,
                session: tokio::sync::Mutex::new(None),
                slots,
                granted_ttl_secs: AtomicU64::new(asked_secs),
            }),
        }
    }

    /// The name to give `etcdctl lock` (or etcd's `concurrency.NewMutex`) so that it contends
    /// with this locker for `name`: `<prefix>/<name with '/' encoded as %2F>`, or
    /// `<prefix>/<name>` with [`EtcdLockerBuilder::raw_names`].
    ///
    /// ```no_run
    /// # async fn demo(locker: dlock_etcd::EtcdLocker) -> Result<(), dlock_core::Error> {
    /// let name = dlock_core::LockName::new("orders/42")?;
    /// assert_eq!(locker.etcd_mutex_name(&name), "dlock/orders%2F42");
    /// # Ok(()) }
    /// ```
    pub fn etcd_mutex_name(&self, name: &LockName) -> String {
        keys::etcd_mutex_name(&self.inner.cfg.prefix, name, self.inner.cfg.raw_names)
    }

    /// The lock range of `name`: `<prefix>/<name>/`.
    pub(crate) fn range_of(&self, name: &LockName) -> String {
        keys::lock_range(&self.inner.cfg.prefix, name, self.inner.cfg.raw_names)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.cfg.prefix
    }

    /// The underlying etcd client (for fenced writes in your own transactions, e.g. comparing
    /// a stored fence against [`Lease::token`]).
    pub fn client(&self) -> &Client {
        &self.inner.etcd.client
    }

    /// The current session lease id, if a session is open and alive.
    pub async fn session_lease(&self) -> Option<i64> {
        let s = self.inner.session.lock().await;
        s.as_ref().filter(|s| s.is_live()).map(|s| s.lease())
    }
}

#[async_trait]
impl LockBackend for EtcdLocker {
    fn closed(&self) -> bool {
        self.inner.driver.is_closed()
    }

    fn live_counters(&self) -> Option<&Counters> {
        Some(&self.inner.etcd.counters)
    }

    async fn lock(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        let q = Queue::mutex(self.range_of(name));
        self.acquire_in(name, &q, opts, &[]).await
    }

    async fn try_lock(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        Ok(self
            .lock_mutex(name, None, true, &[])
            .await?
            .map(|(lease, _)| lease))
    }

    /// One linearizable range read of the name's key range (the holder is its oldest key, if
    /// that is a mutex key, as the grant decides), then `LeaseTimeToLive` of the holder's
    /// lease: the token is the key's create revision, `expires_within` the lease's remaining
    /// whole seconds plus one (etcd rounds down), `waiting` the other mutex keys.
    async fn state(&self, name: &LockName) -> Result<dlock_core::LockState, Error> {
        self.inspect_mutex(name).await
    }

    /// The TTL etcd grants this locker's session lease: the asked TTL rounded up to whole
    /// seconds, or etcd's minimum TTL (1.5 × its election timeout) when that is longer. Known
    /// from the first session grant on; before it, the asked TTL rounded up. Lease deadlines
    /// are always computed from the asked TTL rounded up to whole seconds (the TTL asked of
    /// etcd, so never later than the server's), not from a longer TTL etcd granted.
    fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.inner.granted_ttl_secs.load(Ordering::Relaxed))
            .max(self.inner.cfg.ttl)
    }

    /// Ends every lease, deletes its key (guarded, all at once) and revokes the session lease
    /// (which deletes whatever keys of the session remain, queued ones included).
    async fn shutdown(&self) -> Result<(), Error> {
        self.inner.driver.close().await
    }

    fn guarantees(&self) -> Capabilities {
        // etcd's lessor checks expiry every 500 ms; the waiter then needs a watch event and a
        // read.
        Capabilities::new(self.lease_ttl())
            .with_fair_queue(true, true)
            .with_crash_release_slack(Duration::from_millis(1000))
            .with_primitives(Primitives::ALL)
    }

    fn counters(&self) -> Stats {
        let mut stats = self.inner.etcd.counters.snapshot();
        let driver = self.inner.driver_counters.snapshot();
        stats.renewals = driver.renewals;
        stats.renewal_failures = driver.renewal_failures;
        // The session's sentinel is internal: the driver counts neither its grant nor its loss.
        stats.losses = driver.losses;
        stats
    }

    fn election(self: Arc<Self>) -> Option<Arc<dyn Election>> {
        Some(self)
    }

    fn rw(self: Arc<Self>) -> Option<Arc<dyn RwLocker>> {
        Some(self)
    }

    fn semaphore(self: Arc<Self>) -> Option<Arc<dyn Semaphore>> {
        Some(self)
    }
}
