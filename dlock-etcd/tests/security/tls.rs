//! TLS through the builder (cargo feature `tls`), against the harness's etcd that serves https
//! and checks client certificates (`support::tls_etcd`). Certificates the client cannot trust
//! (another CA, another host name, no CA) and a missing client certificate fail the first
//! request at once with an error that is not retryable; PEM that cannot be parsed fails
//! `build` before any I/O, naming the option. (`tls_root_certificates` with
//! `tls_client_identity` serving locks is the `etcd-tls` row.)
//!
//! Needs `openssl` (to make the certificates) and `etcd`.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};
use dlock_etcd::EtcdLocker;
use dlock_etcd::etcd_client::{Certificate, Identity, TlsOptions};

use crate::support;

/// A CA that signed nothing the server presents: (certificate, key), PEM, made once.
fn other_ca() -> &'static (Vec<u8>, Vec<u8>) {
    static CA: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    CA.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dlock-etcd-other-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let out = Command::new("openssl")
            .current_dir(&dir)
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes"])
            .args(["-keyout", "ca.key", "-out", "ca.pem", "-days", "1"])
            .args(["-subj", "/CN=dlock-other-ca"])
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let read = |f: &str| std::fs::read(dir.join(f)).expect("read");
        let made = (read("ca.pem"), read("ca.key"));
        let _ = std::fs::remove_dir_all(&dir);
        made
    })
}

/// A builder for the TLS etcd presenting its client identity, trusting nothing yet.
fn with_identity(tls: &support::TlsEtcd, ns: &str) -> dlock_etcd::EtcdLockerBuilder {
    support::builder(tls.cluster.endpoints(), ns)
        .tls_client_identity(tls.cert.clone(), tls.key.clone())
}

/// `EtcdLockerBuilder::tls` (etcd-client's own options: CA, domain name, identity) reaches
/// etcd (renewal over TLS is the `etcd-tls` row's `renewal`); without any CA the server is not
/// trusted.
#[test]
fn tls_options_reach_etcd() {
    support::in_namespace(support::tls_etcd(), "tls", |tls, ns| async move {
        let name = support::name("secure");
        let locker = support::builder(tls.cluster.endpoints(), &ns)
            .tls(
                TlsOptions::new()
                    .ca_certificate(Certificate::from_pem(&tls.ca))
                    .domain_name("localhost")
                    .identity(Identity::from_pem(&tls.cert, &tls.key)),
            )
            .build()
            .await
            .expect("TLS locker");
        let lease = support::hold(&locker, &name).await;
        lease.release().await.expect("release over TLS");

        // Without our CA the server's certificate is not trusted: no lock, a clear error.
        let untrusted = EtcdLocker::builder()
            .endpoints(tls.cluster.endpoints())
            .prefix(ns.clone())
            .request_timeout(Duration::from_secs(1))
            .build()
            .await;
        assert_refused_at_once(untrusted, &name, "no CA").await;
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

/// Another CA, and the right CA for another host name (the certificate names 127.0.0.1 and
/// localhost only): refused at once, not retryable.
#[test]
fn a_wrong_ca_or_host_name_fails_at_once_and_is_not_retryable() {
    support::in_namespace(support::tls_etcd(), "tls-wrong", |tls, ns| async move {
        let name = support::name("secure");
        let built = with_identity(&tls, &ns)
            .tls_root_certificates(other_ca().0.clone())
            .build()
            .await;
        assert_refused_at_once(built, &name, "wrong CA").await;
        let built = with_identity(&tls, &ns)
            .tls(TlsOptions::new().domain_name("not-the-server.invalid"))
            .tls_root_certificates(tls.ca.clone())
            .build()
            .await;
        assert_refused_at_once(built, &name, "wrong host name").await;
    });
}

/// PEM that cannot be used fails `build` before any I/O (nothing listens on port 1), with
/// the option named and the key not quoted.
#[tokio::test]
async fn unusable_pem_is_rejected_before_io() {
    let support::TlsEtcd { ca, cert, key, .. } = support::tls_etcd();
    let other_key = other_ca().1.clone();
    let garbage_body =
        b"-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n";
    let base = || {
        EtcdLocker::builder()
            .endpoints(["https://127.0.0.1:1"])
            .request_timeout(Duration::from_secs(1))
    };
    let roots = |pem: &[u8]| {
        (
            "tls_root_certificates",
            base().tls_root_certificates(pem.to_vec()),
        )
    };
    let identity = |c: &[u8], k: &[u8]| {
        (
            "tls_client_identity",
            base().tls_client_identity(c.to_vec(), k.to_vec()),
        )
    };
    let cases = [
        roots(b"hello"),
        roots(garbage_body),
        roots(&key),
        identity(b"x", &key),
        identity(&cert, b"x"),
        identity(&key, &cert),
        identity(&cert, garbage_body),
        // A key of another certificate.
        identity(&cert, &other_key),
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
}

/// The identity through `tls_client_identity` is accepted; without one the server's refusal
/// is a non-retryable `AccessDenied` at the first request, naming the option.
#[test]
fn client_identity_is_presented_and_its_absence_refused_at_once() {
    support::in_namespace(support::tls_etcd(), "tls-identity", |tls, ns| async move {
        let name = support::name("secure");
        let locker = with_identity(&tls, &ns)
            .tls_root_certificates(tls.ca.clone())
            .build()
            .await
            .expect("TLS locker with a client identity");
        let lease = support::hold(&locker, &name).await;
        lease.release().await.expect("release");

        let started = std::time::Instant::now();
        let anonymous = support::builder(tls.cluster.endpoints(), &ns)
            .tls_root_certificates(tls.ca.clone())
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
