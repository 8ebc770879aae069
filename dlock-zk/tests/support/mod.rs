//! Shared helpers for the ZooKeeper backend tests: real servers from the conformance harness.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod backend;
pub mod java;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_conformance::faults::Proxy;
use dlock_conformance::servers::{Cluster, HarnessError, ServerKind, ServerOptions};
use dlock_core::{FencingToken, Leader, LeaderChanges, LockName};
use dlock_zk::ZkLocker;

/// `started`, or `None` (printed) when the binaries are missing outside CI.
fn available<C>(started: Result<C, HarnessError>) -> Option<C> {
    match started {
        Ok(c) => Some(c),
        Err(e) if e.may_skip() => {
            eprintln!("SKIP: {e}");
            None
        }
        Err(e) => panic!("ZooKeeper harness: {e}"),
    }
}

/// The shared cluster of `nodes` servers.
pub fn shared(nodes: usize) -> Option<Arc<Cluster>> {
    available(Cluster::shared(ServerKind::Zk, nodes))
}

/// The shared single server that serves clients over TLS only, to client certificates of its
/// CA only.
pub fn shared_tls() -> Option<Arc<Cluster>> {
    let tls = ServerOptions::default().with_tls(true);
    available(Cluster::shared_with(ServerKind::Zk, 1, &tls))
}

/// A test on the shared single server: its connect string and a namespace of its own.
pub struct Zk {
    /// The shared server.
    pub cluster: Arc<Cluster>,
    /// Its connect string.
    pub connect: String,
    /// The test's namespace.
    pub ns: String,
}

impl Zk {
    /// The shared server and a fresh namespace for `test`, or `None` (printed) when the
    /// binaries are missing outside CI.
    pub fn new(test: &str) -> Option<Zk> {
        let cluster = shared(1)?;
        let connect = cluster.endpoints()[0].clone();
        Some(Zk {
            cluster,
            connect,
            ns: namespace(test),
        })
    }

    /// A locker on the server, in the namespace, with `ttl`.
    pub async fn locker(&self, ttl: Duration) -> ZkLocker {
        locker(&self.connect, &self.ns, ttl).await
    }

    /// A locker reaching the server through a fresh proxy (returned with it).
    pub async fn proxied(&self, ttl: Duration) -> (ZkLocker, Proxy) {
        let proxy = Proxy::start(self.cluster.addrs()[0]).expect("proxy");
        (
            locker(&proxy.addr().to_string(), &self.ns, ttl).await,
            proxy,
        )
    }

    /// A plain session on the server.
    pub async fn raw(&self) -> zookeeper_client::Client {
        raw(&self.connect).await
    }

    /// A test on the lock `lock`: a locker with `ttl`, the lock, its parent node
    /// (`lock_path`), and a plain session for inspecting the tree.
    pub async fn on_lock(&self, lock: &str, ttl: Duration) -> OnLock {
        let l = self.locker(ttl).await;
        let name = LockName::new(lock).expect("a valid lock name");
        let parent = l.lock_path(&name);
        (l, name, parent, self.raw().await)
    }
}

/// What [`Zk::on_lock`] returns: (locker, lock, parent node, plain session).
pub type OnLock = (ZkLocker, LockName, String, zookeeper_client::Client);

/// A private cluster of `nodes` servers for destructive tests (started off the runtime).
pub async fn private(nodes: usize) -> Option<Cluster> {
    let started = tokio::task::spawn_blocking(move || Cluster::start(ServerKind::Zk, nodes));
    available(started.await.expect("cluster start"))
}

/// A private local 3-server ensemble whose peer links go through fault proxies (its followers
/// wait 10 s for a silent leader, longer than the sessions tests use).
pub async fn partitionable() -> Option<Cluster> {
    let started = tokio::task::spawn_blocking(|| Cluster::start_partitionable(ServerKind::Zk, 3));
    available(started.await.expect("cluster start"))
}

/// A namespace unique to this test and process run.
pub fn namespace(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("zk-tests/p{}-{n}/{test}", std::process::id())
}

/// A locker on `connect` in `ns` with `ttl`.
pub async fn locker(connect: &str, ns: &str, ttl: Duration) -> ZkLocker {
    ZkLocker::builder()
        .connect_string(connect)
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

/// Whether `parent` comes to have exactly `n` children within `within`.
pub async fn children_become(
    raw: &zookeeper_client::Client,
    parent: &str,
    n: usize,
    within: Duration,
) -> bool {
    eventually(within, || async move {
        contenders(raw, parent).await.len() == n
    })
    .await
}

/// Whether the server at `addr` holds a watch on `path` (four-letter word `wchp`).
pub fn watched(addr: std::net::SocketAddr, path: &str) -> bool {
    dlock_conformance::read_text(addr, b"wchp")
        .is_some_and(|text| text.lines().any(|line| line.trim_end() == path))
}

/// The child of `parent` owned by session `session` (full path), if any.
pub async fn node_of(raw: &zookeeper_client::Client, parent: &str, session: i64) -> Option<String> {
    for child in contenders(raw, parent).await {
        let path = format!("{parent}/{child}");
        if let Ok(Some(stat)) = raw.check_stat(&path).await
            && stat.ephemeral_owner == session
        {
            return Some(path);
        }
    }
    None
}

/// `_c_<36-char uuid>-<marker><10-digit sequence>` (a protected node of Curator's recipes):
/// the uuid and the sequence.
pub fn protected<'a>(node: &'a str, marker: &str) -> (&'a str, &'a str) {
    let (uuid, seq) = node
        .strip_prefix("_c_")
        .and_then(|rest| rest.split_once(&format!("-{marker}")))
        .unwrap_or_else(|| panic!("{node} is not a protected {marker} node"));
    assert_eq!(uuid.len(), 36, "{node}");
    assert_eq!(seq.len(), 10, "{node}");
    (uuid, seq)
}

/// Asserts that a request was kept out: it ended in a timeout (`what` says what a grant
/// would have meant).
#[track_caller]
pub fn kept_out<T: std::fmt::Debug>(got: Result<T, dlock_core::Error>, what: &str) {
    let e = got.expect_err(what);
    assert_eq!(e.kind(), dlock_core::ErrorKind::Timeout, "{e}");
}

/// The leader `value` with the term `term`.
pub fn leader(term: FencingToken, value: &[u8]) -> Leader {
    Leader {
        term,
        value: value.to_vec(),
    }
}

/// The next leader change, within `within`.
pub async fn next_change(changes: &mut Box<dyn LeaderChanges>, within: Duration) -> Leader {
    tokio::time::timeout(within, changes.next())
        .await
        .expect("a change in time")
        .expect("the observation goes on")
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

/// Ends a locker's session from the server side: with the locker's own connection blackholed
/// at `proxy` (so it cannot win the session back), another connection resumes the session
/// directly at `direct` and closes it. Returns once no node under `parent` belongs to the
/// session any more; the locker learns of the expiry when the proxy passes traffic again.
pub async fn expire_session(
    l: &ZkLocker,
    direct: &str,
    proxy: &dlock_conformance::faults::Proxy,
    parent: &str,
) {
    use dlock_conformance::faults::Mode;
    let info = l.session_info_for_test().expect("a session");
    let id = info.id().0;
    proxy.set(Mode::Blackhole);
    let other = zookeeper_client::Client::connector()
        .with_session(info)
        .with_session_timeout(l.negotiated_timeout())
        .connect(direct)
        .await
        .expect("take the session over");
    drop(other);
    let z = raw(direct).await;
    let closed = eventually(Duration::from_secs(10), || {
        let z = z.clone();
        async move {
            for child in contenders(&z, parent).await {
                if let Ok(Some(stat)) = z.check_stat(&format!("{parent}/{child}")).await
                    && stat.ephemeral_owner == id
                {
                    return false;
                }
            }
            true
        }
    })
    .await;
    assert!(closed, "the session was not closed");
    proxy.set(Mode::Pass);
}
