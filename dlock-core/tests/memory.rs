//! The in-memory backend's queue semantics that no conformance scenario can ask of every
//! backend (Redis spin mode lets a newcomer in): no barging past queued waiters, and a dropped
//! lease freed at once. Everything else of the reference runs as the `memory` conformance row
//! (`dlock-conformance/tests/memory.rs`).

use std::sync::Arc;
use std::time::Duration;

use dlock_core::memory::MemoryServer;
use dlock_core::{AcquireOptions, LockName, Locker, MemoryLocker};

const TTL: Duration = Duration::from_secs(2);

fn client(server: &Arc<MemoryServer>) -> MemoryLocker {
    MemoryLocker::builder()
        .ttl(TTL)
        .server(Arc::clone(server))
        .build()
        .expect("valid ttl")
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid")
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_never_barges_past_queued_waiters() {
    let server = MemoryServer::new();
    let (a, b, c) = (client(&server), Arc::new(client(&server)), client(&server));
    let lock = name("barge");
    let held = a
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    let waiter = tokio::spawn({
        let (b, lock) = (Arc::clone(&b), lock.clone());
        async move { b.acquire(&lock, AcquireOptions::forever()).await }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    held.release().await.expect("release");
    // The lock is free but b is queued: a newcomer must not take it.
    assert!(
        c.try_acquire(&lock).await.expect("ok").is_none(),
        "barged past the queue"
    );
    let lease = waiter.await.expect("task").expect("granted");
    lease.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn dropping_a_lease_releases_it() {
    let server = MemoryServer::new();
    let (a, b) = (client(&server), client(&server));
    let lock = name("drop");
    drop(
        a.acquire(&lock, AcquireOptions::forever())
            .await
            .expect("free"),
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    let lease = b
        .try_acquire(&lock)
        .await
        .expect("ok")
        .expect("released by drop, not by TTL");
    lease.release().await.expect("release");
}
