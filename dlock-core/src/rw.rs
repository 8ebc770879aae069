//! Read-write locks: readers share a name, a writer holds it alone, and waiting is FIFO across
//! modes, so a queued writer is not starved by readers that keep arriving.

use async_trait::async_trait;

use crate::{AcquireOptions, Error, Lease, LockName, Locker};

/// A read-write lock on one backend. Object-safe, like [`Locker`](crate::Locker), and
/// reached from one with `Locker::as_*`; its `ttl` and `close` are the locker's.
///
/// Every lease, read or write, is a [`Lease`]: renewed by the locker's one driver, lost before
/// the server could let a conflicting holder in, and carrying a fencing token above every
/// earlier grant's of the same name (reads included), so a writer's token is above every
/// earlier lease's.
///
/// Waiting is FIFO across modes: a reader that arrives while a writer waits queues behind the
/// writer, and readers at the head of the queue are granted together.
#[async_trait]
pub trait RwLocker: Locker {
    /// Waits for a shared (read) lease on `name`: granted while no writer holds the name and
    /// no writer queued earlier waits.
    ///
    /// # Errors
    /// As [`Locker::acquire`](crate::Locker::acquire).
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the request; nothing is left behind.
    async fn read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error>;

    /// Waits for an exclusive (write) lease on `name`: granted when nobody holds the name and
    /// every request queued earlier was served.
    ///
    /// # Errors
    /// As [`Locker::acquire`](crate::Locker::acquire).
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the request; nothing is left behind.
    async fn write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error>;
}
