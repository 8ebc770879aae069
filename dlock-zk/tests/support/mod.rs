//! Shared helpers for the ZooKeeper backend tests: real servers from the conformance harness.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_zk::ZkLocker;

/// The shared single-node server, or `None` (printed) when the binaries are missing outside CI.
pub fn shared(nodes: usize) -> Option<Arc<Cluster>> {
    match Cluster::shared(ServerKind::Zk, nodes) {
        Ok(c) => Some(c),
        Err(e) if e.may_skip() => {
            eprintln!("SKIP: {e}");
            None
        }
        Err(e) => panic!("ZooKeeper harness: {e}"),
    }
}

/// A private cluster for destructive tests.
pub fn private(nodes: usize) -> Option<Cluster> {
    match Cluster::start(ServerKind::Zk, nodes) {
        Ok(c) => Some(c),
        Err(e) if e.may_skip() => {
            eprintln!("SKIP: {e}");
            None
        }
        Err(e) => panic!("ZooKeeper harness: {e}"),
    }
}

/// A namespace unique to this test and process run.
pub fn namespace(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("zk-tests/p{}-{n}/{test}", std::process::id())
}

/// A locker on `connect` in `ns` with `ttl`.
pub async fn locker(connect: &str, ns: &str, ttl: Duration) -> ZkLocker {
    ZkLocker::builder(connect)
        .ttl(ttl)
        .namespace(ns)
        .build()
        .await
        .expect("locker builds")
}

/// A plain zookeeper-client session for inspecting the tree.
pub async fn raw(connect: &str) -> zookeeper_client::Client {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(5))
        .connect(connect)
        .await
        .expect("raw client connects")
}

/// The children of a lock's parent node (empty when the parent is gone).
pub async fn contenders(raw: &zookeeper_client::Client, parent: &str) -> Vec<String> {
    match raw.list_children(parent).await {
        Ok(mut c) => {
            c.sort();
            c
        }
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {parent}: {e}"),
    }
}

/// Polls `f` until it returns true or `within` passes.
pub async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
