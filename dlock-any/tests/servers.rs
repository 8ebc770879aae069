//! Lockers connected by URL to real servers started by the conformance harness: a lock
//! acquired, contended and released on Redis (single node and Redlock), etcd and ZooKeeper.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
use dlock_core::{AcquireOptions, Error, ErrorKind, LockName, Locker};

fn cluster(kind: ServerKind, nodes: usize) -> Arc<Cluster> {
    cluster_with(kind, nodes, &ServerOptions::default())
}

fn cluster_with(kind: ServerKind, nodes: usize, options: &ServerOptions) -> Arc<Cluster> {
    Cluster::shared_with(kind, nodes, options).unwrap_or_else(|e| {
        if e.may_skip() {
            eprintln!("SKIP: {e}");
            std::process::exit(0);
        }
        panic!("{} servers unavailable: {e}", kind.as_str())
    })
}

/// `host:port,host:port` of a cluster's nodes.
fn authority(c: &Cluster) -> String {
    c.addrs()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A namespace unique to this process and call.
fn namespace() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "dlock-any-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `template` with `{nodes}` replaced by the cluster's `host:port,…` and a fresh
/// `namespace=…` appended to its query.
fn url(c: &Cluster, template: &str) -> String {
    format!(
        "{}&namespace={}",
        template.replace("{nodes}", &authority(c)),
        namespace()
    )
}

/// A locker from `url`.
async fn connect(url: &str) -> Arc<dyn Locker> {
    dlock_any::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// The error of an acquire of `x` through a locker from `url` (which builds without I/O),
/// waiting at most `wait`; `why` says why it must fail.
async fn acquire_error(url: &str, wait: Duration, why: &str) -> Error {
    let locker = dlock_any::connect(url).await.expect("builds without I/O");
    locker
        .acquire(
            &LockName::new("x").expect("name"),
            AcquireOptions::wait(wait),
        )
        .await
        .expect_err(why)
}

/// Two lockers from `url`: the first acquires, the second finds the lock taken and times out,
/// then gets it after the release with a larger fencing token.
async fn exclude_and_release(url: &str) {
    let (a, b) = (connect(url).await, connect(url).await);
    let name = LockName::new("any/by-url").expect("name");
    let wait = AcquireOptions::wait(Duration::from_secs(20));
    let lease = a.acquire(&name, wait).await.expect("first acquire");
    assert!(
        b.try_acquire(&name).await.expect("try_acquire").is_none(),
        "{url}: the lock is held"
    );
    let err = b
        .acquire(&name, AcquireOptions::wait(Duration::from_millis(300)))
        .await
        .expect_err("held: must time out");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{url}: {err}");
    let first = lease.token();
    lease.release().await.expect("release");
    let again = b.acquire(&name, wait).await.expect("acquire after release");
    assert!(again.token() > first, "{url}: tokens increase");
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_by_url() {
    let url = excluded_by_url(ServerKind::Redis, 1, "redis://{nodes}/0?ttl=2s").await;
    let locker = connect(&url).await;
    assert_eq!(locker.ttl(), Duration::from_secs(2));
    // The family handles work by URL too.
    let election = locker.into_election().expect("redis offers elections");
    let name = LockName::new("any/election").expect("name");
    let lead = election
        .campaign(&name, b"me", AcquireOptions::wait(Duration::from_secs(10)))
        .await
        .expect("campaign");
    let leader = election
        .leader(&name)
        .await
        .expect("leader")
        .expect("a leader");
    assert_eq!(leader.value, b"me".to_vec());
    drop(lead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_by_url() {
    excluded_by_url(ServerKind::Redis, 3, "redlock://{nodes}?ttl=2s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_by_url() {
    let url = excluded_by_url(ServerKind::Etcd, 1, "etcd://{nodes}/dlock-any-test?ttl=2s").await;
    let locker = connect(&url).await;
    locker
        .into_rw_locker()
        .expect("etcd offers read-write locks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_by_url() {
    let url = excluded_by_url(ServerKind::Zk, 1, "zk://{nodes}/dlock-any-test?ttl=4s").await;
    let locker = connect(&url).await;
    locker.into_semaphore().expect("zk offers semaphores");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers_are_unavailable() {
    // ZooKeeper opens its session while connecting: nobody listens on port 1.
    let err = match dlock_any::connect("zk://127.0.0.1:1?ttl=2s").await {
        Ok(_) => panic!("nothing listens there"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // Redis connects in the background: the acquire fails.
    let err = acquire_error(
        "redis://127.0.0.1:1?ttl=1s",
        Duration::from_secs(1),
        "nothing listens there",
    )
    .await;
    assert!(err.is_retryable(), "{err}");
}

/// Percent-encodes a file path for a query value.
fn query_path(p: &std::path::Path) -> String {
    p.to_string_lossy()
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `ca=…&cert=…&key=…` for a TLS cluster that checks client certificates.
fn tls_query(c: &Cluster) -> String {
    let tls = c.tls().expect("a TLS cluster");
    let (cert, key) = tls.client_identity().expect("a client identity");
    format!(
        "ca={}&cert={}&key={}",
        query_path(tls.ca()),
        query_path(cert),
        query_path(key)
    )
}

/// Sends one command to a Redis server (RESP) and returns its raw reply.
fn redis_command(addr: std::net::SocketAddr, args: &[&str]) -> String {
    dlock_conformance::redis_command(addr, args).expect("redis answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_acl_user_by_url() {
    let c = cluster(ServerKind::Redis, 1);
    // An ACL user whose password needs percent-encoding in the URL.
    let user = format!("any-{}", std::process::id());
    let reply = redis_command(
        c.addrs()[0],
        &[
            "ACL",
            "SETUSER",
            &user,
            "on",
            ">p@ss w:rd",
            "~*",
            "&*",
            "+@all",
        ],
    );
    assert_eq!(reply, "+OK\r\n");
    let url = url(
        &c,
        &format!("redis://{user}:p%40ss%20w%3Ard@{{nodes}}?ttl=2s"),
    );
    exclude_and_release(&url).await;
    // A wrong password is refused, not retried.
    let wrong = format!("redis://{user}:nope@{}?ttl=2s", authority(&c));
    let err = acquire_error(&wrong, Duration::from_secs(5), "wrong password").await;
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
}

/// [`exclude_and_release`] on a shared `kind` cluster of `nodes`, through `template` with the
/// cluster's nodes (see [`url`]); that URL.
async fn excluded_by_url(kind: ServerKind, nodes: usize, template: &str) -> String {
    let url = url(&cluster(kind, nodes), template);
    exclude_and_release(&url).await;
    url
}

/// `scheme://NODES[path]?ttl=…&namespace=…&<the CA and client identity>` against TLS-only
/// servers: excludes and releases.
async fn over_tls(kind: ServerKind, nodes: usize, scheme: &str, path: &str, ttl: &str) {
    let c = cluster_with(kind, nodes, &ServerOptions::default().with_tls(true));
    let url = url(
        &c,
        &format!("{scheme}://{{nodes}}{path}?ttl={ttl}&{}", tls_query(&c)),
    );
    exclude_and_release(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_by_url() {
    over_tls(ServerKind::Redis, 1, "rediss", "", "2s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_tls_by_url() {
    over_tls(ServerKind::Redis, 3, "redlock+tls", "", "2s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_tls_by_url() {
    over_tls(ServerKind::Etcd, 1, "etcd+tls", "", "2s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_by_url() {
    let c = cluster_with(
        ServerKind::Redis,
        3,
        &dlock_conformance::servers::redis_cluster::options(),
    );
    dlock_conformance::servers::redis_cluster::form(&c).expect("form the Redis Cluster");
    let url = url(&c, "redis+cluster://{nodes}?ttl=2s");
    exclude_and_release(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_digest_by_url() {
    // Digest credentials authenticate the session; the nodes keep the default open ACL.
    excluded_by_url(
        ServerKind::Zk,
        1,
        "zk://alice:s%3Acret@{nodes}/dlock-any-digest?ttl=4s",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_tls_by_url() {
    over_tls(ServerKind::Zk, 1, "zk+tls", "/dlock-any-tls", "4s").await;
}
