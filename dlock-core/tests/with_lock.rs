//! `LockerExt::with_lock`: the work runs under the lock, is cancelled when the lease is lost,
//! and the lease is released afterwards; on the reference backend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::{
    AcquireOptions, ErrorKind, LockName, Locker, LockerExt, LossReason, MemoryLocker, MemoryServer,
};

fn pair(ttl: Duration) -> (Arc<MemoryServer>, MemoryLocker, MemoryLocker) {
    let server = MemoryServer::new();
    let build = || {
        MemoryLocker::builder()
            .ttl(ttl)
            .server(Arc::clone(&server))
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    (server, a, b)
}

#[tokio::test]
async fn the_work_runs_holding_the_lock_and_the_lock_is_released_after() {
    let (_server, a, b) = pair(Duration::from_secs(2));
    let name = LockName::new("job").unwrap();
    let (token, held_during) = a
        .with_lock(&name, Duration::from_secs(1), |lease| {
            let (b, name) = (&b, &name);
            async move {
                let held = b.try_acquire(name).await.unwrap().is_none();
                lease.check().unwrap();
                (lease.token(), held)
            }
        })
        .await
        .unwrap();
    assert!(held_during, "another locker got the lock during the work");
    let after = b
        .try_acquire(&name)
        .await
        .unwrap()
        .expect("released after the work");
    assert!(after.token() > token);
    after.release().await.unwrap();
}

#[tokio::test]
async fn a_lost_lease_cancels_the_work_with_lost() {
    let (server, a, _b) = pair(Duration::from_secs(1));
    let name = LockName::new("lost").unwrap();
    let finished = Arc::new(AtomicBool::new(false));
    let result = a
        .with_lock(&name, AcquireOptions::forever(), |lease| {
            let (server, finished) = (Arc::clone(&server), Arc::clone(&finished));
            async move {
                assert_eq!(server.expire_now(lease.name()), Some(lease.token()));
                // Longer than the TTL: only the loss can end this.
                tokio::time::sleep(Duration::from_secs(30)).await;
                finished.store(true, Ordering::SeqCst);
            }
        })
        .await;
    let e = result.expect_err("the lease was lost");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the work was not cancelled"
    );
}

#[tokio::test]
async fn a_lease_lost_by_the_time_the_work_returns_is_reported() {
    let (server, a, _b) = pair(Duration::from_secs(1));
    let name = LockName::new("late-loss").unwrap();
    let result = a
        .with_lock(&name, Duration::from_secs(1), |lease| {
            let server = Arc::clone(&server);
            async move {
                server.expire_now(lease.name());
                // No await point after the expiry is noticed: the work completes; the loss
                // must still be reported.
                while lease.check().is_ok() {
                    tokio::task::yield_now().await;
                }
            }
        })
        .await;
    match result {
        Err(dlock_core::Error::Lost(reason)) => assert_ne!(reason, LossReason::Released),
        other => panic!("expected Lost, got {other:?}"),
    }
}

#[tokio::test]
async fn a_wait_that_runs_out_is_a_timeout_and_the_work_never_runs() {
    let (_server, a, b) = pair(Duration::from_secs(2));
    let name = LockName::new("busy").unwrap();
    let held = b.acquire(&name, AcquireOptions::forever()).await.unwrap();
    let ran = AtomicBool::new(false);
    let e = a
        .with_lock(&name, Duration::from_millis(100), |_| async {
            ran.store(true, Ordering::SeqCst);
        })
        .await
        .expect_err("held by b");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(!ran.load(Ordering::SeqCst));
    held.release().await.unwrap();
}

#[tokio::test]
async fn with_lock_works_through_dyn_locker() {
    let (_server, a, _b) = pair(Duration::from_secs(2));
    let locker: Arc<dyn Locker> = Arc::new(a);
    let name = LockName::new("dyn").unwrap();
    let out = locker
        .with_lock(&name, Duration::from_secs(1), |_| async { 7 })
        .await
        .unwrap();
    assert_eq!(out, 7);
}

#[test]
fn a_duration_is_a_bounded_wait() {
    let d = Duration::from_millis(250);
    assert_eq!(AcquireOptions::from(d), AcquireOptions::wait(d));
}
