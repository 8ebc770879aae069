//! Criterion micro-benchmarks of any [`Locker`] (feature `criterion`): what each backend
//! crate's `cargo bench` runs against the servers the harness starts. They time dlock alone;
//! the comparison with the raw server floor and the peer libraries is `cargo xtask bench`
//! (dlock-bench), so these stay small.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use dlock_core::{AcquireOptions, LockName, Locker};
use tokio::runtime::Runtime;

/// The runtime the benches drive their lockers on: two worker threads, timers and I/O.
///
/// # Panics
/// When the runtime cannot be built.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the benches")
}

/// Criterion with short measurements: real servers, a few seconds per benchmark.
pub fn criterion() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args()
}

/// Three benchmarks of one backend, named `{label}/…`, with two lockers (each its own
/// connection or session) of the same backend and namespace:
/// - `acquire_release`: `a` acquires and releases an uncontended lock;
/// - `try_acquire_held`: `b` tries a lock `a` holds (the attempt must fail);
/// - `handoff`: `a` releases a lock `b` is queued for, until `b` holds it (the time from the
///   release's start to `b`'s grant).
///
/// # Panics
/// When a lock operation fails (the bench's servers are expected to be up).
pub fn bench(c: &mut Criterion, rt: &Runtime, label: &str, a: Arc<dyn Locker>, b: Arc<dyn Locker>) {
    let name = |s: &str| LockName::new(format!("micro-{s}")).expect("a valid name");
    let (free, held, passed) = (name("free"), name("held"), name("handoff"));
    let mut g = c.benchmark_group(label);
    g.bench_function("acquire_release", |bench| {
        bench.to_async(rt).iter(|| async {
            let lease = a
                .acquire(&free, AcquireOptions::forever())
                .await
                .expect("acquire");
            lease.release().await.expect("release");
        });
    });
    let holder = rt
        .block_on(a.acquire(&held, AcquireOptions::forever()))
        .expect("acquire the held lock");
    g.bench_function("try_acquire_held", |bench| {
        bench.to_async(rt).iter(|| async {
            let got = b.try_acquire(&held).await.expect("try_acquire");
            assert!(got.is_none(), "try_acquire got a lock someone holds");
        });
    });
    rt.block_on(holder.release())
        .expect("release the held lock");
    g.bench_function("handoff", |bench| {
        bench
            .to_async(rt)
            .iter_custom(|iters| handoffs(&a, &b, &passed, iters));
    });
    g.finish();
}

/// `iters` handoffs from `a` to `b`: the time from each release's start to `b`'s grant.
async fn handoffs(
    a: &Arc<dyn Locker>,
    b: &Arc<dyn Locker>,
    name: &LockName,
    iters: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let lease = a
            .acquire(name, AcquireOptions::forever())
            .await
            .expect("acquire");
        let waits = b.stats().waits;
        let (waiter, lock) = (Arc::clone(b), name.clone());
        let queued =
            tokio::spawn(async move { waiter.acquire(&lock, AcquireOptions::forever()).await });
        // Release only once `b` waits in the queue (it counts the wait after its first
        // attempt found the lock held), so the time is a handoff, not an acquire.
        let patience = Instant::now() + Duration::from_secs(5);
        while b.stats().waits == waits {
            assert!(Instant::now() < patience, "the waiter never queued");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let released = Instant::now();
        lease.release().await.expect("release");
        let next = queued
            .await
            .expect("the waiter task")
            .expect("the waiter's acquire");
        total += released.elapsed();
        next.release().await.expect("release");
    }
    total
}
