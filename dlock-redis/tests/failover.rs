//! A server that stops being a usable master (demoted to a replica during a failover), on real
//! servers: requests fail as `Unavailable` (retryable), are retried within the wait, and the
//! connection is rebuilt so that a failover behind a DNS name reaches the new master.

mod support;

use std::time::Duration;

use dlock_conformance::faults::Proxy;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};
use dlock_redis::RedisLocker;

async fn replicaof(url: &str, master: Option<std::net::SocketAddr>) {
    let mut conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut cmd = redis::cmd("REPLICAOF");
    match master {
        Some(m) => cmd.arg(m.ip().to_string()).arg(m.port()),
        None => cmd.arg("NO").arg("ONE"),
    };
    let _: () = cmd.query_async(&mut conn).await.expect("REPLICAOF");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_server_is_retried_within_the_wait_on_a_new_connection() {
    let cluster = Cluster::start(ServerKind::Redis, 2)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let urls = cluster.endpoints();
    let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
    let l = RedisLocker::builder()
        .url(format!("redis://{}", proxy.addr()))
        .ttl(Duration::from_secs(2))
        .namespace("dlock-test/failover/readonly")
        .build()
        .expect("builds");
    let lock = LockName::new("f").expect("valid name");
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
    let (l2, n2) = (l.clone(), lock.clone());
    let waiting = tokio::spawn(async move {
        l2.acquire(&n2, AcquireOptions::wait(Duration::from_secs(10)))
            .await
    });
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
