//! The extra request of `semaphore_bound` and `rw_exclusion` is judged at the server: a backend
//! that grants it but answers `Unavailable` is caught by what the server still holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::memory::MemoryBackend;
use dlock_conformance::scenarios::{Fencing, run_control};
use dlock_conformance::{ClientOptions, Row, Scenario, Status, TestBackend};
use dlock_core::memory::Defect;
use dlock_core::{
    AcquireOptions, Capabilities, Error, FencingToken, Lease, LockName, LockState, Locker,
    RwLocker, Semaphore, Stats,
};

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

/// The mutex of a lying wrapper is its inner locker's.
macro_rules! inner_locker {
    ($wrapper:ty) => {
        #[async_trait]
        impl Locker for $wrapper {
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
    };
}

inner_locker!(LyingSemaphore);
inner_locker!(LyingRw);

/// A semaphore over [`Defect::SemaphoreOverflow`] (one permit more than it has) that answers
/// the overflowing grant `Unavailable`.
struct LyingSemaphore {
    inner: Arc<dyn Semaphore>,
    backend: Arc<MemoryBackend>,
    namespace: String,
    kept: Mutex<Vec<Lease>>,
}

#[async_trait]
impl Semaphore for LyingSemaphore {
    async fn acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        let lease = self.inner.acquire_permit(name, permits, opts).await?;
        lie_above(
            &self.backend,
            &self.namespace,
            permits as usize,
            lease,
            &self.kept,
        )
        .await
    }
}

/// A read-write lock over [`Defect::WriterWithReaders`] (a writer granted while readers hold)
/// that answers such a writer's grant `Unavailable`.
struct LyingRw {
    inner: Arc<dyn RwLocker>,
    backend: Arc<MemoryBackend>,
    namespace: String,
    kept: Mutex<Vec<Lease>>,
}

#[async_trait]
impl RwLocker for LyingRw {
    async fn read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        self.inner.read(name, opts).await
    }

    async fn write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        let lease = self.inner.write(name, opts).await?;
        lie_above(&self.backend, &self.namespace, 1, lease, &self.kept).await
    }
}

/// The memory backend with `defect`, whose semaphore and read-write clients lie as above.
struct Lying(Arc<MemoryBackend>);

#[async_trait]
impl TestBackend for Lying {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn node_addrs(&self) -> Vec<std::net::SocketAddr> {
        Vec::new()
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        self.0.client(opts).await
    }

    async fn rw(&self, opts: ClientOptions) -> Result<Option<Arc<dyn RwLocker>>, Error> {
        let namespace = opts.namespace.clone();
        Ok(self.0.rw(opts).await?.map(|inner| -> Arc<dyn RwLocker> {
            Arc::new(LyingRw {
                inner,
                backend: Arc::clone(&self.0),
                namespace,
                kept: Mutex::new(Vec::new()),
            })
        }))
    }

    async fn semaphore(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Semaphore>>, Error> {
        let namespace = opts.namespace.clone();
        Ok(self
            .0
            .semaphore(opts)
            .await?
            .map(|inner| -> Arc<dyn Semaphore> {
                Arc::new(LyingSemaphore {
                    inner,
                    backend: Arc::clone(&self.0),
                    namespace,
                    kept: Mutex::new(Vec::new()),
                })
            }))
    }

    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        self.0.leftovers(namespace).await
    }

    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error> {
        self.0.break_holder(namespace, name).await
    }

    fn child_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// Runs `scenario` on the lying memory backend with `defect`: the row must fail for the
/// server-side judgement of the extra request (not for a later check).
fn caught(defect: Defect, scenario: Scenario, what: &str) -> Row {
    let backend = Arc::new(Lying(Arc::new(MemoryBackend::with_defect(defect))));
    let row = run_control(backend, "extra_request_controls", scenario, Fencing::On);
    println!("{}", row.summary());
    assert_eq!(row.status, Status::Fail, "{}", row.summary());
    for needle in [
        what,
        "answered Unavailable",
        "the server still keeps entries of it",
        "held:",
    ] {
        assert!(row.reason.contains(needle), "{needle:?}: {}", row.summary());
    }
    row
}

/// Runs `scenario` on the correct memory backend: the row must pass.
fn passes(scenario: Scenario) -> Row {
    let row = run_control(
        Arc::new(MemoryBackend::new()),
        "memory",
        scenario,
        Fencing::On,
    );
    assert_eq!(row.status, Status::Pass, "{}", row.summary());
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
