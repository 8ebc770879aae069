//! The memory backend's read-write lock and semaphore: shared holders beside the exclusive
//! one, FIFO across modes (see `Backend::may_grant`).

use std::time::Duration;

use async_trait::async_trait;

use super::{MemoryLocker, Mode};
use crate::{
    AcquireOptions, Error, Lease, LockName, Locker, RwLocker, Semaphore, validate_permits,
};

#[async_trait]
impl RwLocker for MemoryLocker {
    async fn read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        Ok(self.acquire_with(name, opts, &[], Mode::Shared).await?.0)
    }

    async fn write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        Ok(self.acquire_with(name, opts, &[], Mode::Exclusive).await?.0)
    }

    fn ttl(&self) -> Duration {
        Locker::ttl(self)
    }

    async fn close(&self) -> Result<(), Error> {
        Locker::close(self).await
    }
}

#[async_trait]
impl Semaphore for MemoryLocker {
    async fn acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        validate_permits(permits)?;
        Ok(self
            .acquire_with(name, opts, &[], Mode::Permit(permits))
            .await?
            .0)
    }

    fn ttl(&self) -> Duration {
        Locker::ttl(self)
    }

    async fn close(&self) -> Result<(), Error> {
        Locker::close(self).await
    }
}
