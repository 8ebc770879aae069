//! [`RwLocker`] and [`Semaphore`] on etcd: the mutex's queue (session lease, key slots,
//! predecessor watch, renewal driver) with another key range and grant rule per primitive
//! (see `queue.rs`, and the crate documentation's "Read-write lock and semaphore").

use async_trait::async_trait;
use dlock_core::backend::{RwBackend, SemaphoreBackend};
use dlock_core::{AcquireOptions, Error, Lease, LockName};

use crate::error;
use crate::keys;
use crate::locker::EtcdLocker;
use crate::permits::count_value;
use crate::queue::Queue;

impl EtcdLocker {
    /// Waits in `q` for `name`, as [`Locker::acquire`](dlock_core::Locker::acquire) does.
    async fn acquire_in(
        &self,
        name: &LockName,
        q: &Queue,
        opts: AcquireOptions,
        value: &[u8],
    ) -> Result<Lease, Error> {
        match self.lock_in(name, q, opts.wait, false, value).await? {
            Some((lease, _)) => Ok(lease),
            None => Err(error::unexpected("acquire", "no lease after waiting")),
        }
    }

    /// The lock range of `name`: `<prefix>/<name>/`.
    fn range_of(&self, name: &LockName) -> String {
        keys::lock_range(&self.inner.cfg.prefix, name, self.inner.cfg.raw_names)
    }
}

/// Read and write leases in the layout of etcd's recipes `RWMutex` (created with the prefix
/// [`EtcdLocker::etcd_mutex_name`]): readers' keys under `<prefix>/<name>/read/`, writers'
/// under `<prefix>/<name>/write/`, one key per request (`<request number>/<session lease
/// hex>`). A reader waits for the last writer key created before its own, a writer for the
/// last key of either kind. The fencing token is the key's create revision.
///
/// Do not mix it with etcd's recipes `RWMutex` on one name where etcd's leader can change:
/// the session's move to a lease of a new raft term raises its keys' mod revisions, which the
/// recipe's waiters filter on, so a recipe waiter can take the lock while a dlock lease holds
/// it (a double hold; see the crate README).
#[async_trait]
impl RwBackend for EtcdLocker {
    async fn lock_read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        let q = Queue::read(&self.range_of(name));
        self.acquire_in(name, &q, opts, &[]).await
    }

    async fn lock_write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        let q = Queue::write(&self.range_of(name));
        self.acquire_in(name, &q, opts, &[]).await
    }
}

/// Permits as keys `<prefix>/<name>/permit/<request number>/<session lease hex>`, each
/// carrying its permit count in decimal; the keys with the `permits` lowest create revisions
/// hold, and the earliest live key's count is the semaphore's. The fencing token is the key's
/// create revision. One locker may hold several permits of a name.
#[async_trait]
impl SemaphoreBackend for EtcdLocker {
    async fn lock_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        let q = Queue::permits(&self.range_of(name), permits);
        self.acquire_in(name, &q, opts, &count_value(permits)).await
    }
}
