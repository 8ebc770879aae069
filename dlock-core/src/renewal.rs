//! The renewal driver shared by every backend: one task per locker keeps every held lease alive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lease::{LeaseCell, LeaseControl};
use crate::options::{drift, loss_margin};
use crate::sync::lock;
use crate::{Background, Counters, Error, FencingToken, Lease, LockName, LossReason};

/// The outcome of renewing one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// The server extended the lease by the full TTL, counted from the request's start.
    Extended,
    /// The server extended the lease, but the backend can prove it kept only until this
    /// instant (this process's monotonic clock, drift not yet taken off): the deadline moves
    /// to the earlier of the request's start + TTL and this bound, less the drift, and never
    /// back. The driver renews the lease again well before that deadline. For a backend whose
    /// proof can be shorter than the TTL after a stall of its own process (ZooKeeper: the
    /// leader may have last heard of the session long before the request).
    ExtendedUntil(Instant),
    /// The server says the lease is no longer ours.
    Lost(LossReason),
    /// Not decided this round (e.g. a Redlock lease short of a majority, one session of
    /// several that did not answer): the lease keeps its current deadline and the driver
    /// retries it soon, within its remaining validity.
    Retry,
}

/// What a backend does for the renewal driver.
///
/// `Entry` identifies one held lock at the server (e.g. key and owner value, or a node path).
#[async_trait]
pub trait RenewBackend: Send + Sync + 'static {
    /// One held lock, as the backend needs it to renew and release.
    type Entry: Send + Sync + 'static;

    /// Extends every listed lease by the TTL, in as few round trips as the backend allows
    /// (one, ideally). Returns one [`Renewal`] per entry, in order: a lease the call could not
    /// decide is [`Renewal::Retry`], and only it is retried.
    ///
    /// The driver may call `renew` again while a call is still awaited, never with a lease
    /// that is part of a call in flight (e.g. a lease granted with little validity left is
    /// renewed at once, while a slow round for the others goes on). A call may be abandoned
    /// (dropped) when it runs out of the leases' validity.
    ///
    /// # Errors
    /// Any error means the attempt failed as a whole and may be retried; the driver retries
    /// with backoff inside the leases' remaining validity. A panic counts as such a failure.
    async fn renew(&self, entries: &[Arc<Self::Entry>]) -> Result<Vec<Renewal>, Error>;

    /// Whether a `renew` call that is slow may be given up for a retry (the default): a round
    /// then runs for three quarters of the leases' remaining validity (at least TTL/3), leaving the
    /// rest for a retry that may take another path (another connection, another member).
    ///
    /// A backend whose retry can only queue behind the slow call (one connection answering
    /// requests in order, where a lost connection fails the call at once) returns `false`: its
    /// rounds then run until the leases' deadline, so a reply that is slow but in time still
    /// renews them.
    fn abandon_slow_rounds(&self) -> bool {
        true
    }

    /// Whether `entry` is the backend's own bookkeeping rather than a user's lock (e.g. a
    /// session's sentinel that keeps the session renewed while its locker only waits). Such a
    /// lease is renewed and lost like any other, but [`Stats`](crate::Stats) counts neither its
    /// grant nor its loss. The default: every entry is a user's lock.
    fn is_internal(&self, _entry: &Self::Entry) -> bool {
        false
    }

    /// Deletes one lease's server entry, guarded so that it never deletes another holder's.
    /// Deleting an entry that is already gone succeeds.
    ///
    /// # Errors
    /// The backend's error when the delete could not be confirmed.
    async fn release(&self, entry: &Self::Entry) -> Result<(), Error>;
}

mod task;

struct Registered<E> {
    cell: Arc<LeaseCell>,
    entry: Arc<E>,
    renewing: bool,
    /// Renew no later than this, even before the next regular round: a grant with little
    /// validity left, a lease left undecided, a lease whose last round failed.
    urgent: Option<Instant>,
    /// Part of a round whose reply is still awaited.
    in_flight: bool,
}

struct Shared<B: RenewBackend> {
    backend: Arc<B>,
    ttl: Duration,
    /// How long before its deadline a lease that was not extended counts as lost.
    margin: Duration,
    counters: Arc<Counters>,
    leases: Mutex<HashMap<u64, Registered<B::Entry>>>,
    next_id: AtomicU64,
    wake: Arc<Notify>,
    /// When the task plans its next wake-up (`None`: idle or not sleeping). A new lease wakes
    /// the task only when it needs a round before then.
    planned: Mutex<Option<Instant>>,
    /// Whether the task runs; a dead one is restarted by the next registration.
    task: Mutex<TaskSlot>,
    /// Set by [`RenewalDriver::close`]: later grants are handed out lost and released.
    closed: AtomicBool,
    /// The locker's background deletes; `close` waits for them.
    background: Background,
}

#[derive(Default)]
struct TaskSlot {
    /// Tasks spawned so far; identifies the current one.
    generation: u64,
    running: bool,
}

impl<B: RenewBackend> Shared<B> {
    fn leases(&self) -> MutexGuard<'_, HashMap<u64, Registered<B::Entry>>> {
        lock(&self.leases)
    }
}

/// Keeps every lease of one locker alive with ONE background task, renewing all of them in one
/// backend call every TTL/3.
///
/// Each lease's deadline is `start of the last successful renewal request + TTL − drift`
/// (drift = TTL·0.01 + 2 ms). A lease with less than TTL/3 of validity left is renewed at
/// once; a lease a round left undecided ([`Renewal::Retry`]) or whose round failed is retried
/// alone, soon, inside its remaining validity, while the others keep the regular cadence. A
/// lease whose deadline passes is lost, and its [`Lease::lost`] fires no later than the deadline
/// (the lease's own timer guarantees it even if the driver is late or dead).
///
/// The task is supervised: a backend whose `renew` panics fails that round only, and a task
/// that died (its runtime shut down, or it panicked) is restarted by the next
/// [`RenewalDriver::register`], counted in [`Stats::driver_restarts`](crate::Stats::driver_restarts).
pub struct RenewalDriver<B: RenewBackend> {
    shared: Arc<Shared<B>>,
}

impl<B: RenewBackend> Clone for RenewalDriver<B> {
    fn clone(&self) -> Self {
        RenewalDriver {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B: RenewBackend> RenewalDriver<B> {
    /// A driver for leases of `ttl`, renewed through `backend`, counting into `counters`.
    pub fn new(backend: Arc<B>, ttl: Duration, counters: Arc<Counters>) -> Self {
        Self::with_background(backend, ttl, counters, Background::new())
    }

    /// [`RenewalDriver::new`] sharing `background` with the backend: the backend's own
    /// background deletes (a cancelled acquire's withdrawal) are spawned there, and
    /// [`close`](Self::close) waits for them as for the driver's.
    pub fn with_background(
        backend: Arc<B>,
        ttl: Duration,
        counters: Arc<Counters>,
        background: Background,
    ) -> Self {
        Self::with_loss_margin(backend, ttl, counters, loss_margin(ttl), background)
    }

    /// [`RenewalDriver::new`] with another loss margin (the memory backend's
    /// `LossAtDeadline` defect).
    pub(crate) fn with_loss_margin(
        backend: Arc<B>,
        ttl: Duration,
        counters: Arc<Counters>,
        margin: Duration,
        background: Background,
    ) -> Self {
        RenewalDriver {
            shared: Arc::new(Shared {
                backend,
                ttl,
                margin,
                counters,
                leases: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                wake: Arc::new(Notify::new()),
                planned: Mutex::new(None),
                task: Mutex::new(TaskSlot::default()),
                closed: AtomicBool::new(false),
                background,
            }),
        }
    }

    /// The locker's background work (shared with the backend when built
    /// [`with_background`](Self::with_background)): spawn a cancelled acquire's withdrawal here
    /// so that [`close`](Self::close) waits for it.
    pub fn background(&self) -> &Background {
        &self.shared.background
    }

    /// The TTL of this driver's leases.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The deadline of a grant whose request started at `start`.
    pub fn deadline_from(&self, start: Instant) -> Instant {
        start + self.shared.ttl.saturating_sub(drift(self.shared.ttl))
    }

    /// Hands out a lease for a grant whose request was SENT at `start`, and renews it from now
    /// on. Counts a grant.
    ///
    /// Call it inside a tokio runtime: the driver's task runs there, and is (re)started there
    /// if it is not running. Called outside any runtime, the lease is handed out but not
    /// renewed until a later registration inside a runtime starts the task (logged as an
    /// error).
    pub fn register(
        &self,
        name: LockName,
        token: FencingToken,
        start: Instant,
        entry: B::Entry,
    ) -> Lease {
        // A grant is a renewal that happened at `start`: the first renewal is due a third of
        // the TTL after it, like every later one, whatever the driver's plans. Counting from
        // the reply instead left a grant slowed by a busy server (a long queue of the session's
        // writes) a single round of TTL/3 before its deadline, and a round as slow as that
        // grant lost it.
        let due = start + self.shared.ttl / 3;
        self.register_renewing_at(name, token, start, due, entry)
    }

    /// As [`register`](Self::register), with the first renewal due at `due` instead of TTL/3
    /// after `start`: for a grant whose deadline leaves less than a TTL for reasons of its own
    /// (a lock a release handed over, capped at the waiter's queue entry), so that it is not
    /// renewed at once, and a short hold costs no renewal at all. `due` should leave the
    /// renewal at least two thirds of the validity left.
    pub fn register_renewing_at(
        &self,
        name: LockName,
        token: FencingToken,
        start: Instant,
        due: Instant,
        entry: B::Entry,
    ) -> Lease {
        let deadline = self.deadline_from(start);
        // lost() aims a margin before the deadline: its timer may fire late.
        let entry = Arc::new(entry);
        // An internal lease counts neither its grant nor its loss.
        let counted = !self.shared.backend.is_internal(&entry);
        let cell = LeaseCell::new(
            name,
            token,
            deadline,
            self.shared.margin,
            Some(self.shared.ttl),
            counted.then(|| Arc::clone(&self.shared.counters)),
        );
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let control = |entry| {
            Arc::new(DriverLease {
                shared: Arc::clone(&self.shared),
                id,
                entry,
            })
        };
        if self.is_closed() {
            // Granted to a request in flight when the locker closed: never renewed, its entry
            // deleted now.
            cell.mark_lost(LossReason::Closed);
            let ctl = control(entry);
            ctl.release_detached(Arc::clone(&cell), Handle::try_current().ok());
            return Lease::from_parts(cell, ctl);
        }
        self.shared.leases().insert(
            id,
            Registered {
                cell: Arc::clone(&cell),
                entry: Arc::clone(&entry),
                renewing: true,
                urgent: Some(due),
                in_flight: false,
            },
        );
        if counted {
            self.shared.counters.add_grants(1);
        }
        tracing::debug!(lock = %cell.name, token = %cell.token, "lease granted");
        self.ensure_task();
        let planned = *lock(&self.shared.planned);
        if planned.is_none_or(|p| due < p) {
            self.shared.wake.notify_one();
        }
        Lease::from_parts(cell, control(entry))
    }

    /// How many leases the driver renews now.
    pub fn len(&self) -> usize {
        self.shared.leases().len()
    }

    /// Whether the driver renews no lease now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Declares every lease whose entry matches `pred` lost (e.g. the session they belong to
    /// ended), and stops renewing them.
    pub fn lose_where(&self, reason: &LossReason, mut pred: impl FnMut(&B::Entry) -> bool) {
        let lost: Vec<_> = {
            let mut leases = self.shared.leases();
            let ids: Vec<u64> = leases
                .iter()
                .filter(|(_, r)| pred(&r.entry))
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| leases.remove(&id))
                .collect()
        };
        for r in lost {
            r.cell.mark_lost(reason.clone());
        }
    }

    /// Declares every lease lost.
    pub fn lose_all(&self, reason: &LossReason) {
        self.lose_where(reason, |_| true);
    }

    /// Closes the driver: every lease is declared lost with [`LossReason::Closed`] at once
    /// (renewal stops, `lost()` resolves), then every lease's server entry is deleted, all
    /// deletes at once, and the [`background`](Self::background) work still running (the
    /// deletes of dropped leases, cancelled acquires' withdrawals) is waited for, at most one
    /// TTL (an entry not deleted by then expires on its own). A lease registered later is
    /// handed out already lost and its entry deleted in the background.
    ///
    /// # Errors
    /// The first failed delete (every delete is tried; an entry not deleted expires at its
    /// TTL). A failed background delete is logged, not returned.
    ///
    /// # Cancel safety
    /// The driver is closed and every lease lost as soon as the future is first polled;
    /// dropping it abandons the deletes not yet done (those entries expire at their TTL) and
    /// stops waiting for the background work, which goes on.
    pub async fn close(&self) -> Result<(), Error> {
        self.shared.closed.store(true, Ordering::Release);
        let closed: Vec<_> = self.shared.leases().drain().map(|(_, r)| r).collect();
        for r in &closed {
            r.cell.mark_lost(LossReason::Closed);
        }
        let backend = &self.shared.backend;
        let background = &self.shared.background;
        let (results, drained) = futures::future::join(
            futures::future::join_all(closed.iter().map(|r| backend.release(&r.entry))),
            tokio::time::timeout(self.shared.ttl, background.drain()),
        )
        .await;
        if drained.is_err() {
            tracing::warn!(
                unfinished = background.len(),
                "close: background deletes still running after a TTL; their entries expire on their own"
            );
        }
        results.into_iter().collect::<Result<Vec<()>, Error>>()?;
        Ok(())
    }

    /// Whether [`RenewalDriver::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Starts the task on the current runtime unless it runs; restarts it if it died.
    fn ensure_task(&self) {
        let mut slot = lock(&self.shared.task);
        if slot.running {
            return;
        }
        let Ok(runtime) = Handle::try_current() else {
            tracing::error!(
                "renewal driver used outside a tokio runtime; its leases are not renewed until a lease is registered inside one"
            );
            return;
        };
        let restart = slot.generation > 0;
        slot.generation += 1;
        slot.running = true;
        let generation = slot.generation;
        drop(slot);
        if restart {
            // The dead task's rounds died with it: their leases are renewable again.
            let held = {
                let mut leases = self.shared.leases();
                for r in leases.values_mut() {
                    r.in_flight = false;
                }
                leases.len()
            };
            self.shared.counters.add_driver_restarts(1);
            tracing::warn!(
                generation,
                leases = held,
                "renewal driver was not running; restarted"
            );
        }
        // The guard is moved into the task, so it runs even if the task is never polled
        // (spawned on a runtime that is shutting down).
        let guard = task::Alive::new(Arc::downgrade(&self.shared), generation);
        runtime.spawn(task::run(Arc::downgrade(&self.shared), guard));
    }
}

/// The [`LeaseControl`] of one driver-managed lease.
struct DriverLease<B: RenewBackend> {
    shared: Arc<Shared<B>>,
    id: u64,
    entry: Arc<B::Entry>,
}

impl<B: RenewBackend> DriverLease<B> {
    /// Stops renewal and marks the lease released; returns whether it was still registered.
    fn unregister(&self, cell: &LeaseCell) {
        self.shared.leases().remove(&self.id);
        cell.mark_released();
    }
}

#[async_trait]
impl<B: RenewBackend> LeaseControl for DriverLease<B> {
    async fn release(&self, cell: &Arc<LeaseCell>) -> Result<(), Error> {
        self.unregister(cell);
        self.shared.backend.release(&self.entry).await
    }

    async fn release_again(&self, cell: &Arc<LeaseCell>) -> Result<(), Error> {
        self.unregister(cell);
        self.shared.backend.release(&self.entry).await
    }

    fn release_detached(&self, cell: Arc<LeaseCell>, runtime: Option<Handle>) {
        self.unregister(&cell);
        let Some(runtime) = runtime else {
            tracing::warn!(lock = %cell.name, "lease dropped outside a runtime; it expires after its TTL");
            return;
        };
        let backend = Arc::clone(&self.shared.backend);
        let entry = Arc::clone(&self.entry);
        // Spawning on a runtime that is shutting down drops the task without panicking.
        self.shared.background.spawn_on(
            async move {
                if let Err(e) = backend.release(&entry).await {
                    tracing::warn!(lock = %cell.name, token = %cell.token, error = %e, "background release failed; the lock expires after its TTL");
                }
            },
            &runtime,
        );
    }

    fn stop_renewal(&self, _cell: &Arc<LeaseCell>) {
        if let Some(r) = self.shared.leases().get_mut(&self.id) {
            r.renewing = false;
        }
    }
}
