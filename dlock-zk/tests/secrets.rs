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

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};
use dlock_zk::{ZkAcl, ZkLocker, ZkLockerBuilder};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use support::backend::tls_pem;

const USER: &str = "secret-test-user";
const PASSWORD: &str = "pw-Xq7-never-print-me";
const OTHER_USER: &str = "secret-test-intruder";
const OTHER_PASSWORD: &str = "pw-Zr9-also-never-printed";

/// Every log line of the process (TRACE, all targets).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static BUF: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    BUF.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buf);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        buf
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The forms a secret may take in text: itself, its bytes as `Debug` prints a byte slice, and
/// in hex; for a PEM key also each base64 line of its body and windows of its DER bytes.
struct Secret {
    what: &'static str,
    forms: Vec<String>,
}

impl Secret {
    fn text(what: &'static str, s: &str) -> Secret {
        let bytes = s.as_bytes();
        Secret {
            what,
            forms: vec![
                s.to_owned(),
                debug_bytes(bytes),
                hex(bytes),
                // Serialized as a JSON or Rust string with escapes: the password has none.
            ],
        }
    }

    fn key(what: &'static str, pem: &[u8]) -> Secret {
        let text = String::from_utf8(pem.to_vec()).unwrap();
        let mut forms: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 16)
            .map(str::to_owned)
            .collect();
        let der = PrivateKeyDer::from_pem_slice(pem).expect("a PEM key");
        let der = der.secret_der();
        // The private scalar lies past the first few header bytes: windows across the key.
        for start in (8..der.len().saturating_sub(16)).step_by(8) {
            forms.push(debug_bytes(&der[start..start + 16]));
            forms.push(hex(&der[start..start + 16]));
        }
        assert!(forms.len() > 4, "a key with a body");
        Secret { what, forms }
    }

    /// The forms of this secret found in `text`.
    fn found_in(&self, text: &str) -> Vec<String> {
        self.forms
            .iter()
            .filter(|f| text.contains(f.as_str()))
            .cloned()
            .collect()
    }
}

/// `[1, 2, 3]` without the brackets (a window inside a longer slice's `Debug`).
fn debug_bytes(b: &[u8]) -> String {
    let s = format!("{b:?}");
    s[1..s.len() - 1].to_owned()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Panics naming where and which form of a secret `text` holds.
fn assert_clean(secrets: &[Secret], where_: &str, text: &str) {
    for s in secrets {
        let found = s.found_in(text);
        assert!(
            found.is_empty(),
            "{} shows in {where_}: {found:?}\n---\n{text}",
            s.what
        );
    }
}

fn tls_server() -> Option<Arc<Cluster>> {
    match Cluster::shared_with(ServerKind::Zk, 1, &ServerOptions::default().with_tls(true)) {
        Ok(c) => Some(c),
        Err(e) if e.may_skip() => {
            eprintln!("SKIP: {e}");
            None
        }
        Err(e) => panic!("ZooKeeper harness: {e}"),
    }
}

#[test]
fn the_check_finds_every_form_of_a_secret() {
    let Some(c) = tls_server() else { return };
    let (_, identity) = tls_pem(&c.tls().unwrap());
    let (_, key) = identity.unwrap();
    let secrets = [
        Secret::text("the password", PASSWORD),
        Secret::key("the key", &key),
    ];
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
        let caught = std::panic::catch_unwind(|| assert_clean(&secrets, "a test string", &text));
        assert!(caught.is_err(), "{what} not found in {text:?}");
    }
    assert_clean(&secrets, "a clean string", "ZooKeeper session opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_debug_output_errors_or_logs() {
    let buf = logs();
    let Some(c) = tls_server() else { return };
    let files = c.tls().unwrap();
    let (ca, identity) = tls_pem(&files);
    let (cert, key) = identity.unwrap();
    let secrets = [
        Secret::text("the digest password", PASSWORD),
        Secret::text("the second digest password", OTHER_PASSWORD),
        Secret::key("the TLS client key", &key),
    ];
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
    let log = String::from_utf8_lossy(&buf.lock().unwrap()).into_owned();
    assert!(
        log.contains("ZooKeeper session opened") && log.contains("TRACE"),
        "the capture must hold the sessions' TRACE logs:\n{log}"
    );
    shown.push(("the TRACE log", log));
    for (where_, text) in &shown {
        assert_clean(&secrets, where_, text);
    }
}
