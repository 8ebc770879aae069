//! [`EtcdLocker`]: the [`Locker`] on etcd.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    AcquireOptions, Capabilities, Counters, Error, FencingToken, Lease, LockName, Locker,
    LossReason, RenewalDriver, Stats,
};
use etcd_client::{Client, EventType, WatchFilterType, WatchOptions};
use tokio::time::Instant;

use crate::builder::{Config, EtcdLockerBuilder};
use crate::errors;
use crate::keys;
use crate::members::Members;
use crate::ops::{Enqueue, Etcd, Recheck};
use crate::session::{Backend, Entry, KeepAlive, LockEntry, Session, spawn_cleanup};
use crate::slots::{SlotGuard, Slots};

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
/// Cloning is cheap and shares the session.
#[derive(Clone)]
pub struct EtcdLocker {
    inner: Arc<Inner>,
}

struct Inner {
    etcd: Etcd,
    cfg: Config,
    driver: RenewalDriver<Backend>,
    /// The driver's own counters (its grants include the session sentinels).
    driver_counters: Arc<Counters>,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    slots: Slots,
    session_losses: Arc<AtomicU64>,
    /// The TTL etcd granted the last session lease, in seconds (the asked TTL until the first
    /// grant). etcd raises short TTLs to its minimum (1.5 × the election timeout).
    granted_ttl_secs: AtomicU64,
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

/// How one queue attempt (on one session) ended.
enum Attempt {
    Granted(Lease),
    NotOwner,
    Timeout,
    Requeue,
}

/// Our queue key until it is either handed to a lease or deleted. Dropping it (a cancelled
/// acquire) deletes the key in the background.
struct Pending {
    etcd: Etcd,
    key: String,
    rev: Option<i64>,
    session: Arc<Session>,
    slot: Option<SlotGuard>,
}

impl Pending {
    /// Deletes our key now; on failure keeps deleting in the background.
    async fn delete_now(mut self) {
        let Some(slot) = self.slot.take() else { return };
        let result = match self.rev {
            Some(rev) => self.etcd.delete_guarded(&self.key, rev, None).await,
            None => self.etcd.delete_unknown(&self.key).await,
        };
        match result {
            Ok(_) => drop(slot),
            Err(e) => {
                tracing::warn!(key = %self.key, error = %e, "deleting our queue key failed; retrying in the background");
                spawn_cleanup(
                    self.etcd.clone(),
                    self.key.clone(),
                    self.rev,
                    Arc::clone(&self.session),
                    slot,
                );
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            spawn_cleanup(
                self.etcd.clone(),
                self.key.clone(),
                self.rev,
                Arc::clone(&self.session),
                slot,
            );
        }
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
        let members = Arc::new(Members::new(&cfg.endpoints, opts.clone()));
        // One attempt of a request: a third of the request timeout; with several members also at
        // most a sixth of the TTL, so that a keep-alive round can try two other members after
        // one that hangs.
        let mut attempt_cap = cfg.request_timeout / 3;
        if members.len() > 1 {
            attempt_cap = attempt_cap.min(cfg.ttl / 6);
        }
        let attempt_cap = attempt_cap.max(Duration::from_millis(100));
        let client = match tokio::time::timeout(
            cfg.request_timeout,
            Client::connect(&cfg.endpoints, Some(opts)),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(errors::map("connect", e)),
            Err(_) => return Err(errors::no_reply("connect", started.elapsed())),
        };
        let counters = Arc::new(Counters::default());
        let driver_counters = Arc::new(Counters::default());
        let etcd = Etcd {
            client,
            members,
            request_timeout: cfg.request_timeout,
            attempt_cap,
            counters,
            authenticates,
        };
        let slots = Slots::default();
        let asked_secs = cfg.ttl.as_secs();
        let backend = Arc::new(Backend {
            etcd: etcd.clone(),
            slots: slots.clone(),
            prefix: cfg.prefix.clone(),
        });
        let driver = RenewalDriver::new(backend, cfg.ttl, Arc::clone(&driver_counters));
        Ok(EtcdLocker {
            inner: Arc::new(Inner {
                etcd,
                cfg,
                driver,
                driver_counters,
                session: tokio::sync::Mutex::new(None),
                slots,
                session_losses: Arc::new(AtomicU64::new(0)),
                granted_ttl_secs: AtomicU64::new(asked_secs),
            }),
        })
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
        s.as_ref().filter(|s| s.is_live()).map(|s| s.id())
    }

    /// Returns the live session, granting a new lease when there is none or the last one
    /// ended.
    async fn session(&self, deadline: Option<Instant>) -> Result<Arc<Session>, Error> {
        let inner = &self.inner;
        // Another task may be granting the session: wait for it, but not past our deadline.
        let mut current = match deadline {
            None => inner.session.lock().await,
            Some(d) => match tokio::time::timeout_at(d, inner.session.lock()).await {
                Ok(guard) => guard,
                Err(_) => {
                    return Err(Error::unavailable(
                        "the session lease grant in progress did not finish within the wait",
                        None,
                    ));
                }
            },
        };
        if let Some(s) = current.as_ref() {
            if s.is_live() {
                return Ok(Arc::clone(s));
            }
        }
        if let Some(old) = current.take() {
            let id = old.id();
            tracing::info!(
                lease = format_args!("{id:x}"),
                "session lease ended; granting a new one"
            );
            inner.driver.lose_where(
                &LossReason::SessionEnded(format!("etcd lease {id:x} ended")),
                |e| e.lease_id() == id,
            );
        }
        let start = Instant::now();
        let ttl_secs = inner.cfg.ttl_secs;
        let granted = inner
            .etcd
            .call("lease grant", deadline, |c| {
                let mut leases = c.lease_client();
                async move { leases.grant(ttl_secs, None).await }
            })
            .await?;
        if granted.ttl() < inner.cfg.ttl_secs {
            return Err(errors::unexpected(
                "lease grant",
                format!(
                    "asked a {} s lease, got {} s",
                    inner.cfg.ttl_secs,
                    granted.ttl()
                ),
            ));
        }
        if granted.ttl() > inner.cfg.ttl_secs {
            tracing::info!(
                asked_s = inner.cfg.ttl_secs,
                granted_s = granted.ttl(),
                "etcd raised the lease TTL to its minimum; deadlines keep the asked TTL"
            );
        }
        inner
            .granted_ttl_secs
            .store(granted.ttl().unsigned_abs(), Ordering::Relaxed);
        let id = granted.id();
        let ka = Arc::new(KeepAlive::new(id, inner.etcd.clone()));
        // The sentinel: an internal lease that keeps the session renewed while we only wait.
        let sentinel_name =
            LockName::new("session").map_err(|e| errors::unexpected("session", e))?;
        let sentinel = inner.driver.register(
            sentinel_name,
            FencingToken(0),
            start,
            Entry::Session(Arc::clone(&ka)),
        );
        let session = Arc::new(Session::new(ka, sentinel, inner.cfg.ttl));
        let ended = session.ended();
        let driver = inner.driver.clone();
        let losses = Arc::clone(&inner.session_losses);
        tokio::spawn(async move {
            let reason = ended.await;
            if reason != LossReason::Released {
                losses.fetch_add(1, Ordering::Relaxed);
                driver.lose_where(&reason, |e| e.lease_id() == id);
            }
        });
        tracing::debug!(
            lease = format_args!("{id:x}"),
            ttl_s = inner.cfg.ttl_secs,
            "session lease granted"
        );
        *current = Some(Arc::clone(&session));
        Ok(session)
    }

    async fn lock(
        &self,
        name: &LockName,
        wait: Option<Duration>,
        try_only: bool,
    ) -> Result<Option<Lease>, Error> {
        let started = Instant::now();
        let deadline = wait.map(|w| started + w);
        let range = keys::lock_range(&self.inner.cfg.prefix, name, self.inner.cfg.raw_names);
        let mut counted_wait = false;
        loop {
            let session = self.session(deadline).await?;
            let key = keys::contender_key(&range, session.id());
            let slot = if try_only {
                match self.inner.slots.try_lock(&key) {
                    Some(slot) => slot,
                    // Another task of this locker holds or queues for this name.
                    None => return Ok(None),
                }
            } else {
                match deadline {
                    None => self.inner.slots.lock(&key).await,
                    Some(d) => {
                        match tokio::time::timeout_at(d, self.inner.slots.lock(&key)).await {
                            Ok(slot) => slot,
                            Err(_) => {
                                return Err(Error::Timeout {
                                    waited: started.elapsed(),
                                });
                            }
                        }
                    }
                }
            };
            let pending = Pending {
                etcd: self.inner.etcd.clone(),
                key,
                rev: None,
                session,
                slot: Some(slot),
            };
            match self
                .attempt(name, &range, pending, deadline, try_only, &mut counted_wait)
                .await?
            {
                Attempt::Granted(lease) => return Ok(Some(lease)),
                Attempt::NotOwner => return Ok(None),
                Attempt::Timeout => {
                    return Err(Error::Timeout {
                        waited: started.elapsed(),
                    });
                }
                Attempt::Requeue => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Error::Timeout {
                            waited: started.elapsed(),
                        });
                    }
                }
            }
        }
    }

    /// Enqueues on one session and waits for ownership.
    async fn attempt(
        &self,
        name: &LockName,
        range: &str,
        mut pending: Pending,
        deadline: Option<Instant>,
        try_only: bool,
        counted_wait: &mut bool,
    ) -> Result<Attempt, Error> {
        let inner = &self.inner;
        let etcd = &inner.etcd;
        let session = Arc::clone(&pending.session);
        // On error `pending` is dropped: the key (revision unknown) is deleted in the background.
        let enq = match etcd
            .enqueue(range, &pending.key, session.id(), deadline)
            .await?
        {
            Enqueue::Queued(enq) => enq,
            Enqueue::SessionGone => {
                // etcd dropped the session lease (revoked, or expired before a keep-alive
                // reply told us): it has no key left anywhere. End the session now, so its
                // locks are announced lost and the next attempt queues on a new lease,
                // instead of failing the acquire or ever granting on the removed key.
                let id = session.id();
                tracing::info!(
                    lock = %name,
                    lease = format_args!("{id:x}"),
                    "etcd no longer knows the session lease; queueing on a new session"
                );
                inner.driver.lose_where(
                    &LossReason::SessionEnded(format!("etcd lease {id:x} expired or was revoked")),
                    |e| e.lease_id() == id,
                );
                return Ok(Attempt::Requeue);
            }
            Enqueue::KeyGone => {
                tracing::debug!(lock = %name, key = %pending.key, "our queue key vanished while enqueueing; queueing again");
                return Ok(Attempt::Requeue);
            }
        };
        if enq.rev <= 0 {
            return Err(errors::unexpected(
                "enqueue transaction",
                format!("create revision {}", enq.rev),
            ));
        }
        let rev = enq.rev;
        pending.rev = Some(rev);
        if let Some(pred) = enq.predecessor {
            if try_only {
                pending.delete_now().await;
                return Ok(Attempt::NotOwner);
            }
            if !*counted_wait {
                *counted_wait = true;
                inner.etcd.counters.add_waits(1);
            }
            let turn = self
                .wait_turn(
                    name,
                    range,
                    &pending.key,
                    rev,
                    pred,
                    enq.header_rev,
                    &session,
                    deadline,
                )
                .await;
            match turn {
                Ok(Turn::Owner) => {}
                Ok(Turn::Requeue) => return Ok(Attempt::Requeue),
                Ok(Turn::Timeout) => {
                    pending.delete_now().await;
                    return Ok(Attempt::Timeout);
                }
                // etcd failed until the wait ended: `pending` deletes the key in the background.
                Err(e) => return Err(e),
            }
        }
        // We own the lock if our session is still alive: never grant on a dead lease (the
        // grant could be stale).
        if !session.is_live() {
            return Ok(Attempt::Requeue);
        }
        let start = session.last_ack_start();
        let key = pending.key.clone();
        let slot = pending.slot.take();
        drop(pending);
        let entry = Entry::Lock(LockEntry {
            key,
            rev,
            session,
            slot: Mutex::new(slot),
        });
        let token =
            u64::try_from(rev).map_err(|_| errors::unexpected("grant", "negative revision"))?;
        let lease = inner
            .driver
            .register(name.clone(), FencingToken(token), start, entry);
        inner.etcd.counters.add_grants(1);
        tracing::debug!(lock = %name, token, "lock granted");
        Ok(Attempt::Granted(lease))
    }

    /// Waits until our key is the first of its range: watch only `pred` (the key just below
    /// ours) for deletion, then re-check; `read_rev` is the revision our last read was made at.
    ///
    /// The watch starts at the CURRENT revision (never an old one: etcd serves watchers that
    /// start in the past from a resync loop that runs every 100 ms). Once it exists we read
    /// again (the deletion may predate the watch) and keep the watch while `pred` is still our
    /// predecessor. One wake-up per release, and a constant number of requests per wait.
    #[allow(clippy::too_many_arguments)]
    async fn wait_turn(
        &self,
        name: &LockName,
        range: &str,
        key: &str,
        rev: i64,
        mut pred: String,
        mut read_rev: i64,
        session: &Session,
        deadline: Option<Instant>,
    ) -> Result<Turn, Error> {
        let etcd = &self.inner.etcd;
        let mut backoff = Duration::from_millis(20);
        // The outcome of a re-read: true to keep watching `pred`, false to watch the (new)
        // `pred` afresh, or a final turn.
        macro_rules! on_recheck {
            ($result:expr, $keep:expr) => {
                match $result {
                    Ok(Recheck::Owner) => return Ok(Turn::Owner),
                    Ok(Recheck::KeyGone) => {
                        tracing::debug!(lock = %name, %key, "our queue key is gone; queueing again");
                        return Ok(Turn::Requeue);
                    }
                    Ok(Recheck::Behind {
                        predecessor,
                        header_rev,
                    }) => {
                        read_rev = header_rev;
                        if predecessor == pred && $keep {
                            true
                        } else {
                            pred = predecessor;
                            false
                        }
                    }
                    Err(e) => {
                        self.transient(e, &mut backoff, session, deadline).await?;
                        false
                    }
                }
            };
        }
        loop {
            tracing::trace!(lock = %name, %key, %pred, "waiting for the predecessor's deletion");
            let opened = match bounded(self.open_watch(&pred), session, deadline).await {
                Cut::Done(r) => r,
                Cut::SessionEnded => return Ok(Turn::Requeue),
                Cut::Deadline => return Ok(Turn::Timeout),
            };
            let (mut stream, watch_rev) = match opened {
                Ok(v) => v,
                Err(e) => {
                    self.transient(e, &mut backoff, session, deadline).await?;
                    continue;
                }
            };
            let opened_at = Instant::now();
            // Re-read once the watch exists: the deletion may predate the watch. etcd registers
            // a watch "from now" at the revision `watch_rev` it read just before; a write that
            // lands in between leaves the watch unsynced, served only by etcd's 100 ms resync
            // loop. If our read shows no write since `watch_rev`, that cannot have happened;
            // otherwise we cannot tell, and re-read a few times during the first resync period
            // (after 5, 15, 35, 75 and 115 ms, until the watch fires): at most five more reads.
            if !on_recheck!(etcd.recheck(range, key, rev, deadline).await, true) {
                continue;
            }
            let mut poll = (read_rev > watch_rev).then_some(Duration::from_millis(5));
            let woke = loop {
                let step = match poll {
                    Some(p) if opened_at.elapsed() + p <= RESYNC_PERIOD => {
                        let at = Instant::now() + p;
                        bounded(
                            tokio::time::timeout_at(at, wait_delete(&mut stream)),
                            session,
                            deadline,
                        )
                        .await
                    }
                    _ => {
                        bounded(
                            async { Ok(wait_delete(&mut stream).await) },
                            session,
                            deadline,
                        )
                        .await
                    }
                };
                match step {
                    Cut::Done(Ok(Ok(()))) => break Woke::Event,
                    Cut::Done(Ok(Err(e))) => break Woke::Failed(e),
                    Cut::Done(Err(_)) => {
                        poll = poll.map(|p| (p * 2).min(Duration::from_millis(40)));
                        if !on_recheck!(etcd.recheck(range, key, rev, deadline).await, true) {
                            break Woke::Moved;
                        }
                    }
                    Cut::SessionEnded => return Ok(Turn::Requeue),
                    Cut::Deadline => return Ok(Turn::Timeout),
                }
            };
            match woke {
                Woke::Event => {
                    etcd.counters.add_wakeups(1);
                    backoff = Duration::from_millis(20);
                }
                // A re-read found a new predecessor: watch it.
                Woke::Moved => continue,
                Woke::Failed(e) => self.transient(e, &mut backoff, session, deadline).await?,
            }
            drop(stream);
            let _ = on_recheck!(etcd.recheck(range, key, rev, deadline).await, false);
        }
    }

    /// After a failed request while waiting: pause (backoff), or end the wait when the session
    /// ended (`Requeue` is signalled as `Ok` by the caller's next step) or the deadline came
    /// (the error is returned: etcd did not answer within the wait).
    async fn transient(
        &self,
        e: Error,
        backoff: &mut Duration,
        session: &Session,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        tracing::debug!(error = %e, retry_in = ?*backoff, "etcd failed while waiting; retrying");
        match bounded(tokio::time::sleep(*backoff), session, deadline).await {
            Cut::Done(()) => {
                *backoff = (*backoff * 2).min(Duration::from_millis(500));
                Ok(())
            }
            // The next step sees the ended session (its key is gone) and re-queues.
            Cut::SessionEnded => Ok(()),
            Cut::Deadline => Err(e),
        }
    }

    /// Opens a watch on `key` for deletions from the current revision; returns the stream and
    /// the revision the watch starts after.
    async fn open_watch(&self, key: &str) -> Result<(etcd_client::WatchStream, i64), Error> {
        let etcd = &self.inner.etcd;
        let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let open = async {
            let mut stream = etcd
                .call("watch", None, |c| {
                    let (mut watcher, opts) = (c.watch_client(), opts.clone());
                    async move { watcher.watch(key, Some(opts)).await }
                })
                .await?;
            loop {
                match stream.message().await {
                    Ok(Some(resp)) if resp.created() => {
                        let rev = resp.header().map_or(i64::MAX, |h| h.revision());
                        return Ok((stream, rev));
                    }
                    Ok(Some(resp)) if resp.canceled() => {
                        return Err(Error::backend(
                            format!("watch refused by etcd: {}", resp.cancel_reason()),
                            None,
                        ));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        return Err(Error::unavailable("watch: stream closed by etcd", None));
                    }
                    Err(e) => return Err(errors::map("watch", e)),
                }
            }
        };
        let started = Instant::now();
        match tokio::time::timeout(etcd.request_timeout, open).await {
            Ok(r) => r,
            Err(_) => Err(errors::no_reply("watch", started.elapsed())),
        }
    }
}

/// etcd's watch resync period: an unsynced watcher is served within it.
/// (A watcher registered just after a resync tick waits a whole period, plus the sync itself.)
const RESYNC_PERIOD: Duration = Duration::from_millis(120);

/// How one watch of the predecessor ended.
enum Woke {
    /// A deletion (or a cancellation by etcd): re-check.
    Event,
    /// A re-read found a different predecessor (already handled).
    Moved,
    /// The watch failed.
    Failed(Error),
}

/// How waiting for our turn ended.
enum Turn {
    /// Our key is the first: we own the lock.
    Owner,
    /// Our key or session is gone: queue again.
    Requeue,
    /// The caller's wait elapsed.
    Timeout,
}

/// A future cut short by the end of the session or the caller's deadline.
enum Cut<T> {
    Done(T),
    SessionEnded,
    Deadline,
}

async fn bounded<T>(
    fut: impl std::future::Future<Output = T>,
    session: &Session,
    deadline: Option<Instant>,
) -> Cut<T> {
    let until = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        v = fut => Cut::Done(v),
        _ = session.ended() => Cut::SessionEnded,
        () = until => Cut::Deadline,
    }
}

/// Waits on an open watch for a deletion (or a cancellation by etcd, e.g. a compaction: the
/// caller re-checks either way).
async fn wait_delete(stream: &mut etcd_client::WatchStream) -> Result<(), Error> {
    loop {
        match stream.message().await {
            Ok(Some(resp)) => {
                if resp.canceled() {
                    tracing::debug!(
                        reason = resp.cancel_reason(),
                        compact = resp.compact_revision(),
                        "watch cancelled by etcd"
                    );
                    return Ok(());
                }
                if resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(());
                }
            }
            Ok(None) => return Err(Error::unavailable("watch: stream closed by etcd", None)),
            Err(e) => return Err(errors::map("watch", e)),
        }
    }
}

#[async_trait]
impl Locker for EtcdLocker {
    async fn acquire(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        opts.validate()?;
        match self.lock(name, opts.wait, false).await? {
            Some(lease) => Ok(lease),
            None => Err(errors::unexpected("acquire", "no lease after waiting")),
        }
    }

    async fn try_acquire(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        self.lock(name, None, true).await
    }

    /// The TTL etcd grants this locker's session lease: the asked TTL rounded up to whole
    /// seconds, or etcd's minimum TTL (1.5 × its election timeout) when that is longer. Known
    /// from the first session grant on; before it, the asked TTL. Lease deadlines are always
    /// computed from the asked TTL (never later than the server's).
    fn ttl(&self) -> Duration {
        Duration::from_secs(self.inner.granted_ttl_secs.load(Ordering::Relaxed))
            .max(self.inner.cfg.ttl)
    }

    fn capabilities(&self) -> Capabilities {
        // etcd's lessor checks expiry every 500 ms; the waiter then needs a watch event and a
        // read.
        Capabilities::new(self.ttl())
            .with_fair_queue(true, true)
            .with_crash_release_slack(Duration::from_millis(1000))
    }

    fn stats(&self) -> Stats {
        let mut stats = self.inner.etcd.counters.snapshot();
        let driver = self.inner.driver_counters.snapshot();
        stats.renewals = driver.renewals;
        stats.renewal_failures = driver.renewal_failures;
        stats.losses = driver
            .losses
            .saturating_sub(self.inner.session_losses.load(Ordering::Relaxed));
        stats
    }
}
