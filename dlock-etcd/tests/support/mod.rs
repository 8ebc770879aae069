//! Shared helpers of the etcd integration tests: real servers from the conformance harness.

#![allow(dead_code)]

// `backend.rs` includes it too: a binary with both (`security`) has it twice.
#[allow(clippy::duplicate_mod)]
mod keys;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
use dlock_core::{AcquireOptions, Lease, LockName, Locker};
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

/// Runs `test` on a [`runtime`] of its own with the [`single`] etcd and a fresh
/// [`namespace`] for `name`.
pub fn on_single<F, Fut>(name: &str, test: F) -> Fut::Output
where
    F: FnOnce(Arc<Cluster>, String) -> Fut,
    Fut: std::future::Future,
{
    in_namespace(single(), name, test)
}

/// Runs `test` on a [`runtime`] of its own with `server` (dropped when `test` ends) and a
/// fresh [`namespace`] for `name`.
pub fn in_namespace<S, F, Fut>(server: S, name: &str, test: F) -> Fut::Output
where
    F: FnOnce(S, String) -> Fut,
    Fut: std::future::Future,
{
    runtime().block_on(test(server, namespace(name)))
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

/// A valid lock name.
pub fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

/// `locker`'s lease on `name`, granted within 5 s.
pub async fn hold(locker: &EtcdLocker, name: &LockName) -> Lease {
    locker
        .acquire(name, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("acquire")
}

/// Asserts that a request was kept out: it ended in a timeout (`what` says what a grant
/// would have meant).
#[track_caller]
pub fn kept_out<T: std::fmt::Debug>(got: Result<T, dlock_core::Error>, what: &str) {
    let e = got.expect_err(what);
    assert_eq!(e.kind(), dlock_core::ErrorKind::Timeout, "{e}");
}

/// `locker`'s acquire of `name`, waiting as `opts` say, in a task of its own.
pub fn spawn_acquire(
    locker: &EtcdLocker,
    name: &LockName,
    opts: AcquireOptions,
) -> tokio::task::JoinHandle<Result<Lease, dlock_core::Error>> {
    let (l, n) = (locker.clone(), name.clone());
    tokio::spawn(async move { l.acquire(&n, opts).await })
}

/// Two lockers on `cluster` under `ns`: a holder of `name` (its lease), and a waiter whose
/// acquire of `name`, waiting `wait`, runs in a task ([`spawn_acquire`]).
pub async fn held_and_waiting(
    cluster: &Cluster,
    ns: &str,
    name: &LockName,
    wait: Duration,
) -> (
    EtcdLocker,
    Lease,
    EtcdLocker,
    tokio::task::JoinHandle<Result<Lease, dlock_core::Error>>,
) {
    let holder = locker(cluster, ns).await;
    let waiter = locker(cluster, ns).await;
    let lease = hold(&holder, name).await;
    let waiting = spawn_acquire(&waiter, name, AcquireOptions::wait(wait));
    (holder, lease, waiter, waiting)
}

/// Acquires and releases a name of its own, so that `locker` has a live session.
pub async fn warm_up(locker: &EtcdLocker) {
    hold(locker, &name("warm-up"))
        .await
        .release()
        .await
        .expect("warm-up release");
}

/// Every key under `ns/`, sorted.
pub async fn keys_under(locker: &EtcdLocker, ns: &str) -> Vec<String> {
    keys::list(&mut locker.client().clone(), ns)
        .await
        .expect("list the namespace")
}

/// Polls until nothing is left under `ns/` (a dropped acquire deletes its key in the
/// background), or panics with what is left after 5 s.
pub async fn assert_no_keys(locker: &EtcdLocker, ns: &str) {
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let keys = keys_under(locker, ns).await;
        if keys.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "keys left behind: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A private 3-member cluster, and the lock that lets only one such cluster live at a time
/// in a test binary: several at once starved their members on 2 cores. Dereferences to the
/// cluster.
pub struct ThreeMembers {
    cluster: Cluster,
    _one: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for ThreeMembers {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

/// Starts a [`ThreeMembers`] cluster, once the previous one of this binary is gone.
pub fn three_members() -> ThreeMembers {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    ThreeMembers {
        cluster: Cluster::start(ServerKind::Etcd, 3).unwrap_or_else(|e| panic!("{e}")),
        _one: one,
    }
}

/// Resumes a paused member on drop, so that a failing test leaves no member stopped.
pub struct Resume<'a>(pub &'a Cluster, pub usize);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        let _ = self.0.node(self.1).resume();
    }
}

/// The shared one-member etcd of this process that serves clients over TLS only and accepts
/// only client certificates of its CA (the harness's TLS cluster, as the `etcd-tls` row), with
/// its CA and client identity read (PEM).
pub struct TlsEtcd {
    /// The cluster.
    pub cluster: Arc<Cluster>,
    /// The CA that signed the server's certificate (for 127.0.0.1 and localhost).
    pub ca: Vec<u8>,
    /// The client certificate.
    pub cert: Vec<u8>,
    /// The client certificate's key.
    pub key: Vec<u8>,
}

/// The [`TlsEtcd`] of this process (started at the first call).
pub fn tls_etcd() -> TlsEtcd {
    let cluster = Cluster::shared_with(
        ServerKind::Etcd,
        1,
        &ServerOptions::default().with_tls(true),
    )
    .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let files = cluster.tls().expect("a TLS cluster");
    let read = |p: &std::path::Path| std::fs::read(p).expect("read a certificate file");
    let (cert, key) = files.client_identity().expect("a client identity");
    let (ca, cert, key) = (read(files.ca()), read(cert), read(key));
    TlsEtcd {
        cluster,
        ca,
        cert,
        key,
    }
}

/// A multi-thread runtime for one test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The sum of the `/metrics` samples named `metric` of `cluster`'s member `node`; `None`
/// when it does not answer or has no such sample.
pub fn metric(cluster: &Cluster, node: usize, metric: &str) -> Option<u64> {
    let text =
        cluster.nodes()[node].read_text(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    dlock_conformance::sum_samples(&text, metric)
}

/// A private one-member etcd of the harness serving as `options` say (flags of its own with
/// `ServerOptions::with_args`: given last, they win). Never external servers: their flags are
/// not ours to set (nor their authentication to enable).
pub fn private(options: &ServerOptions) -> Cluster {
    let cluster = Cluster::start_with(ServerKind::Etcd, 1, options)
        .unwrap_or_else(|e| panic!("a private etcd ({options:?}): {e}"));
    assert!(
        !cluster.is_external(),
        "this test starts an etcd with flags of its own: unset DLOCK_ETCD_ENDPOINTS"
    );
    cluster
}

/// A running `etcdctl` (`lock`, `elect`, `elect -l`) whose output lines are collected;
/// killed on drop.
pub struct Etcdctl {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Etcdctl {
    /// `etcdctl --endpoints <endpoint> <args…>`.
    pub fn spawn(endpoint: &str, args: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoint])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start etcdctl (Debian package etcd-client)");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Etcdctl { child, lines }
    }

    /// `etcdctl lock --ttl 2 <name>`: holds the lock once granted, until interrupted.
    pub fn lock(endpoint: &str, name: &str) -> Self {
        Etcdctl::spawn(endpoint, &["lock", "--ttl", "2", name])
    }

    /// The next line etcdctl printed, if one came within `within` (`lock` prints the key it
    /// holds when granted).
    pub fn line(&self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// SIGINT: etcdctl unlocks or resigns, and closes its session.
    pub fn interrupt(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Etcdctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
