//! Authentication and ACL permissions, on a real server: refusals are not retryable, and a
//! user with exactly the documented ACL rules can use every path of the lock.

mod support;

use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker, RwLocker, Semaphore};
use dlock_redis::RedisLocker;
use support::acl::{FAMILY_RULES, RULES, WAIT_RULES, acl_rules};

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

async fn acl_user(url: &str, user: &str, ns: &str, rules: &[&str]) {
    let mut conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(user).arg("reset");
    for r in acl_rules("pw", &format!("{ns}/"), &[rules]) {
        cmd.arg(r);
    }
    let _: () = cmd.query_async(&mut conn).await.expect("ACL SETUSER");
}

async fn locker(addr: std::net::SocketAddr, user: &str, password: &str, ns: &str) -> RedisLocker {
    RedisLocker::builder()
        .url(format!("redis://{user}:{password}@{addr}"))
        .ttl(Duration::from_secs(2))
        .namespace(ns)
        .build()
        .await
        .expect("builds")
}

/// Exactly the documented rules: uncontended and queued acquires, a handoff with notification,
/// renewal and release all work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rules_suffice() {
    let cluster = Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let (url, addr) = (cluster.endpoints().remove(0), cluster.addrs()[0]);
    let ns = "dlock-test/acl/minimal";
    acl_user(&url, "dlock-minimal", ns, RULES).await;
    let a = locker(addr, "dlock-minimal", "pw", ns).await;
    let b = locker(addr, "dlock-minimal", "pw", ns).await;
    let lock = name("m");
    let held = a
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(2)))
        .await
        .expect("acquire");
    let (b2, l2) = (b.clone(), lock.clone());
    let waiting = tokio::spawn(async move {
        b2.acquire(&l2, AcquireOptions::wait(Duration::from_secs(10)))
            .await
    });
    // Long enough for renewals (TTL/3) and for the waiter to queue.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    held.check().expect("renewed under the ACL");
    held.release().await.expect("release");
    let got = waiting.await.expect("join").expect("handoff under the ACL");
    got.release().await.expect("release");
}

/// A release that the ACL refuses half-way (no `PUBLISH` permission) never leaves the lock
/// reserved for a head that was not told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_never_reserves_without_notifying() {
    let cluster = Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let (url, addr) = (cluster.endpoints().remove(0), cluster.addrs()[0]);
    let ns = "dlock-test/acl/nopublish";
    let rules: Vec<&str> = RULES.iter().copied().filter(|r| *r != "+publish").collect();
    acl_user(&url, "dlock-nopublish", ns, &rules).await;
    let a = locker(addr, "dlock-nopublish", "pw", ns).await;
    let b = locker(addr, "dlock-nopublish", "pw", ns).await;
    let lock = name("p");
    let held = a
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(2)))
        .await
        .expect("acquire");
    let (b2, l2) = (b.clone(), lock.clone());
    let waiting = tokio::spawn(async move {
        b2.acquire(&l2, AcquireOptions::wait(Duration::from_secs(2)))
            .await
    });
    let mut conn = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let queue = format!("{ns}/dlock:{{p}}:q");
    loop {
        let len: usize = redis::cmd("LLEN")
            .arg(&queue)
            .query_async(&mut conn)
            .await
            .expect("LLEN");
        if len == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    let cluster = Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let (url, addr) = (cluster.endpoints().remove(0), cluster.addrs()[0]);
    let ns = "dlock-test/acl/family";
    let rules: Vec<&str> = RULES.iter().chain(FAMILY_RULES).copied().collect();
    acl_user(&url, "dlock-family", ns, &rules).await;
    let a = locker(addr, "dlock-family", "pw", ns).await;
    let b = locker(addr, "dlock-family", "pw", ns).await;
    let lock = name("rw");
    let wait = AcquireOptions::wait(Duration::from_secs(2));
    let read = a.read(&lock, wait).await.expect("read");
    let (b2, l2) = (b.clone(), lock.clone());
    let writing = tokio::spawn(async move {
        b2.write(&l2, AcquireOptions::wait(Duration::from_secs(10)))
            .await
    });
    // Long enough for renewals (TTL/3) and for the writer to queue.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    read.check().expect("renewed under the ACL");
    read.release().await.expect("release");
    let write = writing.await.expect("join").expect("handoff under the ACL");
    write.release().await.expect("release");
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
    let cluster = Cluster::start(ServerKind::Redis, 2)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let urls = cluster.endpoints();
    let mut replica = redis::Client::open(urls[1].as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let master = cluster.addrs()[0];
    let _: () = redis::cmd("REPLICAOF")
        .arg(master.ip().to_string())
        .arg(master.port())
        .query_async(&mut replica)
        .await
        .expect("REPLICAOF");
    let began = std::time::Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut replica)
            .await
            .expect("INFO");
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the replica never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ns = "dlock-test/acl/wait";
    let rules: Vec<&str> = RULES.iter().chain(WAIT_RULES).copied().collect();
    acl_user(&urls[0], "dlock-wait", ns, &rules).await;
    let l = RedisLocker::builder()
        .url(format!("redis://dlock-wait:pw@{master}"))
        .ttl(Duration::from_secs(2))
        .namespace(ns)
        .wait_for_replicas(1, Duration::from_millis(500))
        .build()
        .await
        .expect("builds");
    let lease = l
        .acquire(&name("w"), AcquireOptions::wait(Duration::from_secs(2)))
        .await
        .expect("granted and acknowledged under the ACL");
    lease.release().await.expect("release");
}
