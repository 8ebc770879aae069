//! `SemaphoreBackend` for `RedisLocker`: permits of one name in the name's holders set (see
//! `acquire/holders.rs`).

use async_trait::async_trait;
use dlock_core::backend::SemaphoreBackend;
use dlock_core::{AcquireOptions, Error, Lease, LockName};

use crate::RedisLocker;
use crate::acquire::holders::{Mode, acquire};

/// A counting semaphore of one name on one Redis server: at most N live holders, FIFO.
/// N is recorded with the holders (`p<N>` in their members and queue entries).
#[async_trait]
impl SemaphoreBackend for RedisLocker {
    /// # Errors
    /// [`Error::InvalidOption`] for a permit count outside 1..=[`MAX_PERMITS`](dlock_core::MAX_PERMITS)
    /// (before any I/O), or one that differs from the count of the permits held or awaited;
    /// otherwise as [`Locker::acquire`](dlock_core::Locker::acquire).
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the request in the background; nothing is left behind.
    async fn lock_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        acquire(&self.inner, name, Mode::Permit(permits), opts.wait).await
    }
}
