//! [`RwLocker`](dlock_core::RwLocker) on etcd: the mutex's queue (session lease, key slots,
//! predecessor watch, renewal driver) with a reader's and a writer's key range and grant rule
//! (see `queue.rs`, and the crate documentation's "Read-write lock and semaphore").

use async_trait::async_trait;
use dlock_core::backend::RwBackend;
use dlock_core::{AcquireOptions, Error, Lease, LockName};

use crate::locker::EtcdLocker;
use crate::queue::Queue;

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
