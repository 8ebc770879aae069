//! Fencing tokens under data loss on one node: they never repeat or go back after an evicted
//! fence key or a failover to a lagging replica (a restart without persistence and slow grants
//! are the `server_restart` and `slow_grant` scenarios').

use std::time::Duration;

use dlock_core::LockName;
use tokio::time::Instant;

use super::{conn, granted, locker, name, private, replicaof, url};

/// The token of a fresh grant on `url` (released at once).
async fn token_on(url: &str, ns: &str, lock: &LockName) -> u64 {
    let l = locker(url, ns, Duration::from_secs(2)).await;
    let lease = granted(&l, lock, Duration::from_secs(10), "acquire").await;
    let t = lease.token().get();
    lease.release().await.expect("release");
    t
}

/// An evicted (or deleted) fence key: the next token is still greater than every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_the_fence_key_is_evicted() {
    let url = url();
    let ns = "dlock-test/safety/evicted";
    let lock = name("e");
    let before = token_on(&url, ns, &lock).await;
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{ns}/dlock:{{e}}:fence"))
        .query_async(&mut conn(&url).await)
        .await
        .expect("DEL");
    let after = token_on(&url, ns, &lock).await;
    assert!(
        after > before,
        "token {after} after the eviction, {before} before"
    );
}

/// A failover to a replica that missed the latest grants: tokens the promoted replica grants
/// are still greater than every token the old master granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_a_failover_to_a_lagging_replica() {
    let cluster = private(2);
    let urls = cluster.endpoints();
    let (master, replica) = (cluster.addrs()[0], &urls[1]);
    let ns = "dlock-test/safety/failover";
    let lock = name("f");
    replicaof(replica, Some(master)).await;
    for _ in 0..3 {
        token_on(&urls[0], ns, &lock).await;
    }
    // Wait until the replica has the counter, then cut it off (it lags from here on).
    let fence = format!("{ns}/dlock:{{f}}:fence");
    let want: Option<String> = redis::cmd("GET")
        .arg(&fence)
        .query_async(&mut conn(&urls[0]).await)
        .await
        .expect("GET");
    let mut lagging = conn(replica).await;
    let began = Instant::now();
    loop {
        let got: Option<String> = redis::cmd("GET")
            .arg(&fence)
            .query_async(&mut lagging)
            .await
            .expect("GET on the replica");
        if got == want {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the replica never caught up ({got:?} vs {want:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replicaof(replica, None).await;
    let mut before = 0;
    for _ in 0..3 {
        before = before.max(token_on(&urls[0], ns, &lock).await);
    }
    tokio::task::block_in_place(|| cluster.node(0).kill()).expect("kill the old master");
    let after = token_on(replica, ns, &lock).await;
    assert!(
        after > before,
        "token {after} on the promoted replica, {before} on the old master"
    );
}
