//! Counting semaphores: at most `permits` holders of one name at a time, FIFO waiting.

use async_trait::async_trait;

use crate::{AcquireOptions, Error, Lease, LockName, Locker};

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 1_000_000;

/// Checks a semaphore's permit count.
///
/// # Errors
/// [`Error::InvalidOption`] when `permits` is 0 or above [`MAX_PERMITS`].
pub fn validate_permits(permits: u32) -> Result<(), Error> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::InvalidOption {
            option: "permits",
            reason: format!("{permits} must be between 1 and {MAX_PERMITS}"),
        });
    }
    Ok(())
}

/// A counting semaphore on one backend. Object-safe, like [`Locker`](crate::Locker), and
/// reached from one with `Locker::as_*`; its `ttl` and `close` are the locker's.
///
/// A permit is a [`Lease`]: renewed by the locker's one driver, lost before the server could
/// hand the permit to someone else, with a fencing token above every earlier permit's of the
/// same name. Every holder of one name must agree on the number of permits: the first
/// acquire records it, and an acquire with another number fails instead of changing it.
#[async_trait]
pub trait Semaphore: Locker {
    /// Waits for one of the `permits` permits of `name` (FIFO).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a permit count outside 1..=[`MAX_PERMITS`] (before any
    /// I/O) or one that differs from the count the semaphore was created with; otherwise as
    /// [`Locker::acquire`](crate::Locker::acquire).
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the request; nothing is left behind.
    async fn acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error>;
}
