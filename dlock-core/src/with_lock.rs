//! [`LockerExt::with_lock`]: run a piece of work under a lock, cancelled when the lease is
//! lost, and always release.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::LeaseCell;
use crate::{AcquireOptions, Error, FencingToken, Lease, LockName, Locker, LossReason};

/// What the work of [`LockerExt::with_lock`] sees of its lease: cheap to clone, owned
/// (`'static`), read-only. The lease itself stays with `with_lock`, which releases it.
#[derive(Clone)]
pub struct LeaseView {
    cell: Arc<LeaseCell>,
}

impl LeaseView {
    /// The view of `lease`.
    pub fn of(lease: &Lease) -> Self {
        LeaseView {
            cell: Arc::clone(lease.cell()),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.cell.name
    }

    /// The fencing token of this grant: pass it with every write the lock guards.
    pub fn token(&self) -> FencingToken {
        self.cell.token
    }

    /// As [`Lease::deadline`].
    pub fn deadline(&self) -> Instant {
        self.cell.deadline()
    }

    /// As [`Lease::remaining`].
    pub fn remaining(&self) -> Duration {
        self.cell.remaining()
    }

    /// As [`Lease::check`].
    ///
    /// # Errors
    /// [`Error::Lost`] with the reason when the lease is no longer held.
    pub fn check(&self) -> Result<(), Error> {
        self.cell.check()
    }

    /// As [`Lease::lost`].
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future changes nothing.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        self.cell.lost_future()
    }
}

impl std::fmt::Debug for LeaseView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseView")
            .field("name", &self.cell.name)
            .field("token", &self.cell.token)
            .finish_non_exhaustive()
    }
}

/// Helpers on every [`Locker`] (implemented for all of them, `dyn Locker` included).
pub trait LockerExt: Locker {
    /// Acquires `name` (waiting as `opts` says: a [`Duration`] converts into a bounded wait),
    /// runs `work` with a view of the lease, and releases the lease when the work ends.
    ///
    /// If the lease is lost first, the work's future is dropped at its next await point
    /// (cancelled) and the result is [`Error::Lost`] with the reason; so is a lease lost by the
    /// time the work returns (what the work did may not have been covered by the lock). A
    /// failed release after the work completed is logged (`tracing` warning) and the work's
    /// output is returned: the server lets the lease expire at its TTL.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock_core::Error> {
    /// use std::time::Duration;
    /// use dlock_core::{LockName, LockerExt, MemoryLocker};
    ///
    /// let locker = MemoryLocker::builder().build()?;
    /// let name = LockName::new("nightly-report")?;
    /// let token = locker
    ///     .with_lock(&name, Duration::from_secs(5), |lease| async move {
    ///         // … write, passing lease.token() to the guarded resource …
    ///         lease.token()
    ///     })
    ///     .await?;
    /// assert!(token.get() > 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Locker::acquire`]; [`Error::Lost`] when the lease was lost before the work ended.
    ///
    /// # Cancel safety
    /// Dropping the future drops the work and the lease (which releases it in the
    /// background, as dropping any [`Lease`] does).
    fn with_lock<'a, F, Fut, T>(
        &'a self,
        name: &'a LockName,
        opts: impl Into<AcquireOptions> + Send + 'a,
        work: F,
    ) -> impl Future<Output = Result<T, Error>> + Send + 'a
    where
        F: FnOnce(LeaseView) -> Fut + Send + 'a,
        Fut: Future<Output = T> + Send + 'a,
        T: Send + 'a,
    {
        async move {
            let lease = self.acquire(name, opts.into()).await?;
            let lost = lease.lost();
            let out = tokio::select! {
                biased;
                reason = lost => Err(Error::Lost(reason)),
                out = work(LeaseView::of(&lease)) => Ok(out),
            };
            let out = match out {
                Ok(out) => match lease.check() {
                    Ok(()) => out,
                    Err(lost) => return Err(lost),
                },
                Err(lost) => return Err(lost),
            };
            if let Err(e) = lease.release().await {
                tracing::warn!(lock = %name, error = %e, "release after with_lock failed; the lease expires at its TTL");
            }
            Ok(out)
        }
    }
}

impl<L: Locker + ?Sized> LockerExt for L {}
