//! The session's keys are reconciled with what the locker owns, every keep-alive round: a key
//! attached to the session that no acquire or lease owns (an enqueue whose outcome was unknown
//! and that applied after its cleanup read) is deleted, and a held key deleted at the server
//! (by hand) makes that lease lost.

use crate::support;

use std::time::Duration;

use dlock_conformance::faults::{Direction, Mode, Proxy};
use dlock_core::{AcquireOptions, LockName, Locker, LossReason};
use dlock_etcd::EtcdLocker;
use dlock_etcd::etcd_client::{Client, PutOptions};
use tokio::time::Instant;

/// Puts the end state of an enqueue that applied after its acquire gave up and its cleanup
/// read found nothing: `a`'s key for `name` (on `a`'s live session), owned by
/// nobody. Returns the key and the session, written through `c`.
async fn put_orphan(a: &EtcdLocker, c: &mut Client, name: &LockName) -> (String, i64) {
    let session = a.session_lease().await.expect("a live session");
    let orphan = format!("{}/{session:x}", a.etcd_mutex_name(name));
    c.put(
        orphan.as_str(),
        "",
        Some(PutOptions::new().with_lease(session)),
    )
    .await
    .expect("put the orphan key");
    (orphan, session)
}

/// Whether `key` is gone.
async fn gone(c: &mut Client, key: &str) -> bool {
    c.get(key, None).await.expect("read").kvs().is_empty()
}

#[test]
fn orphan_queue_key_of_the_session_is_deleted() {
    support::on_single("orphan", |cluster, ns| async move {
        let a = support::locker(&cluster, &ns).await;
        let b = support::locker(&cluster, &ns).await;
        let name = support::name("orders/42");
        let mut c = a.client().clone();
        support::warm_up(&a).await;
        let (orphan, session) = put_orphan(&a, &mut c, &name).await;

        // `b` must get the lock once `a` reconciled its session (a round is TTL/3).
        let lease = b
            .acquire(&name, AcquireOptions::wait(a.ttl() * 3))
            .await
            .expect("the orphan key must not block other contenders");
        assert!(gone(&mut c, &orphan).await, "the orphan key is still there");
        assert_eq!(
            a.session_lease().await,
            Some(session),
            "reconciling must not end the session"
        );
        lease.release().await.expect("release");
    });
}

#[test]
fn holder_key_deleted_by_hand_loses_the_lease() {
    support::on_single("deleted-by-hand", |cluster, ns| async move {
        let a = support::locker(&cluster, &ns).await;
        let name = support::name("h");
        let other = support::name("other");
        let held = support::hold(&a, &name).await;
        let kept = support::hold(&a, &other).await;
        let session = a.session_lease().await.expect("a live session");
        let key = format!("{}/{session:x}", a.etcd_mutex_name(&name));
        let mut c = a.client().clone();
        let deleted = c.delete(key.as_str(), None).await.expect("delete by hand");
        assert_eq!(deleted.deleted(), 1, "the holder's key {key}");

        // Noticed at the next keep-alive round (TTL/3), well within a TTL.
        let reason = tokio::time::timeout(a.ttl() + Duration::from_millis(500), held.lost())
            .await
            .expect("the deleted key's lease must be lost");
        assert!(matches!(reason, LossReason::Gone(_)), "{reason:?}");
        // The session and its other locks are not affected.
        tokio::time::sleep(a.ttl()).await;
        kept.check()
            .expect("the other lock of the session is still held");
        assert_eq!(a.session_lease().await, Some(session));
        kept.release().await.expect("release");
    });
}

/// A `try_acquire` that comes while the reconciliation deletes an orphan key of the same name
/// (the delete holds the key's slot until its reply) asks etcd, rather than report the free
/// lock as taken. Before the fix it returned `None` at once, without a request: CI's
/// `etcd::renewal` saw "the lock was not free after the renewed lease was released".
#[test]
fn try_acquire_during_an_orphan_delete_asks_etcd() {
    support::on_single("orphan-try", |cluster, ns| async move {
        let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
        let a = support::builder(vec![format!("http://{}", proxy.addr())], &ns)
            .build()
            .await
            .expect("build the proxied locker");
        let direct = support::locker(&cluster, &ns).await;
        let mut c = direct.client().clone();
        let name = support::name("orders/7");
        support::warm_up(&a).await;
        // Replies reach `a` 400 ms late: the orphan's delete holds the slot that long after
        // it applied at the server.
        proxy.set_direction(
            Direction::Downstream,
            Mode::Delay(Duration::from_millis(400)),
        );
        let (orphan, _) = put_orphan(&a, &mut c, &name).await;
        // Read past the proxy until the reconciliation's delete applied.
        let began = Instant::now();
        while !gone(&mut c, &orphan).await {
            assert!(
                began.elapsed() < a.ttl() * 3,
                "the orphan key was never deleted"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let tried = a.try_acquire(&name).await.expect("try_acquire");
        proxy.set_direction(Direction::Downstream, Mode::Pass);
        let lease = tried.expect("the lock is free: nobody holds or queues for it");
        lease.release().await.expect("release");
    });
}
