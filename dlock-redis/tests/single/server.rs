//! One node's faults and upkeep: a server down or paused, scripts the server forgot, renewal
//! batching, the notification task on a new runtime or a silent connection, and a server
//! demoted to a replica.

use std::time::Duration;

use dlock_conformance::faults::{Mode, Proxy};
use dlock_core::{AcquireOptions, Error, ErrorKind, Locker, RwLocker, Semaphore};
use dlock_redis::RedisLocker;
use tokio::time::Instant;

use super::{acquiring, conn, granted, locker, name, private, replicaof, url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_is_unavailable_within_the_wait() {
    // Start a node, learn its port, kill it: connections are refused.
    let cluster = private(1);
    let url = cluster.endpoints().remove(0);
    tokio::task::block_in_place(|| cluster.node(0).kill()).expect("kill");
    let l = locker(&url, "dlock-test/single", Duration::from_secs(1)).await;
    let began = Instant::now();
    let got = l
        .acquire(&name("down"), AcquireOptions::wait(Duration::from_secs(2)))
        .await;
    assert_eq!(
        got.expect_err("server is down").kind(),
        ErrorKind::Unavailable
    );
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "took {:?}",
        began.elapsed()
    );
    let tried = l.try_acquire(&name("down")).await;
    let e = tried.expect_err("server is down");
    assert!(e.is_retryable(), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_never_holds_acquire_past_its_wait() {
    let cluster = private(1);
    let url = cluster.endpoints().remove(0);
    let l = locker(&url, "dlock-test/single", Duration::from_secs(2)).await;
    // Connect first, then freeze the server: requests hang at the server.
    drop(l.try_acquire(&name("warm")).await.expect("server up"));
    tokio::task::block_in_place(|| cluster.node(0).pause()).expect("pause");
    let began = Instant::now();
    let wait = Duration::from_millis(300);
    let got = l.acquire(&name("paused"), AcquireOptions::wait(wait)).await;
    let took = began.elapsed();
    tokio::task::block_in_place(|| cluster.node(0).resume()).expect("resume");
    assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
    assert!(
        took < wait + Duration::from_millis(200),
        "took {took:?} for a wait of {wait:?}"
    );
}

/// Many held leases of one locker, mutex, read and permit leases together, renew in one round
/// trip per period, not one per lease or per kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_renew_in_one_request_per_period() {
    let (ttl, ns) = (Duration::from_secs(1), "dlock-test/single/batch");
    let l = locker(&url(), ns, ttl).await;
    let wait = AcquireOptions::wait(Duration::from_secs(10));
    let mut leases = vec![
        l.read(&name("r"), wait).await.expect("read"),
        l.acquire_permit(&name("p"), 2, wait).await.expect("permit"),
    ];
    for i in 0..300 {
        leases.push(
            l.try_acquire(&name(&format!("n{i}")))
                .await
                .expect("try")
                .expect("free"),
        );
    }
    let before = l.stats();
    tokio::time::sleep(ttl * 3).await;
    let after = l.stats();
    let requests = after.requests - before.requests;
    let rounds = after.renewals - before.renewals;
    assert!(rounds >= 6, "only {rounds} renewal rounds in 3 TTLs");
    assert_eq!(
        requests, rounds,
        "{requests} requests for {rounds} renewal rounds of 302 leases"
    );
    for lease in &leases {
        lease.check().expect("still held past 3 TTLs");
    }
    for lease in leases {
        lease.release().await.expect("release");
    }
    super::nothing_left(ns).await;
}

/// The scripts are reloaded after the server forgot them (restart, SCRIPT FLUSH).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_a_flush() {
    let cluster = private(1);
    let url = cluster.endpoints().remove(0);
    let l = locker(&url, "dlock-test/single", Duration::from_secs(1)).await;
    let a = l
        .acquire(&name("x"), AcquireOptions::forever())
        .await
        .expect("acquire");
    a.release().await.expect("release");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn(&url).await)
        .await
        .expect("flush");
    let b = l
        .acquire(&name("x"), AcquireOptions::forever())
        .await
        .expect("acquire after flush");
    assert!(b.token() > dlock_core::FencingToken(1));
    b.release().await.expect("release after flush");
}

/// Channels with subscribers under the namespace `ns` (`PUBSUB CHANNELS`).
async fn subscribed_channels(ns: &str) -> usize {
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("{ns}/dlock:notify:*"))
        .query_async(&mut conn(&url()).await)
        .await
        .expect("PUBSUB CHANNELS");
    channels.len()
}

/// Waits (for at most 10 s) until `want` channels under `ns` have subscribers.
async fn until_subscribed(ns: &str, want: usize, what: &str) {
    let began = Instant::now();
    while subscribed_channels(ns).await != want {
        assert!(began.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Makes `waiter` wait (queued) behind a lease of a fresh locker, on the current runtime.
async fn wait_queued(waiter: &RedisLocker, ns: &str) {
    let holder = locker(&url(), ns, Duration::from_secs(5)).await;
    let lock = name("n");
    let held = granted(&holder, &lock, Duration::from_secs(2), "acquire").await;
    let e = waiter
        .acquire(&lock, AcquireOptions::wait(Duration::from_millis(300)))
        .await
        .expect_err("the lock is held");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    held.release().await.expect("release");
}

/// The notification task is supervised like the renewal driver: when the runtime it ran on
/// shut down, the next wait (on another runtime) subscribes the locker's channel again.
#[test]
fn the_notification_task_is_restarted_on_a_new_runtime() {
    let ns = "dlock-test/single/notifier-runtime";
    let first = super::runtime();
    let waiter = first.block_on(async {
        let waiter = locker(&url(), ns, Duration::from_secs(5)).await;
        wait_queued(&waiter, ns).await;
        until_subscribed(ns, 1, "the first wait never subscribed").await;
        waiter
    });
    drop(first);
    super::runtime().block_on(async {
        until_subscribed(ns, 0, "the subscription outlived its runtime").await;
        // The command connection's task died with the first runtime too: its first request
        // here may fail (broken pipe) before it reconnects.
        let mut tries = 0;
        while let Err(e) = waiter.inspect(&name("n")).await {
            tries += 1;
            assert!(tries < 10, "the locker never reconnected: {e}");
        }
        wait_queued(&waiter, ns).await;
        until_subscribed(
            ns,
            1,
            "the notification channel was never subscribed again after its runtime shut down",
        )
        .await;
    });
}

/// The subscribed connection is probed: when it stops answering, the locker notices within
/// the probe period plus its deadline and subscribes again on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_notification_connection_is_probed_and_replaced() {
    let proxy = Proxy::start(super::shared().addrs()[0]).expect("proxy");
    let ns = "dlock-test/dead/pubsub";
    let ttl = Duration::from_secs(1);
    let holder = locker(&url(), ns, ttl).await;
    let waiter = locker(&format!("redis://{}", proxy.addr()), ns, ttl).await;
    let lock = name("n");
    let held = granted(&holder, &lock, Duration::from_secs(2), "holder acquires").await;
    // One wait starts the waiter's notification connection.
    let got = waiter
        .acquire(&lock, AcquireOptions::wait(Duration::from_millis(300)))
        .await;
    assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
    held.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = proxy.connections();
    // The flow goes silent: nothing passes, nothing is closed.
    proxy.set(Mode::Blackhole);
    // Probe period 2 s + probe deadline 0.5 s, and 2 s of slack for a loaded host.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let during = proxy.connections();
    proxy.set(Mode::Pass);
    assert!(
        during > before,
        "the silent notification connection was never probed and replaced"
    );
}

/// A server demoted to a replica (as in a failover) refuses writes: requests fail as
/// `Unavailable` (retryable), are retried within the wait, and the connection is rebuilt, so a
/// failover behind a DNS name reaches the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_server_is_retried_within_the_wait_on_a_new_connection() {
    let cluster = private(2);
    let urls = cluster.endpoints();
    let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
    let l = locker(
        &format!("redis://{}", proxy.addr()),
        "dlock-test/failover/readonly",
        Duration::from_secs(2),
    )
    .await;
    let lock = name("f");
    drop(l.try_acquire(&lock).await.expect("server up"));
    // Demote node 0: it answers READONLY (or LOADING while it syncs).
    replicaof(&urls[0], Some(cluster.addrs()[1])).await;
    let connections = proxy.connections();
    let e = l
        .try_acquire(&lock)
        .await
        .expect_err("a replica refuses writes");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.is_retryable(), "{e}");
    let waiting = acquiring(&l, &lock, AcquireOptions::wait(Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The "failover" completes: node 0 is a master again.
    replicaof(&urls[0], None).await;
    let lease = waiting
        .await
        .expect("join")
        .expect("granted once the server is a master again");
    assert!(
        proxy.connections() > connections,
        "the connection to the demoted server was never rebuilt"
    );
    lease.release().await.expect("release");
}
