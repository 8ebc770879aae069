//! [`Semaphore`](dlock_core::Semaphore) on etcd: the mutex's queue (session lease, key slots,
//! renewal driver) with a permit key range and grant rule (see `queue.rs`), its own requests
//! (`semaphore/permits.rs`) and its own wait (`semaphore/wait.rs`).

mod permits;
mod wait;

use async_trait::async_trait;
use dlock_core::backend::SemaphoreBackend;
use dlock_core::{AcquireOptions, Error, Lease, LockName};

use crate::locker::EtcdLocker;
use crate::queue::Queue;
use permits::count_value;
pub(crate) use wait::PermitWait;

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
