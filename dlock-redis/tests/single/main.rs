//! Redis and Redlock behaviours beyond the shared conformance scenarios, on real servers of the
//! harness: one test binary, one module per topic. What every Redis row already proves
//! (exclusion, FIFO, timeouts, cancels, the family's edges, …) is the scenarios' alone; these
//! check what only Redis has: its options, key layout, scripts, notifications, ACL rules,
//! replicas, TLS refusals and Redlock's quorum arithmetic.

#[path = "../support/mod.rs"]
mod support;

mod acl;
mod failover;
mod family;
mod options;
mod queue;
mod redlock;
mod safety;
mod server;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, Error, Lease, LockName, Locker};
use dlock_redis::{RedisLocker, RedisLockerBuilder};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

/// The shared single node.
fn shared() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

/// The shared single node's URL.
fn url() -> String {
    shared().endpoints().remove(0)
}

/// A cluster of `nodes` independent nodes of this test's own.
fn private(nodes: usize) -> Cluster {
    Cluster::start(ServerKind::Redis, nodes)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

/// An administrative connection to `url` (the default user).
async fn conn(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// A fair-mode locker's builder on `url`, under `ns`, with `ttl`.
fn builder(url: &str, ns: &str, ttl: Duration) -> RedisLockerBuilder {
    RedisLocker::builder().url(url).ttl(ttl).namespace(ns)
}

/// A fair-mode locker on `url`.
async fn locker(url: &str, ns: &str, ttl: Duration) -> RedisLocker {
    builder(url, ns, ttl).build().await.expect("builds")
}

/// Makes the node at `url` a replica of `master`, or a master again (`None`).
async fn replicaof(url: &str, master: Option<SocketAddr>) {
    let mut cmd = redis::cmd("REPLICAOF");
    match master {
        Some(m) => cmd.arg(m.ip().to_string()).arg(m.port()),
        None => cmd.arg("NO").arg("ONE"),
    };
    let _: () = cmd
        .query_async(&mut conn(url).await)
        .await
        .expect("REPLICAOF");
}

/// Makes node 1 of `cluster` a replica of node 0 and waits until it synced and acknowledged
/// a write.
async fn replicate(cluster: &Cluster) {
    let urls = cluster.endpoints();
    replicaof(&urls[1], Some(cluster.addrs()[0])).await;
    let mut replica = conn(&urls[1]).await;
    let began = Instant::now();
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
    // The first acknowledgement after a full sync can take longer than a grant's replica
    // timeout on a loaded machine: `WAIT 1 300` right after the sync answered 0 in 1 of 15
    // tries at a load of 4 on 2 cores (redis-cli alone), and never once one write had been
    // acknowledged. So one acknowledged write first (no response timeout: WAIT blocks).
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut master = redis::Client::open(urls[0].as_str())
        .expect("url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect");
    let (acked,): (i64,) = redis::pipe()
        .cmd("SET")
        .arg("dlock-test:replica-warm-up")
        .arg(1)
        .ignore()
        .cmd("WAIT")
        .arg(1)
        .arg(10_000)
        .query_async(&mut master)
        .await
        .expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged no write within 10 s");
}

/// Waits (at most 10 s) until the fair queue `queue` holds `n` entries, and returns them.
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

/// Waits until nothing of `ns` is left at the shared node (the leak audit the
/// conformance suite uses).
async fn nothing_left(ns: &str) {
    let began = Instant::now();
    loop {
        let left = support::server_leftovers(&url(), ns)
            .await
            .expect("leak audit");
        if left.is_empty() {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "left behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A runtime of its own, for tests that fault servers outside one.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// `locker`'s acquire of `lock` within `wait`; panics saying `what` was expected.
async fn granted<L: Locker + ?Sized>(
    locker: &L,
    lock: &LockName,
    wait: Duration,
    what: &str,
) -> Lease {
    locker
        .acquire(lock, AcquireOptions::wait(wait))
        .await
        .expect(what)
}

/// `locker`'s acquire of `lock` with `options`, in a task of its own.
fn acquiring<L: Locker + Clone + 'static>(
    locker: &L,
    lock: &LockName,
    options: AcquireOptions,
) -> tokio::task::JoinHandle<Result<Lease, Error>> {
    let (locker, lock) = (locker.clone(), lock.clone());
    tokio::spawn(async move { locker.acquire(&lock, options).await })
}
