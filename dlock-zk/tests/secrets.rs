//! Secrets never show: the digest password and the TLS client key appear in no `Debug` output
//! (builder, locker, errors) and in no log line of a session (every `tracing` event at TRACE,
//! of this crate and of the client crate, written to a buffer) while lockers authenticate with
//! digest over TLS (and over plain TCP) against real servers, acquire, release, and fail (a
//! refused ACL, a wrong CA, a bad key, a wait that times out).
//!
//! The check itself is shown to find each secret in text that holds it
//! ([`the_check_finds_every_form_of_a_secret`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use dlock_conformance::kit::{Secrets, captured, hex};
use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};
use dlock_zk::{ZkAcl, ZkLocker, ZkLockerBuilder};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use support::backend::tls_pem;

const USER: &str = "secret-test-user";
const PASSWORD: &str = "pw-Xq7-never-print-me";
const OTHER_USER: &str = "secret-test-intruder";
const OTHER_PASSWORD: &str = "pw-Zr9-also-never-printed";

#[test]
fn the_check_finds_every_form_of_a_secret() {
    let Some(c) = support::shared_tls() else {
        return;
    };
    let (_, identity) = tls_pem(&c.tls().unwrap());
    let (_, key) = identity.unwrap();
    let secrets = Secrets::new()
        .password("the password", PASSWORD)
        .pem_key("the key", &key);
    let pem = String::from_utf8(key.clone()).unwrap();
    let der = PrivateKeyDer::from_pem_slice(&key).unwrap();
    let der = der.secret_der().to_vec();
    for (what, text) in [
        ("the password", format!("auth user:{PASSWORD} sent")),
        ("the password", format!("{:?}", PASSWORD.as_bytes())),
        ("the password", format!("0x{}", hex(PASSWORD.as_bytes()))),
        ("the key", format!("key = {pem}")),
        ("the key", format!("PrivateKey {{ der: {der:?} }}")),
        ("the key", format!("der={}", hex(&der))),
    ] {
        let caught = std::panic::catch_unwind(|| secrets.assert_hidden("a test string", &text));
        assert!(caught.is_err(), "{what} not found in {text:?}");
    }
    secrets.assert_hidden("a clean string", "ZooKeeper session opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_debug_output_errors_or_logs() {
    captured();
    let Some(c) = support::shared_tls() else {
        return;
    };
    let files = c.tls().unwrap();
    let (ca, identity) = tls_pem(&files);
    let (cert, key) = identity.unwrap();
    let secrets = Secrets::new()
        .password("the digest password", PASSWORD)
        .password("the second digest password", OTHER_PASSWORD)
        .pem_key("the TLS client key", &key);
    let connect = c.endpoints().join(",");
    let ns = support::namespace("secrets");
    let builder = |user: &str, password: &str| -> ZkLockerBuilder {
        ZkLocker::builder()
            .connect_string(connect.clone())
            .ttl(Duration::from_secs(4))
            .namespace(ns.clone())
            .digest_auth(user, password)
            .acl(ZkAcl::CreatorAll)
            .tls_root_certificates(ca.clone())
            .tls_client_identity(cert.clone(), key.clone())
    };
    let mut shown = Vec::new();

    let b = builder(USER, PASSWORD);
    shown.push(("the builder's Debug", format!("{b:?}")));
    let locker = b.build().await.expect("build");
    shown.push(("the locker's Debug", format!("{locker:?}")));
    let name = LockName::new("secret").unwrap();
    let lease = locker
        .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("acquire");
    shown.push(("the lease's Debug", format!("{lease:?}")));

    // Another digest identity with the same client certificate: ZooKeeper expands
    // `CreatorAll` to every identity of the creating session, the certificate's `x509` one
    // too, so it may queue; its wait times out behind the holder.
    let second = builder(OTHER_USER, OTHER_PASSWORD)
        .build()
        .await
        .expect("build");
    let waited = second
        .acquire(&name, AcquireOptions::wait(Duration::from_millis(500)))
        .await
        .expect_err("the lock is held");
    shown.push(("a timed-out acquire's Debug", format!("{waited:?}")));
    shown.push(("the second locker's Debug", format!("{second:?}")));
    drop(second);

    // Without TLS only the digest identity counts: another identity is refused.
    if let Some(plain) = support::shared(1) {
        let plain_builder = |user: &str, password: &str| {
            ZkLocker::builder()
                .connect_string(plain.endpoints().join(","))
                .ttl(Duration::from_secs(4))
                .namespace(ns.clone())
                .digest_auth(user, password)
                .acl(ZkAcl::CreatorAll)
        };
        let owner = plain_builder(USER, PASSWORD).build().await.expect("build");
        let held = owner
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire");
        let intruder = plain_builder(OTHER_USER, OTHER_PASSWORD)
            .build()
            .await
            .expect("build");
        let refused = intruder
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(2)))
            .await
            .expect_err("the lock parent is the owner's alone");
        assert_eq!(refused.kind(), ErrorKind::AccessDenied, "{refused}");
        shown.push(("a refused acquire's Display", refused.to_string()));
        shown.push(("a refused acquire's Debug", format!("{refused:?}")));
        shown.push(("the intruder's Debug", format!("{intruder:?}")));
        held.release().await.expect("release");
    }
    lease.release().await.expect("release");
    drop(locker);

    // A wrong CA: the error explains the handshake.
    let wrong = builder(USER, PASSWORD)
        .tls_root_certificates(cert.clone())
        .build()
        .await
        .expect_err("a client certificate is no CA of the server's");
    shown.push(("a handshake error's Display", wrong.to_string()));
    shown.push(("a handshake error's Debug", format!("{wrong:?}")));

    // A key that is no key: the option error.
    let mut broken = key.clone();
    broken.truncate(broken.len() / 2);
    let bad = builder(USER, PASSWORD)
        .tls_client_identity(cert.clone(), broken)
        .build()
        .await
        .expect_err("half a key");
    shown.push(("an option error's Display", bad.to_string()));
    shown.push(("an option error's Debug", format!("{bad:?}")));

    // Background work (deletes, watchers) logs a little later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = captured();
    assert!(
        log.contains("ZooKeeper session opened") && log.contains("TRACE"),
        "the capture must hold the sessions' TRACE logs:\n{log}"
    );
    shown.push(("the TRACE log", log));
    for (place, text) in &shown {
        secrets.assert_hidden(place, text);
    }
}
