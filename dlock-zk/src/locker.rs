//! The locker type, [`ZkLocker`], and its `LockBackend` impl: the mutex.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Counters, LockBackend};
use dlock_core::{
    AcquireOptions, Capabilities, Error, ErrorKind, FencingStrength, FencingToken, Lease, LockName,
    Primitives, Stats,
};
use tokio::sync::Mutex;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::builder::{Config, ZkLockerBuilder};
use crate::contend::{Contender, Outcome, Retry};
use crate::keys::{LOCK_MARKER, parent_path};
use crate::payload::node_payload;
use crate::renew::NodeEntry;
use crate::rule::Rule;
use crate::session::Session;

/// A distributed mutex on ZooKeeper, compatible with Curator's `InterProcessMutex`.
///
/// One locker is one ZooKeeper session. Each acquire creates an EPHEMERAL_SEQUENTIAL node
/// `<root>/<encoded name>/_c_<uuid>-lock-<seq>`; the lowest sequence holds the lock and every
/// other contender watches only its predecessor (a release wakes exactly one waiter, in FIFO
/// order). The fencing token is the node's `czxid`.
///
/// The lease TTL is the session timeout the server negotiated. All leases of the locker are
/// renewed together with one request per TTL/3; if the session ends every lease is lost at once,
/// and if the connection is cut the leases are lost at their deadline (send time of the last
/// answered request + negotiated timeout − drift) unless the client reconnects in time. After a
/// session ends, the next acquire opens a new session transparently. Cloning is cheap: a
/// clone shares the session and its leases.
///
/// The locker is also a [`dlock_core::Election`] on the same queue machinery, with nodes laid
/// out as Curator's `LeaderLatch` lays them out (`_c_<uuid>-latch-<seq>`, holding the value);
/// see the crate documentation's "Election" section. It is a [`dlock_core::RwLocker`]
/// (Curator's `InterProcessReadWriteLock` layout: `__READ__` and `__WRIT__` nodes in one
/// queue) and a [`dlock_core::Semaphore`] (`InterProcessSemaphoreV2`'s: a `locks` mutex
/// guarding acquisition, `leases` holding the permits), on the same machinery; see the crate
/// documentation's "Read-write lock and semaphore" section.
///
/// ```no_run
/// use std::time::Duration;
/// use dlock_core::{AcquireOptions, LockName, Locker};
/// use dlock_zk::ZkLocker;
/// # async fn demo() -> Result<(), dlock_core::Error> {
/// let locker = ZkLocker::builder()
///     .connect_string("127.0.0.1:2181")
///     .ttl(Duration::from_secs(6))
///     .build()
///     .await?;
/// let name = LockName::new("orders/42")?;
/// let lease = locker.acquire(&name, AcquireOptions::wait(Duration::from_secs(5))).await?;
/// // Pass lease.token() to the protected resource; stop when lease.lost() resolves.
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkLocker {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: Config,
    counters: Arc<Counters>,
    acls: zk::Acls<'static>,
    no_container: Arc<AtomicBool>,
    /// Set by [`Locker::close`](dlock_core::Locker::close): no session is opened or used again.
    closed: AtomicBool,
    /// The current session; replaced after it ends.
    slot: Mutex<Option<Arc<Session>>>,
    /// A copy of the current session for the fast path.
    current: StdMutex<Option<Arc<Session>>>,
    negotiated_ms: AtomicU64,
    /// This locker's id, written into its lock nodes.
    locker_id: String,
    /// The data of every lock node this locker creates.
    payload: Arc<[u8]>,
}

impl std::fmt::Debug for ZkLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLocker")
            .field("config", &self.inner.cfg)
            .field("negotiated_timeout", &self.negotiated_timeout())
            .finish()
    }
}

impl ZkLocker {
    /// A builder with the defaults (TTL 10 s, root `/dlock`, open ACL); give it the ensemble
    /// with [`connect_string`](ZkLockerBuilder::connect_string).
    pub fn builder() -> ZkLockerBuilder {
        ZkLockerBuilder::default()
    }

    pub(crate) async fn open(cfg: Config) -> Result<Self, Error> {
        let counters = Arc::new(Counters::labelled("zk", &cfg.common));
        let session = Session::open(&cfg, Arc::clone(&counters)).await?;
        let negotiated = duration_ms(session.timeout);
        let locker_id = uuid::Uuid::new_v4().to_string();
        let payload = Arc::from(node_payload(&locker_id));
        Ok(ZkLocker {
            inner: Arc::new(Inner {
                acls: cfg.acl.acls(),
                cfg,
                counters,
                no_container: Arc::new(AtomicBool::new(false)),
                closed: AtomicBool::new(false),
                current: StdMutex::new(Some(Arc::clone(&session))),
                slot: Mutex::new(Some(session)),
                negotiated_ms: AtomicU64::new(negotiated),
                locker_id,
                payload,
            }),
        })
    }

    /// The session timeout the server granted (the lease TTL), as of the latest session.
    pub fn negotiated_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.negotiated_ms.load(Ordering::Relaxed))
    }

    /// The session timeout this locker asked for.
    pub fn requested_timeout(&self) -> Duration {
        self.inner.cfg.ttl
    }

    /// This locker's id (a random UUID chosen when it was built), written into every lock node
    /// it creates as `host=<host> pid=<process id> locker=<id>` so operators can tell which
    /// process holds or waits for a lock.
    pub fn locker_id(&self) -> &str {
        &self.inner.locker_id
    }

    /// The id of the current ZooKeeper session (`None` when it ended and no new one is open yet).
    pub fn session_id(&self) -> Option<i64> {
        self.current().filter(|s| !s.is_ended()).map(|s| s.id)
    }

    /// The znode under which this locker keeps the nodes of lock `name`.
    pub fn lock_path(&self, name: &LockName) -> String {
        parent_path(&self.inner.cfg.base, &name.encoded())
    }

    /// For tests and fault drills: the current session's id and password, so a test can take
    /// the session over from another connection and close it (the way to end a session from the
    /// server side). Only with the `testing` feature; not a stable API.
    #[cfg(feature = "testing")]
    pub fn session_info_for_test(&self) -> Option<zk::SessionInfo> {
        self.current().map(|s| s.client.session().clone())
    }

    /// For tests: runs the protected-create recovery (what an acquire does when a create's reply
    /// is lost) for lock `name` and protection uuid `uuid`. Returns the node adopted (path,
    /// czxid) — only one owned by the CURRENT session; a node with that uuid owned by another
    /// session is deleted. Only with the `testing` feature; not a stable API.
    ///
    /// # Errors
    /// As [`Locker::acquire`](dlock_core::Locker::acquire).
    #[cfg(feature = "testing")]
    pub async fn recover_protected_for_test(
        &self,
        name: &LockName,
        uuid: &str,
    ) -> Result<Option<(String, i64)>, Error> {
        let sess = self.session().await?;
        let mut c = Contender::new(
            sess,
            self.lock_path(name),
            self.inner.acls,
            Arc::clone(&self.inner.no_container),
            Arc::clone(&self.inner.payload),
            Rule::First(LOCK_MARKER),
        );
        match c.recover_for_test(uuid.to_owned()).await {
            Ok(found) => Ok(found),
            Err(Retry::Fatal(e)) => Err(e),
            Err(other) => Err(Error::unavailable(
                format!("recovery interrupted: {other:?}"),
                None,
            )),
        }
    }

    /// Whether [`Locker::close`](dlock_core::Locker::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    fn current(&self) -> Option<Arc<Session>> {
        self.inner
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The live session, opening a new one if the last ended.
    pub(crate) async fn session(&self) -> Result<Arc<Session>, Error> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(s) = self.current()
            && !s.is_ended()
        {
            return Ok(s);
        }
        let mut slot = self.inner.slot.lock().await;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(s) = slot.as_ref()
            && !s.is_ended()
        {
            return Ok(Arc::clone(s));
        }
        let s = Session::open(&self.inner.cfg, Arc::clone(&self.inner.counters)).await?;
        self.inner
            .negotiated_ms
            .store(duration_ms(s.timeout), Ordering::Relaxed);
        *slot = Some(Arc::clone(&s));
        *self.inner.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&s));
        Ok(s)
    }

    /// One mutex acquire: [`ZkLocker::contend`] with `lock-` nodes holding the locker's payload.
    async fn attempt(
        &self,
        name: &LockName,
        wait: Option<Duration>,
        single: bool,
    ) -> Result<Option<Lease>, Error> {
        let queue = Queue {
            rule: Rule::First(LOCK_MARKER),
            payload: self.payload(),
            under: None,
        };
        Ok(self
            .contend(name, wait, single, queue)
            .await?
            .map(|grant| grant.lease))
    }

    /// The data of every node this locker creates (see `payload`).
    pub(crate) fn payload(&self) -> Arc<[u8]> {
        Arc::clone(&self.inner.payload)
    }

    /// Queues in `name`'s parent (or its child `queue.under`) with a node of `queue`'s kind
    /// and waits for its turn (or, with `single`, checks once). The machinery of the mutex,
    /// the election, the read-write lock and the semaphore.
    ///
    /// # Cancel safety
    /// Dropping the future removes our node in the background.
    #[tracing::instrument(level = "debug", name = "zk.acquire", skip(self, name, queue), fields(lock = %name))]
    pub(crate) async fn contend(
        &self,
        name: &LockName,
        wait: Option<Duration>,
        single: bool,
        queue: Queue,
    ) -> Result<Option<Grant>, Error> {
        let began = Instant::now();
        let deadline = wait.map(|w| began + w);
        let parent = match queue.under {
            Some(child) => format!("{}/{child}", self.lock_path(name)),
            None => self.lock_path(name),
        };
        let mut restarts: u32 = 0;
        let mut open_backoff = Duration::from_millis(20);
        loop {
            let sess = match within(deadline, self.session()).await {
                Some(Ok(s)) => s,
                // A new session could not be opened (no answer within a connect): try again
                // while the wait lasts; a try_acquire or an acquire without a deadline reports
                // it (an acquire forever would otherwise hang on a wrong address).
                Some(Err(e))
                    if e.kind() == ErrorKind::Unavailable
                        && !single
                        && deadline.is_some_and(|d| Instant::now() + open_backoff < d) =>
                {
                    tracing::debug!(lock = %name, error = %e, retry_in = ?open_backoff, "opening a ZooKeeper session failed; retrying within the wait");
                    tokio::time::sleep(open_backoff).await;
                    open_backoff = (open_backoff * 2).min(Duration::from_millis(500));
                    continue;
                }
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(Error::unavailable(
                        format!(
                            "no ZooKeeper session could be opened within {:?}",
                            began.elapsed()
                        ),
                        None,
                    ));
                }
            };
            let mut contender = Contender::new(
                Arc::clone(&sess),
                parent.clone(),
                self.inner.acls,
                Arc::clone(&self.inner.no_container),
                Arc::clone(&queue.payload),
                queue.rule,
            );
            let outcome = match within(deadline, contender.run(single)).await {
                // A proof counts from its send time less this process's stalls before it.
                Some(Ok(Outcome::Granted { path, czxid, proof })) => Some(Ok(Outcome::Granted {
                    path,
                    czxid,
                    proof: sess.proven_from(proof),
                })),
                other => other,
            };
            let retry = match outcome {
                Some(Ok(Outcome::Granted { path, proof, .. }))
                    if sess.driver.deadline_from(proof) <= Instant::now() =>
                {
                    // The answer took longer than the lease would last: never hand out a lease
                    // that is already past its deadline. Start over.
                    tracing::warn!(lock = %name, node = %path, "grant arrived after its own deadline; retrying");
                    Retry::LateGrant
                }
                Some(Ok(Outcome::Granted { path, .. })) if sess.is_ended() => {
                    // The session was retired while we waited (its timeout was lowered): its
                    // driver's deadlines are not safe any more. Remove the node, start over.
                    tracing::info!(lock = %name, node = %path, "granted on a retired session; retrying");
                    Retry::SessionEnded("retired".into())
                }
                Some(Ok(Outcome::Granted { path, czxid, proof })) => {
                    contender.disarm();
                    let token = FencingToken(u64::try_from(czxid).unwrap_or_default());
                    tracing::debug!(lock = %name, %token, node = %path, waited = ?began.elapsed(), "granted");
                    let lease = sess.driver.register(
                        name.clone(),
                        token,
                        proof,
                        NodeEntry {
                            path: path.clone(),
                            czxid,
                        },
                    );
                    if sess.is_ended() {
                        // Retired between the check above and the registration.
                        if let Err(e) = lease.release().await {
                            tracing::debug!(lock = %name, error = %e, "releasing a grant of a retired session");
                        }
                        Retry::SessionEnded("retired".into())
                    } else {
                        return Ok(Some(Grant {
                            lease,
                            path,
                            czxid,
                            session: sess,
                        }));
                    }
                }
                Some(Ok(Outcome::Busy)) => {
                    contender.remove_now().await;
                    return Ok(None);
                }
                None => {
                    contender.remove_now().await;
                    let waited = began.elapsed();
                    // Unavailable when the ensemble was out of reach for much of the wait (or a
                    // single attempt could not complete); a passing reconnect is still a timeout.
                    if single || sess.down_for() >= waited / 2 {
                        return Err(Error::unavailable(
                            format!(
                                "ZooKeeper did not answer within {waited:?} (session {:#x}, connected: {})",
                                sess.id,
                                sess.is_connected()
                            ),
                            None,
                        ));
                    }
                    return Err(Error::Timeout { waited });
                }
                Some(Err(Retry::Fatal(e))) => {
                    contender.remove_now().await;
                    return Err(e);
                }
                Some(Err(retry)) => retry,
            };
            contender.remove_now().await;
            drop(contender);
            restarts += 1;
            tracing::info!(lock = %name, ?retry, restarts, "starting the acquire over");
            if single && restarts >= 3 {
                return Err(Error::unavailable(
                    format!("ZooKeeper attempt kept failing: {retry:?}"),
                    None,
                ));
            }
            let pause = Duration::from_millis(20).saturating_mul(restarts.min(25));
            if let Some(d) = deadline
                && Instant::now() + pause >= d
            {
                return Err(Error::Timeout {
                    waited: began.elapsed(),
                });
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// What kind of node a contender queues with.
pub(crate) struct Queue {
    /// The primitive (node-name marker, order, grant rule; see `rule`).
    pub(crate) rule: Rule,
    /// The node's data.
    pub(crate) payload: Arc<[u8]>,
    /// The child of the lock's parent to queue in (a semaphore's `locks` or `leases`), or
    /// `None` for the parent itself.
    pub(crate) under: Option<&'static str>,
}

/// A granted contention: the lease, and the node and session it rests on.
pub(crate) struct Grant {
    pub(crate) lease: Lease,
    /// Our node's full path.
    pub(crate) path: String,
    /// Our node's czxid (the lease's fencing token).
    pub(crate) czxid: i64,
    /// The session that owns the node.
    pub(crate) session: Arc<Session>,
}

/// Runs `fut` until `deadline` (if any); `None` when the deadline passed first.
async fn within<F: std::future::Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
        None => Some(fut.await),
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[async_trait]
impl LockBackend for ZkLocker {
    fn closed(&self) -> bool {
        self.is_closed()
    }

    fn live_counters(&self) -> Option<&Counters> {
        Some(&self.inner.counters)
    }

    /// Queues for the lock and waits for its turn.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a bad wait (before any I/O); [`Error::Timeout`] when the wait
    /// elapses (our node is removed first); [`Error::Unavailable`] when no server could be
    /// reached during the wait; [`Error::Backend`] when the server refuses (e.g. ACLs).
    ///
    /// # Cancel safety
    /// Dropping the future removes our node in the background (retried until it is gone or the
    /// session ends).
    async fn lock(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        match self.attempt(name, opts.wait, false).await? {
            Some(lease) => Ok(lease),
            None => Err(Error::backend(
                "ZooKeeper acquire ended without a grant",
                None,
            )),
        }
    }

    /// Creates a node and checks once; if it is not the lowest, deletes it and returns `None`.
    ///
    /// # Errors
    /// As [`Locker::acquire`](dlock_core::Locker::acquire), without `Timeout`: when the ensemble does not answer within
    /// twice the negotiated session timeout, [`Error::Unavailable`].
    ///
    /// # Cancel safety
    /// As [`Locker::acquire`](dlock_core::Locker::acquire).
    async fn try_lock(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        // One attempt, bounded (twice the session timeout, room for a reconnect) when the
        // ensemble does not answer.
        self.attempt(name, Some(self.negotiated_timeout() * 2), true)
            .await
    }

    /// Who holds the mutex `name` (the first node of its queue) and how many wait behind it:
    /// a synced listing, then the holder node's data and stat (its token is the node's czxid).
    /// `expires_within` is `None`: a holder lasts as long as its session, whose expiry only
    /// the ensemble's leader knows.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`Locker::close`](dlock_core::Locker::close); [`Error::Unavailable`] when the ensemble
    /// cannot be reached; [`Error::Backend`] when the server refuses.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    async fn state(&self, name: &LockName) -> Result<dlock_core::LockState, Error> {
        self.inspect_mutex(name).await
    }

    fn lease_ttl(&self) -> Duration {
        self.negotiated_timeout()
    }

    /// Ends every lease and deletes its node (by its own path, all at once), and lets the
    /// session go: the client library sends `closeSession` once nothing uses the session any
    /// more (a waiter still in flight, or the state watcher within a third of the timeout).
    async fn shutdown(&self) -> Result<(), Error> {
        self.inner.closed.store(true, Ordering::Release);
        let session = self.inner.slot.lock().await.take();
        self.inner
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match session {
            Some(s) => s.driver.close().await,
            None => Ok(()),
        }
    }

    fn guarantees(&self) -> Capabilities {
        let ttl = self.negotiated_timeout();
        // The server expires sessions on tick boundaries (tickTime <= timeout / 2), after the
        // last packet it received; allow for that plus the watch notification.
        Capabilities::new(ttl)
            .with_fair_queue(true, true)
            .with_fencing(FencingStrength::Linearizable)
            .with_crash_release_slack(ttl / 2 + Duration::from_millis(300))
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
