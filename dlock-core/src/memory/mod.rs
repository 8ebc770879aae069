//! An in-process backend with the same semantics as the network backends.
//!
//! [`MemoryServer`] plays the server: one FIFO queue per name, TTL expiry on the monotonic
//! clock, a fencing counter per name. Any number of [`MemoryLocker`] clients share one server,
//! the way several processes share a Redis. It is the reference the conformance suite is proven
//! on, and a test double for code that takes an `Arc<dyn Locker>`.

mod election;
mod family;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use crate::options::validate_ttl;
use crate::sync::lock;
use crate::{
    AcquireOptions, Capabilities, CommonOptions, Counters, Error, FencingStrength, FencingToken,
    HolderState, Leader, Lease, LockBackend, LockName, LockState, LossReason, Primitives,
    RenewBackend, Renewal, RenewalDriver, Stats,
};

mod defect;
#[cfg(feature = "testing")]
pub use defect::{Defect, REPLY_DELAY};
#[cfg(not(feature = "testing"))]
use defect::{Defect, REPLY_DELAY};

/// How much earlier than the client's deadline [`Defect::LateLoss`] expires entries.
const LATE_LOSS: Duration = Duration::from_millis(50);

/// How a request holds a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Alone: a mutex, a leader, a read-write writer.
    Exclusive,
    /// Beside other shared holders: a read-write reader.
    Shared,
    /// One of this many permits.
    Permit(u32),
}

#[derive(Default)]
struct NameState {
    /// The exclusive holder.
    holder: Option<Holder>,
    /// Shared holders: readers, or semaphore permits.
    shared: Vec<Holder>,
    /// The semaphore's permit count while it has holders or permit waiters.
    permits: Option<u32>,
    queue: VecDeque<Waiter>,
    fence: u64,
    /// The last holder went without a release (expired or broken).
    lapsed: bool,
    /// Election observers of the name; each is told every grant and proclamation.
    observers: Vec<UnboundedSender<Leader>>,
    /// Changes announced so far (for [`Defect::ObserverSkips`]).
    announced: u64,
}

struct Holder {
    owner: u64,
    expires: Instant,
    token: FencingToken,
    /// The value the holder campaigned with or last proclaimed (empty for a plain lock).
    value: Vec<u8>,
}

struct Waiter {
    id: u64,
    wake: Arc<Notify>,
    mode: Mode,
}

/// The shared state that [`MemoryLocker`] clients lock against.
#[derive(Default)]
pub struct MemoryServer {
    names: Mutex<HashMap<String, NameState>>,
    ids: AtomicU64,
    /// Renewal requests fail ([`MemoryServer::fail_renewals`]).
    renewals_fail: AtomicBool,
}

impl std::fmt::Debug for MemoryServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryServer").finish_non_exhaustive()
    }
}

impl MemoryServer {
    /// A new, empty server.
    pub fn new() -> Arc<Self> {
        Arc::new(MemoryServer::default())
    }

    fn names(&self) -> MutexGuard<'_, HashMap<String, NameState>> {
        lock(&self.names)
    }

    /// Test hook (`testing` feature): expire the current holder of `name` now, as if its TTL ran out. The holder
    /// learns at its next renewal. Returns the token of the holder it expired, if there was one.
    #[cfg(feature = "testing")]
    pub fn expire_now(&self, name: &LockName) -> Option<FencingToken> {
        let mut names = self.names();
        let st = names.get_mut(name.as_str())?;
        let had = match st.holder.take() {
            Some(h) => Some(h.token),
            None if !st.shared.is_empty() => Some(st.shared.remove(0).token),
            None => None,
        };
        st.lapsed |= had.is_some();
        if let Some(w) = st.queue.front() {
            w.wake.notify_one();
        }
        had
    }

    /// Test hook (`testing` feature): while `on`, every renewal request fails as if the server
    /// did not answer (`Error::Unavailable`): failed rounds, then losses at the deadline.
    #[cfg(feature = "testing")]
    pub fn fail_renewals(&self, on: bool) {
        self.renewals_fail.store(on, Ordering::SeqCst);
    }

    /// Test hook (`testing` feature) for the conformance suite's server-side view: when the
    /// server expires the current holder of `name` (`None` when nobody holds it, or its TTL
    /// already ran out).
    #[cfg(feature = "testing")]
    pub fn holder_expiry(&self, name: &LockName) -> Option<Instant> {
        let now = Instant::now();
        let names = self.names();
        let h = names.get(name.as_str())?.holder.as_ref()?;
        (h.expires > now).then_some(h.expires)
    }

    /// Test hook (`testing` feature) for leak audits: every live entry (held name or queued waiter) whose name
    /// starts with `prefix`, as `"held:<name>"` or `"queued:<name>"`. Expired holders do not
    /// count.
    #[cfg(feature = "testing")]
    pub fn entries(&self, prefix: &str) -> Vec<String> {
        let now = Instant::now();
        let names = self.names();
        let mut out = Vec::new();
        for (name, st) in names.iter().filter(|(n, _)| n.starts_with(prefix)) {
            if st.holder.as_ref().is_some_and(|h| h.expires > now) {
                out.push(format!("held:{name}"));
            }
            out.extend(
                st.shared
                    .iter()
                    .filter(|h| h.expires > now)
                    .map(|_| format!("held:{name}")),
            );
            out.extend(st.queue.iter().map(|_| format!("queued:{name}")));
        }
        out.sort();
        out
    }
}

/// Builds a [`MemoryLocker`].
#[derive(Debug, Clone)]
pub struct MemoryLockerBuilder {
    ttl: Duration,
    server: Option<Arc<MemoryServer>>,
    defect: Option<Defect>,
    /// Only the metrics labels are read from it.
    metrics: CommonOptions,
}

impl MemoryLockerBuilder {
    /// The lease TTL (default 10 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The server to lock against (default: a new one of its own).
    pub fn server(mut self, server: Arc<MemoryServer>) -> Self {
        self.server = Some(server);
        self
    }

    /// The `tier` label on this locker's metrics (`metrics` feature), as every backend's
    /// builder has it: `[A-Za-z0-9._-]`, at most [`MAX_METRICS_TIER_LEN`](crate::MAX_METRICS_TIER_LEN)
    /// bytes; empty means none. Checked by `build`.
    pub fn metrics_tier(mut self, tier: impl Into<String>) -> Self {
        self.metrics.set_metrics_tier(tier);
        self
    }

    /// Label this locker's per-lock metrics with the lock's name, as `lock` (default off): a
    /// cardinality risk, every distinct name is a time series.
    pub fn metrics_lock_names(mut self, on: bool) -> Self {
        self.metrics.set_metrics_lock_names(on);
        self
    }

    /// Builds in a deliberate defect (`testing` feature; for checker tests only).
    #[cfg(feature = "testing")]
    pub fn defect(mut self, defect: Defect) -> Self {
        self.defect = Some(defect);
        self
    }

    /// Builds the locker.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a TTL outside [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL),
    /// or a bad `metrics_tier`.
    pub fn build(self) -> Result<MemoryLocker, Error> {
        let ttl = validate_ttl(self.ttl)?;
        if let Some(tier) = self.metrics.metrics_tier() {
            crate::validate_metrics_tier(tier)?;
        }
        let counters = Arc::new(Counters::labelled("memory", &self.metrics));
        let backend = Arc::new(Backend {
            server: self.server.unwrap_or_default(),
            ttl,
            defect: self.defect,
            counters: Arc::clone(&counters),
        });
        /// Lockers built with [`Defect::LossAtDeadlineSometimes`] so far.
        static SOMETIMES: AtomicU64 = AtomicU64::new(0);
        let at_deadline = match self.defect {
            Some(Defect::LossAtDeadline) => true,
            Some(Defect::LossAtDeadlineSometimes) => {
                SOMETIMES.fetch_add(1, Ordering::Relaxed).is_multiple_of(3)
            }
            _ => false,
        };
        let margin = if at_deadline {
            Duration::ZERO
        } else {
            crate::loss_margin(ttl)
        };
        let driver = RenewalDriver::with_loss_margin(
            Arc::clone(&backend),
            ttl,
            Arc::clone(&counters),
            margin,
            crate::Background::new(),
        );
        Ok(MemoryLocker {
            backend,
            driver,
            counters,
        })
    }
}

/// An in-process [`Locker`](crate::Locker): FIFO, herd-free, fenced, renewed by the shared driver.
///
/// Cloning is cheap: a clone shares the server, the renewal driver and the counters.
#[derive(Clone)]
pub struct MemoryLocker {
    backend: Arc<Backend>,
    driver: RenewalDriver<Backend>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for MemoryLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLocker")
            .field("ttl", &self.backend.ttl)
            .finish_non_exhaustive()
    }
}

impl MemoryLocker {
    /// A builder with a 10 s TTL and a server of its own.
    pub fn builder() -> MemoryLockerBuilder {
        MemoryLockerBuilder {
            ttl: Duration::from_secs(10),
            server: None,
            defect: None,
            metrics: CommonOptions::default(),
        }
    }

    /// The server this locker locks against.
    pub fn server(&self) -> &Arc<MemoryServer> {
        &self.backend.server
    }

    /// How many leases this locker's renewal driver keeps alive.
    pub fn renewing(&self) -> usize {
        self.driver.len()
    }
}

struct Backend {
    server: Arc<MemoryServer>,
    ttl: Duration,
    defect: Option<Defect>,
    counters: Arc<Counters>,
}

/// A held name at the memory server.
pub struct Entry {
    name: String,
    owner: u64,
}

impl Backend {
    fn server_ttl(&self) -> Duration {
        match self.defect {
            Some(Defect::EarlyExpiry) => self.ttl / 2,
            Some(Defect::LateLoss) => self
                .ttl
                .saturating_sub(crate::options::drift(self.ttl) + LATE_LOSS),
            Some(Defect::SlowExpiry) => self.ttl * 3,
            _ => self.ttl,
        }
    }

    /// The TTL a renewal re-arms at the server.
    fn renewed_ttl(&self) -> Duration {
        match self.defect {
            Some(Defect::RenewalFromReply) => self.server_ttl().saturating_sub(REPLY_DELAY),
            _ => self.server_ttl(),
        }
    }

    /// Tells `st`'s election observers that `leader` leads now (or proclaimed a new value).
    fn announce(&self, st: &mut NameState, leader: &Leader) {
        st.announced += 1;
        if self.defect == Some(Defect::ObserverSkips) && st.announced.is_multiple_of(2) {
            return;
        }
        st.observers.retain(|tx| tx.send(leader.clone()).is_ok());
    }

    /// Grants `name` to `owner` (with `value`) as an exclusive holder if it is free and `owner`
    /// may go next. Returns the token.
    fn try_grant(
        &self,
        st: &mut NameState,
        owner: u64,
        now: Instant,
        value: &[u8],
    ) -> Option<FencingToken> {
        self.try_grant_as(st, owner, now, value, Mode::Exclusive)
    }

    /// Drops holders whose TTL ran out.
    fn expire(st: &mut NameState, now: Instant) {
        if st.holder.as_ref().is_some_and(|h| h.expires <= now) {
            st.holder = None;
            st.lapsed = true;
        }
        let before = st.shared.len();
        st.shared.retain(|h| h.expires > now);
        if st.shared.len() < before {
            st.lapsed = true;
        }
    }

    /// Whether `owner` (queued at `pos`, or not queued yet: `None`) may be granted `mode` now.
    fn may_grant(&self, st: &NameState, owner: u64, pos: Option<usize>, mode: Mode) -> bool {
        let ahead = &st.queue.as_slices();
        let ahead: Vec<&Waiter> = ahead
            .0
            .iter()
            .chain(ahead.1.iter())
            .take(pos.unwrap_or(st.queue.len()))
            .collect();
        match mode {
            Mode::Exclusive => {
                let barge = self.defect == Some(Defect::DoubleGrant) && st.fence % 2 == 1;
                let readers_ok =
                    st.shared.is_empty() || self.defect == Some(Defect::WriterWithReaders);
                let free = st.holder.is_none() && readers_ok;
                let my_turn = match self.defect {
                    Some(Defect::Lifo) => st.queue.back().is_none_or(|w| w.id == owner),
                    _ => ahead.is_empty(),
                };
                barge || (free && my_turn)
            }
            Mode::Shared => {
                st.holder.is_none()
                    && (ahead.iter().all(|w| w.mode == Mode::Shared)
                        || self.defect == Some(Defect::ReadersBarge))
            }
            Mode::Permit(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                let cap = if self.defect == Some(Defect::SemaphoreOverflow) {
                    n + 1
                } else {
                    n
                };
                st.holder.is_none() && st.shared.len() < cap && ahead.len() < cap - st.shared.len()
            }
        }
    }

    /// Grants `name` to `owner` (with `value`) in `mode` if it may go now. Returns the token.
    fn try_grant_as(
        &self,
        st: &mut NameState,
        owner: u64,
        now: Instant,
        value: &[u8],
        mode: Mode,
    ) -> Option<FencingToken> {
        Self::expire(st, now);
        let pos = st.queue.iter().position(|w| w.id == owner);
        if !self.may_grant(st, owner, pos, mode) {
            return None;
        }
        st.queue.retain(|w| w.id != owner);
        let reuse = self.defect == Some(Defect::ReusedToken) && st.lapsed && st.fence > 0;
        if !reuse {
            st.fence += 1;
        }
        let lower = self.defect == Some(Defect::LowerTokenAfterLapse) && st.lapsed && st.fence > 2;
        st.lapsed = false;
        let token = FencingToken(if self.defect == Some(Defect::NoFencing) {
            1
        } else if lower {
            // The counter is still advanced: the next grant gets a fresh, higher token.
            st.fence - 2
        } else {
            st.fence
        });
        let holder = Holder {
            owner,
            expires: now + self.server_ttl(),
            token,
            value: value.to_vec(),
        };
        if mode == Mode::Exclusive {
            st.holder = Some(holder);
            let leader = Leader {
                term: token,
                value: value.to_vec(),
            };
            self.announce(st, &leader);
        } else {
            st.shared.push(holder);
        }
        // Shared requests queued behind this one may go too.
        self.wake_grantable(st);
        Some(token)
    }

    fn wake_next(&self, st: &NameState) {
        match self.defect {
            Some(Defect::WakeAll) => st.queue.iter().for_each(|w| w.wake.notify_one()),
            Some(Defect::WakeTwo) => st.queue.iter().take(2).for_each(|w| w.wake.notify_one()),
            Some(Defect::Lifo) => {
                if let Some(w) = st.queue.back() {
                    w.wake.notify_one();
                }
            }
            // The head (it checks again), and the shared requests right behind it that may
            // go as well.
            _ => {
                for (i, w) in st.queue.iter().enumerate() {
                    if i == 0
                        || (w.mode != Mode::Exclusive && self.may_grant(st, w.id, Some(i), w.mode))
                    {
                        w.wake.notify_one();
                    } else {
                        break;
                    }
                }
            }
        }
    }

    /// Wakes the queued requests that may be granted now (after a shared grant: the readers or
    /// permit holders right behind it).
    fn wake_grantable(&self, st: &NameState) {
        for (i, w) in st.queue.iter().enumerate() {
            if w.mode != Mode::Exclusive && self.may_grant(st, w.id, Some(i), w.mode) {
                w.wake.notify_one();
            } else {
                break;
            }
        }
    }
}

#[async_trait]
impl RenewBackend for Backend {
    type Entry = Entry;

    async fn renew(&self, entries: &[Arc<Entry>]) -> Result<Vec<Renewal>, Error> {
        self.counters.add_requests(1);
        if self.server.renewals_fail.load(Ordering::SeqCst) {
            return Err(Error::unavailable(
                "the memory server fails renewals (test hook)",
                None,
            ));
        }
        let now = Instant::now();
        let mut names = self.server.names();
        let verdicts: Vec<Renewal> = entries
            .iter()
            .map(|e| {
                let held = names.get_mut(&e.name).and_then(|st| {
                    st.holder
                        .iter_mut()
                        .chain(st.shared.iter_mut())
                        .find(|h| h.owner == e.owner)
                });
                match held {
                    Some(h) if h.expires > now => {
                        h.expires = now + self.renewed_ttl();
                        Renewal::Extended
                    }
                    _ => Renewal::Lost(LossReason::Gone(
                        "the name has another holder or none".into(),
                    )),
                }
            })
            .collect();
        let one_lost = verdicts.iter().any(|v| matches!(v, Renewal::Lost(_)));
        if self.defect == Some(Defect::BatchLoss) && one_lost {
            return Ok(entries
                .iter()
                .map(|_| Renewal::Lost(LossReason::Gone("another lease of the round".into())))
                .collect());
        }
        Ok(verdicts)
    }

    async fn release(&self, entry: &Entry) -> Result<(), Error> {
        self.counters.add_requests(1);
        let mut names = self.server.names();
        if let Some(st) = names.get_mut(&entry.name) {
            let ours = st.holder.as_ref().is_some_and(|h| h.owner == entry.owner);
            if ours || (self.defect == Some(Defect::UnguardedRelease) && st.holder.is_some()) {
                st.holder = None;
                st.lapsed = false;
                self.wake_next(st);
            } else if let Some(i) = st.shared.iter().position(|h| h.owner == entry.owner) {
                st.shared.remove(i);
                self.wake_next(st);
            }
            if st.holder.is_none()
                && st.shared.is_empty()
                && st.queue.is_empty()
                && st.fence == 0
                && st.observers.is_empty()
            {
                names.remove(&entry.name);
            }
        }
        Ok(())
    }
}

/// Removes a waiter's queue entry if its acquire is dropped or fails.
struct QueueGuard<'a> {
    backend: &'a Backend,
    name: &'a str,
    id: u64,
    armed: bool,
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if !self.armed || self.backend.defect == Some(Defect::CancelLeavesEntry) {
            return;
        }
        let mut names = self.backend.server.names();
        if let Some(st) = names.get_mut(self.name) {
            let was_head = st.queue.front().is_some_and(|w| w.id == self.id);
            st.queue.retain(|w| w.id != self.id);
            if was_head {
                self.backend.wake_next(st);
            } else {
                // A withdrawn writer may have been all that held back the readers behind it.
                self.backend.wake_grantable(st);
            }
        }
    }
}

impl MemoryLocker {
    /// Hands out an acquire's grant whose request started at `start` (defects may skew it).
    async fn deliver(
        &self,
        name: &LockName,
        token: FencingToken,
        owner: u64,
        start: Instant,
    ) -> Lease {
        match self.backend.defect {
            // Every other grant (odd tokens) is slow, so a slow holder's successor is fast.
            Some(Defect::DeadlineFromReply | Defect::StaleRegrant) if token.get() % 2 == 1 => {
                // The reply (or the retry that re-finds our own grant) comes REPLY_DELAY later;
                // the server's TTL still runs from `start`.
                tokio::time::sleep(REPLY_DELAY).await;
                self.grant(name, token, owner, Instant::now())
            }
            _ => self.grant(name, token, owner, start),
        }
    }

    fn grant(&self, name: &LockName, token: FencingToken, owner: u64, start: Instant) -> Lease {
        tracing::debug!(lock = %name, %token, "granted");
        self.driver.register(
            name.clone(),
            token,
            start,
            Entry {
                name: name.as_str().to_owned(),
                owner,
            },
        )
    }
}

/// Records `n` as the semaphore's permit count when nobody holds or waits for a permit of
/// it; otherwise `n` must be the recorded count.
fn agree_on_permits(st: &mut NameState, name: &LockName, n: u32) -> Result<(), Error> {
    let in_use =
        !st.shared.is_empty() || st.queue.iter().any(|w| matches!(w.mode, Mode::Permit(_)));
    match st.permits {
        Some(p) if in_use && p != n => Err(Error::InvalidOption {
            option: "permits",
            reason: format!("semaphore {name} has {p} permits; this acquire asked for {n}"),
        }),
        _ => {
            st.permits = Some(n);
            Ok(())
        }
    }
}

impl MemoryLocker {
    /// Acquires `name`, recording `value` as the holder's value; returns the lease and the
    /// owner id the server knows the holder by.
    async fn acquire_with(
        &self,
        name: &LockName,
        opts: AcquireOptions,
        value: &[u8],
        mode: Mode,
    ) -> Result<(Lease, u64), Error> {
        let began = Instant::now();
        let until = opts.wait.map(|w| began + w);
        let owner = self.backend.server.ids.fetch_add(1, Ordering::Relaxed) + 1;
        let wake = Arc::new(Notify::new());
        let b = &*self.backend;
        let first = {
            let start = Instant::now();
            self.counters.add_requests(1);
            let mut names = b.server.names();
            let st = names.entry(name.as_str().to_owned()).or_default();
            if let Mode::Permit(n) = mode {
                Backend::expire(st, start);
                agree_on_permits(st, name, n)?;
            }
            let granted = b.try_grant_as(st, owner, start, value, mode);
            if granted.is_none() {
                st.queue.push_back(Waiter {
                    id: owner,
                    wake: Arc::clone(&wake),
                    mode,
                });
            }
            granted.map(|token| (token, start))
        };
        if let Some((token, start)) = first {
            return Ok((self.deliver(name, token, owner, start).await, owner));
        }
        self.counters.add_waits(1);
        let mut guard = QueueGuard {
            backend: b,
            name: name.as_str(),
            id: owner,
            armed: true,
        };
        loop {
            // Sleep until notified, a holder's expiry (timer fallback), or our wait's end.
            let holder_expiry = {
                let names = b.server.names();
                names.get(name.as_str()).and_then(|st| {
                    st.holder
                        .iter()
                        .chain(st.shared.iter())
                        .map(|h| h.expires)
                        .min()
                })
            };
            let far = Instant::now() + Duration::from_secs(3600);
            let released = tokio::select! {
                () = wake.notified() => true,
                () = tokio::time::sleep_until(holder_expiry.unwrap_or(far)) => {
                    self.counters.add_timer_wakeups(1);
                    false
                }
                () = tokio::time::sleep_until(until.unwrap_or(far)) => {
                    self.counters.add_timer_wakeups(1);
                    false
                }
            };
            self.counters.add_wakeups(1);
            let start = Instant::now();
            self.counters.add_requests(1);
            let granted = {
                let mut names = b.server.names();
                let st = names.entry(name.as_str().to_owned()).or_default();
                if b.defect == Some(Defect::PagedQueueRead) {
                    self.counters.add_requests(st.queue.len().min(5) as u64);
                }
                b.try_grant_as(st, owner, start, value, mode)
            };
            if let Some(token) = granted {
                guard.armed = false;
                if released && b.defect == Some(Defect::HandoffFromWake) {
                    // The server's TTL runs from `start`; the handed-over grant counts from later.
                    tokio::time::sleep(REPLY_DELAY).await;
                    return Ok((self.grant(name, token, owner, Instant::now()), owner));
                }
                return Ok((self.deliver(name, token, owner, start).await, owner));
            }
            if until.is_some_and(|u| start >= u) {
                drop(guard);
                return Err(Error::Timeout {
                    waited: began.elapsed(),
                });
            }
        }
    }
}

#[async_trait]
impl LockBackend for MemoryLocker {
    fn closed(&self) -> bool {
        self.driver.is_closed()
    }

    async fn lock(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        Ok(self.acquire_with(name, opts, &[], Mode::Exclusive).await?.0)
    }

    async fn try_lock(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        let owner = self.backend.server.ids.fetch_add(1, Ordering::Relaxed) + 1;
        let start = Instant::now();
        self.counters.add_requests(1);
        let mut names = self.backend.server.names();
        let st = names.entry(name.as_str().to_owned()).or_default();
        match self.backend.try_grant(st, owner, start, &[]) {
            Some(token) => {
                drop(names);
                Ok(Some(self.grant(name, token, owner, start)))
            }
            None => Ok(None),
        }
    }

    async fn state(&self, name: &LockName) -> Result<LockState, Error> {
        self.counters.add_requests(1);
        let now = Instant::now();
        let names = self.backend.server.names();
        let Some(st) = names.get(name.as_str()) else {
            return Ok(LockState::new(None, Some(0)));
        };
        let holder = st
            .holder
            .iter()
            .chain(st.shared.iter())
            .find(|h| h.expires > now)
            .map(|h| {
                HolderState::new(
                    Some(h.token),
                    format!("memory:{}", h.owner),
                    String::from_utf8_lossy(&h.value),
                    Some(h.expires - now),
                )
            });
        let mut waiting = st.queue.len();
        if self.backend.defect == Some(Defect::InspectCountsHolder) && holder.is_some() {
            waiting += 1;
        }
        Ok(LockState::new(holder, Some(waiting)))
    }

    fn lease_ttl(&self) -> Duration {
        self.backend.ttl
    }

    /// Ends and releases every lease (see [`Locker::close`](crate::Locker::close)); the server stays up for others.
    async fn shutdown(&self) -> Result<(), Error> {
        if self.backend.defect == Some(Defect::CloseKeepsEntries) {
            self.driver.lose_all(&LossReason::Closed);
            return Ok(());
        }
        self.driver.close().await
    }

    fn guarantees(&self) -> Capabilities {
        Capabilities::new(self.backend.ttl)
            .with_fair_queue(true, self.backend.defect != Some(Defect::WakeAll))
            .with_fencing(FencingStrength::Linearizable)
            .with_crash_release_slack(Duration::from_millis(50))
            .with_primitives(Primitives::ALL)
    }

    fn counters(&self) -> Stats {
        self.counters.snapshot()
    }

    fn live_counters(&self) -> Option<&Counters> {
        Some(&self.counters)
    }

    fn election(self: Arc<Self>) -> Option<Arc<dyn crate::Election>> {
        Some(self)
    }

    fn rw(self: Arc<Self>) -> Option<Arc<dyn crate::RwLocker>> {
        Some(self)
    }

    fn semaphore(self: Arc<Self>) -> Option<Arc<dyn crate::Semaphore>> {
        Some(self)
    }
}
