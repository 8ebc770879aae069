//! TLS against a real TLS-only ZooKeeper (`secureClientPort`, Netty, client certificates
//! required), started by the harness: locking works with the CA and the client identity; a
//! wrong CA, a wrong host name or a missing client certificate fails the build at once with a
//! clear, non-retryable error (the client crate alone would retry the handshake until the
//! session timeout and then say only "timeout"); bad PEM is refused before any I/O.
//!
//! Every test here first installs the `aws-lc-rs` crypto provider as the process default, as
//! an application may: the locker must keep it (and not panic). The other test binaries
//! install none, so the locker installs `ring` there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dlock_conformance::servers::{Cluster, TlsFiles};
use dlock_core::{AcquireOptions, Error, ErrorKind, LockName, Locker};
use dlock_zk::{ZkLocker, ZkLockerBuilder};

/// The TTL of these lockers: a refused handshake must fail well within it.
const TTL: Duration = Duration::from_secs(6);

/// The application's own provider, installed before anything else in this process.
fn app_provider() -> &'static Arc<rustls::crypto::CryptoProvider> {
    static P: OnceLock<&'static Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        rustls::crypto::CryptoProvider::get_default().expect("a provider is installed")
    })
}

/// The shared TLS-only ZooKeeper of this process (client certificates required), or `None`
/// (printed) when ZooKeeper is not installed outside CI.
fn server() -> Option<Arc<Cluster>> {
    app_provider();
    support::shared_tls()
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// A builder for `connect` trusting the cluster's CA and presenting its client identity.
fn builder(files: &TlsFiles, connect: &str, ns: &str) -> ZkLockerBuilder {
    let (cert, key) = files.client_identity().expect("a client identity");
    ZkLocker::builder()
        .connect_string(connect)
        .ttl(TTL)
        .namespace(ns)
        .tls_root_certificates(read(files.ca()))
        .tls_client_identity(read(cert), read(key))
}

/// Builds, and checks the failure came quickly and is not retryable.
async fn fails_fast(b: ZkLockerBuilder) -> Error {
    let began = Instant::now();
    let result = tokio::time::timeout(TTL * 2, b.build()).await;
    let elapsed = began.elapsed();
    let err = match result {
        Err(_) => panic!("the build hung for {:?}", TTL * 2),
        Ok(Ok(_)) => panic!("the build succeeded"),
        Ok(Err(e)) => e,
    };
    assert!(
        elapsed < TTL / 2,
        "the refusal took {elapsed:?} (the client's own retries run until the {TTL:?} session timeout): {err}"
    );
    assert!(!err.is_retryable(), "retryable: {err:?}");
    // The provider the application installed is still the process default.
    let now = rustls::crypto::CryptoProvider::get_default().expect("a provider");
    assert!(
        Arc::ptr_eq(now, app_provider()),
        "the default provider changed"
    );
    err
}

/// A CA of its own (not the servers'), made with `openssl` in a temp dir.
fn other_ca() -> Vec<u8> {
    let dir = tempfile_dir("other-ca");
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=another CA",
        ])
        .current_dir(&dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pem = read(&dir.join("ca.crt"));
    let _ = std::fs::remove_dir_all(&dir);
    pem
}

fn tempfile_dir(what: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("dlock-zk-tls-{what}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The server's address as `host:port` (the endpoint without `tcp+tls://`).
fn addr(c: &Cluster) -> std::net::SocketAddr {
    c.addrs()[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_with_a_client_certificate() {
    let Some(c) = server() else { return };
    let files = c.tls().expect("a TLS cluster");
    let ns = support::namespace("tls-lock");
    // The endpoint is written `tcp+tls://`; a bare `host:port` is TLS too once roots are set.
    for connect in [c.endpoints()[0].clone(), addr(&c).to_string()] {
        let a = builder(&files, &connect, &ns).build().await.expect("build");
        let b = builder(&files, &connect, &ns).build().await.expect("build");
        let name = LockName::new("tls").unwrap();
        let lease = a
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire over TLS");
        let busy = b.try_acquire(&name).await.expect("try_acquire");
        assert!(busy.is_none(), "a second holder over TLS");
        lease.release().await.expect("release");
        let again = b
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire after release");
        again.release().await.expect("release");
    }
    let now = rustls::crypto::CryptoProvider::get_default().expect("a provider");
    assert!(
        Arc::ptr_eq(now, app_provider()),
        "the default provider changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_a_clear_non_retryable_error() {
    let Some(c) = server() else { return };
    let files = c.tls().expect("a TLS cluster");
    let (cert, key) = files.client_identity().unwrap();
    let b = ZkLocker::builder()
        .connect_string(c.endpoints()[0].clone())
        .ttl(TTL)
        .tls_root_certificates(other_ca())
        .tls_client_identity(read(cert), read(key));
    let err = fails_fast(b).await;
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    let text = err.to_string();
    assert!(text.contains("UnknownIssuer"), "{text}");
    assert!(text.contains("tls_root_certificates"), "{text}");
}

/// A name the server's certificate does not carry: the server is reached as `127.0.0.2`
/// (any 127/8 address is loopback on Linux) through a plain TCP forwarder; its certificate
/// names 127.0.0.1 and localhost only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_host_name_is_a_clear_non_retryable_error() {
    let Some(c) = server() else { return };
    let files = c.tls().expect("a TLS cluster");
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2");
    let other = listener.local_addr().unwrap();
    let target = addr(&c);
    let forward = tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    // The same server through the forwarder, named as in its certificate, works: the
    // refusal below is the name's.
    let ok = builder(&files, &format!("localhost:{}", target.port()), "tls-name")
        .build()
        .await;
    assert!(ok.is_ok(), "by a name in the certificate: {:?}", ok.err());
    let err = fails_fast(builder(&files, &other.to_string(), "tls-name")).await;
    forward.abort();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("NotValidForName"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_certificate_is_refused_clearly() {
    let Some(c) = server() else { return };
    let files = c.tls().expect("a TLS cluster");
    let b = ZkLocker::builder()
        .connect_string(c.endpoints()[0].clone())
        .ttl(TTL)
        .tls_root_certificates(read(files.ca()));
    let err = fails_fast(b).await;
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
    assert!(err.to_string().contains("client certificate"), "{err}");
}

/// A plain locker on the TLS port is not refused over certificates (it speaks no TLS): it
/// keeps the client's own behaviour, an `Unavailable` error after about the session timeout.
/// Here only that it ends, and retryably.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_on_the_tls_port_ends() {
    let Some(c) = server() else { return };
    let b = ZkLocker::builder()
        .connect_string(addr(&c).to_string())
        .ttl(Duration::from_secs(1));
    let err = tokio::time::timeout(Duration::from_secs(20), b.build())
        .await
        .expect("a plain connect to a TLS port hung")
        .expect_err("a plain session on a TLS port");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

#[tokio::test]
async fn bad_tls_options_are_refused_before_any_io() {
    let option = |b: ZkLockerBuilder| async move {
        // Port 1: nothing listens; a build that got that far would say Unavailable.
        match b.build().await {
            Err(Error::InvalidOption { option, .. }) => option,
            other => panic!("expected InvalidOption, got {:?}", other.map(|_| ())),
        }
    };
    let b = || ZkLocker::builder().connect_string("127.0.0.1:1").ttl(TTL);
    assert_eq!(
        option(b().tls_root_certificates(b"not pem".to_vec())).await,
        "tls_root_certificates"
    );
    assert_eq!(
        option(b().tls_root_certificates(Vec::new())).await,
        "tls_root_certificates"
    );
    let ca = other_ca();
    assert_eq!(
        option(b().tls_client_identity(ca.clone(), b"no key".to_vec())).await,
        "tls_client_identity",
        "an identity without roots"
    );
    assert_eq!(
        option(
            b().tls_root_certificates(ca.clone())
                .tls_client_identity(ca.clone(), b"no key".to_vec())
        )
        .await,
        "tls_client_identity"
    );
    assert_eq!(
        option(
            b().tls_root_certificates(ca.clone())
                .tls_client_identity(b"no cert".to_vec(), b"no key".to_vec())
        )
        .await,
        "tls_client_identity"
    );
    assert_eq!(
        option(ZkLocker::builder().connect_string("tcp+tls://127.0.0.1:1")).await,
        "connect",
        "tcp+tls:// without roots"
    );
    // A key of another certificate.
    if let Some(c) = server() {
        let files = c.tls().unwrap();
        let (cert, _) = files.client_identity().unwrap();
        let (_, server_key) = files.server_identity().unwrap();
        assert_eq!(
            option(
                b().tls_root_certificates(ca)
                    .tls_client_identity(read(cert), read(server_key))
            )
            .await,
            "tls_client_identity",
            "a key that is not the certificate's"
        );
    }
}
