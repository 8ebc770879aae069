//! A follower cut from its leader: it keeps answering reads and pings (until syncLimit ×
//! tickTime passes) while the leader expires the client's session and grants the lock to
//! someone else. The holder must not extend its lease through such a follower.
//!
//! The ensemble (`support::ensemble`) routes every peer link through its own proxy, so one
//! follower can be cut from the leader while the leader keeps its quorum with the other one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use dlock_conformance::servers::local::zk_mode;
use dlock_core::{AcquireOptions, LockName, Locker};
use support::ensemble::Ensemble;
use support::{eventually, locker, namespace};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);

/// A holds the lock through follower F. F is cut from the leader: the leader expires A's session
/// after its timeout and grants the lock to B, while F keeps answering A's reads for syncLimit ×
/// tickTime. A's deadline must never be later than B's grant (its `lost()` fires first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_cut_from_its_leader_extends_no_lease() {
    let Some(ens) = Ensemble::start() else { return };
    let leader = ens.wait_ready().await;
    let follower = (leader + 1) % 3;
    let ns = namespace("partition");
    let name = LockName::new("cut").unwrap();
    let a = locker(&ens.servers[follower].client.to_string(), &ns, TTL).await;
    let b = locker(&ens.servers[leader].client.to_string(), &ns, TTL).await;
    let held = a.acquire(&name, AcquireOptions::forever()).await.unwrap();
    // Let a few renewals pass on a healthy ensemble.
    tokio::time::sleep(TTL).await;
    held.check().expect("A holds on a healthy ensemble");

    ens.cut(follower, leader);
    let cut_at = Instant::now();
    let granted = b
        .acquire(&name, AcquireOptions::wait(Duration::from_secs(20)))
        .await
        .expect("the leader expires A's session and grants B");
    let granted_at = Instant::now();
    // F still serves A: the partition is a follower that lost its leader, not a dead server.
    assert_eq!(
        zk_mode(ens.servers[follower].client).as_deref(),
        Some("follower"),
        "the follower gave up on its leader before the test could observe it"
    );
    let deadline = held.deadline();
    assert!(
        deadline <= granted_at,
        "A's lease runs until {:?} after the cut, but B was granted {:?} after the cut \
         (A was extended through a follower cut from its leader)",
        deadline - cut_at,
        granted_at - cut_at
    );
    assert!(held.check().is_err(), "A still believes it holds the lock");
    granted.release().await.unwrap();
    // Heal, so the follower rejoins before teardown (not needed for the verdict).
    ens.heal();
    let _ = eventually(Duration::from_secs(10), || async {
        zk_mode(ens.servers[follower].client).as_deref() == Some("follower")
    })
    .await;
}
