//! How the suite talks to one backend topology. Each backend crate implements [`TestBackend`]
//! in its `tests/conformance.rs` and hands it to [`conformance_tests!`](crate::conformance_tests).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{Error, LockName, Locker};

use crate::servers::{Cluster, ServerKind};

/// Options for one test client.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Namespace (key prefix / chroot) the client works in; unique per scenario and run.
    pub namespace: String,
    /// Lease TTL of the client's locker.
    pub ttl: Duration,
    /// When set, the client must reach every server node through these addresses instead of
    /// the nodes' own (index i = node i): a fault proxy sits there.
    pub via: Option<Vec<std::net::SocketAddr>>,
}

impl ClientOptions {
    /// Options for `namespace` with `ttl`, connecting directly.
    pub fn new(namespace: impl Into<String>, ttl: Duration) -> Self {
        ClientOptions {
            namespace: namespace.into(),
            ttl,
            via: None,
        }
    }

    /// Connect through the given proxy addresses (one per node).
    pub fn via(mut self, addrs: Vec<std::net::SocketAddr>) -> Self {
        self.via = Some(addrs);
        self
    }
}

/// One backend topology under test (e.g. "redis", "redlock", "etcd-cluster", "memory").
#[async_trait]
pub trait TestBackend: Send + Sync + 'static {
    /// The row name in the report.
    fn name(&self) -> &str;

    /// The server nodes' addresses (for proxies), in node order. Empty for in-process backends.
    fn node_addrs(&self) -> Vec<std::net::SocketAddr>;

    /// A new, independent client (own connection / session).
    ///
    /// # Errors
    /// Whatever building the locker returns.
    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error>;

    /// Everything the backend keeps at the server under `namespace` right now (keys, nodes,
    /// queue entries, leases holding locks), for leak audits. Expired entries do not count.
    ///
    /// # Errors
    /// The backend's error when the server cannot be read.
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error>;

    /// Breaks the current holder of `name` from the server side (delete its key or node, revoke
    /// its lease), as an operator or a server fault would.
    ///
    /// # Errors
    /// The backend's error.
    async fn break_holder(&self, namespace: &str, name: &LockName) -> Result<(), Error>;

    /// Environment variables that make a child process (the crash-test holder) reach the same
    /// servers through the `external` provider.
    fn child_env(&self) -> Vec<(String, String)>;

    /// The servers' captured output, printed when a scenario fails. Empty by default.
    fn logs(&self) -> String {
        String::new()
    }

    /// The server kind and node count this backend runs on (`(Redis, 5)` for Redlock,
    /// `(Etcd, 3)` for an etcd cluster). `None` (the default) for in-process backends; the
    /// server-node fault scenarios skip with a printed reason then.
    fn topology(&self) -> Option<(ServerKind, usize)> {
        None
    }

    /// The same backend over another cluster of the same [`topology`](TestBackend::topology):
    /// a private one the server-node fault scenarios kill and pause nodes of (never the shared
    /// one). `None` (the default): those scenarios skip with a printed reason.
    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        let _ = cluster;
        None
    }

    /// Requests the servers have received so far, summed over the nodes (Redis
    /// `INFO commandstats` calls, etcd gRPC requests handled from `/metrics`, ZooKeeper `mntr`
    /// packets received), read with blocking I/O. Includes every other client's traffic to the
    /// same servers. By default it is read from the nodes of [`topology`](TestBackend::topology)
    /// at [`node_addrs`](TestBackend::node_addrs); `None` when the backend has no topology or
    /// a node does not answer.
    fn server_requests(&self) -> Option<u64> {
        let (kind, _) = self.topology()?;
        crate::servers::stats::requests(kind, &self.node_addrs())
    }
}
