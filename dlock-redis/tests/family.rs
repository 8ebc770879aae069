//! The read-write lock and the semaphore on one Redis server, beyond the shared scenarios:
//! permit counts that disagree, requests dropped while queued, a reader behind a waiting
//! writer, a holder deleted from outside, and mutex and family leases renewed together.

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{
    AcquireOptions, ErrorKind, Lease, LockName, Locker, LossReason, RwLocker, Semaphore,
};
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

fn locker(ns: &str, ttl: Duration, fair: bool) -> RedisLocker {
    RedisLocker::builder()
        .url(url())
        .ttl(ttl)
        .namespace(ns)
        .fair(fair)
        .build()
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

/// Waits until the family queue of `lock` under `ns` holds `n` entries.
async fn queue_len_becomes(ns: &str, lock: &str, n: usize) {
    let key = format!("{ns}/dlock:{{{lock}}}:holders:q");
    let mut c = conn().await;
    let began = Instant::now();
    loop {
        let len: usize = redis::cmd("LLEN")
            .arg(&key)
            .query_async(&mut c)
            .await
            .expect("LLEN");
        if len == n {
            return;
        }
        assert!(
            began.elapsed() < WAIT,
            "the queue {key} never held {n} entries (it holds {len})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_count_that_differs_from_the_held_one_is_invalid_input() {
    let ns = ns("permits-differ");
    let (a, b) = (
        locker(&ns, Duration::from_secs(5), true),
        locker(&ns, Duration::from_secs(5), true),
    );
    let lock = name("sem");
    let held = a
        .acquire_permit(&lock, 2, AcquireOptions::wait(WAIT))
        .await
        .expect("a permit");
    for other in [1, 3] {
        let err = b
            .acquire_permit(&lock, other, AcquireOptions::wait(Duration::from_secs(2)))
            .await
            .expect_err("another count while permits are held");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{other}: {err}");
    }
    // The agreed count still works beside it, and the refused requests left nothing queued.
    let second = b
        .acquire_permit(&lock, 2, AcquireOptions::wait(WAIT))
        .await
        .expect("the second of two permits");
    second.release().await.expect("release");
    held.release().await.expect("release");
    nothing_left(&ns).await;
    // Once nobody holds or waits, a new count may be recorded.
    let fresh = b
        .acquire_permit(&lock, 5, AcquireOptions::wait(WAIT))
        .await
        .expect("a new count once the semaphore is unused");
    fresh.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_permits_is_invalid_input_without_a_request() {
    let ns = ns("zero-permits");
    let l = locker(&ns, Duration::from_secs(5), true);
    let before = l.stats().requests;
    let err = l
        .acquire_permit(&name("sem"), 0, AcquireOptions::wait(WAIT))
        .await
        .expect_err("zero permits");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let err = l
        .acquire_permit(
            &name("sem"),
            dlock_core::MAX_PERMITS + 1,
            AcquireOptions::wait(WAIT),
        )
        .await
        .expect_err("too many permits");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert_eq!(l.stats().requests, before, "no request may be sent");
}

/// A read, a write and a permit request, each dropped while queued behind a holder, leave
/// nothing behind (in fair and spin mode: both queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_dropped_while_queued_leave_nothing_behind() {
    for fair in [true, false] {
        let ns = ns(&format!("dropped-{fair}"));
        let holder = locker(&ns, Duration::from_secs(5), fair);
        let waiter = locker(&ns, Duration::from_secs(5), fair);
        let rw = name("rw");
        let sem = name("sem");
        let write = holder
            .write(&rw, AcquireOptions::wait(WAIT))
            .await
            .expect("write");
        let permit = holder
            .acquire_permit(&sem, 1, AcquireOptions::wait(WAIT))
            .await
            .expect("permit");
        for (lock, what) in [("rw", "read"), ("rw", "write"), ("sem", "permit")] {
            let (w, n) = (waiter.clone(), name(lock));
            let task = tokio::spawn(async move {
                let opts = AcquireOptions::forever();
                match what {
                    "read" => w.read(&n, opts).await,
                    "write" => w.write(&n, opts).await,
                    _ => w.acquire_permit(&n, 1, opts).await,
                }
            });
            queue_len_becomes(&ns, lock, 1).await;
            task.abort();
            assert!(task.await.is_err(), "{what}: the request was cancelled");
            queue_len_becomes(&ns, lock, 0).await;
        }
        write.release().await.expect("release");
        permit.release().await.expect("release");
        nothing_left(&ns).await;
        assert_eq!(waiter.held(), 0);
    }
}

/// A reader that arrives while a writer waits (behind another reader) queues behind the
/// writer: granted only after the writer, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_a_waiting_writer_waits_for_it() {
    let ns = ns("reader-behind-writer");
    let (r1, w, r2) = (
        locker(&ns, Duration::from_secs(5), true),
        locker(&ns, Duration::from_secs(5), true),
        locker(&ns, Duration::from_secs(5), true),
    );
    let lock = name("rw");
    let first = r1
        .read(&lock, AcquireOptions::wait(WAIT))
        .await
        .expect("first reader");
    let (wc, l) = (w.clone(), lock.clone());
    let writer = tokio::spawn(async move { wc.write(&l, AcquireOptions::wait(WAIT)).await });
    queue_len_becomes(&ns, "rw", 1).await;
    let (rc, l) = (r2.clone(), lock.clone());
    let reader = tokio::spawn(async move { rc.read(&l, AcquireOptions::wait(WAIT)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !reader.is_finished(),
        "the second reader was granted past the waiting writer"
    );
    queue_len_becomes(&ns, "rw", 2).await;
    first.release().await.expect("release");
    let written: Lease = writer.await.expect("join").expect("the writer is granted");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !reader.is_finished(),
        "the second reader was granted while the writer holds"
    );
    let wtoken = written.token();
    written.release().await.expect("release");
    let read = reader.await.expect("join").expect("the second reader");
    assert!(read.token() > wtoken, "{} <= {wtoken}", read.token());
    read.release().await.expect("release");
    nothing_left(&ns).await;
}

/// A read, a write or a permit lease whose entry was deleted from outside is lost at its next
/// renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_deleted_from_outside_is_lost_at_its_next_renewal() {
    let ns = ns("deleted");
    let ttl = Duration::from_millis(900);
    let l = locker(&ns, ttl, true);
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
    let l = locker(&ns, ttl, true);
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
