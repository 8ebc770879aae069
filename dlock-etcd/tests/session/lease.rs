//! The session lease: one lease for all locks of a locker, loss of all of them when etcd drops
//! it, and a fresh session for later acquires.

use crate::support;

use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{Locker, LossReason};

#[test]
fn revoked_session_loses_every_lock_then_a_new_session_serves_later_acquires() {
    support::on_single("session-loss", |cluster, ns| async move {
        let locker = support::locker(&cluster, &ns).await;
        let (a, b) = (support::name("a"), support::name("b"));
        let la = support::hold(&locker, &a).await;
        let lb = support::hold(&locker, &b).await;
        let first = locker.session_lease().await.expect("a live session");
        let (lost_a, lost_b) = (la.lost(), lb.lost());

        let mut c = locker.client().clone();
        c.lease_revoke(first)
            .await
            .expect("revoke the session lease");

        // Both locks of the session are announced lost, within the TTL (next keep-alive).
        let bound = locker.ttl() + Duration::from_millis(500);
        for lost in [lost_a, lost_b] {
            let reason = tokio::time::timeout(bound, lost)
                .await
                .expect("lost() fires");
            assert!(matches!(reason, LossReason::SessionEnded(_)), "{reason:?}");
        }
        assert!(la.check().is_err() && lb.check().is_err());
        let stats = locker.stats();
        assert_eq!(
            stats.losses, 2,
            "the internal session lease is not counted: {stats:?}"
        );

        // A later acquire opens a new session and is granted with a higher token.
        let again = support::hold(&locker, &a).await;
        let second = locker.session_lease().await.expect("a new session");
        assert_ne!(first, second);
        assert!(again.token() > la.token());
        again.release().await.expect("release");
        drop((la, lb));
    });
}

/// etcd's count of lease keep-alives it served.
fn renewed_total(cluster: &Cluster) -> u64 {
    support::metric(cluster, 0, "etcd_debugging_lease_renewed_total")
        .expect("etcd_debugging_lease_renewed_total")
}

#[test]
fn many_locks_share_one_keep_alive_per_round() {
    // A private server: its keep-alive counter sees only this locker.
    let cluster = Cluster::start(ServerKind::Etcd, 1).expect("a private etcd");
    support::runtime().block_on(async {
        let ns = support::namespace("one-stream");
        let locker = support::locker(&cluster, &ns).await;
        let mut leases = Vec::new();
        for i in 0..50 {
            let name = support::name(&format!("l{i}"));
            leases.push(support::hold(&locker, &name).await);
        }
        let before = locker.stats();
        let served_before = renewed_total(&cluster);
        // Two TTLs: about six renewal rounds of TTL/3, each ONE keep-alive for all 50 locks.
        tokio::time::sleep(locker.ttl() * 2).await;
        let after = locker.stats();
        let served = renewed_total(&cluster) - served_before;
        let rounds = after.renewals - before.renewals;
        assert!((4..=8).contains(&rounds), "renewal rounds {rounds}");
        assert!(
            served.abs_diff(rounds) <= 1,
            "etcd served {served} keep-alives for {rounds} renewal rounds of 50 locks"
        );
        // Besides the keep-alive, each round lists the session's keys once (reconciliation).
        let requests = after.requests - before.requests;
        assert!(
            requests <= rounds + 1,
            "holding must not send per-lock requests: {requests} requests in {rounds} rounds"
        );
        assert!(leases.iter().all(|l| l.check().is_ok()));
        for l in leases {
            l.release().await.expect("release");
        }
    });
}
