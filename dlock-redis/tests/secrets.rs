//! Secrets never show: the password in a Redis URL (`redis://user:PASSWORD@host`), the
//! sentinel and master passwords, appear neither in the `Debug` output of builders, lockers
//! and errors (a wrong password against a real server included), nor in anything traced at
//! TRACE level while a locker logged in as an ACL user acquires and releases on a real server.
//!
//! Every check goes through [`Secrets::leaks`]; `the_detector_finds_each_form` shows that it
//! finds each form a password could take (its text, its bytes as `Debug` prints them, the
//! URL that carries it) and nothing else. Only crates that trace through `tracing` are
//! captured (redis-rs itself does not log through it).

mod support;

use std::time::Duration;

use dlock_conformance::kit::{Secrets, captured};
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker, RwLocker, Semaphore};
use dlock_redis::{RedisLocker, RedlockLocker};
use support::acl::{FAMILY_RULES, RULES, acl_rules};

/// The ACL user's password: distinctive, so that any occurrence is a leak.
const PASSWORD: &str = "Pw-redis-8Rt3-secret-Kx5N";
const SENTINEL_PASSWORD: &str = "Sentinel-redis-2Jd7-secret-Wq4C";
const MASTER_PASSWORD: &str = "Master-redis-6Hn1-secret-Ub8E";
const USER: &str = "dlock-secrets";

fn secrets() -> Secrets {
    Secrets::new()
        .password("password", PASSWORD)
        .password("sentinel password", SENTINEL_PASSWORD)
        .password("master password", MASTER_PASSWORD)
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

/// `l`'s acquire of `x`, refused for `why` as `AccessDenied`, not retryable: the error.
async fn denied(l: &RedisLocker, why: &str) -> dlock_core::Error {
    let err = l
        .acquire(&name("x"), AcquireOptions::wait(Duration::from_secs(2)))
        .await
        .expect_err(why);
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
    assert!(!err.is_retryable(), "{err}");
    err
}

/// The shared node and an ACL user [`USER`] with the README's rules under `ns` (password
/// [`PASSWORD`]); returns the node's address and the user, held until the guard drops.
async fn acl_user(ns: &str) -> (std::net::SocketAddr, tokio::sync::MutexGuard<'static, ()>) {
    // One user on one shared server: a test that resets it while another still uses it
    // takes that one's key pattern away (CI rehearsal r37: NOPERM). Hold it for the test.
    static IN_USE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let guard = IN_USE.lock().await;
    let cluster = Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let url = cluster.endpoints().remove(0);
    let mut conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(USER).arg("reset");
    for r in acl_rules(PASSWORD, &format!("{ns}/"), &[RULES, FAMILY_RULES]) {
        cmd.arg(r);
    }
    let _: () = cmd.query_async(&mut conn).await.expect("ACL SETUSER");
    (cluster.addrs()[0], guard)
}

#[test]
fn the_detector_finds_each_form() {
    let s = secrets();
    let url = format!("redis://{USER}:{PASSWORD}@127.0.0.1:6379");
    assert_eq!(s.leaks(&url), ["password"]);
    assert_eq!(s.leaks(&format!("{url:?}")), ["password"]);
    let bytes = format!("{:?}", SENTINEL_PASSWORD.as_bytes().to_vec());
    assert_eq!(s.leaks(&bytes), ["sentinel password (bytes)"]);
    // redis-rs redacts the password in its client's `Debug` (what a locker's connection
    // shows), and the detector agrees.
    let client = redis::Client::open(url.as_str()).expect("url");
    assert!(s.leaks(&format!("{client:?}")).is_empty(), "{client:?}");
    assert!(
        s.leaks("redis://dlock-secrets:***@127.0.0.1:6379")
            .is_empty()
    );
}

/// The builders' `Debug` (`{:?}` and `{:#?}`) hides the password in a URL (also one holding a
/// character that starts a URL's query or fragment, `?` or `#`: neither part shows), the
/// sentinel and master passwords, and the passwords in Redlock's node URLs. Every case is
/// checked before the verdict, so that a failure lists them all.
#[test]
fn builder_debug_hides_passwords() {
    let (head, tail) = ("Qm-redis-4Lv7", "secret-Hs2P");
    let s = secrets()
        .password("password head", head)
        .password("password tail", tail);
    let shown = |b: &dyn std::fmt::Debug| [format!("{b:?}"), format!("{b:#?}")];
    let mut cases = vec![
        (
            "URL",
            shown(&RedisLocker::builder().url(format!("redis://{USER}:{PASSWORD}@127.0.0.1:6379"))),
        ),
        (
            "sentinels",
            shown(
                &RedisLocker::builder()
                    .sentinels(["127.0.0.1:26379"], "mymaster")
                    .sentinel_password(SENTINEL_PASSWORD)
                    .master_username(USER)
                    .master_password(MASTER_PASSWORD),
            ),
        ),
        (
            "Redlock nodes",
            shown(&RedlockLocker::builder().nodes([
                format!("redis://{USER}:{PASSWORD}@127.0.0.1:6379"),
                format!("redis://:{PASSWORD}@127.0.0.1:6380"),
                format!("redis://{USER}:{PASSWORD}@127.0.0.1:6381"),
            ])),
        ),
    ];
    for delim in ['?', '#'] {
        let url = format!("redis://{USER}:{head}{delim}{tail}@127.0.0.1:6379/0");
        let nodes = [url.clone(), "redis://127.0.0.1:6380".into()];
        cases.push(("URL with ? or #", shown(&RedisLocker::builder().url(url))));
        cases.push((
            "Redlock URL with ? or #",
            shown(&RedlockLocker::builder().nodes(nodes)),
        ));
    }
    let mut leaks = Vec::new();
    for (case, texts) in &cases {
        for text in texts {
            let found = s.leaks(text);
            if !found.is_empty() {
                leaks.push(format!("{case}: {found:?} in {text}"));
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "a builder's Debug shows secrets:\n{}",
        leaks.join("\n")
    );
}

/// Lockers' `Debug`, and the errors of a malformed URL carrying a password, of a wrong
/// password and of a missing permission against a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockers_and_errors_hide_passwords() {
    let s = secrets().password("wrong password", "Wrong-redis-5Pz9-secret-Gc2Y");
    let ns = "dlock-test/secrets/errors";
    let (addr, _user) = acl_user(ns).await;

    // Malformed URLs that carry the password.
    for url in [
        format!("redis://{USER}:{PASSWORD}@127.0.0.1:notaport"),
        format!("redis://{USER}:{PASSWORD}@[::1"),
        format!("redis://{USER}:{PASSWORD}@127.0.0.1:6379/notadb"),
    ] {
        let err = RedisLocker::builder()
            .url(url.clone())
            .build()
            .await
            .expect_err("a malformed URL");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        s.assert_hidden("a URL error", &format!("{err}\n{err:?}"));
        let err = RedlockLocker::builder()
            .nodes([url.clone(), url.clone(), url])
            .build()
            .await
            .expect_err("a malformed URL");
        s.assert_hidden("a Redlock URL error", &format!("{err}\n{err:?}"));
    }

    let wrong = RedisLocker::builder()
        .url(format!(
            "redis://{USER}:Wrong-redis-5Pz9-secret-Gc2Y@{addr}"
        ))
        .ttl(Duration::from_secs(2))
        .namespace(ns)
        .build()
        .await
        .expect("builds");
    s.assert_hidden("a RedisLocker's Debug", &format!("{wrong:?}"));
    let err = denied(&wrong, "a wrong password").await;
    s.assert_error_hidden("a wrong-password error", &err);

    // The right password, a namespace the user's key pattern does not cover.
    let outside = RedisLocker::builder()
        .url(format!("redis://{USER}:{PASSWORD}@{addr}"))
        .ttl(Duration::from_secs(2))
        .namespace("dlock-test/secrets/elsewhere")
        .build()
        .await
        .expect("builds");
    let err = denied(&outside, "no permission").await;
    s.assert_hidden(
        "a permission error",
        &format!("{err}\n{err:?}\n{outside:?}"),
    );

    let redlock = RedlockLocker::builder()
        .nodes([format!("redis://{USER}:{PASSWORD}@{addr}")])
        .ttl(Duration::from_secs(2))
        .namespace(ns)
        .build()
        .await
        .expect("builds");
    s.assert_hidden("a RedlockLocker's Debug", &format!("{redlock:?}"));
}

/// TRACE while a locker logged in as the ACL user acquires, renews and releases a mutex, a
/// read lock and a semaphore permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_do_not_show_the_password() {
    captured();
    let s = secrets();
    let ns = "dlock-test/secrets/trace";
    let (addr, _user) = acl_user(ns).await;
    let locker = RedisLocker::builder()
        .url(format!("redis://{USER}:{PASSWORD}@{addr}"))
        .ttl(Duration::from_secs(1))
        .namespace(ns)
        .build()
        .await
        .expect("builds");
    let wait = AcquireOptions::wait(Duration::from_secs(5));
    let lease = locker.acquire(&name("m"), wait).await.expect("acquire");
    let read = locker.read(&name("rw"), wait).await.expect("read lock");
    let permit = locker
        .acquire_permit(&name("sem"), 2, wait)
        .await
        .expect("permit");
    // A few renewal rounds.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    lease.check().expect("renewed");
    lease.release().await.expect("release");
    read.release().await.expect("release");
    permit.release().await.expect("release");
    let text = captured();
    assert!(
        text.contains("dlock_"),
        "the capture saw nothing of dlock ({} bytes):\n{text}",
        text.len()
    );
    s.assert_hidden("the TRACE output", &text);
}
