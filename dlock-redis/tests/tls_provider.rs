//! An application that installed its own rustls crypto provider keeps it, and TLS works: the
//! locker installs `ring` only when the process has none, and neither fails nor panics when
//! one is there (a locker that insisted on installing its own would). Without that step, a
//! binary whose dependencies enable two rustls providers and that installs neither would panic
//! inside rustls on the first TLS connection. Its own test binary: a process installs its
//! provider once. (Not tested here: a binary with a second provider crate enabled; it would add
//! aws-lc-rs, a large C build, to every test build.)

use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_redis::RedisLocker;
use rustls::crypto::CryptoProvider;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_crypto_provider_is_kept() {
    // The application's choice: ring restricted to TLS 1.3 suites.
    let mut mine = rustls::crypto::ring::default_provider();
    mine.cipher_suites
        .retain(|s| s.version() == &rustls::version::TLS13);
    let suites = mine.cipher_suites.len();
    assert!(suites > 0 && suites < rustls::crypto::ring::default_provider().cipher_suites.len());
    mine.install_default().expect("no provider installed yet");

    // A TLS-only server of the harness (its own readiness checks bring their own provider).
    let tls = ServerOptions::default().with_tls(false);
    let cluster = tokio::task::block_in_place(|| Cluster::start_with(ServerKind::Redis, 1, &tls))
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let ca = cluster
        .tls()
        .expect("a TLS cluster")
        .ca_pem()
        .expect("read the CA");
    let l = RedisLocker::builder()
        .url(cluster.endpoints().remove(0))
        .tls_root_certificates(ca)
        .ttl(Duration::from_secs(2))
        .build()
        .await
        .expect("builds");
    let name = LockName::new("tls-provider").expect("valid name");
    let lease = l
        .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("acquire over TLS with the application's provider");
    lease.release().await.expect("release");
    let installed = CryptoProvider::get_default().expect("a provider is installed");
    assert_eq!(
        installed.cipher_suites.len(),
        suites,
        "the locker replaced the application's crypto provider"
    );
}
