//! `RwBackend` for `RedisLocker`: readers and writers of one name in the name's holders set
//! (see `acquire/holders.rs`).

use async_trait::async_trait;
use dlock_core::backend::RwBackend;
use dlock_core::{AcquireOptions, Error, Lease, LockName};

use crate::RedisLocker;
use crate::acquire::holders::{Mode, acquire};

/// Readers and writers of one name on one Redis server: FIFO across modes (a reader that
/// arrives while a writer waits queues behind it), readers at the head granted together.
/// In fair and spin mode alike (the queue is what keeps writers from starving).
#[async_trait]
impl RwBackend for RedisLocker {
    /// # Errors
    /// As [`Locker::acquire`](dlock_core::Locker::acquire).
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the request in the background (its queue entry, and a
    /// grant whose reply was not seen); nothing is left behind.
    async fn lock_read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        acquire(&self.inner, name, Mode::Read, opts.wait).await
    }

    /// # Errors
    /// As [`Locker::acquire`](dlock_core::Locker::acquire).
    ///
    /// # Cancel safety
    /// As [`lock_read`](Self::lock_read).
    async fn lock_write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        acquire(&self.inner, name, Mode::Write, opts.wait).await
    }
}
