//! The extra request of `semaphore_bound` and `rw_exclusion` is judged at the server: a backend
//! that grants it but answers `Unavailable` is caught by what the server still holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::memory::MemoryBackend;
use dlock_conformance::{ClientOptions, Row, Scenario, TestBackend};
use dlock_core::memory::Defect;
use dlock_core::{
    AcquireOptions, Capabilities, Error, Lease, LockName, LockState, Locker, RwLocker, Semaphore,
    Stats,
};
use support::{assert_caught, in_process, passes, run_printed};

mod support;

/// How many leases hold a name under `namespace` at the memory server (its `held:` entries).
async fn held(server: &MemoryBackend, namespace: &str) -> Result<usize, Error> {
    Ok(server
        .leftovers(namespace)
        .await?
        .iter()
        .filter(|e| e.starts_with("held:"))
        .count())
}

/// The lie: a grant that leaves more than `most` holders at the server is kept (renewed, never
/// released) and answered `Unavailable`, as a client whose grant reply was lost after the
/// server granted would answer.
async fn lie_above(
    backend: &MemoryBackend,
    namespace: &str,
    most: usize,
    lease: Lease,
    kept: &Mutex<Vec<Lease>>,
) -> Result<Lease, Error> {
    if held(backend, namespace).await? <= most {
        return Ok(lease);
    }
    kept.lock().unwrap_or_else(|p| p.into_inner()).push(lease);
    Err(Error::unavailable(
        "the grant's reply was lost (negative control)",
        None,
    ))
}

/// A semaphore or read-write lock (`T`) of the memory backend whose overflowing grant is kept
/// and answered `Unavailable` (see [`lie_above`]); its mutex is its inner locker's.
struct Liar<T: ?Sized> {
    inner: Arc<T>,
    backend: Arc<MemoryBackend>,
    namespace: String,
    kept: Mutex<Vec<Lease>>,
}

impl<T: ?Sized> Liar<T> {
    fn new(inner: Arc<T>, backend: &Arc<MemoryBackend>, namespace: String) -> Self {
        Liar {
            inner,
            backend: Arc::clone(backend),
            namespace,
            kept: Mutex::new(Vec::new()),
        }
    }

    async fn lie_above(&self, most: usize, lease: Lease) -> Result<Lease, Error> {
        lie_above(&self.backend, &self.namespace, most, lease, &self.kept).await
    }
}

#[async_trait]
impl<T: Locker + ?Sized> Locker for Liar<T> {
    async fn acquire(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        self.inner.acquire(name, opts).await
    }
    async fn try_acquire(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        self.inner.try_acquire(name).await
    }
    async fn inspect(&self, name: &LockName) -> Result<LockState, Error> {
        self.inner.inspect(name).await
    }
    fn ttl(&self) -> Duration {
        self.inner.ttl()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
    async fn close(&self) -> Result<(), Error> {
        self.inner.close().await
    }
}

/// A semaphore over [`Defect::SemaphoreOverflow`] (one permit more than it has) that answers
/// the overflowing grant `Unavailable`.
#[async_trait]
impl Semaphore for Liar<dyn Semaphore> {
    async fn acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        let lease = self.inner.acquire_permit(name, permits, opts).await?;
        self.lie_above(permits as usize, lease).await
    }
}

/// A read-write lock over [`Defect::WriterWithReaders`] (a writer granted while readers hold)
/// that answers such a writer's grant `Unavailable`.
#[async_trait]
impl RwLocker for Liar<dyn RwLocker> {
    async fn read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        self.inner.read(name, opts).await
    }

    async fn write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        let lease = self.inner.write(name, opts).await?;
        self.lie_above(1, lease).await
    }
}

/// The memory backend with `defect`, whose semaphore and read-write clients lie as above.
struct Lying(Arc<MemoryBackend>);

in_process!(forward(0) Lying {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        self.0.client(opts).await
    }

    async fn rw(&self, opts: ClientOptions) -> Result<Option<Arc<dyn RwLocker>>, Error> {
        let namespace = opts.namespace.clone();
        Ok(self.0.rw(opts).await?.map(|inner| -> Arc<dyn RwLocker> {
            Arc::new(Liar::new(inner, &self.0, namespace))
        }))
    }

    async fn semaphore(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Semaphore>>, Error> {
        let namespace = opts.namespace.clone();
        Ok(self.0.semaphore(opts).await?.map(|inner| -> Arc<dyn Semaphore> {
            Arc::new(Liar::new(inner, &self.0, namespace))
        }))
    }
});

/// Runs `scenario` on the lying memory backend with `defect`: the row must fail for the
/// server-side judgement of the extra request (not for a later check).
fn caught(defect: Defect, scenario: Scenario, what: &str) -> Row {
    let backend = Arc::new(Lying(Arc::new(MemoryBackend::with_defect(defect))));
    let row = run_printed(backend, "extra_request_controls", scenario);
    assert_caught(
        &row,
        &[
            what,
            "answered Unavailable",
            "the server still keeps entries of it",
            "held:",
        ],
    );
    row
}

/// A semaphore that grants a fourth permit of three but answers `Unavailable` is caught: the
/// extra permit is still held at the server while the three holders hold.
#[test]
fn semaphore_bound_judges_an_unavailable_extra_acquire_at_the_server() {
    caught(
        Defect::SemaphoreOverflow,
        Scenario::SemaphoreBound,
        "more than the 3 permit holders may hold at once",
    );
}

/// A writer granted while two readers hold, answered `Unavailable`, is caught the same way.
#[test]
fn rw_exclusion_judges_an_unavailable_writer_at_the_server() {
    caught(
        Defect::WriterWithReaders,
        Scenario::RwExclusion,
        "more than two readers may hold at once",
    );
}

/// The correct memory backend passes both, its extra request judged at the server too.
#[test]
fn the_reference_passes_both() {
    for scenario in [Scenario::SemaphoreBound, Scenario::RwExclusion] {
        let row = passes(scenario);
        assert!(
            row.figures.contains_key("extra_withdrawn_ms"),
            "the extra request was judged at the server: {}",
            row.summary()
        );
    }
}
