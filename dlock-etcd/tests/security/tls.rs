//! TLS through the builder (cargo feature `tls`): an etcd serving https with a test CA.
//! Certificates the client cannot trust (another CA, another host name, no CA) fail the first
//! request at once with an error that is not retryable; PEM that cannot be parsed fails
//! `build` before any I/O, naming the option.
//!
//! Run with `cargo test -p dlock-etcd --test security tls` (the tests build with the `tls` feature).
//! Needs `openssl` (to make the test certificates), `etcd` and `etcdctl`.

use crate::support;

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

/// A CA the server's certificate does not come from (`other-ca.pem`).
fn make_other_ca(dir: &Path) {
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
            "other-ca.key",
            "-out",
            "other-ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=dlock-other-ca",
        ],
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
    // One directory per server: the tests run in parallel.
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "dlock-etcd-tls-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    make_certs(&dir);
    make_other_ca(&dir);
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
        assert_refused_at_once(untrusted, &name, "no CA").await;
    });
}

/// The same CA through the builder's `tls_root_certificates`: no domain needed, the
/// certificate names 127.0.0.1.
#[test]
fn root_certificates_reach_etcd() {
    let server = start();
    let ca = std::fs::read(server.dir.join("ca.pem")).expect("ca");
    support::runtime().block_on(async {
        let ns = support::namespace("tls-roots");
        let name = LockName::new("secure").expect("valid");
        let locker = support::builder(vec![server.endpoint.clone()], &ns)
            .tls_root_certificates(ca)
            .build()
            .await
            .expect("TLS locker");
        let lease = locker
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire over TLS");
        lease.release().await.expect("release over TLS");
    });
}

/// Building (or the first request) fails within about a second with a non-retryable error
/// that says the certificate was not accepted: never a hang until the wait runs out.
async fn assert_refused_at_once(
    built: Result<EtcdLocker, dlock_core::Error>,
    name: &LockName,
    what: &str,
) {
    let started = std::time::Instant::now();
    let err = match built {
        Err(e) => e,
        Ok(l) => l
            .acquire(name, AcquireOptions::wait(Duration::from_secs(10)))
            .await
            .expect_err("an untrusted server must not grant"),
    };
    let took = started.elapsed();
    assert_ne!(err.kind(), ErrorKind::InvalidInput, "{what}: {err}");
    assert!(!err.is_retryable(), "{what}: retryable: {err} ({err:?})");
    assert!(
        err.to_string().contains("certificate"),
        "{what}: the error does not say it is about the certificate: {err}"
    );
    assert!(
        took < Duration::from_secs(3),
        "{what}: took {took:?} to fail (a 10 s wait): {err}"
    );
}

#[test]
fn a_wrong_ca_fails_at_once_and_is_not_retryable() {
    let server = start();
    let other = std::fs::read(server.dir.join("other-ca.pem")).expect("other ca");
    support::runtime().block_on(async {
        let ns = support::namespace("tls-wrong-ca");
        let name = LockName::new("secure").expect("valid");
        let built = support::builder(vec![server.endpoint.clone()], &ns)
            .tls_root_certificates(other)
            .build()
            .await;
        assert_refused_at_once(built, &name, "wrong CA").await;
    });
}

#[test]
fn a_wrong_host_name_fails_at_once_and_is_not_retryable() {
    let server = start();
    let ca = std::fs::read(server.dir.join("ca.pem")).expect("ca");
    support::runtime().block_on(async {
        let ns = support::namespace("tls-wrong-host");
        let name = LockName::new("secure").expect("valid");
        // The right CA, but the certificate names 127.0.0.1 and localhost only.
        let built = support::builder(vec![server.endpoint.clone()], &ns)
            .tls(TlsOptions::new().domain_name("not-the-server.invalid"))
            .tls_root_certificates(ca)
            .build()
            .await;
        assert_refused_at_once(built, &name, "wrong host name").await;
    });
}

/// PEM that cannot be used fails `build` before any I/O (nothing listens on port 1), with
/// the option named.
#[tokio::test]
async fn unusable_pem_is_rejected_before_io() {
    let dir = std::env::temp_dir().join(format!("dlock-etcd-tls-pem-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    make_certs(&dir);
    let read = |f: &str| std::fs::read(dir.join(f)).expect("read");
    let (ca, cert, key) = (read("ca.pem"), read("server.pem"), read("server.key"));
    let other_key = read("ca.key");
    let garbage_body =
        b"-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n";
    let base = || {
        EtcdLocker::builder()
            .endpoints(["https://127.0.0.1:1"])
            .request_timeout(Duration::from_secs(1))
    };
    let cases: Vec<(&str, dlock_etcd::EtcdLockerBuilder)> = vec![
        (
            "tls_root_certificates",
            base().tls_root_certificates(b"hello".to_vec()),
        ),
        (
            "tls_root_certificates",
            base().tls_root_certificates(garbage_body.to_vec()),
        ),
        (
            "tls_root_certificates",
            base().tls_root_certificates(key.clone()),
        ),
        (
            "tls_client_identity",
            base().tls_client_identity(b"x".to_vec(), key.clone()),
        ),
        (
            "tls_client_identity",
            base().tls_client_identity(cert.clone(), b"x".to_vec()),
        ),
        (
            "tls_client_identity",
            base().tls_client_identity(key.clone(), cert.clone()),
        ),
        (
            "tls_client_identity",
            base().tls_client_identity(cert.clone(), garbage_body.to_vec()),
        ),
        // A key of another certificate.
        (
            "tls_client_identity",
            base().tls_client_identity(cert.clone(), other_key),
        ),
    ];
    let key_text = String::from_utf8_lossy(&key).into_owned();
    let key_line = key_text.lines().nth(1).expect("a key body line");
    for (i, (option, b)) in cases.into_iter().enumerate() {
        let err = b.build().await.expect_err("unusable PEM");
        match &err {
            dlock_core::Error::InvalidOption { option: got, .. } => {
                assert_eq!(got, &option, "case {i}: {err}")
            }
            other => panic!("case {i}: expected InvalidOption({option}), got {other:?}"),
        }
        assert!(
            !format!("{err} {err:?}").contains(key_line),
            "case {i}: the key leaked: {err:?}"
        );
    }
    // The checker passes what is usable, with no server listening.
    base()
        .tls_root_certificates(ca)
        .tls_client_identity(cert, key)
        .validate()
        .expect("usable PEM");
    let _ = std::fs::remove_dir_all(&dir);
}

/// etcd checking client certificates (`--client-cert-auth`, the harness's TLS cluster): the
/// identity through `tls_client_identity` is accepted; without one the server's refusal is a
/// non-retryable `AccessDenied` at the first request.
#[test]
fn client_identity_is_presented_and_its_absence_refused_at_once() {
    use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
    let cluster = Cluster::shared_with(
        ServerKind::Etcd,
        1,
        &ServerOptions::default().with_tls(true),
    )
    .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let files = cluster.tls().expect("a TLS cluster");
    let read = |p: &Path| std::fs::read(p).expect("read a certificate file");
    let ca = read(files.ca());
    let (cert, key) = files.client_identity().expect("a client identity");
    let (cert, key) = (read(cert), read(key));
    support::runtime().block_on(async {
        let ns = support::namespace("tls-identity");
        let name = LockName::new("secure").expect("valid");
        let locker = support::builder(cluster.endpoints(), &ns)
            .tls_root_certificates(ca.clone())
            .tls_client_identity(cert, key)
            .build()
            .await
            .expect("TLS locker with a client identity");
        let lease = locker
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire with a client certificate");
        lease.release().await.expect("release");

        let started = std::time::Instant::now();
        let anonymous = support::builder(cluster.endpoints(), &ns)
            .tls_root_certificates(ca)
            .build()
            .await
            .expect("lazy connect");
        let err = anonymous
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(10)))
            .await
            .expect_err("no client certificate");
        assert!(!err.is_retryable(), "retryable: {err}");
        assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
        assert!(err.to_string().contains("tls_client_identity"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "took {:?}: {err}",
            started.elapsed()
        );
    });
}
