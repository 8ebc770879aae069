//! Replicas of one node: `wait_for_replicas` hands a grant out only once a replica acknowledged
//! it, and a stalled replica does not starve the renewals of leases already held.

use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};
use dlock_redis::RedisLocker;

use super::{builder, conn, granted, name, private, replicate};

/// `WAIT` blocks the connection it is sent on until it returns. While the only replica is
/// stalled (SIGSTOP: still connected, acknowledging nothing), several grants at once wait for
/// its acknowledgement, again and again, for twice the TTL: none of them is handed out (the
/// `WAIT` still waits for THEIR grant), and the lease the locker already holds keeps being
/// renewed (its renewals do not queue behind the `WAIT`s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_does_not_starve_renewals() {
    let cluster = private(2);
    replicate(&cluster).await;
    let ttl = Duration::from_secs(2);
    let l = builder(
        &cluster.endpoints()[0],
        "dlock-test/failover/wait-starves",
        ttl,
    )
    .wait_for_replicas(1, Duration::from_millis(900))
    .build()
    .await
    .expect("builds");
    let held = granted(
        &l,
        &name("held"),
        Duration::from_secs(2),
        "a replica acknowledges",
    )
    .await;
    tokio::task::block_in_place(|| cluster.node(1).pause()).expect("stall the replica");
    let stalled = std::time::Instant::now();
    let grants: Vec<_> = (0..6)
        .map(|k| {
            let l = l.clone();
            tokio::spawn(async move {
                let name = LockName::new(format!("g{k}")).expect("valid name");
                let mut refused = 0;
                while stalled.elapsed() < 2 * ttl {
                    match l.try_acquire(&name).await {
                        Ok(Some(lease)) => {
                            let _ = lease.release().await;
                            return Err(format!("{name} was granted without an acknowledgement"));
                        }
                        Ok(None) => {}
                        Err(e) if e.kind() == ErrorKind::Unavailable => refused += 1,
                        Err(e) => return Err(format!("{name}: {e}")),
                    }
                }
                Ok(refused)
            })
        })
        .collect();
    let mut refused = 0;
    for g in grants {
        refused += g.await.expect("join").unwrap_or_else(|e| panic!("{e}"));
    }
    let check = held.check();
    tokio::task::block_in_place(|| cluster.node(1).resume()).expect("resume the replica");
    assert!(refused > 0, "no grant ever waited for the stalled replica");
    check.unwrap_or_else(|e| {
        panic!(
            "the held lease was not renewed while grants waited for the stalled replica ({:?} after the stall began): {e}",
            stalled.elapsed()
        )
    });
    held.release().await.expect("release");
}

/// `wait_for_replicas`: a grant is handed out only once a replica acknowledged it; with the
/// replica gone, the grant is given back and the acquire fails as `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_wait_for_replica_acknowledgement() {
    let cluster = private(2);
    let urls = cluster.endpoints();
    replicate(&cluster).await;
    let ns = "dlock-test/failover/wait";
    let l = builder(&urls[0], ns, Duration::from_secs(2))
        .wait_for_replicas(1, Duration::from_millis(300))
        .build()
        .await
        .expect("builds");
    let lease = granted(
        &l,
        &name("acked"),
        Duration::from_secs(2),
        "a replica acknowledges",
    )
    .await;
    lease.release().await.expect("release");
    tokio::task::block_in_place(|| cluster.node(1).kill()).expect("kill the replica");
    let e = l
        .acquire(
            &name("unacked"),
            AcquireOptions::wait(Duration::from_secs(2)),
        )
        .await
        .expect_err("no replica acknowledges");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let left: Option<String> = redis::cmd("GET")
        .arg(format!("{ns}/dlock:{{unacked}}"))
        .query_async(&mut conn(&urls[0]).await)
        .await
        .expect("GET");
    assert_eq!(left, None, "the unacknowledged grant was not given back");
    let bad = RedisLocker::builder()
        .url(&urls[0])
        .ttl(Duration::from_secs(2))
        .wait_for_replicas(0, Duration::from_millis(300))
        .build()
        .await;
    assert_eq!(bad.expect_err("no replica").kind(), ErrorKind::InvalidInput);
}
