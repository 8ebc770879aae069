//! Failures against real etcd processes: endpoints down or hung, a follower or the leader
//! killed while a lock is held.

mod support;

use std::net::TcpListener;
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};
use tokio::time::Instant;

/// Scheduling slack on a loaded test machine: the bound is "within the wait", never a hang.
const SLACK: Duration = Duration::from_millis(800);

/// An address where nothing listens.
fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

/// An address that accepts connections and never answers (a hung server).
fn hung_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            match s {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
    });
    format!("http://{addr}")
}

#[test]
fn endpoints_down_or_hung_give_unavailable_within_the_wait() {
    support::runtime().block_on(async {
        for endpoint in [closed_port(), hung_server()] {
            let locker = support::builder(vec![endpoint.clone()], "dlock-test/down")
                .request_timeout(Duration::from_secs(1))
                .build()
                .await
                .expect("building connects lazily");
            let name = LockName::new("a").expect("valid");

            let wait = Duration::from_millis(600);
            let t = Instant::now();
            let err = locker
                .acquire(&name, AcquireOptions::wait(wait))
                .await
                .expect_err("no server");
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{endpoint}: {err}");
            assert!(
                t.elapsed() <= wait + SLACK,
                "{endpoint}: took {:?}",
                t.elapsed()
            );

            // Without a wait, the request timeout bounds it.
            let t = Instant::now();
            let err = locker
                .acquire(&name, AcquireOptions::forever())
                .await
                .expect_err("no server");
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{endpoint}: {err}");
            assert!(
                t.elapsed() <= Duration::from_secs(1) + SLACK,
                "{endpoint}: took {:?}",
                t.elapsed()
            );

            let err = locker.try_acquire(&name).await.expect_err("no server");
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{endpoint}: {err}");
            assert!(err.is_retryable());
        }
    });
}

/// The index of the leader among `cluster`'s nodes, asking each live node.
async fn leader(cluster: &Cluster) -> usize {
    for _ in 0..50 {
        for (i, ep) in cluster.endpoints().iter().enumerate() {
            let Ok(mut c) = dlock_etcd::etcd_client::Client::connect([ep], None).await else {
                continue;
            };
            let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(1), c.status()).await else {
                continue;
            };
            let me = s.header().map(|h| h.member_id());
            if me == Some(s.leader()) {
                return i;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no leader found");
}

#[test]
fn follower_killed_while_held_keeps_the_lock() {
    let cluster = Cluster::start(ServerKind::Etcd, 3).expect("start a 3-member etcd cluster");
    support::runtime().block_on(async {
        let ns = support::namespace("follower-killed");
        let holder = support::locker(&cluster, &ns).await;
        let contender = support::locker(&cluster, &ns).await;
        let name = LockName::new("held").expect("valid");
        let lease = holder
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire");
        let lead = leader(&cluster).await;
        let follower = (lead + 1) % 3;
        cluster.node(follower).kill().expect("kill a follower");
        // Three TTLs: renewal must go on through the two live members.
        tokio::time::sleep(holder.ttl() * 3).await;
        assert!(
            lease.check().is_ok(),
            "lease lost after a follower died: {:?}",
            lease.check()
        );
        assert!(
            contender
                .try_acquire(&name)
                .await
                .expect("try_acquire")
                .is_none(),
            "a contender got the lock while it is held"
        );
        assert!(holder.stats().renewals >= 3, "{:?}", holder.stats());
        let token = lease.token();
        lease.release().await.expect("release");
        let next = contender
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("free after release");
        assert!(next.token() > token);
        next.release().await.expect("release");
    });
}

#[test]
fn leader_killed_while_held_never_double_grants() {
    let cluster = Cluster::start(ServerKind::Etcd, 3).expect("start a 3-member etcd cluster");
    support::runtime().block_on(async {
        let ns = support::namespace("leader-killed");
        let holder = support::locker(&cluster, &ns).await;
        let contender = support::locker(&cluster, &ns).await;
        let name = LockName::new("held").expect("valid");
        let lease = holder
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire");
        let lost = lease.lost();
        let lost_at = tokio::spawn(async move {
            let reason = lost.await;
            (Instant::now(), reason)
        });
        let lead = leader(&cluster).await;
        cluster.node(lead).kill().expect("kill the leader");
        let ttl = holder.ttl();
        let n2 = name.clone();
        let c2 = contender.clone();
        let contended = tokio::spawn(async move {
            let got = c2.acquire(&n2, AcquireOptions::wait(ttl * 4)).await;
            (Instant::now(), got)
        });
        let (granted_at, got) = contended.await.expect("task");
        match got {
            Ok(second) => {
                // The contender was granted: the holder must have been told first.
                assert!(
                    lease.is_lost(),
                    "double grant: the holder's lease is still live"
                );
                let (lost_t, reason) = lost_at.await.expect("task");
                assert!(
                    lost_t <= granted_at,
                    "the holder learned of the loss after the contender's grant"
                );
                assert!(
                    second.token() > lease.token(),
                    "fencing token did not increase"
                );
                eprintln!("leader killed: holder lost ({reason}), contender granted afterwards");
                second.release().await.expect("release");
            }
            Err(e) => {
                // The lease survived the election: it must still be held.
                assert!(
                    lease.check().is_ok(),
                    "neither held nor granted: {e}; {:?}",
                    lease.check()
                );
                eprintln!("leader killed: the lease survived ({e})");
                lease.release().await.expect("release");
            }
        }
    });
}
