//! Leader election on one Redis server, beyond the shared scenarios: a leader whose key was
//! deleted cannot proclaim, bad values send nothing, and an observer that missed
//! announcements fails instead of skipping them.

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, Election, ErrorKind, LockName};
use dlock_redis::RedisLocker;

const WAIT: Duration = Duration::from_secs(10);

fn shared() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

async fn locker(ns: &str) -> RedisLocker {
    RedisLocker::builder()
        .url(shared().endpoints().remove(0))
        .ttl(Duration::from_secs(2))
        .namespace(ns)
        .build()
        .await
        .expect("locker")
}

async fn conn() -> redis::aio::MultiplexedConnection {
    redis::Client::open(shared().endpoints().remove(0))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connection")
}

fn ns(test: &str) -> String {
    format!("dlock-test/redis-election-{}/{test}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_that_missed_announcements_fails_instead_of_skipping() {
    let ns = ns("gap");
    let l = locker(&ns).await;
    let name = LockName::new("leader").expect("valid");
    let mut changes = l.observe(&name).await.expect("observe");
    let leading = l
        .campaign(&name, b"v1", AcquireOptions::wait(WAIT))
        .await
        .expect("lead");
    let first = tokio::time::timeout(WAIT, changes.next())
        .await
        .expect("in time")
        .expect("first change");
    assert_eq!(first.value, b"v1");
    // Announcements the observer never sees: trimmed from the stream, as MAXLEN would after
    // many changes.
    leading.proclaim(b"v2").await.expect("proclaim");
    let stream = format!("{}dlock:{{leader}}:changes", l.prefix());
    let _: i64 = redis::cmd("XTRIM")
        .arg(&stream)
        .arg("MAXLEN")
        .arg(0)
        .query_async(&mut conn().await)
        .await
        .expect("trim");
    leading.proclaim(b"v3").await.expect("proclaim");
    let err = tokio::time::timeout(WAIT, changes.next())
        .await
        .expect("in time")
        .expect_err("a change was missed");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("missed"), "{err}");
    leading.resign().await.expect("resign");
}
