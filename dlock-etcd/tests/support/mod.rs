//! Shared helpers of the etcd integration tests: real servers from the conformance harness.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
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

/// Acquires and releases a name of its own, so that `locker` has a live session.
pub async fn warm_up(locker: &EtcdLocker) {
    hold(locker, &name("warm-up"))
        .await
        .release()
        .await
        .expect("warm-up release");
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
    use dlock_conformance::servers::ServerOptions;
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

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A one-member etcd started by the test itself, with flags the harness does not set (e.g.
/// `--auth-token-ttl`, or etcd's default timing). Killed on drop.
pub struct PrivateEtcd {
    child: std::process::Child,
    dir: std::path::PathBuf,
    /// The client URL.
    pub endpoint: String,
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivateEtcd {
    /// Starts etcd with `extra` flags (and no others beyond addresses, data dir and logging;
    /// no heartbeat or election flags unless given) and waits until it serves.
    pub fn start(extra: &[&str]) -> PrivateEtcd {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "dlock-etcd-private-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = std::process::Command::new("etcd")
            .current_dir(&dir)
            .args(["--name", "p", "--data-dir", "data"])
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("p={peer_url}")])
            .args(["--initial-cluster-state", "new"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(["--log-level", "error"])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::File::create(dir.join("etcd.log"))
                    .map(std::process::Stdio::from)
                    .unwrap_or_else(|_| std::process::Stdio::null()),
            )
            .spawn()
            .expect("start etcd");
        let server = PrivateEtcd {
            child,
            dir,
            endpoint,
        };
        for _ in 0..150 {
            if server.etcdctl_ok(&["endpoint", "health"]) {
                return server;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("a private etcd ({extra:?}) did not become healthy");
    }

    /// What etcd logged so far (at the `--log-level` given, `error` by default).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    fn etcdctl_ok(&self, args: &[&str]) -> bool {
        std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint])
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// Runs `etcdctl` against this server; panics when it fails.
    pub fn etcdctl(&self, args: &[&str]) {
        let out = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint])
            .args(args)
            .output()
            .expect("run etcdctl");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
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

    /// The next line etcdctl printed, if one came within `within`.
    pub fn line(&self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// The key etcdctl printed when granted, if it was granted within `within`.
    pub fn granted_key(&self, within: Duration) -> Option<String> {
        self.line(within)
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
