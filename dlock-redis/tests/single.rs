//! Single-node behaviours beyond the shared suite, on real servers.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, Error, ErrorKind, LockName, Locker};
use dlock_redis::RedisLocker;

fn shared() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn url() -> String {
    shared().endpoints().remove(0)
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

/// Every option a builder refuses, refused by `validate` (no runtime, no I/O) and by `build`
/// before any I/O (nothing listens at the addresses): one URL, Sentinel, Cluster, TLS and
/// Redlock options. TTLs and waits out of range are the `bad_input` scenario's on every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_fail_before_any_io() {
    use dlock_redis::RedlockLocker;
    let u = "redis://127.0.0.1:1";
    let b = RedisLocker::builder;
    let s = || ["127.0.0.1:26379", "127.0.0.1:26380"].map(String::from);
    let pem = || b"not PEM".to_vec();
    let redis = [
        ("no URL", b()),
        ("not a redis URL", b().url("http://x")),
        ("zero TTL", b().url(u).ttl(Duration::ZERO)),
        ("hash tag in the prefix", b().url(u).prefix("a{b}")),
        ("empty namespace segment", b().url(u).namespace("a//b")),
        (
            "request timeout above the TTL",
            b().url(u)
                .ttl(Duration::from_secs(1))
                .request_timeout(Duration::from_secs(5)),
        ),
        ("zero retry delay", b().url(u).retry_delay(Duration::ZERO)),
        ("#insecure", b().url("rediss://127.0.0.1:1/#insecure")),
        ("roots with redis://", b().url(u).tls_root_certificates(pem())),
        ("roots not PEM", b().url("rediss://127.0.0.1:1").tls_root_certificates(pem())),
        (
            "no replica",
            b().url(u).wait_for_replicas(0, Duration::from_millis(300)),
        ),
        ("TLS flag with a URL", b().url(u).tls(true)),
        ("master password with a URL", b().url(u).master_password("pw")),
        ("URL and sentinels", b().url(u).sentinels(s(), "m")),
        ("no sentinel", b().sentinels(Vec::<String>::new(), "m")),
        ("sentinel without port", b().sentinels(["127.0.0.1"], "m")),
        ("sentinel port 0", b().sentinels(["127.0.0.1:0"], "m")),
        ("sentinel not an address", b().sentinels(["a b:1"], "m")),
        ("sentinel twice", b().sentinels([s()[0].clone(), s()[0].clone()], "m")),
        ("empty master name", b().sentinels(s(), "")),
        ("master name with a space", b().sentinels(s(), "my master")),
        (
            "sentinel roots not PEM",
            b().sentinels(s(), "m").tls_root_certificates(pem()),
        ),
        ("no cluster node", b().cluster(Vec::<String>::new())),
        ("URL and cluster", b().url(u).cluster(["redis://127.0.0.1:2"])),
        (
            "cluster node twice",
            b().cluster(["redis://127.0.0.1:2", "redis://127.0.0.1:2"]),
        ),
        ("unix cluster node", b().cluster(["unix:///tmp/r.sock"])),
        (
            "mixed schemes",
            b().cluster(["redis://127.0.0.1:2", "rediss://127.0.0.1:3"]),
        ),
        (
            "mixed credentials",
            b().cluster(["redis://a:b@127.0.0.1:2", "redis://127.0.0.1:3"]),
        ),
        (
            "address map without port",
            b().cluster(["redis://127.0.0.1:2"])
                .cluster_address_map("127.0.0.1", "127.0.0.1:5"),
        ),
        (
            "address mapped twice",
            b().cluster(["redis://127.0.0.1:2"])
                .cluster_address_map("127.0.0.1:2", "127.0.0.1:5")
                .cluster_address_map("127.0.0.1:2", "127.0.0.1:6"),
        ),
        (
            "address map without cluster",
            b().url(u).cluster_address_map("127.0.0.1:2", "127.0.0.1:5"),
        ),
        (
            "cluster waiting for replicas",
            b().cluster(["redis://127.0.0.1:2"])
                .wait_for_replicas(1, Duration::from_secs(1)),
        ),
        (
            "master password with a cluster",
            b().cluster(["redis://127.0.0.1:2"]).master_password("x"),
        ),
    ];
    for (what, builder) in redis {
        let e = builder.validate().expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "validate, {what}: {e}");
        let began = Instant::now();
        let e = builder.build().await.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "build, {what}: {e}");
        assert!(began.elapsed() < Duration::from_millis(100), "{what}: I/O?");
    }
    let r = RedlockLocker::builder;
    let nodes = ["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"];
    let redlock = [
        ("no node", r()),
        ("no nodes", r().nodes(Vec::<String>::new())),
        ("node twice", r().nodes([u, u])),
        ("zero node timeout", r().nodes(nodes).node_timeout(Duration::ZERO)),
        (
            "#insecure node",
            r().nodes([nodes[0], "rediss://127.0.0.1:2/#insecure", nodes[2]]),
        ),
    ];
    for (what, builder) in redlock {
        let e = builder.validate().expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "validate, {what}: {e}");
        let e = builder.build().await.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "build, {what}: {e}");
    }
    // Good options build without I/O although nothing listens there; IPv6 and host names are
    // sentinel addresses; a cluster locker's Debug names its seeds but not the password.
    r().nodes(nodes).validate().expect("valid Redlock options");
    b().url(u).build().await.expect("builds without I/O");
    b().sentinels(["[::1]:26379", "sentinel-1.example:26379"], "m")
        .build()
        .await
        .expect("IPv6 and host names are addresses");
    let l = b()
        .cluster(["redis://u:s3cr3t@127.0.0.1:1", "redis://u:s3cr3t@127.0.0.1:2"])
        .cluster_address_map("127.0.0.1:1", "localhost:7001")
        .build()
        .await
        .expect("valid cluster options build without I/O");
    let shown = format!("{l:?}");
    assert!(shown.contains("127.0.0.1:1"), "{shown}");
    assert!(!shown.contains("s3cr3t"), "the password leaked: {shown}");
}

#[test]
fn building_outside_a_runtime_is_an_error_not_a_panic() {
    let r = futures::executor::block_on(RedisLocker::builder().url("redis://127.0.0.1:1").build());
    assert_eq!(r.expect_err("no runtime").kind(), ErrorKind::InvalidInput);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_is_unavailable_within_the_wait() {
    // Start a node, learn its port, kill it: connections are refused.
    let cluster = Cluster::start(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let url = cluster.endpoints().remove(0);
    tokio::task::block_in_place(|| cluster.node(0).kill()).expect("kill");
    let l = RedisLocker::builder()
        .url(url)
        .ttl(Duration::from_secs(1))
        .build()
        .await
        .expect("builds");
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
    let cluster = Cluster::start(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let url = cluster.endpoints().remove(0);
    let l = RedisLocker::builder()
        .url(url)
        .ttl(Duration::from_secs(2))
        .build()
        .await
        .expect("builds");
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

/// Many held leases renew in one round trip per period, not one per lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_renew_in_one_request_per_period() {
    let ttl = Duration::from_secs(1);
    let l = RedisLocker::builder()
        .url(url())
        .ttl(ttl)
        .namespace("dlock-test/single/batch")
        .build()
        .await
        .expect("builds");
    let mut leases = Vec::new();
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
        "{requests} requests for {rounds} renewal rounds of 2500 leases"
    );
    for lease in &leases {
        lease.check().expect("still held past 3 TTLs");
    }
    for lease in leases {
        lease.release().await.expect("release");
    }
}

/// The scripts are reloaded after the server forgot them (restart, SCRIPT FLUSH).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_a_flush() {
    let cluster = Cluster::start(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let url = cluster.endpoints().remove(0);
    let l = RedisLocker::builder()
        .url(&url)
        .ttl(Duration::from_secs(1))
        .build()
        .await
        .expect("builds");
    let a = l
        .acquire(&name("x"), AcquireOptions::forever())
        .await
        .expect("acquire");
    a.release().await.expect("release");
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("flush");
    let b = l
        .acquire(&name("x"), AcquireOptions::forever())
        .await
        .expect("acquire after flush");
    assert!(b.token() > dlock_core::FencingToken(1));
    b.release().await.expect("release after flush");
}

/// AUTH credentials in the URL are used; without them the server's refusal is a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_through_the_url() {
    let cluster = Cluster::start(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let addr = cluster.addrs()[0];
    let client = redis::Client::open(format!("redis://{addr}")).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query_async(&mut conn)
        .await
        .expect("set a password");
    let good = RedisLocker::builder()
        .url(format!("redis://:s3cret@{addr}"))
        .ttl(Duration::from_secs(1))
        .build()
        .await
        .expect("builds");
    let lease = good
        .acquire(&name("auth"), AcquireOptions::wait(Duration::from_secs(1)))
        .await
        .expect("acquire with AUTH");
    lease.release().await.expect("release");
    let bad = RedisLocker::builder()
        .url(format!("redis://{addr}"))
        .ttl(Duration::from_secs(1))
        .build()
        .await
        .expect("builds");
    let e = bad
        .try_acquire(&name("auth"))
        .await
        .expect_err("no password");
    assert_eq!(e.kind(), ErrorKind::AccessDenied, "{e}");
    assert!(!e.is_retryable(), "{e}");
    assert!(!format!("{e}").contains("s3cret"));
}

/// A fair waiter whose holder crashed (key left to expire, no release message) gets the lock
/// through its timer at the holder's expiry, not a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_waiter_takes_over_an_expired_holder() {
    let ttl = Duration::from_secs(1);
    let ns = "dlock-test/single/expired";
    let holder = RedisLocker::builder()
        .url(url())
        .ttl(ttl)
        .namespace(ns)
        .build()
        .await
        .expect("builds");
    let waiter = RedisLocker::builder()
        .url(url())
        .ttl(ttl)
        .namespace(ns)
        .build()
        .await
        .expect("builds");
    let lease = holder
        .acquire(&name("e"), AcquireOptions::forever())
        .await
        .expect("acquire");
    lease.stop_renewal_for_test();
    let began = Instant::now();
    let got = waiter
        .acquire(&name("e"), AcquireOptions::wait(ttl * 3))
        .await
        .expect("the waiter takes over");
    let took = began.elapsed();
    assert!(took < ttl + Duration::from_millis(300), "took {took:?}");
    assert!(lease.is_lost());
    let wakeups = waiter.stats().wakeups;
    assert!(wakeups <= 3, "{wakeups} wakeups: the waiter polled");
    got.release().await.expect("release");
    drop(lease);
}

/// `rediss://` URLs are accepted and use TLS; against a server that does not speak TLS the
/// handshake fails with a typed, retryable error (never a panic for a missing crypto provider).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_urls_are_supported() {
    let addr = shared().addrs()[0];
    let l = RedisLocker::builder()
        .url(format!("rediss://{addr}/"))
        .ttl(Duration::from_secs(1))
        .build()
        .await
        .expect("a rediss URL builds");
    let e = l
        .try_acquire(&name("tls"))
        .await
        .expect_err("the server does not speak TLS");
    assert!(
        matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Backend),
        "{e}"
    );
}

/// A release with waiters queued reserves the lock for the head: a newcomer's `try_acquire`
/// right after the release never barges in, and the head gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_head_not_to_a_newcomer() {
    let ns = "dlock-test/single/no-barging";
    let build = async || {
        RedisLocker::builder()
            .url(url())
            .ttl(Duration::from_secs(2))
            .namespace(ns)
            .build()
            .await
            .expect("builds")
    };
    let (holder, waiter, newcomer) = (build().await, build().await, build().await);
    let mut conn = redis::Client::open(url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let lock = name("handoff");
    let queue = format!("{ns}/dlock:{{handoff}}:q");
    for round in 0..20 {
        let held = holder
            .acquire(&lock, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("holder acquires");
        let (w, l) = (waiter.clone(), lock.clone());
        let waiting = tokio::spawn(async move {
            w.acquire(&l, AcquireOptions::wait(Duration::from_secs(5)))
                .await
        });
        loop {
            let len: usize = redis::cmd("LLEN")
                .arg(&queue)
                .query_async(&mut conn)
                .await
                .expect("LLEN");
            if len == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        held.release().await.expect("release");
        let barged = newcomer.try_acquire(&lock).await.expect("try_acquire");
        assert!(
            barged.is_none(),
            "round {round}: a newcomer took the lock from the queued head"
        );
        let got = waiting
            .await
            .expect("join")
            .expect("the head gets the lock");
        got.release().await.expect("release");
    }
}

/// A locker built from the application's own `redis::Client` locks against that server like
/// one built from the URL (the same name excludes across the two), and `client` with a second
/// way to reach a server is a typed error before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_from_an_existing_client() {
    let client = redis::Client::open(url()).expect("client");
    let ns = format!("from-client-{}", std::process::id());
    let mine = RedisLocker::builder()
        .client(client.clone())
        .namespace(&ns)
        .ttl(Duration::from_secs(2))
        .build()
        .await
        .expect("locker from a client");
    let theirs = RedisLocker::builder()
        .url(url())
        .namespace(&ns)
        .ttl(Duration::from_secs(2))
        .build()
        .await
        .expect("locker from the URL");
    let lock = name("shared");
    let held = mine
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("granted");
    assert!(
        theirs
            .try_acquire(&lock)
            .await
            .expect("reachable")
            .is_none(),
        "the URL's locker sees the client's locker's hold"
    );
    let state = theirs.inspect(&lock).await.expect("inspect");
    assert_eq!(state.holder.and_then(|h| h.token), Some(held.token()));
    held.release().await.expect("release");
    let next = theirs.try_acquire(&lock).await.expect("reachable");
    assert!(next.is_some(), "free after the release");
    for conflicting in [
        RedisLocker::builder().client(client.clone()).url(url()),
        RedisLocker::builder()
            .client(client.clone())
            .cluster([url()]),
        RedisLocker::builder()
            .client(client.clone())
            .tls_root_certificates(b"-----BEGIN CERTIFICATE-----".to_vec()),
    ] {
        let err = conflicting.validate().expect_err("two ways to one server");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
}

/// Channels with subscribers under the namespace `ns` (`PUBSUB CHANNELS`).
async fn subscribed_channels(ns: &str) -> usize {
    let mut conn = redis::Client::open(url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("{ns}/dlock:notify:*"))
        .query_async(&mut conn)
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
    let holder = RedisLocker::builder()
        .url(url())
        .ttl(Duration::from_secs(5))
        .namespace(ns)
        .build()
        .await
        .expect("builds");
    let lock = name("n");
    let held = holder
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(2)))
        .await
        .expect("acquire");
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
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    let first = runtime();
    let waiter = first.block_on(async {
        let waiter = RedisLocker::builder()
            .url(url())
            .ttl(Duration::from_secs(5))
            .namespace(ns)
            .build()
            .await
            .expect("builds");
        wait_queued(&waiter, ns).await;
        until_subscribed(ns, 1, "the first wait never subscribed").await;
        waiter
    });
    drop(first);
    runtime().block_on(async {
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
