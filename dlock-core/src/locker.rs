//! The backend-independent locker trait.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    AcquireOptions, Capabilities, Election, Error, Lease, LockName, LockState, RwLocker, Semaphore,
    Stats,
};

/// A distributed mutex client. Every backend implements it with the same semantics.
///
/// The trait is object-safe: select a backend from configuration and keep an
/// `Arc<dyn Locker>`. The primitives a backend offers beside the mutex are reached through
/// it: [`Locker::into_election`], [`Locker::into_rw_locker`], [`Locker::into_semaphore`].
///
/// Backends do not implement it directly: they implement
/// [`backend::LockBackend`](crate::backend::LockBackend), and this crate implements `Locker`
/// over it once, with the closed check and the option checks in one place.
#[async_trait]
pub trait Locker: Send + Sync + 'static {
    /// Waits until the lock is granted, until `opts.wait` elapses, or until the future is
    /// dropped.
    ///
    /// The returned [`Lease`] is renewed in the background until it is released or lost.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for bad options (before any I/O); [`Error::Timeout`] when the
    /// wait elapses; [`Error::Unavailable`], [`Error::QuorumNotReached`] or [`Error::Backend`]
    /// when the server cannot grant it.
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the request: its queue entry (key, node, watch) is removed
    /// promptly, and nothing is left behind.
    async fn acquire(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error>;

    /// Makes one attempt, never waits: `Ok(None)` when someone else holds the lock.
    ///
    /// # Errors
    /// As [`Locker::acquire`], without `Timeout`.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind; a failed attempt leaves nothing behind either.
    async fn try_acquire(&self, name: &LockName) -> Result<Option<Lease>, Error>;

    /// Reads who holds `name`, at most how long the server keeps it for them, and how many
    /// wait, without taking part: it takes no fencing token, creates and deletes nothing, and
    /// delays no waiter.
    ///
    /// The answer is a snapshot, stale as soon as it arrives (see [`LockState`]). Redlock
    /// reports the holder a majority of its nodes agree on.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`Locker::close`]; [`Error::Unavailable`],
    /// [`Error::QuorumNotReached`] or [`Error::Backend`] when the server cannot answer.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &LockName) -> Result<LockState, Error>;

    /// The lease TTL: how long a crashed holder can block others.
    fn ttl(&self) -> Duration;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// The locker's counters.
    fn stats(&self) -> Stats;

    /// Closes the locker and every clone of it: every lease it holds is ended at once (its
    /// `lost()` resolves with [`LossReason::Closed`](crate::LossReason::Closed), not counted as
    /// a loss) and its server entry deleted, and the backend's session (etcd lease, ZooKeeper
    /// session) is ended. The deletes the locker runs in the background (a dropped lease's, a
    /// cancelled acquire's queue entry) are waited for, so nothing the locker wrote is left at
    /// the server when `close` returns, even if the runtime ends right after. Later calls fail
    /// with [`Error::Closed`] before any I/O; a request already in flight that is granted
    /// anyway gets a lease that is already ended, its entry deleted. Closing again does nothing
    /// more.
    ///
    /// # Errors
    /// The first server error while deleting entries or ending the session; every lease is
    /// ended and every delete tried all the same (an entry not deleted expires at its TTL).
    ///
    /// # Cancel safety
    /// The locker is closed and its leases ended once the future is first polled; dropping it
    /// abandons the deletes not yet done (those entries expire at their TTL).
    async fn close(&self) -> Result<(), Error>;

    /// This locker as its backend's leader election, when the backend offers one
    /// ([`Primitives::election`](crate::Primitives::election)); `None` otherwise.
    fn into_election(self: Arc<Self>) -> Option<Arc<dyn Election>> {
        None
    }

    /// This locker as its backend's read-write lock, when the backend offers one
    /// ([`Primitives::read_write`](crate::Primitives::read_write)); `None` otherwise.
    fn into_rw_locker(self: Arc<Self>) -> Option<Arc<dyn RwLocker>> {
        None
    }

    /// This locker as its backend's counting semaphore, when the backend offers one
    /// ([`Primitives::semaphore`](crate::Primitives::semaphore)); `None` otherwise.
    fn into_semaphore(self: Arc<Self>) -> Option<Arc<dyn Semaphore>> {
        None
    }
}

#[async_trait]
impl<L: Locker + ?Sized> Locker for Arc<L> {
    async fn acquire(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        (**self).acquire(name, opts).await
    }

    async fn try_acquire(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        (**self).try_acquire(name).await
    }

    async fn close(&self) -> Result<(), Error> {
        (**self).close().await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState, Error> {
        (**self).inspect(name).await
    }

    fn ttl(&self) -> Duration {
        (**self).ttl()
    }

    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }

    fn stats(&self) -> Stats {
        (**self).stats()
    }

    fn into_election(self: Arc<Self>) -> Option<Arc<dyn Election>> {
        L::into_election(Arc::clone(&self))
    }

    fn into_rw_locker(self: Arc<Self>) -> Option<Arc<dyn RwLocker>> {
        L::into_rw_locker(Arc::clone(&self))
    }

    fn into_semaphore(self: Arc<Self>) -> Option<Arc<dyn Semaphore>> {
        L::into_semaphore(Arc::clone(&self))
    }
}
