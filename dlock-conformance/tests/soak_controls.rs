//! The soak cannot pass with nothing tested: a backend whose every acquire fails, a run below
//! its minimum counts, a backend that cannot be built and a skip under CI all fail it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::memory::MemoryBackend;
use dlock_conformance::soak::{Minimums, SoakPlan, run_plan, soak_outcome};
use dlock_conformance::{ClientOptions, TestBackend};
use dlock_core::{AcquireOptions, Capabilities, Error, Lease, LockName, LockState, Locker, Stats};
use support::{in_process, reason};

mod support;

/// A memory locker whose acquires all fail with `Unavailable` (its server is never reached);
/// everything else is the memory locker's.
struct NeverGrants(Arc<dyn Locker>);

#[async_trait]
impl Locker for NeverGrants {
    async fn acquire(&self, _: &LockName, _: AcquireOptions) -> Result<Lease, Error> {
        Err(Error::unavailable("never grants (negative control)", None))
    }

    async fn try_acquire(&self, _: &LockName) -> Result<Option<Lease>, Error> {
        Err(Error::unavailable("never grants (negative control)", None))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState, Error> {
        self.0.inspect(name).await
    }

    fn ttl(&self) -> Duration {
        self.0.ttl()
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    fn stats(&self) -> Stats {
        self.0.stats()
    }

    async fn close(&self) -> Result<(), Error> {
        self.0.close().await
    }
}

/// The memory backend with [`NeverGrants`] clients.
struct NeverGrantsBackend(MemoryBackend);

in_process!(forward(0) NeverGrantsBackend {
    fn name(&self) -> &str {
        "memory-nevergrants"
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Ok(Arc::new(NeverGrants(self.0.client(opts).await?)))
    }
});

/// A short soak with every nemesis, judged against `minimums`.
fn soak(backend: Arc<dyn TestBackend>, minimums: Minimums) -> Result<String, String> {
    let mut plan = SoakPlan::new(Duration::from_secs(4), 7);
    plan.minimums = minimums;
    let out = run_plan(backend, "soak_controls", &plan).map_err(reason);
    println!("{out:?}");
    out
}

/// Asks for one grant, one accepted write and one break that hit a holder.
const SOME: Minimums = Minimums {
    grants: 1,
    accepted_writes: 1,
    breaks_hit: 1,
    frozen_rejected: 0,
};

/// The control: the honest memory backend reaches [`SOME`] in the same short soak.
#[test]
fn the_honest_memory_backend_reaches_the_minimums() {
    let out = soak(Arc::new(MemoryBackend::new()), SOME).expect("the honest backend passes");
    assert!(!out.contains(" grants=0 "), "{out}");
    assert!(!out.contains(" breaks_hit=0 "), "{out}");
}

/// A backend whose every acquire fails never violates a checker (nothing is held), yet the
/// soak fails: `grants=0`.
#[test]
fn a_backend_whose_acquires_all_fail_fails_the_soak() {
    let err = soak(Arc::new(NeverGrantsBackend(MemoryBackend::new())), SOME)
        .expect_err("a soak with no grant passed");
    assert!(err.contains("the soak tested too little"), "{err}");
    assert!(err.contains("grants=0 (at least 1)"), "{err}");
    assert!(err.contains("accepted writes=0 (at least 1)"), "{err}");
    assert!(
        err.contains("breaks that hit a holder=0 (at least 1)"),
        "{err}"
    );
}

/// Even the default minimums of a short soak (no whole minute) ask for a grant and a write.
#[test]
fn a_soak_of_seconds_still_needs_a_grant_and_a_write() {
    let min = Minimums::for_duration(Duration::from_secs(4));
    assert_eq!((min.grants, min.accepted_writes), (1, 1));
    let err = soak(Arc::new(NeverGrantsBackend(MemoryBackend::new())), min)
        .expect_err("a soak with no grant passed");
    assert!(err.contains("grants=0 (at least 1)"), "{err}");
}

/// A count below its minimum fails the soak on its own: the honest backend cannot show 10,000
/// breaks that hit a holder in 4 s.
#[test]
fn a_count_below_its_minimum_fails_the_soak() {
    let err = soak(
        Arc::new(MemoryBackend::new()),
        Minimums {
            breaks_hit: 10_000,
            ..SOME
        },
    )
    .expect_err("a soak below its minimum passed");
    assert!(
        err.contains("breaks that hit a holder=") && err.contains("(at least 10000)"),
        "{err}"
    );
    assert!(
        !err.contains("grants=0 (at least"),
        "only the short count is named: {err}"
    );
}

fn builds_nothing() -> Arc<dyn TestBackend> {
    panic!("cannot connect to the test servers")
}

fn skips() -> Arc<dyn TestBackend> {
    dlock_conformance::skip_backend("the server binaries are missing".into())
}

/// A backend that cannot be built fails the soak, under CI or not; a deliberate skip is a
/// skip only outside CI.
#[test]
fn only_a_deliberate_skip_outside_ci_is_a_skip() {
    let plan = SoakPlan::new(Duration::from_secs(60), 1);
    for ci in [false, true] {
        let err = soak_outcome("broken", builds_nothing, &plan, ci)
            .expect_err("a backend that cannot be built passed the soak");
        assert!(err.starts_with("DLOCK_SOAK failed backend=broken"), "{err}");
        assert!(err.contains("could not be built"), "{err}");
    }
    let skipped = soak_outcome("absent", skips, &plan, false).expect("a skip outside CI");
    assert!(
        skipped.starts_with("DLOCK_SOAK skipped backend=absent"),
        "{skipped}"
    );
    let err = soak_outcome("absent", skips, &plan, true).expect_err("a skip under CI passed");
    assert!(err.starts_with("DLOCK_SOAK failed backend=absent"), "{err}");
    assert!(err.contains("skipped under CI"), "{err}");
}
