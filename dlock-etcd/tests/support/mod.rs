//! Shared helpers of the etcd integration tests: real servers from the conformance harness.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_etcd::{EtcdLocker, EtcdLockerBuilder};

/// The shared single-node etcd of this test process (skips when etcd is not installed and `CI`
/// is unset; fails under `CI`).
pub fn single() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Etcd, 1).unwrap_or_else(|e| {
        if e.may_skip() && std::env::var_os("CI").is_none() {
            eprintln!("SKIP: {e}");
            std::process::exit(0);
        }
        panic!("etcd unavailable: {e}")
    })
}

/// A namespace unique to this process and call.
pub fn namespace(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "dlock-test/etcd-{}-{}/{test}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A builder for `endpoints` under `ns` with a 2 s TTL and a 2 s request timeout.
pub fn builder(endpoints: Vec<String>, ns: &str) -> EtcdLockerBuilder {
    EtcdLocker::builder()
        .endpoints(endpoints)
        .prefix(ns)
        .ttl(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(2))
}

/// A locker on `cluster` under `ns`.
pub async fn locker(cluster: &Cluster, ns: &str) -> EtcdLocker {
    builder(cluster.endpoints(), ns)
        .build()
        .await
        .expect("build the locker")
}

/// A multi-thread runtime for one test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
