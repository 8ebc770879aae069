//! The memory backend's read-write lock and semaphore: shared holders beside the exclusive
//! one, FIFO across modes (see `Backend::may_grant`).

use async_trait::async_trait;

use super::{MemoryLocker, Mode};
use crate::{AcquireOptions, Error, Lease, LockName, RwBackend, SemaphoreBackend};

#[async_trait]
impl RwBackend for MemoryLocker {
    async fn lock_read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        Ok(self.acquire_with(name, opts, &[], Mode::Shared).await?.0)
    }

    async fn lock_write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        Ok(self.acquire_with(name, opts, &[], Mode::Exclusive).await?.0)
    }
}

#[async_trait]
impl SemaphoreBackend for MemoryLocker {
    async fn lock_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        Ok(self
            .acquire_with(name, opts, &[], Mode::Permit(permits))
            .await?
            .0)
    }
}
