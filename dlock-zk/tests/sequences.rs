//! Sequence order after the parent's cversion wraps: ZooKeeper then names sequential nodes with a
//! negative number (`lock--000000005`), and Curator sorts those first. A dlock contender must see
//! such a node as ahead of its own, as a Curator contender does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, LockName, Locker};
use support::{contenders, eventually, locker, namespace, raw, shared};

const TTL: Duration = Duration::from_secs(2);

/// A holder's node named as after a wrap (created by name here: wrapping a real cversion takes
/// 2^31 child changes) holds the lock for Curator, so it must hold it for us too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_named_after_a_cversion_wrap_is_ahead_of_ours() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("wrap");
    let l = Arc::new(locker(connect, &ns, TTL).await);
    let name = LockName::new("wrapped").unwrap();
    let parent = l.lock_path(&name);
    let z = raw(connect).await;
    let open = zookeeper_client::Acls::anyone_all();
    z.mkdir(
        &parent,
        &zookeeper_client::CreateMode::Persistent.with_acls(open),
    )
    .await
    .unwrap();
    let wrapped = format!("{parent}/_c_0b9e6a77-3c1d-4b4f-9d6e-4f1f2f3a4b5c-lock--000000005");
    z.create(
        &wrapped,
        b"",
        &zookeeper_client::CreateMode::Ephemeral.with_acls(open),
    )
    .await
    .unwrap();

    assert!(
        l.try_acquire(&name).await.unwrap().is_none(),
        "granted while a node Curator sorts first exists"
    );
    let (l2, n2) = (Arc::clone(&l), name.clone());
    let waiting = tokio::spawn(async move {
        l2.acquire(&n2, AcquireOptions::wait(Duration::from_secs(10)))
            .await
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            contenders(&z, &parent).await.len() == 2
        })
        .await,
        "our contender did not queue"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "granted ahead of the wrapped node");
    z.delete(&wrapped, None).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("granted once the wrapped node is gone")
        .unwrap()
        .unwrap();
    lease.release().await.unwrap();
    assert!(contenders(&z, &parent).await.is_empty());
}
