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
        .await
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

/// Makes node 1 a replica of node 0 and waits until it synced.
async fn replicate(cluster: &Cluster) {
    let urls = cluster.endpoints();
    replicaof(&urls[1], Some(cluster.addrs()[0])).await;
    let mut replica = redis::Client::open(urls[1].as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let began = std::time::Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut replica)
            .await
            .expect("INFO");
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the replica never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `WAIT` blocks the connection it is sent on until it returns. While the only replica is
/// stalled (SIGSTOP: still connected, acknowledging nothing), several grants at once wait for
/// its acknowledgement, again and again, for twice the TTL: none of them is handed out (the
/// `WAIT` still waits for THEIR grant), and the lease the locker already holds keeps being
/// renewed (its renewals do not queue behind the `WAIT`s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_does_not_starve_renewals() {
    let cluster = Cluster::start(ServerKind::Redis, 2)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    replicate(&cluster).await;
    let ttl = Duration::from_secs(2);
    let l = RedisLocker::builder()
        .url(&cluster.endpoints()[0])
        .ttl(ttl)
        .namespace("dlock-test/failover/wait-starves")
        .wait_for_replicas(1, Duration::from_millis(900))
        .build()
        .await
        .expect("builds");
    let held = l
        .acquire(
            &LockName::new("held").expect("valid name"),
            AcquireOptions::wait(Duration::from_secs(2)),
        )
        .await
        .expect("a replica acknowledges");
    tokio::task::block_in_place(|| cluster.node(1).pause()).expect("stall the replica");
    let stalled = std::time::Instant::now();
    let grants: Vec<_> = (0..6)
        .map(|k| {
            let l = l.clone();
            tokio::spawn(async move {
                let name = LockName::new(format!("g{k}")).expect("valid name");
                let mut refused = 0;
                while stalled.elapsed() < 2 * ttl {
                    match l.try_acquire(&name).await {
                        Ok(Some(lease)) => {
                            let _ = lease.release().await;
                            return Err(format!("{name} was granted without an acknowledgement"));
                        }
                        Ok(None) => {}
                        Err(e) if e.kind() == ErrorKind::Unavailable => refused += 1,
                        Err(e) => return Err(format!("{name}: {e}")),
                    }
                }
                Ok(refused)
            })
        })
        .collect();
    let mut refused = 0;
    for g in grants {
        refused += g.await.expect("join").unwrap_or_else(|e| panic!("{e}"));
    }
    let check = held.check();
    tokio::task::block_in_place(|| cluster.node(1).resume()).expect("resume the replica");
    assert!(refused > 0, "no grant ever waited for the stalled replica");
    check.unwrap_or_else(|e| {
        panic!(
            "the held lease was not renewed while grants waited for the stalled replica ({:?} after the stall began): {e}",
            stalled.elapsed()
        )
    });
    held.release().await.expect("release");
}

/// `wait_for_replicas`: a grant is handed out only once a replica acknowledged it; with the
/// replica gone, the grant is given back and the acquire fails as `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_wait_for_replica_acknowledgement() {
    let cluster = Cluster::start(ServerKind::Redis, 2)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let urls = cluster.endpoints();
    replicaof(&urls[1], Some(cluster.addrs()[0])).await;
    let mut replica = redis::Client::open(urls[1].as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let began = std::time::Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut replica)
            .await
            .expect("INFO");
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the replica never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ns = "dlock-test/failover/wait";
    let l = RedisLocker::builder()
        .url(&urls[0])
        .ttl(Duration::from_secs(2))
        .namespace(ns)
        .wait_for_replicas(1, Duration::from_millis(300))
        .build()
        .await
        .expect("builds");
    let lease = l
        .acquire(
            &LockName::new("acked").expect("valid name"),
            AcquireOptions::wait(Duration::from_secs(2)),
        )
        .await
        .expect("a replica acknowledges");
    lease.release().await.expect("release");
    tokio::task::block_in_place(|| cluster.node(1).kill()).expect("kill the replica");
    let e = l
        .acquire(
            &LockName::new("unacked").expect("valid name"),
            AcquireOptions::wait(Duration::from_secs(2)),
        )
        .await
        .expect_err("no replica acknowledges");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let mut master = redis::Client::open(urls[0].as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let left: Option<String> = redis::cmd("GET")
        .arg(format!("{ns}/dlock:{{unacked}}"))
        .query_async(&mut master)
        .await
        .expect("GET");
    assert_eq!(left, None, "the unacknowledged grant was not given back");
    let bad = RedisLocker::builder()
        .url(&urls[0])
        .ttl(Duration::from_secs(2))
        .wait_for_replicas(0, Duration::from_millis(300))
        .build()
        .await;
    assert_eq!(bad.expect_err("no replica").kind(), ErrorKind::InvalidInput);
}
