//! The fair queue under crashed waiters and mixed TTLs, on real servers: a crashed head stalls
//! the queue for a few seconds at most, whatever the TTL, and a short-TTL locker never shortens
//! the queue's life for the others.

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::faults::{Mode, Proxy};
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_redis::RedisLocker;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

fn shared() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

async fn locker(url: &str, ns: &str, ttl: Duration) -> RedisLocker {
    RedisLocker::builder()
        .url(url)
        .ttl(ttl)
        .namespace(ns)
        .build()
        .await
        .expect("builds")
}

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// Waits until the queue holds `n` entries and returns them.
async fn queued(conn: &mut MultiplexedConnection, queue: &str, n: usize) -> Vec<String> {
    let began = Instant::now();
    loop {
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(queue)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await
            .expect("LRANGE");
        if entries.len() == n {
            return entries;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the queue never held {n} entries: {entries:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The bound on how long a crashed head waiter can stall the queue after a release: its
/// entry's lifetime (3 s) plus the next waiter's refresh period (1 s), both independent of the
/// TTL, plus 2 s of scheduling slack for a loaded host.
const CRASHED_HEAD_STALL_BOUND: Duration = Duration::from_secs(6);

/// A waiter at the head of the queue crashes (here: its link goes silent), then the holder
/// releases, reserving the lock for that dead head. With a 30 s TTL, the next waiter must
/// still get the lock within a few seconds, not after one or more TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_head_stalls_the_queue_for_seconds_not_ttls() {
    let cluster = shared();
    let url = cluster.endpoints().remove(0);
    let ns = "dlock-test/fair/crashed-head";
    let ttl = Duration::from_secs(30);
    let lock = name("stall");
    let queue = format!("{ns}/dlock:{{stall}}:q");
    let mut conn = connect(&url).await;
    let holder = locker(&url, ns, ttl).await;
    let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
    let doomed = locker(&format!("redis://{}", proxy.addr()), ns, ttl).await;
    let next = locker(&url, ns, ttl).await;
    let held = holder
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("holder acquires");
    let (d, l) = (doomed.clone(), lock.clone());
    let crashed = tokio::spawn(async move { d.acquire(&l, AcquireOptions::forever()).await });
    queued(&mut conn, &queue, 1).await;
    proxy.set(Mode::Blackhole);
    let (n, l) = (next.clone(), lock.clone());
    let waiting = tokio::spawn(async move {
        n.acquire(&l, AcquireOptions::wait(Duration::from_secs(40)))
            .await
    });
    queued(&mut conn, &queue, 2).await;
    held.release().await.expect("release");
    let released = Instant::now();
    let got = waiting
        .await
        .expect("join")
        .expect("the next waiter gets the lock");
    let stalled = released.elapsed();
    crashed.abort();
    got.release().await.expect("release");
    assert!(
        stalled <= CRASHED_HEAD_STALL_BOUND,
        "a crashed head stalled the queue for {stalled:?} (TTL {ttl:?})"
    );
}

/// A locker with a short TTL queueing on a name never shortens the queue keys' life below a
/// long-TTL waiter's entry deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_ttl_waiter_never_shortens_the_queue() {
    let url = shared().endpoints().remove(0);
    let ns = "dlock-test/fair/mixed-ttl";
    let lock = name("mixed");
    let queue = format!("{ns}/dlock:{{mixed}}:q");
    let deadlines = format!("{ns}/dlock:{{mixed}}:qt");
    let mut conn = connect(&url).await;
    let long = Duration::from_secs(30);
    let holder = locker(&url, ns, long).await;
    let patient = locker(&url, ns, long).await;
    let hasty = locker(&url, ns, Duration::from_millis(200)).await;
    let held = holder
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("holder acquires");
    let (p, l) = (patient.clone(), lock.clone());
    let waiting = tokio::spawn(async move {
        p.acquire(&l, AcquireOptions::wait(Duration::from_secs(20)))
            .await
    });
    let first = queued(&mut conn, &queue, 1).await.remove(0);
    let (h, l) = (hasty.clone(), lock.clone());
    let short = tokio::spawn(async move {
        h.acquire(&l, AcquireOptions::wait(Duration::from_secs(5)))
            .await
    });
    queued(&mut conn, &queue, 2).await;
    // One MULTI: the server's clock, the entry's deadline and both keys' TTLs, read at one
    // instant (separate reads let the clock move on between them under load).
    let ((secs, micros), entry_deadline, ttls): ((u64, u64), u64, [i64; 2]) = {
        let (time, deadline, q_ttl, qt_ttl): ((u64, u64), u64, i64, i64) = redis::pipe()
            .atomic()
            .cmd("TIME")
            .cmd("HGET")
            .arg(&deadlines)
            .arg(&first)
            .cmd("PTTL")
            .arg(&queue)
            .cmd("PTTL")
            .arg(&deadlines)
            .query_async(&mut conn)
            .await
            .expect("MULTI TIME HGET PTTL PTTL");
        (time, deadline, [q_ttl, qt_ttl])
    };
    let now_ms = secs * 1000 + micros / 1000;
    for (key, pttl) in [&queue, &deadlines].into_iter().zip(ttls) {
        // Both round to milliseconds: 2 ms of slack.
        let expires = now_ms + u64::try_from(pttl).unwrap_or(0) + 2;
        assert!(
            pttl == -1 || expires >= entry_deadline,
            "{key} expires {} ms before the long-TTL waiter's entry",
            entry_deadline.saturating_sub(expires)
        );
    }
    short.abort();
    held.release().await.expect("release");
    let got = waiting
        .await
        .expect("join")
        .expect("the patient waiter gets the lock");
    got.release().await.expect("release");
}
