//! `Reentrant` under real threads: a last release racing nested acquires, and a lease released
//! behind a hold's back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    AcquireOptions, Capabilities, Error, Lease, LockName, LockState, Locker, LossReason,
    MemoryLocker, MemoryServer, Reentrant, Stats,
};

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid")
}

/// A memory locker with `ttl` on `server`.
fn memory_locker(server: &Arc<MemoryServer>, ttl: Duration) -> MemoryLocker {
    MemoryLocker::builder()
        .ttl(ttl)
        .server(Arc::clone(server))
        .build()
        .expect("locker")
}

fn held_at_server(server: &MemoryServer, name: &LockName) -> bool {
    server
        .entries(name.as_str())
        .contains(&format!("held:{name}"))
}

/// Grants only through `acquire`; `try_acquire` never grants (it reports the lock as taken).
/// Nested acquires through `Reentrant::try_acquire` then only ever re-enter the grant the main
/// task holds, so "the server holds the lock" means "the server holds *that* grant".
struct AcquireOnly(MemoryLocker);

#[async_trait]
impl Locker for AcquireOnly {
    async fn acquire(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        self.0.acquire(name, opts).await
    }
    async fn try_acquire(&self, _name: &LockName) -> Result<Option<Lease>, Error> {
        Ok(None)
    }
    fn ttl(&self) -> Duration {
        self.0.ttl()
    }
    async fn close(&self) -> Result<(), Error> {
        self.0.close().await
    }
    async fn inspect(&self, name: &LockName) -> Result<LockState, Error> {
        self.0.inspect(name).await
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    fn stats(&self) -> Stats {
        self.0.stats()
    }
}

/// While a task has a hold, only its own release can release the lock, so a hold whose
/// `check()` passes must be backed by the server's entry. Nested acquires on other threads race
/// the last release of the main task's hold; none of them may get a hold on a lock that is being
/// released at the server.
///
/// Each nester tries `TRIES` times and then goes on until the nesters have seen `ENOUGH`
/// nested holds: on a busy machine every try of a fixed count can fall where the main task
/// holds nothing (the threads descheduled in turn), and the test would have checked nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nested_acquire_racing_the_last_release_never_holds_a_released_lock() {
    const NESTERS: usize = 3;
    /// Tries of each nester at least.
    const TRIES: usize = 100_000;
    /// Nested holds the nesters must have checked.
    const ENOUGH: usize = 300;
    /// Rounds of the main task before the test gives up on seeing `ENOUGH` nested holds.
    const MAX_ROUNDS: usize = 1_000_000;
    let server = MemoryServer::new();
    let locker = Arc::new(Reentrant::new(AcquireOnly(memory_locker(
        &server,
        Duration::from_secs(10),
    ))));
    let lock = name("race");
    let stop = Arc::new(AtomicBool::new(false));
    let nested = Arc::new(AtomicUsize::new(0));
    let nesters: Vec<_> = (0..NESTERS)
        .map(|_| {
            let (server, locker, lock) = (Arc::clone(&server), Arc::clone(&locker), lock.clone());
            let (stop, nested) = (Arc::clone(&stop), Arc::clone(&nested));
            tokio::spawn(async move {
                let mut tries = 0usize;
                while !stop.load(Ordering::Relaxed)
                    && (tries < TRIES || nested.load(Ordering::Relaxed) < ENOUGH)
                {
                    tries += 1;
                    let Some(hold) = locker.try_acquire(&lock).await.expect("try") else {
                        continue;
                    };
                    nested.fetch_add(1, Ordering::Relaxed);
                    // Give a racing release time to reach the server.
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                        assert!(
                            hold.check().is_err() || held_at_server(&server, &lock),
                            "a hold (count {}) passes check() while the server does not hold the lock",
                            hold.hold_count()
                        );
                        assert!(hold.is_lost() || held_at_server(&server, &lock));
                        // And as this hold keeps the count above zero, nobody can have
                        // released the grant: a nested hold is never handed out dead.
                        assert!(
                            hold.check().is_ok(),
                            "a nested hold on a grant its last hold released: {:?}",
                            hold.check()
                        );
                    }
                    hold.release().await.expect("release");
                }
            })
        })
        .collect();
    let mut rounds = 0usize;
    while rounds < MAX_ROUNDS && nesters.iter().any(|n| !n.is_finished()) {
        let outer = locker
            .acquire(&lock, AcquireOptions::forever())
            .await
            .expect("acquire");
        tokio::task::yield_now().await;
        outer.release().await.expect("release");
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for n in nesters {
        n.await.expect("a nester failed");
    }
    let nested = nested.load(Ordering::Relaxed);
    assert!(
        nested >= ENOUGH,
        "rounds {rounds}, nested {nested}: the race did not happen often enough"
    );
    assert!(
        !held_at_server(&server, &lock),
        "the last release left the lock held"
    );
}

/// A lease released through its `Releaser` is no longer held: `check()` fails, `is_lost()` is
/// true, `lost()` resolves with `Released`, for every hold of a re-entrant lease too.
#[tokio::test(start_paused = true)]
async fn a_lease_released_through_its_releaser_is_not_reported_held() {
    let server = MemoryServer::new();
    let plain = memory_locker(&server, Duration::from_secs(2));
    let lock = name("releaser");
    let lease = plain
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    lease.releaser().release().await.expect("release");
    assert!(!held_at_server(&server, &lock));
    assert!(
        matches!(lease.check(), Err(Error::Lost(LossReason::Released))),
        "{:?}",
        lease.check()
    );
    assert!(lease.is_lost());
    assert_eq!(lease.lost().await, LossReason::Released);
    drop(lease);

    let reentrant = Reentrant::new(memory_locker(&server, Duration::from_secs(2)));
    let outer = reentrant
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    let inner = reentrant
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("nested");
    inner.releaser().release().await.expect("release");
    assert!(!held_at_server(&server, &lock));
    assert!(outer.check().is_err() && outer.is_lost());
    assert!(inner.check().is_err() && inner.is_lost());
    // A released lease is not re-entered: the next acquire is a new grant.
    let again = reentrant
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("new grant");
    assert!(again.token() > outer.token());
    assert_eq!(again.hold_count(), 1);
    assert!(held_at_server(&server, &lock));
    inner.release().await.expect("release");
    outer.release().await.expect("release");
    assert!(
        held_at_server(&server, &lock),
        "releasing the old grant's holds must not release the new grant"
    );
    again.release().await.expect("release");
    assert!(!held_at_server(&server, &lock));
}
