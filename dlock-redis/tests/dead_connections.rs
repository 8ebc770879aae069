//! A notification connection whose flow was dropped silently (a NAT or load balancer forgot
//! it: no FIN, no RST), on a real server behind the fault proxy.

mod support;

use std::time::Duration;

use dlock_conformance::faults::{Mode, Proxy};
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, Error, LockName, Locker};
use dlock_redis::RedisLocker;

/// The subscribed connection is probed: when it stops answering, the locker notices within
/// the probe period plus its deadline and subscribes again on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_notification_connection_is_probed_and_replaced() {
    let cluster = Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let url = cluster.endpoints().remove(0);
    let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
    let ns = "dlock-test/dead/pubsub";
    let build = async |url: &str| {
        RedisLocker::builder()
            .url(url)
            .ttl(Duration::from_secs(1))
            .namespace(ns)
            .build()
            .await
            .expect("builds")
    };
    let holder = build(&url).await;
    let waiter = build(&format!("redis://{}", proxy.addr())).await;
    let lock = LockName::new("n").expect("valid name");
    let held = holder
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(2)))
        .await
        .expect("holder acquires");
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
