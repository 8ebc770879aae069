//! The shared conformance suite on a Redis Sentinel deployment: `redis_sentinel` (row
//! `redis-sentinel`): 1 master, 1 replica, 3 sentinels (quorum 2), every data server with
//! `min-replicas-to-write 1`; the lockers (fair mode) find the master through the sentinels
//! (`RedisLocker::builder().sentinels(…)`). See `support/sentinel.rs` for how link faults reach
//! the master through the sentinels and what a private deployment (server restart, herd) is.
//! Its own test binary: its sentinels and the scenarios' private deployments are processes of
//! their own, kept apart from the other Redis rows' load.

mod support;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock_conformance::faults::{Mode, Proxy};
use dlock_conformance::servers::HarnessError;
use dlock_conformance::{ClientOptions, TestBackend};
use dlock_core::{AcquireOptions, LockName, Locker};
use support::FAIR;
use support::sentinel::SentinelBackend;

/// The shared deployment's backend, started on first use (a failed start is remembered).
fn shared() -> Result<Arc<SentinelBackend>, HarnessError> {
    static B: OnceLock<Result<Arc<SentinelBackend>, HarnessError>> = OnceLock::new();
    B.get_or_init(|| SentinelBackend::shared("redis-sentinel").map(Arc::new))
        .clone()
}

fn redis_sentinel() -> Arc<dyn TestBackend> {
    shared().unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

dlock_conformance::conformance_tests!(redis_sentinel, redis_sentinel(), declared = FAIR);

/// The link-fault scenarios fault what they mean to: a client built with `via` finds the
/// master through the sentinels at the proxy's address and talks to it only through the
/// proxy. A blackholed proxy stops its requests (a client that bypassed the proxy would still
/// be granted) while a direct client is granted; passing again, it is granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_clients_reach_the_master_only_through_the_proxy() {
    let backend = match tokio::task::spawn_blocking(shared).await.expect("start") {
        Ok(b) => b,
        Err(e) if e.may_skip() => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("the sentinel deployment is unavailable: {e}"),
    };
    let ns = format!("dlock-test/sentinel-via/{}", std::process::id());
    let ttl = Duration::from_secs(2);
    let proxy = Proxy::start(backend.node_addrs()[0]).expect("a proxy");
    let via = backend
        .client(
            ClientOptions::new(&ns, ttl)
                .via(vec![proxy.addr()])
                .request_timeout(Duration::from_millis(500)),
        )
        .await
        .expect("a proxied client");
    let direct = backend
        .client(ClientOptions::new(&ns, ttl))
        .await
        .expect("a direct client");
    let a = LockName::new("via-a").expect("name");
    let b = LockName::new("via-b").expect("name");
    let lease = via
        .try_acquire(&a)
        .await
        .expect("granted through the proxy")
        .expect("free");
    lease.release().await.expect("release");
    let up = proxy.bytes(dlock_conformance::faults::Direction::Upstream);
    assert!(up > 0, "nothing went through the proxy");
    proxy.set(Mode::Blackhole);
    let blocked = via.try_acquire(&b).await;
    assert!(
        blocked.is_err(),
        "the proxied client was answered through a blackholed proxy: it bypasses the proxy"
    );
    direct
        .try_acquire(&b)
        .await
        .expect("the direct client reaches the master")
        .expect("free")
        .release()
        .await
        .expect("release");
    proxy.set(Mode::Pass);
    let began = std::time::Instant::now();
    loop {
        match via.acquire(&b, AcquireOptions::wait(ttl)).await {
            Ok(l) => {
                l.release().await.expect("release");
                break;
            }
            Err(e) => assert!(
                began.elapsed() < Duration::from_secs(15),
                "not granted through the healed proxy: {e}"
            ),
        }
    }
    // Once its proxy is gone, the next proxied client's registration removes its name.
    let gone = format!("via-{}", proxy.addr().port());
    drop(via);
    drop(proxy);
    let next = Proxy::start(backend.node_addrs()[0]).expect("a proxy");
    let _client = backend
        .client(ClientOptions::new(&ns, ttl).via(vec![next.addr()]))
        .await
        .expect("a proxied client");
    for s in &backend.deployment().sentinels {
        let mut c = redis::Client::open(format!("redis://{s}"))
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("a sentinel");
        let named = |name: String| {
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name)
                .clone()
        };
        let old: Option<(String, u16)> = named(gone.clone())
            .query_async(&mut c)
            .await
            .expect("SENTINEL");
        assert_eq!(old, None, "sentinel {s} still names {gone}");
        let new: Option<(String, u16)> = named(format!("via-{}", next.addr().port()))
            .query_async(&mut c)
            .await
            .expect("SENTINEL");
        assert_eq!(new.map(|(_, p)| p), Some(next.addr().port()));
    }
}

/// The herd scenario's server-side count (`TestBackend::wake_signals`) on a sentinel
/// deployment: every `PUBLISH` the master executes, from a client or a script, and none of
/// the sentinels' hello messages (which the master's `INFO commandstats` would count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_signals_count_publishes_but_not_sentinel_hellos() {
    let Ok(backend) = tokio::task::spawn_blocking(shared).await.expect("start") else {
        // `proxied_clients_reach_the_master_only_through_the_proxy` says why.
        return;
    };
    let cluster = tokio::task::spawn_blocking(|| {
        dlock_conformance::servers::Cluster::start(dlock_conformance::servers::ServerKind::Redis, 1)
    })
    .await
    .expect("start")
    .expect("a private master");
    let cluster = Arc::new(cluster);
    let private = backend
        .on_cluster(Arc::clone(&cluster))
        .expect("a private deployment");
    let count = || {
        let b = Arc::clone(&private);
        async move {
            tokio::task::spawn_blocking(move || b.wake_signals())
                .await
                .expect("read")
                .expect("countable")
        }
    };
    let before = count().await;
    let mut c = redis::Client::open(cluster.endpoints()[0].as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    for _ in 0..3 {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("dlock-test:chan")
            .arg("x")
            .query_async(&mut c)
            .await
            .expect("PUBLISH");
    }
    let _: i64 = redis::cmd("EVAL")
        .arg("return redis.call('PUBLISH', KEYS[1], 'x')")
        .arg(1)
        .arg("dlock-test:chan")
        .query_async(&mut c)
        .await
        .expect("PUBLISH from a script");
    let _: i64 = redis::cmd("PUBLISH")
        .arg("__sentinel__:hello")
        .arg("x")
        .query_async(&mut c)
        .await
        .expect("PUBLISH");
    // The sentinels publish their own hellos meanwhile (every 2 s each).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = count().await;
    assert_eq!(after - before, 4, "PUBLISH calls counted");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .expect("INFO");
    let all = support::commandstat_calls(&info, "publish").expect("cmdstat_publish");
    assert!(
        all > 5,
        "the master's own count ({all}) has no sentinel hellos: this test shows nothing"
    );
}
