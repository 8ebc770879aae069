//! The ZooKeeper [`RwLocker`](dlock_core::RwLocker): the mutex's queue with `__READ__` and `__WRIT__` nodes (the
//! layout of Curator's `InterProcessReadWriteLock`), a reader holding while no write node
//! precedes it, a writer when first (see `rule`).

use async_trait::async_trait;
use dlock_core::backend::RwBackend;
use dlock_core::{AcquireOptions, Error, Lease, LockName};

use crate::locker::{Queue, ZkLocker};
use crate::rule::Rule;

impl ZkLocker {
    /// One read or write acquire on the mutex's machinery with `rule`'s nodes.
    async fn rw_acquire(
        &self,
        name: &LockName,
        opts: AcquireOptions,
        rule: Rule,
    ) -> Result<Lease, Error> {
        let queue = Queue {
            rule,
            payload: self.payload(),
            under: None,
        };
        match self.contend(name, opts.wait, false, queue).await? {
            Some(grant) => Ok(grant.lease),
            None => Err(Error::backend(
                "ZooKeeper read-write acquire ended without a grant",
                None,
            )),
        }
    }
}

/// A read-write lock on ZooKeeper: read and write nodes queue together in the lock's parent
/// (`<root>/<encoded name>/_c_<uuid>-__READ__<seq>` or `…-__WRIT__<seq>`, ordered by sequence
/// as Curator orders them). A reader holds while no write node precedes it and watches only the
/// last write node before it; a writer holds when it is first and watches only its
/// predecessor. The fencing token is the node's `czxid`. See the README's "Read-write lock and
/// semaphore" section.
#[async_trait]
impl RwBackend for ZkLocker {
    /// Creates an EPHEMERAL_SEQUENTIAL `__READ__` node and waits until no write node precedes
    /// it (readers queued together are granted together; a reader behind a waiting writer
    /// waits for it).
    ///
    /// # Errors
    /// As [`Locker::acquire`](dlock_core::Locker::acquire): [`Error::InvalidOption`] for a bad wait (before any I/O),
    /// [`Error::Timeout`] when the wait elapses (our node is removed first),
    /// [`Error::Unavailable`] when no server could be reached, [`Error::Backend`] when the
    /// server refuses.
    ///
    /// # Cancel safety
    /// Dropping the future removes our node in the background, as for [`Locker::acquire`](dlock_core::Locker::acquire).
    async fn lock_read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        self.rw_acquire(name, opts, Rule::Read).await
    }

    /// Creates an EPHEMERAL_SEQUENTIAL `__WRIT__` node and waits until it is first among the
    /// read and write nodes.
    ///
    /// # Errors
    /// As [`RwLocker::read`](dlock_core::RwLocker::read).
    ///
    /// # Cancel safety
    /// As [`RwLocker::read`](dlock_core::RwLocker::read).
    async fn lock_write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        self.rw_acquire(name, opts, Rule::Write).await
    }
}
