//! Polling waiters (spin mode, Redlock) write nothing while the lock stays held: a refused
//! attempt must not bump the fencing counter (one write per poll would load the server and
//! its replicas for nothing).

mod support;

use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, Error, LockName, Locker};
use dlock_redis::{RedisLocker, RedlockLocker};

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

async fn fence(url: &str, key: &str) -> Option<String> {
    let mut conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("GET")
}

/// Many failed polls of `waiter` while `holder` holds the lock leave every node's fence as the
/// grant left it.
async fn polls_leave_the_fence_alone(
    holder: &dyn Locker,
    waiter: &dyn Locker,
    urls: &[String],
    fence_key: &str,
) {
    let lock = name("held");
    let lease = holder
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("holder acquires");
    let mut before = Vec::new();
    for url in urls {
        before.push(fence(url, fence_key).await);
    }
    let polls_before = waiter.stats().requests;
    let got = waiter
        .acquire(&lock, AcquireOptions::wait(Duration::from_millis(400)))
        .await;
    assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
    let polls = waiter.stats().requests - polls_before;
    assert!(polls >= 5, "only {polls} polls: the test proves nothing");
    for (url, was) in urls.iter().zip(before) {
        assert_eq!(
            fence(url, fence_key).await,
            was,
            "{polls} failed polls changed the fence on {url}"
        );
    }
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spin_mode_polls_do_not_write() {
    let url = Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
        .endpoints()
        .remove(0);
    let ns = "dlock-test/polling/spin";
    let build = async || {
        RedisLocker::builder()
            .url(&url)
            .ttl(Duration::from_secs(2))
            .fair(false)
            .retry_delay(Duration::from_millis(10))
            .namespace(ns)
            .build()
            .await
            .expect("builds")
    };
    let (holder, waiter) = (build().await, build().await);
    let key = format!("{ns}/dlock:{{held}}:fence");
    polls_leave_the_fence_alone(&holder, &waiter, std::slice::from_ref(&url), &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_polls_do_not_write() {
    let cluster = Cluster::shared(ServerKind::Redis, 3)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let urls = cluster.endpoints();
    let ns = "dlock-test/polling/redlock";
    let build = async || {
        RedlockLocker::builder()
            .nodes(urls.clone())
            .ttl(Duration::from_secs(2))
            .retry_delay(Duration::from_millis(10))
            .namespace(ns)
            .build()
            .await
            .expect("builds")
    };
    let (holder, waiter) = (build().await, build().await);
    let key = format!("{ns}/dlock:{{held}}:fence");
    polls_leave_the_fence_alone(&holder, &waiter, &urls, &key).await;
}
