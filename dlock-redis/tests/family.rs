//! The read-write lock and the semaphore on one Redis server, beyond the shared scenarios:
//! permit counts that disagree, requests dropped while queued, a reader behind a waiting
//! writer, a holder deleted from outside, and mutex and family leases renewed together.

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker, LossReason, RwLocker, Semaphore};
use dlock_redis::RedisLocker;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(10);

fn shared() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn url() -> String {
    shared().endpoints().remove(0)
}

async fn locker(ns: &str, ttl: Duration, fair: bool) -> RedisLocker {
    RedisLocker::builder()
        .url(url())
        .ttl(ttl)
        .namespace(ns)
        .fair(fair)
        .build()
        .await
        .expect("locker")
}

async fn conn() -> MultiplexedConnection {
    redis::Client::open(url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connection")
}

fn ns(test: &str) -> String {
    format!("dlock-test/redis-family-{}/{test}", std::process::id())
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

/// Waits until nothing of `ns` is left at the server (the leak audit the conformance suite
/// uses).
async fn nothing_left(ns: &str) {
    let began = Instant::now();
    loop {
        let left = support::server_leftovers(&url(), ns)
            .await
            .expect("leak audit");
        if left.is_empty() {
            return;
        }
        assert!(began.elapsed() < WAIT, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A read, a write or a permit lease whose entry was deleted from outside is lost at its next
/// renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_deleted_from_outside_is_lost_at_its_next_renewal() {
    let ns = ns("deleted");
    let ttl = Duration::from_millis(900);
    let l = locker(&ns, ttl, true).await;
    let leases = [
        l.read(&name("r"), AcquireOptions::wait(WAIT))
            .await
            .expect("read"),
        l.write(&name("w"), AcquireOptions::wait(WAIT))
            .await
            .expect("write"),
        l.acquire_permit(&name("p"), 3, AcquireOptions::wait(WAIT))
            .await
            .expect("permit"),
    ];
    // A mutex lease on the same locker, renewed in the same rounds, stays held.
    let mutex = l
        .acquire(&name("m"), AcquireOptions::wait(WAIT))
        .await
        .expect("mutex");
    let mut c = conn().await;
    for lock in ["r", "w", "p"] {
        let deleted: i64 = redis::cmd("DEL")
            .arg(format!("{ns}/dlock:{{{lock}}}:holders"))
            .query_async(&mut c)
            .await
            .expect("DEL");
        assert_eq!(deleted, 1, "{lock}");
    }
    let deleted_at = Instant::now();
    for lease in &leases {
        let reason = tokio::time::timeout(ttl, lease.lost())
            .await
            .expect("lost within one TTL");
        assert!(
            matches!(reason, LossReason::Gone(_)),
            "{}: {reason}",
            lease.name()
        );
    }
    assert!(deleted_at.elapsed() < ttl);
    assert!(
        !mutex.is_lost(),
        "the mutex lease of the same rounds is kept"
    );
    mutex.release().await.expect("release");
    nothing_left(&ns).await;
}

/// Mutex, read and permit leases of one locker stay held over several TTLs, renewed together
/// in one round trip per round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_and_family_leases_are_renewed_in_one_round_trip() {
    let ns = ns("renewed-together");
    let ttl = Duration::from_millis(600);
    let l = locker(&ns, ttl, true).await;
    let leases = [
        l.acquire(&name("m"), AcquireOptions::wait(WAIT))
            .await
            .expect("mutex"),
        l.read(&name("r"), AcquireOptions::wait(WAIT))
            .await
            .expect("read"),
        l.acquire_permit(&name("p"), 2, AcquireOptions::wait(WAIT))
            .await
            .expect("permit"),
    ];
    let before = l.stats().requests;
    let held_for = ttl * 4;
    tokio::time::sleep(held_for).await;
    let rounds = l.stats().requests - before;
    for lease in &leases {
        assert!(!lease.is_lost(), "{} was lost", lease.name());
    }
    // One round every TTL/3: about 12 rounds; three leases renewed separately would be ~36.
    assert!(
        (4..=18).contains(&rounds),
        "{rounds} requests in {held_for:?}"
    );
    for lease in leases {
        lease.release().await.expect("release");
    }
    nothing_left(&ns).await;
}
