//! The in-memory backend's semantics (the reference the conformance suite is proven on).

use std::sync::Arc;
use std::time::Duration;

use dlock_core::memory::MemoryServer;
use dlock_core::{AcquireOptions, Error, LockName, Locker, LossReason, MemoryLocker, Reentrant};
use tokio::time::Instant;

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
async fn grants_in_fifo_order_and_wakes_only_the_head() {
    let server = MemoryServer::new();
    let holder = client(&server);
    let lock = name("fifo");
    let first = holder
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    let mut clients = Vec::new();
    for i in 0..8 {
        let c = Arc::new(client(&server));
        clients.push(Arc::clone(&c));
        let tx = tx.clone();
        let lock = lock.clone();
        waiters.push(tokio::spawn(async move {
            let lease = c
                .acquire(&lock, AcquireOptions::forever())
                .await
                .expect("granted");
            tx.send(i).expect("send");
            tokio::time::sleep(Duration::from_millis(10)).await;
            lease.release().await.expect("release");
        }));
        // Let waiter i enqueue before waiter i+1.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    first.release().await.expect("release");
    for w in waiters {
        w.await.expect("task");
    }
    let order: Vec<i32> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert_eq!(order, (0..8).collect::<Vec<_>>());
    let wakeups: u64 = clients.iter().map(|c| c.stats().wakeups).sum();
    assert_eq!(wakeups, 8, "one wakeup per handoff");
    assert!(server.entries("").is_empty());
}

#[tokio::test(start_paused = true)]
async fn cancel_and_timeout_leave_nothing_and_pass_the_turn_on() {
    let server = MemoryServer::new();
    let (a, b, c) = (client(&server), client(&server), client(&server));
    let lock = name("cancel");
    let held = a
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    // b times out.
    let err = b
        .acquire(&lock, AcquireOptions::wait(Duration::from_millis(300)))
        .await
        .expect_err("held");
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert_eq!(server.entries(""), vec!["held:cancel".to_owned()]);
    // b enqueues, then is cancelled; c waits behind it.
    let pending = tokio::spawn({
        let b = Arc::new(b);
        let lock = lock.clone();
        async move { b.acquire(&lock, AcquireOptions::forever()).await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    let c = Arc::new(c);
    let waiting = tokio::spawn({
        let c = Arc::clone(&c);
        let lock = lock.clone();
        async move { c.acquire(&lock, AcquireOptions::forever()).await }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    pending.abort();
    let _ = pending.await;
    assert_eq!(
        server.entries(""),
        vec!["held:cancel".to_owned(), "queued:cancel".to_owned()]
    );
    let released_at = Instant::now();
    held.release().await.expect("release");
    let lease = waiting.await.expect("task").expect("granted");
    assert!(
        Instant::now() - released_at < Duration::from_millis(50),
        "granted at once, not after a TTL"
    );
    lease.release().await.expect("release");
    assert!(server.entries("").is_empty());
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
async fn tokens_increase_also_after_a_forced_expiry() {
    let server = MemoryServer::new();
    let (a, b) = (client(&server), client(&server));
    let lock = name("fence");
    let t1 = a
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    assert!(server.expire_now(&lock).is_some());
    let t2 = b
        .try_acquire(&lock)
        .await
        .expect("ok")
        .expect("free after expiry");
    assert!(t2.token() > t1.token());
    // The expired holder learns at its next renewal.
    assert!(matches!(t1.lost().await, LossReason::Gone(_)));
    let t2_token = t2.token();
    t2.release().await.expect("release");
    // The stale holder's release must not delete anything of a newer holder.
    let t3 = a
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    assert!(t3.token() > t2_token);
    t1.releaser().release().await.expect("idempotent");
    assert!(
        b.try_acquire(&lock).await.expect("ok").is_none(),
        "t3 still holds"
    );
    t3.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn loss_is_announced_before_anyone_else_is_granted() {
    let server = MemoryServer::new();
    let (a, b) = (client(&server), client(&server));
    let lock = name("loss");
    let lease = a
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    lease.stop_renewal_for_test();
    let lost = tokio::spawn({
        let f = lease.lost();
        async move {
            let r = f.await;
            (r, Instant::now())
        }
    });
    let other = b
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("granted after expiry");
    let granted_at = Instant::now();
    let (reason, lost_at) = lost.await.expect("task");
    assert_eq!(reason, LossReason::Expired);
    assert!(
        lost_at <= granted_at,
        "lost() must fire before the other grant"
    );
    assert!(other.token() > lease.token());
    other.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn renewal_keeps_a_lease_for_many_ttls() {
    let server = MemoryServer::new();
    let (a, b) = (client(&server), client(&server));
    let lock = name("renew");
    let lease = a
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    for _ in 0..20 {
        tokio::time::sleep(TTL / 2).await;
        assert!(b.try_acquire(&lock).await.expect("ok").is_none());
    }
    assert!(!lease.is_lost());
    assert!(a.stats().renewals >= 25, "{:?}", a.stats());
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

#[tokio::test]
async fn names_are_isolated() {
    let server = MemoryServer::new();
    let a = client(&server);
    let held = a
        .acquire(&name("a"), AcquireOptions::forever())
        .await
        .expect("free");
    for other in ["a/b", "ab", "a.b"] {
        let l = a
            .try_acquire(&name(other))
            .await
            .expect("ok")
            .expect("isolated");
        l.release().await.expect("release");
    }
    held.release().await.expect("release");
}

#[test]
fn bad_options_are_rejected_before_any_io() {
    assert!(matches!(
        MemoryLocker::builder().ttl(Duration::ZERO).build(),
        Err(Error::InvalidOption { option: "ttl", .. })
    ));
    assert!(
        MemoryLocker::builder()
            .ttl(Duration::from_secs(100 * 24 * 3600))
            .build()
            .is_err()
    );
}

#[tokio::test(start_paused = true)]
async fn reentrant_holds_are_counted_and_the_last_release_releases() {
    let server = MemoryServer::new();
    let a = Reentrant::new(client(&server));
    let b = client(&server);
    let lock = name("re");
    let outer = a
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    let inner = a
        .acquire(&lock, AcquireOptions::wait(Duration::ZERO))
        .await
        .expect("nested");
    let third = a.try_acquire(&lock).await.expect("ok").expect("nested");
    assert_eq!(inner.token(), outer.token());
    assert_eq!(outer.hold_count(), 3);
    third.release().await.expect("release");
    inner.release().await.expect("release");
    assert_eq!(outer.hold_count(), 1);
    assert!(
        b.try_acquire(&lock).await.expect("ok").is_none(),
        "still held once"
    );
    let outer_token = outer.token();
    outer.release().await.expect("release");
    let l = b
        .try_acquire(&lock)
        .await
        .expect("ok")
        .expect("free after the last release");
    l.release().await.expect("release");
    // After release, the wrapper acquires afresh with a new token.
    let again = a
        .acquire(&lock, AcquireOptions::forever())
        .await
        .expect("free");
    assert!(again.token() > outer_token);
    again.release().await.expect("release");
}
