//! Re-entrancy over any [`Locker`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;

use crate::lease::{LeaseCell, LeaseControl};
use crate::sync::lock;
use crate::{
    AcquireOptions, Capabilities, Error, Lease, LockName, LockState, Locker, Releaser, Stats,
};

/// Makes any [`Locker`] re-entrant: acquiring a name this wrapper already holds returns at once,
/// with the same token and one more hold; the last release releases the lock.
///
/// Holds are counted per wrapper (the wrapper is the owner), not per task.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{AcquireOptions, LockName, Locker, MemoryLocker, Reentrant};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::Error> {
/// let locker = Reentrant::new(MemoryLocker::builder().ttl(Duration::from_secs(2)).build()?);
/// let name = LockName::new("job")?;
/// let outer = locker.acquire(&name, AcquireOptions::forever()).await?;
/// let inner = locker.acquire(&name, AcquireOptions::forever()).await?;
/// assert_eq!(inner.token(), outer.token());
/// assert_eq!(outer.hold_count(), 2);
/// inner.release().await?;
/// assert_eq!(outer.hold_count(), 1);
/// outer.release().await?; // now the lock is free
/// # Ok(())
/// # }
/// ```
pub struct Reentrant<L> {
    inner: L,
    held: Arc<Table>,
}

type Table = Mutex<HashMap<LockName, Arc<Held>>>;

/// One grant held through the wrapper.
///
/// Lock order: the table, then `state`. The hold count only changes while the table is locked
/// (or once the wrapper is gone, when no nested acquire can happen any more), so a nested
/// acquire never sees a count that the last release already took to zero.
struct Held {
    state: Mutex<HoldState>,
    releaser: Releaser,
    table: Weak<Table>,
    name: LockName,
}

struct HoldState {
    /// Holds handed out and not yet released; 0 once the last one released the grant.
    count: u32,
    /// The inner lease, until the last hold releases it.
    lease: Option<Lease>,
}

impl<L: Locker> Reentrant<L> {
    /// Wraps `inner`.
    pub fn new(inner: L) -> Self {
        Reentrant {
            inner,
            held: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The wrapped locker.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// A new hold on `name` if this wrapper holds it and the lease is still held (not lost,
    /// not released, deadline not passed, not being released by its last hold).
    fn nested(&self, name: &LockName) -> Option<Lease> {
        let table = lock(&self.held);
        let held = table.get(name)?;
        let mut state = lock(&held.state);
        if state.count == 0 {
            return None;
        }
        let lease = state.lease.as_ref()?;
        if lease.is_lost() {
            return None;
        }
        let cell = Arc::clone(lease.cell());
        state.count += 1;
        Some(Lease::from_parts(
            cell,
            Arc::clone(held) as Arc<dyn LeaseControl>,
        ))
    }

    fn first(&self, lease: Lease) -> Lease {
        let cell = Arc::clone(lease.cell());
        let held = Arc::new(Held {
            releaser: lease.releaser(),
            state: Mutex::new(HoldState {
                count: 1,
                lease: Some(lease),
            }),
            table: Arc::downgrade(&self.held),
            name: cell.name.clone(),
        });
        lock(&self.held).insert(cell.name.clone(), Arc::clone(&held));
        Lease::from_parts(cell, held)
    }
}

impl Held {
    /// Drops one hold; returns the inner lease when it was the last.
    fn drop_hold(&self) -> Option<Lease> {
        let table = self.table.upgrade();
        let mut table = table.as_deref().map(lock);
        let mut state = lock(&self.state);
        state.count = state.count.saturating_sub(1);
        if state.count > 0 {
            return None;
        }
        if let Some(table) = table.as_mut()
            && table
                .get(&self.name)
                .is_some_and(|h| std::ptr::eq(Arc::as_ptr(h), self))
        {
            table.remove(&self.name);
        }
        state.lease.take()
    }
}

#[async_trait]
impl LeaseControl for Held {
    async fn release(&self, _cell: &Arc<LeaseCell>) -> Result<(), Error> {
        match self.drop_hold() {
            Some(lease) => lease.release().await,
            None => Ok(()),
        }
    }

    async fn release_again(&self, _cell: &Arc<LeaseCell>) -> Result<(), Error> {
        self.releaser.release().await
    }

    fn release_detached(&self, _cell: Arc<LeaseCell>, _runtime: Option<Handle>) {
        // Dropping the inner lease schedules its own background release.
        drop(self.drop_hold());
    }

    fn stop_renewal(&self, _cell: &Arc<LeaseCell>) {
        if let Some(lease) = lock(&self.state).lease.as_ref() {
            lease.stop_renewal();
        }
    }

    fn hold_count(&self) -> u32 {
        lock(&self.state).count
    }
}

#[async_trait]
impl<L: Locker> Locker for Reentrant<L> {
    async fn acquire(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        if let Some(lease) = self.nested(name) {
            return Ok(lease);
        }
        let lease = self.inner.acquire(name, opts).await?;
        Ok(self.first(lease))
    }

    async fn try_acquire(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        if let Some(lease) = self.nested(name) {
            return Ok(Some(lease));
        }
        Ok(self.inner.try_acquire(name).await?.map(|l| self.first(l)))
    }

    fn ttl(&self) -> Duration {
        self.inner.ttl()
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState, Error> {
        self.inner.inspect(name).await
    }

    /// Closes the inner locker: every hold's lease ends with it.
    async fn close(&self) -> Result<(), Error> {
        self.inner.close().await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn stats(&self) -> Stats {
        self.inner.stats()
    }
}
