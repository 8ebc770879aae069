//! Many leases on one locker: renewal covers every held node each round.
//!
//! Its own test binary, so its 1,000 acquires do not load the shared server while the
//! short-TTL tests of `locking` and `faults` run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, Error, LockName, Locker, LossReason};
use support::{Zk, contenders, eventually};

const TTL: Duration = Duration::from_secs(2);

/// Renewal reads back every held node each round: nodes deleted at the server among 1,000
/// leases are all lost within three renewal rounds (counted, not timed: three rounds, and
/// every other lease renewed by a round started a period after the deletions), the other leases stay
/// held, and a round stays a `sync` plus multi-reads of at most 100 nodes each, all sent at once
/// (one round trip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_nodes_among_many_leases_are_lost_within_three_rounds() {
    use futures::StreamExt;
    const LEASES: usize = 1000;
    let Some(zk) = Zk::new("many") else { return };
    let l = Arc::new(zk.locker(TTL).await);
    let names: Vec<LockName> = (0..LEASES)
        .map(|i| LockName::new(format!("m{i}")).unwrap())
        .collect();
    let leases: Vec<_> = futures::stream::iter(names.clone())
        .map(|n| {
            let l = Arc::clone(&l);
            async move { l.acquire(&n, AcquireOptions::wait(TTL * 10)).await }
        })
        .buffered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    // Settle into whole-set rounds first.
    let r = l.stats().renewals;
    assert!(eventually(TTL * 5, || async { l.stats().renewals >= r + 2 }).await);
    assert!(leases.iter().all(|x| !x.is_lost()));

    // Spread over the whole set: a partial window per round (64 of 1,000) cannot reach them
    // all in three rounds.
    let victims = [0, LEASES / 4, LEASES / 2, LEASES * 3 / 4, LEASES - 1];
    let z = zk.raw().await;
    for &v in &victims {
        let parent = l.lock_path(&names[v]);
        let kids = contenders(&z, &parent).await;
        assert_eq!(kids.len(), 1, "{kids:?}");
        z.delete(&format!("{parent}/{}", kids[0]), None)
            .await
            .unwrap();
    }
    let deleted_at = tokio::time::Instant::now();
    let before = l.stats();
    // A lease whose deadline is past this was renewed by a round that started at least a
    // period after the deletions.
    let renewed_since = deleted_at + TTL + TTL / 3;
    assert!(
        eventually(TTL * 5, || async {
            // Three rounds: they may overlap, and one or two in flight may predate the
            // deletions. And every other lease renewed since: a round counted may be a retry
            // of a few leases only (r52 saw three counted while the victims' round was due).
            l.stats().renewals >= before.renewals + 3
                && (0..LEASES).all(|i| {
                    victims.contains(&i)
                        || leases[i].is_lost()
                        || leases[i].deadline() >= renewed_since
                })
        })
        .await,
        "{:?}",
        l.stats()
    );
    let after = l.stats();
    for &v in &victims {
        assert!(
            leases[v].is_lost(),
            "m{v}: its node was deleted three rounds ago but the lease is still held"
        );
        let reason = leases[v].check().unwrap_err();
        assert!(
            matches!(reason, Error::Lost(LossReason::Gone(_))),
            "m{v}: {reason:?}"
        );
    }
    let kept: Vec<usize> = (0..LEASES)
        .filter(|i| !victims.contains(i) && leases[*i].is_lost())
        .collect();
    assert!(kept.is_empty(), "other leases lost: {kept:?}");
    // One round = a sync and a multi-read per 100 nodes (a round in flight at either end adds
    // one). Failed rounds (timed out under load) send requests too.
    let rounds =
        (after.renewals - before.renewals) + (after.renewal_failures - before.renewal_failures);
    let requests = after.requests - before.requests;
    let per_round = 1 + LEASES.div_ceil(100) as u64;
    assert!(
        requests <= per_round * (rounds + 1),
        "{requests} requests for {rounds} rounds of {LEASES} leases"
    );
    let released: Vec<_> = futures::stream::iter(leases)
        .enumerate()
        .filter(|(i, _)| std::future::ready(!victims.contains(i)))
        .map(|(_, x)| x.release())
        .buffer_unordered(32)
        .collect()
        .await;
    assert_eq!(released.iter().filter(|r| r.is_err()).count(), 0);
}
