//! TLS through the builder (cargo feature `tls`): an etcd serving https with a test CA.
//!
//! Run with `cargo test -p dlock-etcd --features tls --test tls`. Needs `openssl` (to make the
//! test certificates), `etcd` and `etcdctl`.

#![cfg(feature = "tls")]

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};
use dlock_etcd::EtcdLocker;
use dlock_etcd::etcd_client::{Certificate, TlsOptions};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn run(dir: &Path, args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and a server certificate for 127.0.0.1 / localhost.
fn make_certs(dir: &Path) {
    run(
        dir,
        &[
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=dlock-test-ca",
        ],
    );
    run(
        dir,
        &[
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("write ext");
    run(
        dir,
        &[
            "openssl",
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        ],
    );
}

struct TlsEtcd {
    child: Child,
    dir: PathBuf,
    endpoint: String,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start() -> TlsEtcd {
    let dir = std::env::temp_dir().join(format!("dlock-etcd-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    make_certs(&dir);
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("https://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .current_dir(&dir)
        .args(["--name", "t", "--data-dir", "data"])
        .args([
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args([
            "--initial-cluster",
            &format!("t={peer_url}"),
            "--initial-cluster-state",
            "new",
        ])
        .args(["--cert-file", "server.pem", "--key-file", "server.key"])
        .args([
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
            "--log-level",
            "error",
        ])
        .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    let server = TlsEtcd {
        child,
        dir,
        endpoint,
    };
    for _ in 0..100 {
        let ok = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .current_dir(&server.dir)
            .args([
                "--endpoints",
                &server.endpoint,
                "--cacert",
                "ca.pem",
                "endpoint",
                "health",
            ])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return server;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("etcd with TLS did not become healthy");
}

#[test]
fn tls_options_reach_etcd() {
    let server = start();
    let ca = std::fs::read(server.dir.join("ca.pem")).expect("ca");
    support::runtime().block_on(async {
        let ns = support::namespace("tls");
        let name = LockName::new("secure").expect("valid");
        let locker = support::builder(vec![server.endpoint.clone()], &ns)
            .tls(
                TlsOptions::new()
                    .ca_certificate(Certificate::from_pem(&ca))
                    .domain_name("localhost"),
            )
            .build()
            .await
            .expect("TLS locker");
        let lease = locker
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire over TLS");
        tokio::time::sleep(locker.ttl()).await;
        assert!(
            lease.check().is_ok(),
            "renewal over TLS: {:?}",
            lease.check()
        );
        lease.release().await.expect("release over TLS");

        // Without our CA the server's certificate is not trusted: no lock, a clear error.
        let untrusted = EtcdLocker::builder()
            .endpoints([server.endpoint.clone()])
            .prefix(ns.clone())
            .request_timeout(Duration::from_secs(1))
            .build()
            .await;
        match untrusted {
            Err(e) => assert_ne!(e.kind(), ErrorKind::InvalidInput, "{e}"),
            Ok(l) => {
                let err = l
                    .acquire(&name, AcquireOptions::wait(Duration::from_secs(2)))
                    .await
                    .expect_err("an untrusted server must not grant");
                assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
            }
        }
    });
}
