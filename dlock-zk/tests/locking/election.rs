//! `Election` on ZooKeeper, beyond the conformance scenarios: the `LeaderLatch` layout, and
//! observers that read late, lose their connection, share their session with a campaign, or
//! list the queue just before a campaign lands.

use std::time::Duration;

use crate::support::{Zk, contenders, leader, next_change, protected};
use crate::{TTL, wait};
use dlock_core::{Election, ErrorKind, Leader, LeaderChanges, LockName};

/// The leader's node is `_c_<uuid>-latch-<seq>` (Curator's `LeaderLatch` with protection)
/// holding the value, and `leader()` reads its czxid and data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_latch_nodes_holding_the_value() {
    let Some(zk) = Zk::new("election-layout") else {
        return;
    };
    let (l, name, parent, z) = zk.on_lock("layout", TTL).await;
    let leading = l.campaign(&name, b"participant-1", wait()).await.unwrap();
    let kids = contenders(&z, &parent).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    let node = &kids[0];
    protected(node, "latch-");
    let (data, stat) = z.get_data(&format!("{parent}/{node}")).await.unwrap();
    assert_eq!(data, b"participant-1");
    assert_eq!(leading.term().get(), u64::try_from(stat.czxid).unwrap());
    assert_eq!(
        l.leader(&name).await.unwrap(),
        Some(leader(leading.term(), b"participant-1"))
    );
    leading.proclaim(b"participant-1b").await.unwrap();
    assert_eq!(
        l.leader(&name).await.unwrap().map(|l| l.value),
        Some(b"participant-1b".to_vec())
    );
    leading.resign().await.unwrap();
    assert_eq!(l.leader(&name).await.unwrap(), None);
}

/// An observer whose reads arrive late (its replies and events delayed 300 ms) while a leader
/// proclaims three times in a row, resigns, and the next leader proclaims: every read finds
/// the parent a few proclamations further on, and the parent's history still gives each one
/// in order. (With only the newest record kept, the observation failed at the first read:
/// "proclamations were missed".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_that_reads_late_still_sees_every_proclamation() {
    use dlock_conformance::faults::{Direction, Mode};
    let Some(zk) = Zk::new("election-observe-late") else {
        return;
    };
    let (o, proxy) = zk.proxied(TTL).await;
    let (a, b) = (zk.locker(TTL).await, zk.locker(TTL).await);
    let name = LockName::new("late").unwrap();
    let la = a.campaign(&name, b"a1", wait()).await.unwrap();
    let ta = la.term();
    let mut changes = o.observe(&name).await.unwrap();
    assert_eq!(next(&mut changes).await.value, b"a1");
    let bname = name.clone();
    let waiting = tokio::spawn(async move { b.campaign(&bname, b"b1", wait()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set_direction(
        Direction::Downstream,
        Mode::Delay(Duration::from_millis(300)),
    );
    for value in [&b"a2"[..], b"a3", b"a4"] {
        la.proclaim(value).await.unwrap();
    }
    la.resign().await.unwrap();
    let lb = waiting.await.unwrap().unwrap();
    lb.proclaim(b"b2").await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(next(&mut changes).await);
    }
    let tb = lb.term();
    assert_eq!(
        seen,
        vec![
            leader(ta, b"a2"),
            leader(ta, b"a3"),
            leader(ta, b"a4"),
            leader(tb, b"b1"),
            leader(tb, b"b2"),
        ]
    );
    lb.resign().await.unwrap();
}

/// The next change, within 5 s.
async fn next(changes: &mut Box<dyn LeaderChanges>) -> Leader {
    next_change(changes, Duration::from_secs(5)).await
}

/// A lost connection may hide changes (ZooKeeper does not replay the events of a reconnect):
/// the observation fails with `Unavailable` rather than go on as if it saw everything, and a
/// new observation starts from the leader then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observation_fails_when_its_connection_drops() {
    use dlock_conformance::faults::Mode;
    let Some(zk) = Zk::new("election-observe-cut") else {
        return;
    };
    let (o, proxy) = zk.proxied(TTL).await;
    let a = zk.locker(TTL).await;
    let name = LockName::new("cut").unwrap();
    let la = a.campaign(&name, b"a1", wait()).await.unwrap();
    let mut changes = o.observe(&name).await.unwrap();
    assert_eq!(next(&mut changes).await.value, b"a1");
    proxy.set(Mode::Reset);
    let e = tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("the observation fails within 5 s")
        .expect_err("changes may have been missed");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // It stays failed.
    let again = changes.next().await.expect_err("still failed");
    assert_eq!(again.kind(), ErrorKind::Unavailable, "{again}");
    proxy.set(Mode::Pass);
    la.proclaim(b"a2").await.unwrap();
    let mut fresh = o.observe(&name).await.unwrap();
    assert_eq!(next(&mut fresh).await, leader(la.term(), b"a2"));
    la.resign().await.unwrap();
}

/// An observer whose locker also campaigns (its session then holds a data watch on its
/// predecessor beside the recursive watch) still sees every change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sharing_its_session_with_a_campaign_sees_every_change() {
    let Some(zk) = Zk::new("election-observe-shared") else {
        return;
    };
    let (a, b) = (
        zk.locker(TTL).await,
        std::sync::Arc::new(zk.locker(TTL).await),
    );
    let name = LockName::new("shared").unwrap();
    let mut changes = b.observe(&name).await.unwrap();
    let la = a.campaign(&name, b"a1", wait()).await.unwrap();
    let waiting = tokio::spawn({
        let (b, name) = (std::sync::Arc::clone(&b), name.clone());
        async move { b.campaign(&name, b"b1", wait()).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    la.proclaim(b"a2").await.unwrap();
    la.resign().await.unwrap();
    let lb = waiting.await.unwrap().unwrap();
    lb.proclaim(b"b2").await.unwrap();
    let tb = lb.term();
    let seen = [
        next(&mut changes).await,
        next(&mut changes).await,
        next(&mut changes).await,
        next(&mut changes).await,
    ];
    let values: Vec<&[u8]> = seen.iter().map(|l| l.value.as_slice()).collect();
    assert_eq!(values, [&b"a1"[..], b"a2", b"b1", b"b2"], "{seen:?}");
    assert_eq!(seen[0].term, seen[1].term);
    assert_eq!(seen[2].term, tb);
    assert_eq!(seen[3].term, tb);
    assert!(seen[2].term > seen[1].term, "{seen:?}");
    lb.resign().await.unwrap();
}

/// A campaign that lands right after the observer's snapshot listed the queue (its event
/// reaches the observer after the listing's reply) is still followed: when the leader resigns,
/// the observer reports it as the next leader. The hook creates the node through the
/// observer's own session and waits for the reply, so its event is already delivered when the
/// snapshot goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_campaign_made_right_after_its_listing() {
    let Some(zk) = Zk::new("election-observe-after-listing") else {
        return;
    };
    let (a, o) = (zk.locker(TTL).await, zk.locker(TTL).await);
    let name = LockName::new("after-listing").unwrap();
    let parent = o.lock_path(&name);
    let la = a.campaign(&name, b"a1", wait()).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let prefix = format!("{parent}/_c_6f1d2a3e-0c4b-4e8f-9a1b-2c3d4e5f6a7b-latch-");
    let mut changes = o
        .observe_with_hook_for_test(&name, move |client| async move {
            let created = client
                .create(
                    &prefix,
                    b"b1",
                    &zookeeper_client::CreateMode::EphemeralSequential
                        .with_acls(zookeeper_client::Acls::anyone_all()),
                )
                .await
                .map(|(stat, seq)| (stat.czxid, format!("{prefix}{seq}")));
            let _ = tx.send(created);
        })
        .await
        .unwrap();
    let (czxid_b, node_b) = rx.await.unwrap().unwrap();
    assert_eq!(next(&mut changes).await, leader(la.term(), b"a1"));
    la.resign().await.unwrap();
    assert_eq!(
        next(&mut changes).await,
        leader(
            dlock_core::FencingToken(u64::try_from(czxid_b).unwrap()),
            b"b1"
        ),
        "the campaign made right after the listing ({node_b}) leads now"
    );
    zk.raw().await.delete(&node_b, None).await.unwrap();
}
