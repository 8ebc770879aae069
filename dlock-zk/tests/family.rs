//! `RwLocker` and `Semaphore` on ZooKeeper, beyond the conformance scenarios: Curator's node
//! names, FIFO across modes, permit counts that disagree, and withdrawn requests that leave
//! nothing behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker, RwLocker, Semaphore};
use support::{contenders, eventually, locker, namespace, raw, shared};

const TTL: Duration = Duration::from_secs(2);

fn wait() -> AcquireOptions {
    AcquireOptions::wait(Duration::from_secs(10))
}

/// `_c_<36-char uuid>-<marker><10-digit sequence>`: the marker and the sequence.
fn split_node<'a>(node: &'a str, marker: &str) -> (&'a str, &'a str) {
    let (uuid, seq) = node
        .strip_prefix("_c_")
        .and_then(|rest| rest.split_once(&format!("-{marker}")))
        .unwrap_or_else(|| panic!("{node} is not a protected {marker} node"));
    assert_eq!(uuid.len(), 36, "{node}");
    assert_eq!(seq.len(), 10, "{node}");
    (uuid, seq)
}

/// Read and write nodes are Curator's `InterProcessReadWriteLock` nodes (`__READ__`,
/// `__WRIT__`, protected) in the lock's own parent, and a lease's token is its node's czxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_nodes_are_curator_read_and_write_nodes() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let l = locker(connect, &namespace("rw-layout"), TTL).await;
    let name = LockName::new("layout").unwrap();
    let parent = l.lock_path(&name);
    let z = raw(connect).await;

    let r1 = l.read(&name, wait()).await.unwrap();
    let r2 = l.read(&name, wait()).await.unwrap();
    let kids = contenders(&z, &parent).await;
    assert_eq!(kids.len(), 2, "{kids:?}");
    for node in &kids {
        split_node(node, "__READ__");
        let (_, stat) = z.get_data(&format!("{parent}/{node}")).await.unwrap();
        let czxid = u64::try_from(stat.czxid).unwrap();
        assert!(czxid == r1.token().get() || czxid == r2.token().get());
    }
    r1.release().await.unwrap();
    r2.release().await.unwrap();

    let w = l.write(&name, wait()).await.unwrap();
    let kids = contenders(&z, &parent).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    split_node(&kids[0], "__WRIT__");
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
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let l = locker(connect, &namespace("sem-layout"), TTL).await;
    let name = LockName::new("layout").unwrap();
    let parent = l.lock_path(&name);
    let z = raw(connect).await;
    let a = l.acquire_permit(&name, 2, wait()).await.unwrap();
    let b = l.acquire_permit(&name, 2, wait()).await.unwrap();
    assert!(b.token() > a.token());
    assert!(contenders(&z, &format!("{parent}/locks")).await.is_empty());
    let leases = contenders(&z, &format!("{parent}/leases")).await;
    assert_eq!(leases.len(), 2, "{leases:?}");
    for node in &leases {
        split_node(node, "lease-");
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

/// A reader that arrives while a writer waits queues behind the writer: it is granted only
/// after the writer released, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_a_waiting_writer_waits_for_it() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("rw-fifo");
    let (a, b, d) = (
        locker(connect, &ns, TTL).await,
        locker(connect, &ns, TTL).await,
        locker(connect, &ns, TTL).await,
    );
    let name = LockName::new("fifo").unwrap();
    let parent = a.lock_path(&name);
    let z = raw(connect).await;
    let first = a.read(&name, wait()).await.unwrap();
    let n = name.clone();
    let writer = tokio::spawn(async move { b.write(&n, wait()).await });
    assert!(
        eventually(Duration::from_secs(5), || {
            let (z, p) = (z.clone(), parent.clone());
            async move { contenders(&z, &p).await.len() == 2 }
        })
        .await
    );
    let n = name.clone();
    let reader = tokio::spawn(async move { d.read(&n, wait()).await });
    assert!(
        eventually(Duration::from_secs(5), || {
            let (z, p) = (z.clone(), parent.clone());
            async move { contenders(&z, &p).await.len() == 3 }
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "the writer went while a reader held");
    assert!(
        !reader.is_finished(),
        "a reader behind a waiting writer was granted before it"
    );
    first.release().await.unwrap();
    let w = writer.await.unwrap().expect("the writer is granted");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !reader.is_finished(),
        "a reader was granted while the writer held"
    );
    let w_token = w.token();
    w.release().await.unwrap();
    let r = reader.await.unwrap().expect("the reader is granted");
    assert!(r.token() > w_token);
    r.release().await.unwrap();
}

/// A read or write acquire dropped while it waits leaves no node behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_rw_acquires_leave_no_node() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("rw-dropped");
    let (holder, other) = (
        locker(connect, &ns, TTL).await,
        locker(connect, &ns, TTL).await,
    );
    let other = std::sync::Arc::new(other);
    let name = LockName::new("dropped").unwrap();
    let parent = holder.lock_path(&name);
    let z = raw(connect).await;
    for write_held in [true, false] {
        let held = if write_held {
            holder.write(&name, wait()).await.unwrap()
        } else {
            holder.read(&name, wait()).await.unwrap()
        };
        // A writer queues behind either; a reader only behind a writer.
        let mut modes = vec![true];
        if write_held {
            modes.push(false);
        }
        for write in modes {
            let (o, n) = (std::sync::Arc::clone(&other), name.clone());
            let task = tokio::spawn(async move {
                if write {
                    o.write(&n, wait()).await
                } else {
                    o.read(&n, wait()).await
                }
            });
            assert!(
                eventually(Duration::from_secs(5), || {
                    let (z, p) = (z.clone(), parent.clone());
                    async move { contenders(&z, &p).await.len() == 2 }
                })
                .await,
                "the request (write: {write}) did not queue"
            );
            task.abort();
            assert!(task.await.unwrap_err().is_cancelled());
            assert!(
                eventually(Duration::from_secs(5), || {
                    let (z, p) = (z.clone(), parent.clone());
                    async move { contenders(&z, &p).await.len() == 1 }
                })
                .await,
                "a dropped request (write: {write}, behind a {}) left its node: {:?}",
                if write_held { "writer" } else { "reader" },
                contenders(&z, &parent).await
            );
        }
        held.release().await.unwrap();
    }
    assert!(contenders(&z, &parent).await.is_empty());
}

/// Permit requests dropped while they wait (one holding the guard and waiting for a lease,
/// one waiting for the guard) leave no node behind, and the next acquire goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_permit_acquires_leave_no_node() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("sem-dropped");
    let holder = locker(connect, &ns, TTL).await;
    let name = LockName::new("dropped").unwrap();
    let parent = holder.lock_path(&name);
    let (locks, leases) = (format!("{parent}/locks"), format!("{parent}/leases"));
    let z = raw(connect).await;
    let held = holder.acquire_permit(&name, 1, wait()).await.unwrap();
    let mut tasks = Vec::new();
    for queued in 1..=2 {
        let l = locker(connect, &ns, TTL).await;
        let n = name.clone();
        tasks.push(tokio::spawn(async move {
            l.acquire_permit(&n, 1, wait()).await
        }));
        // The first waiter holds the guard (one node in locks) and waits in leases; the
        // second waits for the guard.
        assert!(
            eventually(Duration::from_secs(5), || {
                let (z, locks, leases) = (z.clone(), locks.clone(), leases.clone());
                async move {
                    contenders(&z, &locks).await.len() == queued
                        && contenders(&z, &leases).await.len() == 2
                }
            })
            .await,
            "waiter {queued} did not queue"
        );
    }
    for task in tasks.into_iter().rev() {
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    assert!(
        eventually(Duration::from_secs(5), || {
            let (z, locks, leases) = (z.clone(), locks.clone(), leases.clone());
            async move {
                contenders(&z, &locks).await.is_empty() && contenders(&z, &leases).await.len() == 1
            }
        })
        .await,
        "dropped permit requests left nodes: locks {:?}, leases {:?}",
        contenders(&z, &locks).await,
        contenders(&z, &leases).await
    );
    held.release().await.unwrap();
    let again = holder.acquire_permit(&name, 1, wait()).await.unwrap();
    again.release().await.unwrap();
}

/// An acquire with another count than the holders' fails with `InvalidInput` and leaves no
/// node; with the holders gone, a new count is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_count_that_differs_from_the_held_one_is_refused() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("sem-count");
    let (a, b) = (
        locker(connect, &ns, TTL).await,
        locker(connect, &ns, TTL).await,
    );
    let name = LockName::new("count").unwrap();
    let parent = a.lock_path(&name);
    let z = raw(connect).await;
    let held = a.acquire_permit(&name, 3, wait()).await.unwrap();
    for other in [1, 2, 4] {
        let e = b
            .acquire_permit(&name, other, wait())
            .await
            .expect_err("a different count must be refused");
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(
            eventually(Duration::from_secs(5), || {
                let (z, p) = (z.clone(), parent.clone());
                async move {
                    contenders(&z, &format!("{p}/locks")).await.is_empty()
                        && contenders(&z, &format!("{p}/leases")).await.len() == 1
                }
            })
            .await,
            "a refused acquire left a node"
        );
    }
    let same = b.acquire_permit(&name, 3, wait()).await.unwrap();
    same.release().await.unwrap();
    held.release().await.unwrap();
    let fresh = b.acquire_permit(&name, 5, wait()).await.unwrap();
    fresh.release().await.unwrap();
}

/// 0 permits (or more than `MAX_PERMITS`) is refused before any request is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_permits_are_refused_without_a_request() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let l = locker(connect, &namespace("sem-zero"), TTL).await;
    let name = LockName::new("zero").unwrap();
    let before = l.stats().requests;
    for bad in [0, dlock_core::MAX_PERMITS + 1] {
        let e = l
            .acquire_permit(&name, bad, wait())
            .await
            .expect_err("must be refused");
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    }
    assert_eq!(l.stats().requests, before, "a request was sent");
}
