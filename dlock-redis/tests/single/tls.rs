//! TLS against a real TLS-only `redis-server` of the harness (certificates made by `openssl` when
//! it starts), and a plain one: the handshake refusal classes (locking over TLS is the
//! `redis-tls` row's).

use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};
use dlock_redis::RedisLocker;

use super::{name, shared};

/// A server that requires client certificates (`--tls-auth-clients yes`, the harness' TLS
/// cluster with client authentication): a locker presenting the cluster's client identity
/// locks; one without it, or trusting another CA, fails its first request at once with a
/// non-retryable error naming the option to check, never a wait that runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_when_the_server_requires_them() {
    use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
    let options = ServerOptions::default().with_tls(true);
    let cluster = match Cluster::start_with(ServerKind::Redis, 1, &options) {
        Ok(c) => c,
        Err(e) => dlock_conformance::harness_unavailable(e),
    };
    let files = cluster.tls().expect("a TLS cluster");
    let ca = files.ca_pem().expect("read the CA");
    let (cert, key) = files.client_identity().expect("a client identity");
    let (cert, key) = (
        std::fs::read(cert).expect("read the client certificate"),
        std::fs::read(key).expect("read the client key"),
    );
    let url = cluster.endpoints().remove(0);
    assert!(url.starts_with("rediss://"), "{url}");
    let name = LockName::new("client-cert").expect("valid name");
    let wait = AcquireOptions::wait(Duration::from_secs(5));

    // With the cluster's client identity, one node and Redlock over it lock.
    let redis = RedisLocker::builder()
        .url(&url)
        .tls_root_certificates(ca.clone())
        .tls_client_identity(cert.clone(), key.clone())
        .ttl(Duration::from_secs(2));
    let redlock = dlock_redis::RedlockLocker::builder()
        .nodes([url.clone()])
        .tls_root_certificates(ca.clone())
        .tls_client_identity(cert.clone(), key.clone())
        .ttl(Duration::from_secs(2));
    let lockers: [std::sync::Arc<dyn Locker>; 2] = [
        std::sync::Arc::new(redis.build().await.expect("builds")),
        std::sync::Arc::new(redlock.build().await.expect("builds")),
    ];
    for with_identity in lockers {
        let lease = with_identity
            .acquire(&name, wait)
            .await
            .expect("acquire with a client certificate");
        lease.release().await.expect("release");
    }

    // No identity: the server refuses the connection; our roots do not trust the server (the
    // system's roots only): each fails its first acquire at once, not retryable, naming the
    // option to check.
    let without = RedisLocker::builder().tls_root_certificates(ca.clone());
    let untrusted = RedisLocker::builder().tls_client_identity(cert.clone(), key.clone());
    for (builder, kind, option) in [
        (without, ErrorKind::AccessDenied, "tls_client_identity"),
        (untrusted, ErrorKind::Backend, "tls_root_certificates"),
    ] {
        let l = builder
            .url(&url)
            .ttl(Duration::from_secs(2))
            .build()
            .await
            .expect("builds");
        let began = std::time::Instant::now();
        let e = l.acquire(&name, wait).await.expect_err(option);
        assert_eq!(e.kind(), kind, "{e}");
        assert!(!e.is_retryable(), "{e}");
        assert!(e.to_string().contains(option), "{e}");
        assert!(
            began.elapsed() < Duration::from_secs(4),
            "{:?}: {e}",
            began.elapsed()
        );
    }

    // Bad PEM and a plain URL are refused at build, and the key never shows.
    let bad = RedisLocker::builder()
        .url(&url)
        .tls_client_identity(cert.clone(), b"not a key".to_vec())
        .build()
        .await
        .expect_err("not a PEM key");
    assert_eq!(bad.kind(), ErrorKind::InvalidInput);
    let plain = RedisLocker::builder()
        .url("redis://127.0.0.1:6379")
        .tls_client_identity(cert.clone(), key.clone())
        .build()
        .await
        .expect_err("an identity without rediss://");
    assert_eq!(plain.kind(), ErrorKind::InvalidInput);
    let shown = format!(
        "{:?}",
        RedisLocker::builder().tls_client_identity(cert, key.clone())
    );
    let key_text = String::from_utf8_lossy(&key);
    let key_body = key_text.lines().nth(1).expect("a PEM body line");
    assert!(!shown.contains(key_body), "{shown}");
}

/// `rediss://` URLs are accepted and use TLS; against a server that does not speak TLS the
/// handshake fails with a typed, retryable error (never a panic for a missing crypto provider).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_urls_are_supported() {
    let addr = shared().addrs()[0];
    let l = RedisLocker::builder()
        .url(format!("rediss://{addr}/"))
        .ttl(Duration::from_secs(1))
        .build()
        .await
        .expect("a rediss URL builds");
    let e = l
        .try_acquire(&name("tls"))
        .await
        .expect_err("the server does not speak TLS");
    assert!(
        matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Backend),
        "{e}"
    );
}
