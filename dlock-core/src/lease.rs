//! The handle of a held lock.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::{self, End};
use crate::sync::lock;
use crate::{Counters, Error, FencingToken, LockName, LossReason};

/// The state of one lease shared by the [`Lease`] handle and the renewal driver.
pub(crate) struct LeaseCell {
    pub(crate) name: LockName,
    pub(crate) token: FencingToken,
    /// How long before the deadline the lease counts as lost: `lost()` rides a timer that can
    /// fire late (millisecond granularity, then scheduling), so it aims this much earlier.
    early: Duration,
    /// The TTL its deadlines are counted with (the renewal driver's), when it has one.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    ttl: Option<Duration>,
    /// Where the loss is counted (none for a backend's internal lease). Counted when the cell
    /// ends, before anyone awaiting `lost()` is woken, whichever path ends it (the driver, the
    /// lease's own timer, a check that finds it expired). Its labels are the lease's metrics'.
    losses: Option<Arc<Counters>>,
    /// When the cell was made (the grant), for the hold-time metric.
    granted: Instant,
    state: Mutex<CellState>,
    status: watch::Sender<Status>,
}

struct CellState {
    deadline: Instant,
    ended: bool,
    /// When the lease was declared lost (by its own loss timer, the renewal driver's, a check
    /// that found it expired, or the server's word): the instant `lost()` became resolvable.
    lost_declared: Option<Instant>,
}

/// What `lost()` reports; `Released` ends the watch without a loss.
#[derive(Clone, Debug, PartialEq)]
enum Status {
    Held,
    Lost(LossReason),
    Released,
}

impl LeaseCell {
    pub(crate) fn new(
        name: LockName,
        token: FencingToken,
        deadline: Instant,
        early: Duration,
        ttl: Option<Duration>,
        losses: Option<Arc<Counters>>,
    ) -> Arc<Self> {
        if let Some(c) = &losses {
            metrics::granted(c, &name);
        }
        Arc::new(LeaseCell {
            name,
            token,
            early,
            ttl,
            losses,
            granted: Instant::now(),
            state: Mutex::new(CellState {
                deadline,
                ended: false,
                lost_declared: None,
            }),
            status: watch::Sender::new(Status::Held),
        })
    }

    fn state(&self) -> MutexGuard<'_, CellState> {
        lock(&self.state)
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.state().deadline
    }

    /// Time left until the deadline (zero once passed).
    pub(crate) fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// `Ok` while held; [`Error::Lost`] with the reason otherwise.
    pub(crate) fn check(&self) -> Result<(), Error> {
        match self.loss() {
            Some(reason) => Err(Error::Lost(reason)),
            None => Ok(()),
        }
    }

    /// When the lease counts as lost unless extended first: the deadline less the margin.
    pub(crate) fn lost_at(&self) -> Instant {
        self.lost_at_of(&self.state())
    }

    fn lost_at_of(&self, st: &CellState) -> Instant {
        st.deadline.checked_sub(self.early).unwrap_or(st.deadline)
    }

    /// Whether the lease still counts as held right now (not lost, released or expired).
    pub(crate) fn is_live(&self) -> bool {
        let st = self.state();
        !st.ended && Instant::now() < self.lost_at_of(&st)
    }

    /// Moves the deadline to `new` when the lease is still held and has not expired. Returns
    /// false when the lease already ended or expired (a late renewal must never resurrect it,
    /// not even one that beat the deadline but not the margin before it: `check()` may already
    /// have said it was lost).
    pub(crate) fn extend(&self, new: Instant) -> bool {
        let mut st = self.state();
        if st.ended || Instant::now() >= self.lost_at_of(&st) {
            return false;
        }
        if new > st.deadline {
            st.deadline = new;
        }
        true
    }

    /// Ends the lease's state, recording when it was declared lost if `lost`. Returns true when
    /// this call ended it (false when it had already ended).
    fn end(&self, lost: bool) -> bool {
        let mut st = self.state();
        if st.ended {
            return false;
        }
        st.ended = true;
        if lost {
            st.lost_declared = Some(Instant::now());
        }
        true
    }

    /// Marks the lease lost. Returns true when this call ended it.
    pub(crate) fn mark_lost(&self, reason: LossReason) -> bool {
        if !self.end(true) {
            return false;
        }
        // Closing the locker ends its leases on purpose: not a loss to count or warn about.
        if reason == LossReason::Closed {
            self.ended_metrics(End::Closed);
            tracing::debug!(lock = %self.name, token = %self.token, "lease ended: the locker was closed");
        } else {
            if let Some(c) = &self.losses {
                c.add_losses(1);
            }
            self.ended_metrics(End::Lost(&reason));
            tracing::warn!(lock = %self.name, token = %self.token, %reason, "lease lost");
        }
        self.status.send_replace(Status::Lost(reason));
        true
    }

    /// When the lease was declared lost, if it was.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn lost_declared(&self) -> Option<Instant> {
        self.state().lost_declared
    }

    /// Records the end of a counted lease in the metrics (nothing for an internal one).
    fn ended_metrics(&self, how: End<'_>) {
        if let Some(c) = &self.losses {
            metrics::ended(c, &self.name, self.granted.elapsed(), how);
        }
    }

    /// Marks the lease released. Returns false when it had already ended.
    pub(crate) fn mark_released(&self) -> bool {
        if !self.end(false) {
            return false;
        }
        self.ended_metrics(End::Released);
        self.status.send_replace(Status::Released);
        true
    }

    /// Why the lease is not held, if it is not: lost, released, or its deadline passed.
    fn loss(&self) -> Option<LossReason> {
        match &*self.status.borrow() {
            Status::Lost(r) => return Some(r.clone()),
            // Released is not a loss, but a released lease is not held either: reporting it as
            // held would let a hold act on a lock someone else may have by now.
            Status::Released => return Some(LossReason::Released),
            Status::Held => {}
        }
        if Instant::now() >= self.lost_at() {
            self.mark_lost(LossReason::Expired);
            return Some(LossReason::Expired);
        }
        None
    }

    pub(crate) fn lost_future(
        self: &Arc<Self>,
    ) -> impl Future<Output = LossReason> + Send + 'static {
        let cell = Arc::clone(self);
        async move {
            let mut rx = cell.status.subscribe();
            loop {
                let status = rx.borrow_and_update().clone();
                match status {
                    Status::Lost(reason) => return reason,
                    Status::Released => return LossReason::Released,
                    Status::Held => {}
                }
                let lost_at = cell.lost_at();
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            // The sender lives in `cell`, which we hold: unreachable, but never panic.
                            return LossReason::Closed;
                        }
                    }
                    () = tokio::time::sleep_until(lost_at) => {
                        if Instant::now() >= cell.lost_at() {
                            cell.mark_lost(LossReason::Expired);
                        }
                    }
                }
            }
        }
    }
}

impl Drop for LeaseCell {
    /// A counted lease dropped without ending (no path does today) leaves the held gauge.
    fn drop(&mut self) {
        if let Some(c) = self.losses.as_ref().filter(|_| !self.state().ended) {
            metrics::released_unended(c);
        }
    }
}

/// How a [`Lease`] releases its lock; implemented by the renewal driver and the re-entrancy
/// wrapper.
#[async_trait]
pub(crate) trait LeaseControl: Send + Sync + 'static {
    /// Stops renewing the lease and deletes it at the server.
    async fn release(&self, cell: &Arc<LeaseCell>) -> Result<(), Error>;
    /// Deletes the lease's server entry again (guarded: never a newer holder's).
    async fn release_again(&self, cell: &Arc<LeaseCell>) -> Result<(), Error>;
    /// Stops renewing at once, then releases in the background on `runtime`. Never blocks.
    fn release_detached(&self, cell: Arc<LeaseCell>, runtime: Option<Handle>);
    /// For tests: stop renewing this lease without releasing it.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    fn stop_renewal(&self, cell: &Arc<LeaseCell>);
    /// How many holds a re-entrant lease has; 1 otherwise.
    fn hold_count(&self) -> u32 {
        1
    }
}

/// A held lock.
///
/// While it is held, the locker renews it in the background. Watch [`Lease::lost`] to learn,
/// before [`Lease::deadline`], that it is no longer safe to act as the holder; pass
/// [`Lease::token`] to the resources you protect.
///
/// A lease that is not extended counts as lost (in [`Lease::lost`], [`Lease::is_lost`] and
/// [`Lease::check`]) a margin before its deadline — [`loss_margin`](crate::loss_margin): the
/// drift allowance again plus TTL/10 (at most 200 ms), 222 ms for a 2 s TTL — because the timer
/// behind `lost()` can fire late (millisecond granularity, then thread scheduling on a loaded
/// machine).
///
/// Release it with [`Lease::release`]. Dropping an unreleased lease stops its renewal at once
/// and schedules a best-effort release on the runtime it was created on; the TTL is the
/// backstop.
#[must_use = "dropping a Lease releases the lock in the background; hold it while you work"]
pub struct Lease {
    cell: Arc<LeaseCell>,
    ctl: Arc<dyn LeaseControl>,
    runtime: Option<Handle>,
    done: bool,
}

impl Lease {
    pub(crate) fn from_parts(cell: Arc<LeaseCell>, ctl: Arc<dyn LeaseControl>) -> Self {
        Lease {
            cell,
            ctl,
            runtime: Handle::try_current().ok(),
            done: false,
        }
    }

    pub(crate) fn cell(&self) -> &Arc<LeaseCell> {
        &self.cell
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.cell.name
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> FencingToken {
        self.cell.token
    }

    /// The instant (monotonic clock) until which no one else can be granted the lock:
    /// start of the last request that set or extended the TTL + TTL − drift.
    pub fn deadline(&self) -> Instant {
        self.cell.deadline()
    }

    /// Time left until [`Lease::deadline`] (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.cell.remaining()
    }

    /// How many times this lease is held through a re-entrant locker (1 otherwise).
    pub fn hold_count(&self) -> u32 {
        self.ctl.hold_count()
    }

    /// Whether the lease is no longer held right now: lost, expired (within the margin before
    /// its deadline, see [`Lease`]), or released
    /// (through a [`Releaser`], or by the last hold of a re-entrant lease).
    pub fn is_lost(&self) -> bool {
        self.cell.loss().is_some()
    }

    /// Checks that the lease is still held.
    ///
    /// # Errors
    /// [`Error::Lost`] with the reason when it is not; [`LossReason::Released`] when it was
    /// released (through a [`Releaser`], or by the last hold of a re-entrant lease).
    pub fn check(&self) -> Result<(), Error> {
        self.cell.check()
    }

    /// Resolves when the lease is lost, with the reason: at once when the server says so, and
    /// when it was not extended, a margin before its deadline (see [`Lease`]), so that a timer
    /// or scheduling delay still leaves it resolved before the deadline.
    ///
    /// Any number of tasks may await it; the future owns what it needs (`'static`) and can be
    /// spawned. If the lease is released first, it resolves with [`LossReason::Released`].
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future changes nothing.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        self.cell.lost_future()
    }

    /// A handle that can repeat the server-side release later. It deletes only this grant's
    /// entry (compared by value, revision or node path), so calling it after the lock passed to
    /// someone else is harmless.
    pub fn releaser(&self) -> Releaser {
        Releaser {
            cell: Arc::clone(&self.cell),
            ctl: Arc::clone(&self.ctl),
        }
    }

    /// Releases the lock: stops renewal and deletes our entry at the server (only ours).
    ///
    /// # Errors
    /// The backend's error when the delete could not be confirmed; the lease is then released
    /// locally and expires at the server within the TTL. Use [`Lease::releaser`] to retry.
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, renewal has stopped and a best-effort
    /// release runs in the background.
    pub async fn release(mut self) -> Result<(), Error> {
        self.done = true;
        let guard = DetachOnDrop {
            cell: Some(Arc::clone(&self.cell)),
            ctl: Arc::clone(&self.ctl),
            runtime: self.runtime.clone(),
        };
        let result = self.ctl.release(&self.cell).await;
        guard.disarm();
        tracing::debug!(lock = %self.cell.name, token = %self.cell.token, ok = result.is_ok(), "lease released");
        result
    }

    /// For tests and fault drills: stop renewing this lease without releasing it, as if every
    /// renewal request failed. The lease is then lost at its deadline. Only with the
    /// `testing` feature.
    #[cfg(feature = "testing")]
    pub fn stop_renewal_for_test(&self) {
        self.stop_renewal();
    }

    /// For tests: the instant the core declared this lease lost — its loss timer firing (or
    /// the renewal driver's, or a check finding it expired, or the server's word) — which is
    /// when [`Lease::lost`] became resolvable, before any awaiting task was scheduled. `None`
    /// while held, and when it was released instead. Only with the `testing` feature.
    #[cfg(feature = "testing")]
    pub fn lost_declared_at_for_test(&self) -> Option<Instant> {
        self.cell.lost_declared()
    }

    /// For tests: the TTL this lease's deadlines are counted with (its renewal driver's, which
    /// may differ from the locker's: a ZooKeeper session's proof TTL), so that a checker can
    /// derive the loss margin the contract asks for ([`loss_margin`](crate::loss_margin) of
    /// it) without trusting the margin the lease aims with. Only with the `testing` feature.
    #[cfg(feature = "testing")]
    pub fn renewal_ttl_for_test(&self) -> Option<Duration> {
        self.cell.ttl
    }

    /// As [`Lease::stop_renewal_for_test`], for a re-entrant lease's inner lease.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn stop_renewal(&self) {
        self.ctl.stop_renewal(&self.cell);
    }
}

/// Releases in the background if a `release` future is dropped mid-way.
struct DetachOnDrop {
    cell: Option<Arc<LeaseCell>>,
    ctl: Arc<dyn LeaseControl>,
    runtime: Option<Handle>,
}

impl DetachOnDrop {
    fn disarm(mut self) {
        self.cell = None;
    }
}

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            self.ctl.release_detached(cell, self.runtime.take());
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            self.ctl
                .release_detached(Arc::clone(&self.cell), self.runtime.take());
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.cell.name)
            .field("token", &self.cell.token)
            .field("remaining", &self.remaining())
            .finish()
    }
}

/// Repeats a lease's server-side release; see [`Lease::releaser`].
#[derive(Clone)]
pub struct Releaser {
    cell: Arc<LeaseCell>,
    ctl: Arc<dyn LeaseControl>,
}

impl Releaser {
    /// Deletes this grant's server entry if it still exists; never another grant's.
    ///
    /// # Errors
    /// The backend's error when the delete could not be confirmed.
    ///
    /// # Cancel safety
    /// Cancel-safe: the delete is guarded, so an interrupted call can simply be repeated.
    pub async fn release(&self) -> Result<(), Error> {
        self.cell.mark_released();
        self.ctl.release_again(&self.cell).await
    }
}

impl fmt::Debug for Releaser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Releaser")
            .field("name", &self.cell.name)
            .field("token", &self.cell.token)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(after: Duration) -> Arc<LeaseCell> {
        let name = LockName::new("cell").unwrap_or_else(|e| panic!("{e}"));
        LeaseCell::new(
            name,
            FencingToken(1),
            Instant::now() + after,
            Duration::ZERO,
            None,
            None,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_extension_never_resurrects() {
        let c = cell(Duration::from_secs(1));
        assert!(c.extend(Instant::now() + Duration::from_secs(2)));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !c.extend(Instant::now() + Duration::from_secs(5)),
            "past its deadline"
        );
        assert!(!c.is_live());
        let c = cell(Duration::from_secs(1));
        assert!(c.mark_released());
        assert!(
            !c.extend(Instant::now() + Duration::from_secs(5)),
            "released"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lost_fires_on_its_own_timer_without_any_driver() {
        let c = cell(Duration::from_millis(1500));
        let deadline = c.deadline();
        assert_eq!(c.lost_future().await, LossReason::Expired);
        assert_eq!(Instant::now(), deadline);
        assert_eq!(c.lost_declared(), Some(deadline), "the timer's own instant");
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_was_never_declared_lost() {
        let c = cell(Duration::from_secs(1));
        assert!(c.mark_released());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(c.lost_future().await, LossReason::Released);
        assert_eq!(c.lost_declared(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_follows_an_extended_deadline() {
        let c = cell(Duration::from_secs(1));
        let lost = tokio::spawn(c.lost_future());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let new = Instant::now() + Duration::from_secs(3);
        assert!(c.extend(new));
        assert_eq!(
            lost.await.unwrap_or(LossReason::Closed),
            LossReason::Expired
        );
        assert_eq!(Instant::now(), new);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_counts_as_lost_its_margin_before_the_deadline() {
        let name = LockName::new("cell").unwrap_or_else(|e| panic!("{e}"));
        let margin = Duration::from_millis(12);
        let deadline = Instant::now() + Duration::from_secs(1);
        let c = LeaseCell::new(name, FencingToken(1), deadline, margin, None, None);
        let lost = tokio::spawn(c.lost_future());
        tokio::time::sleep_until(deadline - margin - Duration::from_millis(1)).await;
        assert!(c.is_live());
        assert!(c.loss().is_none());
        assert_eq!(
            lost.await.unwrap_or(LossReason::Closed),
            LossReason::Expired
        );
        assert_eq!(Instant::now(), deadline - margin);
        assert_eq!(c.loss(), Some(LossReason::Expired));
        assert!(
            !c.extend(deadline + Duration::from_secs(1)),
            "an extension after the margin must not resurrect it"
        );
    }
}
