//! Secrets never show: the password given to `EtcdLockerBuilder::user` and the private key
//! given to `tls_client_identity` (or `tls`) appear neither in the `Debug` output of builders,
//! lockers and errors (a wrong password against a real server with authentication included),
//! nor in anything traced at TRACE level, by dlock or by the crates under it, while lockers
//! connect, acquire, refresh their auth token and release against real servers (etcd with
//! authentication on; etcd checking client certificates).
//!
//! Every check goes through [`Secrets::leaks`]; `the_detector_finds_each_form` shows that it
//! finds the forms etcd-client's own `Debug` output prints them in (the text, a key's bytes)
//! and a line of a PEM key; the kit's unit test shows the password's other forms.

use crate::support::{self, name};

use std::time::Duration;

use crate::backend::AuthUsers;
use dlock_conformance::kit::{Secrets, captured};
use dlock_conformance::servers::Cluster;
use dlock_core::{AcquireOptions, Error, ErrorKind, Locker};
use dlock_etcd::EtcdLocker;
use dlock_etcd::etcd_client::{ConnectOptions, Identity, TlsOptions};

/// The locker user's password: distinctive, so that any occurrence is a leak.
const PASSWORD: &str = "Pw-etcd-7Qx2-secret-Lm9Z";
/// root's password (only the set-up uses it).
const ROOT_PASSWORD: &str = "Root-etcd-4Hk8-secret-Tz3W";
const USER: &str = "dlock-secrets";

/// An etcd with authentication on and the user [`USER`] (password [`PASSWORD`]) whose role
/// may read and write `dlock-test/`, issuing auth tokens that expire after 2 s unused.
fn auth_server() -> Cluster {
    crate::auth_etcd(&AuthUsers {
        user: USER.into(),
        password: PASSWORD.into(),
        root_password: ROOT_PASSWORD.into(),
    })
}

/// The secrets to look for: [`PASSWORD`] and the PEM key `key`.
fn password_and_key(key: &[u8]) -> Secrets {
    Secrets::new()
        .password("password", PASSWORD)
        .pem_key("key", key)
}

/// A locker of [`USER`] logged in to `server` with `password`, under `ns`.
async fn logged_in(server: &Cluster, ns: &str, password: &str) -> Result<EtcdLocker, Error> {
    support::builder(server.endpoints(), ns)
        .user(USER, password)
        .build()
        .await
}

/// A client identity of a test CA, made with openssl: (certificate, key) PEM.
fn identity_files() -> (Vec<u8>, Vec<u8>) {
    let tls = support::tls_etcd();
    (tls.cert, tls.key)
}

/// The detector finds the password and the key in etcd-client's own `Debug` output (which
/// prints them), and a line of the PEM key; not the certificate. (A password's other forms,
/// and nothing in a string without it, are the kit's own unit test.)
#[test]
fn the_detector_finds_each_form() {
    let (cert, key) = identity_files();
    let secrets = password_and_key(&key);
    let options = format!("{:?}", ConnectOptions::new().with_user(USER, PASSWORD));
    assert!(secrets.leaks(&options).contains(&"password"), "{options}");
    let identity = format!("{:?}", Identity::from_pem(&cert, &key));
    assert!(
        secrets.leaks(&identity).contains(&"key (bytes)"),
        "{identity}"
    );
    let pem = String::from_utf8_lossy(&key).into_owned();
    assert!(secrets.leaks(&pem).contains(&"key (PEM line)"));
    assert!(secrets.leaks(&format!("{:?}", cert)).is_empty());
}

/// The builder's `Debug` (plain and pretty) shows the user but not the password or the key,
/// whichever way the key was given.
#[test]
fn builder_debug_hides_the_password_and_the_key() {
    let (cert, key) = identity_files();
    let secrets = password_and_key(&key);
    let b = EtcdLocker::builder()
        .endpoints(["https://127.0.0.1:2379"])
        .user(USER, PASSWORD)
        .tls_root_certificates(cert.clone())
        .tls_client_identity(cert.clone(), key.clone())
        .tls(TlsOptions::new().identity(Identity::from_pem(&cert, &key)));
    for text in [format!("{b:?}"), format!("{b:#?}")] {
        assert!(
            text.contains(USER),
            "the Debug output shows nothing: {text}"
        );
        secrets.assert_hidden("the builder's Debug", &text);
    }
    // An option error about the identity does not quote the key either.
    let bad = EtcdLocker::builder()
        .endpoints(["https://127.0.0.1:1"])
        .tls_client_identity(key.clone(), key.clone())
        .validate()
        .expect_err("a key is not a certificate");
    secrets.assert_hidden("an identity error", &format!("{bad} {bad:?}"));
}

/// A wrong password against a real server: a non-retryable `AccessDenied` whose text
/// (Display, Debug, source chain) names neither the wrong password nor the right one; a user
/// without permission for the prefix gets an error without the password; a locker without
/// credentials is refused.
#[test]
fn errors_do_not_show_passwords() {
    let server = auth_server();
    let wrong = "Wrong-etcd-3Vb6-secret-Qa1P";
    let secrets = Secrets::new()
        .password("password", PASSWORD)
        .password("wrong password", wrong)
        .password("root password", ROOT_PASSWORD);
    support::runtime().block_on(async {
        let ns = support::namespace("secrets");
        let err = logged_in(&server, &ns, wrong)
            .await
            .expect_err("a wrong password");
        assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
        assert!(!err.is_retryable(), "{err}");
        secrets.assert_error_hidden("a wrong-password error", &err);

        // Outside the role's prefix: refused by permission, after a successful login.
        let outside = logged_in(&server, "elsewhere/secrets", PASSWORD)
            .await
            .expect("the right password logs in");
        let err = outside
            .acquire(&name("x"), AcquireOptions::wait(Duration::from_secs(2)))
            .await
            .expect_err("no permission outside dlock-test/");
        assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
        secrets.assert_hidden(
            "a permission error",
            &format!("{err}\n{err:?}\n{outside:?}"),
        );

        // Without credentials: refused as well.
        let anonymous = support::locker(&server, &ns).await;
        let err = anonymous
            .acquire(&name("x"), AcquireOptions::wait(Duration::from_secs(2)))
            .await
            .expect_err("anonymous access must be refused");
        assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
    });
}

/// TRACE from every crate while lockers log in, acquire, have their token expire and
/// refreshed, and release (etcd with authentication), and while a locker with a client
/// identity does the same over TLS: neither the password nor the key shows.
#[test]
fn traces_do_not_show_the_password_or_the_key() {
    captured();
    let server = auth_server();
    let support::TlsEtcd {
        cluster: tls_cluster,
        ca,
        cert,
        key,
    } = support::tls_etcd();
    let secrets = password_and_key(&key);
    support::runtime().block_on(async {
        let ns = support::namespace("secrets-trace");
        let locker = logged_in(&server, &ns, PASSWORD).await.expect("log in");
        let lease = locker
            .acquire(&name("a"), AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire");
        // The 2 s token expires unused (keep-alives do not use it): the next requests
        // refresh it, logging in again with the password.
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let second = locker
            .acquire(&name("b"), AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire after the token expired");
        lease.release().await.expect("release");
        second.release().await.expect("release");
        secrets.assert_hidden("the locker's Debug", &format!("{locker:?}"));

        let tls = support::builder(tls_cluster.endpoints(), &ns)
            .tls_root_certificates(ca)
            .tls_client_identity(cert, key.clone())
            .build()
            .await
            .expect("TLS locker");
        let lease = tls
            .acquire(&name("c"), AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire over TLS");
        lease.release().await.expect("release over TLS");
    });
    let text = captured();
    // The capture saw the work: dlock's events, the refresh, and the HTTP/2 layer's TRACE.
    for expected in ["dlock_etcd", "auth token refreshed", "TRACE h2"] {
        assert!(
            text.contains(expected),
            "the capture lacks {expected:?} ({} bytes captured)",
            text.len()
        );
    }
    secrets.assert_hidden("the TRACE output", &text);
}
