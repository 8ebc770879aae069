//! An application that installed its own rustls crypto provider keeps it, and TLS works: the
//! locker installs `ring` only when the process has none, and neither fails nor panics when
//! one is there (a locker that insisted on installing its own would). Without that step, a
//! binary whose dependencies enable two rustls providers and that installs neither would panic
//! inside rustls on the first TLS connection. Its own test binary: a process installs its
//! provider once. (Not tested here: a binary with a second provider crate enabled; it would add
//! aws-lc-rs, a large C build, to every test build.)

use std::time::Duration;

use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_redis::RedisLocker;
use rustls::crypto::CryptoProvider;

#[path = "support/tls_server.rs"]
mod tls_server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_crypto_provider_is_kept() {
    // The application's choice: ring restricted to TLS 1.3 suites.
    let mut mine = rustls::crypto::ring::default_provider();
    mine.cipher_suites
        .retain(|s| s.version() == &rustls::version::TLS13);
    let suites = mine.cipher_suites.len();
    assert!(suites > 0 && suites < rustls::crypto::ring::default_provider().cipher_suites.len());
    mine.install_default().expect("no provider installed yet");

    let server = tokio::task::block_in_place(tls_server::start);
    let ca = std::fs::read(server.dir.join("ca.crt")).expect("read the CA");
    let l = RedisLocker::builder()
        .url(format!("rediss://{}", server.addr))
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
