//! Authentication and ACL permissions, on a real server: a password in the URL is used and its
//! absence refused (not retryable), and a user with exactly the documented ACL rules can use
//! every path of the lock (wrong passwords and missing permissions are the secrets test's).

use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, Lease, Locker, RwLocker, Semaphore};
use dlock_redis::RedisLocker;

use super::support::acl::{FAMILY_RULES, RULES, WAIT_RULES, acl_rules};
use super::{acquiring, conn, granted, name, queued, shared};

/// Creates (or resets) the ACL user `user` with password `pw` and `rules` for the keys under
/// `ns` on the node at `url`.
async fn acl_user(url: &str, user: &str, ns: &str, rules: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(user).arg("reset");
    for r in acl_rules("pw", &format!("{ns}/"), &[rules]) {
        cmd.arg(r);
    }
    let _: () = cmd
        .query_async(&mut conn(url).await)
        .await
        .expect("ACL SETUSER");
}

/// A locker on `addr` logged in as `user` (password `pw`).
async fn locker(addr: std::net::SocketAddr, user: &str, ns: &str) -> RedisLocker {
    super::locker(
        &format!("redis://{user}:pw@{addr}"),
        ns,
        Duration::from_secs(2),
    )
    .await
}

/// The ACL user `user` with `rules` under `ns` on the shared node, two lockers logged in as
/// it, and the node's URL.
async fn two_lockers(user: &str, ns: &str, rules: &[&str]) -> (String, RedisLocker, RedisLocker) {
    let cluster = shared();
    let (url, addr) = (cluster.endpoints().remove(0), cluster.addrs()[0]);
    acl_user(&url, user, ns, rules).await;
    let a = locker(addr, user, ns).await;
    let b = locker(addr, user, ns).await;
    (url, a, b)
}

/// AUTH credentials in the URL are used; without them the server's refusal is a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_through_the_url() {
    let cluster = super::private(1);
    let addr = cluster.addrs()[0];
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query_async(&mut conn(&cluster.endpoints()[0]).await)
        .await
        .expect("set a password");
    let good = super::locker(
        &format!("redis://:s3cret@{addr}"),
        "dlock-test/acl/auth",
        Duration::from_secs(1),
    )
    .await;
    let lease = granted(
        &good,
        &name("auth"),
        Duration::from_secs(1),
        "acquire with AUTH",
    )
    .await;
    lease.release().await.expect("release");
    let bad = super::locker(
        &format!("redis://{addr}"),
        "dlock-test/acl/auth",
        Duration::from_secs(1),
    )
    .await;
    let e = bad
        .try_acquire(&name("auth"))
        .await
        .expect_err("no password");
    assert_eq!(e.kind(), ErrorKind::AccessDenied, "{e}");
    assert!(!e.is_retryable(), "{e}");
    assert!(!format!("{e}").contains("s3cret"));
}

/// Once long enough for renewals (TTL/3) and for the waiter to queue has passed: `held` was
/// renewed, and its release hands the lock to `waiting`.
async fn renewed_then_handed_over(
    held: Lease,
    waiting: tokio::task::JoinHandle<Result<Lease, dlock_core::Error>>,
) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    held.check().expect("renewed under the ACL");
    held.release().await.expect("release");
    let got = waiting.await.expect("join").expect("handoff under the ACL");
    got.release().await.expect("release");
}

/// Exactly the documented rules: uncontended and queued acquires, a handoff with notification,
/// renewal and release all work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rules_suffice() {
    let ns = "dlock-test/acl/minimal";
    let (_, a, b) = two_lockers("dlock-minimal", ns, RULES).await;
    let lock = name("m");
    let held = granted(&a, &lock, Duration::from_secs(2), "acquire").await;
    let waiting = acquiring(&b, &lock, AcquireOptions::wait(Duration::from_secs(10)));
    renewed_then_handed_over(held, waiting).await;
}

/// A release that the ACL refuses half-way (no `PUBLISH` permission) never leaves the lock
/// reserved for a head that was not told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_never_reserves_without_notifying() {
    let ns = "dlock-test/acl/nopublish";
    let rules: Vec<&str> = RULES.iter().copied().filter(|r| *r != "+publish").collect();
    let (url, a, b) = two_lockers("dlock-nopublish", ns, &rules).await;
    let lock = name("p");
    let held = granted(&a, &lock, Duration::from_secs(2), "acquire").await;
    let waiting = acquiring(&b, &lock, AcquireOptions::wait(Duration::from_secs(2)));
    let mut conn = conn(&url).await;
    queued(&mut conn, &format!("{ns}/dlock:{{p}}:q"), 1).await;
    let e = held.release().await.expect_err("PUBLISH is refused");
    assert!(!e.is_retryable(), "{e}");
    let value: Option<String> = redis::cmd("GET")
        .arg(format!("{ns}/dlock:{{p}}"))
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert!(
        !value.as_deref().is_some_and(|v| v.starts_with("r:")),
        "the lock was reserved ({value:?}) but its head was never told"
    );
    waiting.abort();
}

/// The documented rules plus the family's: reads, a queued write with its notification,
/// renewal, permits and releases all work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_family_acl_rules_suffice() {
    let ns = "dlock-test/acl/family";
    let rules: Vec<&str> = RULES.iter().chain(FAMILY_RULES).copied().collect();
    let (_, a, b) = two_lockers("dlock-family", ns, &rules).await;
    let lock = name("rw");
    let wait = AcquireOptions::wait(Duration::from_secs(2));
    let read = a.read(&lock, wait).await.expect("read");
    let (b2, l2) = (b.clone(), lock.clone());
    let writing = tokio::spawn(async move {
        b2.write(&l2, AcquireOptions::wait(Duration::from_secs(10)))
            .await
    });
    renewed_then_handed_over(read, writing).await;
    let permit = a
        .acquire_permit(&name("sem"), 2, wait)
        .await
        .expect("permit");
    permit.release().await.expect("release");
}

/// `wait_for_replicas` under exactly the documented rules (the mutex's and its own): a grant
/// that a replica acknowledged is handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rules_suffice_for_wait_for_replicas() {
    let cluster = super::private(2);
    super::replicate(&cluster).await;
    let (urls, master) = (cluster.endpoints(), cluster.addrs()[0]);
    let ns = "dlock-test/acl/wait";
    let rules: Vec<&str> = RULES.iter().chain(WAIT_RULES).copied().collect();
    acl_user(&urls[0], "dlock-wait", ns, &rules).await;
    let l = super::builder(
        &format!("redis://dlock-wait:pw@{master}"),
        ns,
        Duration::from_secs(2),
    )
    .wait_for_replicas(1, Duration::from_millis(500))
    .build()
    .await
    .expect("builds");
    let lease = granted(
        &l,
        &name("w"),
        Duration::from_secs(2),
        "granted and acknowledged under the ACL",
    )
    .await;
    lease.release().await.expect("release");
}
