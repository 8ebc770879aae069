//! The renewal driver shared by every backend: one task per locker keeps every held lease alive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lease::{LeaseCell, LeaseControl};
use crate::options::drift;
use crate::{Counters, Error, FencingToken, Lease, LockName, LossReason};

/// The outcome of renewing one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// The server extended the lease by the full TTL, counted from the request's start.
    Extended,
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
    /// (one, ideally). Returns one [`Renewal`] per entry, in order.
    ///
    /// # Errors
    /// Any error means the attempt failed as a whole and may be retried; the driver retries
    /// with backoff inside the leases' remaining validity.
    async fn renew(&self, entries: &[Arc<Self::Entry>]) -> Result<Vec<Renewal>, Error>;

    /// Deletes one lease's server entry, guarded so that it never deletes another holder's.
    /// Deleting an entry that is already gone succeeds.
    ///
    /// # Errors
    /// The backend's error when the delete could not be confirmed.
    async fn release(&self, entry: &Self::Entry) -> Result<(), Error>;
}

struct Registered<E> {
    cell: Arc<LeaseCell>,
    entry: Arc<E>,
    renewing: bool,
}

struct Shared<B: RenewBackend> {
    backend: Arc<B>,
    ttl: Duration,
    counters: Arc<Counters>,
    leases: Mutex<HashMap<u64, Registered<B::Entry>>>,
    next_id: AtomicU64,
    wake: Arc<Notify>,
    /// When the task plans its next wake-up (`None`: idle or not sleeping). A new lease wakes
    /// the task only when it needs a round before then.
    planned: Mutex<Option<Instant>>,
    started: std::sync::Once,
}

impl<B: RenewBackend> Shared<B> {
    fn leases(&self) -> MutexGuard<'_, HashMap<u64, Registered<B::Entry>>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Keeps every lease of one locker alive with ONE background task, renewing all of them in one
/// backend call every TTL/3.
///
/// Each lease's deadline is `start of the last successful renewal request + TTL − drift`
/// (drift = TTL·0.01 + 2 ms). When renewals fail, the driver retries with backoff inside the
/// remaining validity; a lease whose deadline passes is lost, and its [`Lease::lost`] fires no
/// later than the deadline (the lease's own timer guarantees it even if the driver is late).
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
        RenewalDriver {
            shared: Arc::new(Shared {
                backend,
                ttl,
                counters,
                leases: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                wake: Arc::new(Notify::new()),
                planned: Mutex::new(None),
                started: std::sync::Once::new(),
            }),
        }
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
    /// Must be called inside a tokio runtime (the driver's task is spawned there on first use).
    pub fn register(
        &self,
        name: LockName,
        token: FencingToken,
        start: Instant,
        entry: B::Entry,
    ) -> Lease {
        let deadline = self.deadline_from(start);
        let cell = LeaseCell::new(name, token, deadline);
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(entry);
        self.shared.leases().insert(
            id,
            Registered {
                cell: Arc::clone(&cell),
                entry: Arc::clone(&entry),
                renewing: true,
            },
        );
        self.shared.counters.add_grants(1);
        tracing::debug!(lock = %cell.name, token = %cell.token, "lease granted");
        self.start_task();
        let due = deadline
            .checked_sub(self.shared.ttl / 3)
            .unwrap_or(deadline);
        let planned = *self
            .shared
            .planned
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if planned.is_none_or(|p| due < p) {
            self.shared.wake.notify_one();
        }
        let ctl = Arc::new(DriverLease {
            shared: Arc::clone(&self.shared),
            id,
            entry,
        });
        Lease::from_parts(cell, ctl)
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
            if r.cell.mark_lost(reason.clone()) {
                self.shared.counters.add_losses(1);
            }
        }
    }

    /// Declares every lease lost.
    pub fn lose_all(&self, reason: &LossReason) {
        self.lose_where(reason, |_| true);
    }

    fn start_task(&self) {
        self.shared.started.call_once(|| {
            let weak = Arc::downgrade(&self.shared);
            match Handle::try_current() {
                Ok(handle) => {
                    handle.spawn(run(weak));
                }
                Err(_) => tracing::error!(
                    "renewal driver used outside a tokio runtime; leases will expire"
                ),
            }
        });
    }
}

/// The driver's one task. Holds only a weak reference: it ends when the locker and every lease
/// are gone.
///
/// Rounds run every TTL/3 after the previous round started; a lease whose remaining validity
/// drops below TTL/3 (e.g. it took long to acquire) pulls the next round forward.
async fn run<B: RenewBackend>(weak: Weak<Shared<B>>) {
    let mut failures: u32 = 0;
    // When the next regular round is due; `None` while idle.
    let mut tick: Option<Instant> = None;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let period = shared.ttl / 3;
        let wake = Arc::clone(&shared.wake);
        let notified = wake.notified();
        let (renewable_due, earliest_deadline) = {
            let leases = shared.leases();
            let due = leases
                .values()
                .filter(|r| r.renewing)
                .map(|r| r.cell.deadline())
                .min();
            let earliest = leases.values().map(|r| r.cell.deadline()).min();
            (due.map(|d| d.checked_sub(period).unwrap_or(d)), earliest)
        };
        drop(shared);
        let Some(earliest_deadline) = earliest_deadline else {
            // Idle: wait for a lease (re-checking now and then so a dropped locker ends us).
            tick = None;
            let _ = tokio::time::timeout(period, notified).await;
            continue;
        };
        let regular = *tick.get_or_insert_with(|| Instant::now() + period);
        // While failing, the backoff sets the pace; otherwise a lease close to its deadline may
        // pull the round forward.
        let round_at = match renewable_due {
            Some(due) if failures == 0 => Some(regular.min(due)),
            Some(_) => Some(regular),
            None => None,
        };
        let target = round_at.map_or(earliest_deadline, |r| r.min(earliest_deadline));
        set_planned(&weak, Some(target));
        tokio::select! {
            () = tokio::time::sleep_until(target) => {}
            () = notified => {
                set_planned(&weak, None);
                continue;
            }
        }
        set_planned(&weak, None);
        let Some(shared) = weak.upgrade() else { return };
        let batch = expire_and_collect(&shared);
        if batch.is_empty() || round_at.is_none_or(|r| Instant::now() < r) {
            // Woken only to expire leases (or nothing renewable): no round now.
            continue;
        }
        let entries: Vec<Arc<B::Entry>> = batch.iter().map(|(_, _, e)| Arc::clone(e)).collect();
        let start = Instant::now();
        let earliest = batch
            .iter()
            .map(|(_, c, _)| c.deadline())
            .min()
            .unwrap_or(start);
        // A round may run for TTL/3, or for two thirds of the remaining validity if that is
        // longer: a reply delayed by a short network blip still counts, and a third of the
        // validity is left for a retry when the request is truly lost.
        let remaining = earliest.saturating_duration_since(start);
        let budget = period
            .max(remaining * 2 / 3)
            .min(remaining)
            .max(Duration::from_millis(1));
        let backend = Arc::clone(&shared.backend);
        let outcome = tokio::time::timeout(budget, backend.renew(&entries)).await;
        match outcome {
            Ok(Ok(results)) if results.len() == batch.len() => {
                failures = 0;
                shared.counters.add_renewals(1);
                let new_deadline = start + shared.ttl.saturating_sub(drift(shared.ttl));
                let mut undecided = 0usize;
                for ((id, cell, _), result) in batch.iter().zip(results) {
                    let reason = match result {
                        Renewal::Retry => {
                            undecided += 1;
                            continue;
                        }
                        Renewal::Extended if cell.extend(new_deadline) => {
                            tracing::trace!(lock = %cell.name, token = %cell.token, "lease renewed");
                            continue;
                        }
                        // Released meanwhile, or the reply came after the deadline: a late
                        // reply never resurrects a lease.
                        Renewal::Extended => LossReason::Expired,
                        Renewal::Lost(reason) => reason,
                    };
                    shared.leases().remove(id);
                    if cell.mark_lost(reason) {
                        shared.counters.add_losses(1);
                    }
                }
                tick = Some(if undecided == 0 {
                    start + period
                } else {
                    // Some leases were not extended: retry soon, inside their validity.
                    tracing::debug!(undecided, "renewal left leases undecided; retrying");
                    shared.counters.add_renewal_failures(1);
                    Instant::now() + (period / 4).max(Duration::from_millis(1))
                });
            }
            other => {
                failures += 1;
                shared.counters.add_renewal_failures(1);
                let why = match other {
                    Ok(Ok(r)) => format!(
                        "backend returned {} results for {} leases",
                        r.len(),
                        batch.len()
                    ),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("renewal timed out after {budget:?}"),
                };
                tracing::warn!(leases = batch.len(), failures, error = %why, "renewal failed; retrying");
                // Back off (10 ms doubling, capped at TTL/12) inside the remaining validity.
                let backoff = Duration::from_millis(10)
                    .saturating_mul(1 << failures.min(10))
                    .min(period / 4)
                    .max(Duration::from_millis(1));
                tick = Some(Instant::now() + backoff);
            }
        }
    }
}

fn set_planned<B: RenewBackend>(weak: &Weak<Shared<B>>, at: Option<Instant>) {
    if let Some(shared) = weak.upgrade() {
        *shared.planned.lock().unwrap_or_else(|p| p.into_inner()) = at;
    }
}

type Batch<E> = Vec<(u64, Arc<LeaseCell>, Arc<E>)>;

/// Declares expired leases lost and returns the ones to renew.
fn expire_and_collect<B: RenewBackend>(shared: &Shared<B>) -> Batch<B::Entry> {
    let now = Instant::now();
    let mut expired = Vec::new();
    let mut batch = Vec::new();
    {
        let mut leases = shared.leases();
        leases.retain(|id, r| {
            if r.cell.deadline() <= now || !r.cell.is_live() {
                expired.push(Arc::clone(&r.cell));
                false
            } else {
                if r.renewing {
                    batch.push((*id, Arc::clone(&r.cell), Arc::clone(&r.entry)));
                }
                true
            }
        });
    }
    for cell in expired {
        if cell.mark_lost(LossReason::Expired) {
            shared.counters.add_losses(1);
        }
    }
    batch
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
        runtime.spawn(async move {
            if let Err(e) = backend.release(&entry).await {
                tracing::warn!(lock = %cell.name, token = %cell.token, error = %e, "background release failed; the lock expires after its TTL");
            }
        });
    }

    fn stop_renewal(&self, _cell: &Arc<LeaseCell>) {
        if let Some(r) = self.shared.leases().get_mut(&self.id) {
            r.renewing = false;
        }
    }
}
