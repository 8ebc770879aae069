//! `RwLocker` and `Semaphore` on ZooKeeper, beyond the conformance scenarios: Curator's node
//! names and what the nodes hold.

use crate::support::{Zk, contenders, protected};
use crate::{TTL, wait};
use dlock_core::{RwLocker, Semaphore};

/// Read and write nodes are Curator's `InterProcessReadWriteLock` nodes (`__READ__`,
/// `__WRIT__`, protected) in the lock's own parent, and a lease's token is its node's czxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_nodes_are_curator_read_and_write_nodes() {
    let Some(zk) = Zk::new("rw-layout") else {
        return;
    };
    let (l, name, parent, z) = zk.on_lock("layout", TTL).await;

    let r1 = l.read(&name, wait()).await.unwrap();
    let r2 = l.read(&name, wait()).await.unwrap();
    let kids = contenders(&z, &parent).await;
    assert_eq!(kids.len(), 2, "{kids:?}");
    for node in &kids {
        protected(node, "__READ__");
        let (_, stat) = z.get_data(&format!("{parent}/{node}")).await.unwrap();
        let czxid = u64::try_from(stat.czxid).unwrap();
        assert!(czxid == r1.token().get() || czxid == r2.token().get());
    }
    r1.release().await.unwrap();
    r2.release().await.unwrap();

    let w = l.write(&name, wait()).await.unwrap();
    let kids = contenders(&z, &parent).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    protected(&kids[0], "__WRIT__");
    let (data, stat) = z.get_data(&format!("{parent}/{}", kids[0])).await.unwrap();
    assert_eq!(w.token().get(), u64::try_from(stat.czxid).unwrap());
    assert!(String::from_utf8_lossy(&data).contains(l.locker_id()));
    w.release().await.unwrap();
    assert!(contenders(&z, &parent).await.is_empty());
}

/// A semaphore uses `InterProcessSemaphoreV2`'s layout: `locks` (empty once nobody
/// acquires) and `leases` with one `lease-` node per permit, recording the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_nodes_are_curator_lease_nodes() {
    let Some(zk) = Zk::new("sem-layout") else {
        return;
    };
    let (l, name, parent, z) = zk.on_lock("layout", TTL).await;
    let a = l.acquire_permit(&name, 2, wait()).await.unwrap();
    let b = l.acquire_permit(&name, 2, wait()).await.unwrap();
    assert!(b.token() > a.token());
    assert!(contenders(&z, &format!("{parent}/locks")).await.is_empty());
    let leases = contenders(&z, &format!("{parent}/leases")).await;
    assert_eq!(leases.len(), 2, "{leases:?}");
    for node in &leases {
        protected(node, "lease-");
        let (data, _) = z
            .get_data(&format!("{parent}/leases/{node}"))
            .await
            .unwrap();
        let data = String::from_utf8_lossy(&data).into_owned();
        assert!(data.ends_with(" permits=2"), "{data}");
    }
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert!(contenders(&z, &format!("{parent}/leases")).await.is_empty());
}
