//! Safety of the single-node lock under data loss, on real servers: fencing tokens never repeat
//! or go back after a failover to a lagging replica or an evicted fence key (a restart without
//! persistence and slow grants are the `server_restart` and `slow_grant` scenarios').

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_redis::RedisLocker;
use tokio::time::Instant;

fn shared() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn private(nodes: usize) -> Cluster {
    Cluster::start(ServerKind::Redis, nodes)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

async fn locker(url: &str, ns: &str) -> RedisLocker {
    RedisLocker::builder()
        .url(url)
        .ttl(Duration::from_secs(2))
        .namespace(ns)
        .build()
        .await
        .expect("builds")
}

/// The token of a fresh grant on `url` (released at once).
async fn token_on(url: &str, ns: &str, lock: &LockName) -> u64 {
    let l = locker(url, ns).await;
    let lease = l
        .acquire(lock, AcquireOptions::wait(Duration::from_secs(10)))
        .await
        .expect("acquire");
    let t = lease.token().get();
    lease.release().await.expect("release");
    t
}

/// An evicted (or deleted) fence key: the next token is still greater than every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_the_fence_key_is_evicted() {
    let url = shared().endpoints().remove(0);
    let ns = "dlock-test/safety/evicted";
    let lock = name("e");
    let before = token_on(&url, ns, &lock).await;
    let mut conn = connect(&url).await;
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{ns}/dlock:{{e}}:fence"))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let after = token_on(&url, ns, &lock).await;
    assert!(
        after > before,
        "token {after} after the eviction, {before} before"
    );
}

/// A failover to a replica that missed the latest grants: tokens the promoted replica grants
/// are still greater than every token the old master granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_a_failover_to_a_lagging_replica() {
    let cluster = private(2);
    let urls = cluster.endpoints();
    let (master, replica) = (cluster.addrs()[0], &urls[1]);
    let ns = "dlock-test/safety/failover";
    let lock = name("f");
    let mut conn = connect(replica).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg(master.ip().to_string())
        .arg(master.port())
        .query_async(&mut conn)
        .await
        .expect("REPLICAOF");
    for _ in 0..3 {
        token_on(&urls[0], ns, &lock).await;
    }
    // Wait until the replica has the counter, then cut it off (it lags from here on).
    let fence = format!("{ns}/dlock:{{f}}:fence");
    let mut master_conn = connect(&urls[0]).await;
    let want: Option<String> = redis::cmd("GET")
        .arg(&fence)
        .query_async(&mut master_conn)
        .await
        .expect("GET");
    let began = Instant::now();
    loop {
        let got: Option<String> = redis::cmd("GET")
            .arg(&fence)
            .query_async(&mut conn)
            .await
            .expect("GET on the replica");
        if got == want {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the replica never caught up ({got:?} vs {want:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut conn)
        .await
        .expect("promote");
    let mut before = 0;
    for _ in 0..3 {
        before = before.max(token_on(&urls[0], ns, &lock).await);
    }
    tokio::task::block_in_place(|| cluster.node(0).kill()).expect("kill the old master");
    let after = token_on(replica, ns, &lock).await;
    assert!(
        after > before,
        "token {after} on the promoted replica, {before} on the old master"
    );
}
