//! Behaviour of the ZooKeeper locker against a real server: layout, fencing, cleanup, herd,
//! session loss.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock_conformance::faults::Proxy;
use dlock_core::{AcquireOptions, Error, LockName, Locker, LossReason};
use support::{contenders, eventually, expire_session, locker, namespace, raw, shared};

const TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_layout_token_and_release() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("layout");
    let l = locker(connect, &ns, TTL).await;
    assert!(l.negotiated_timeout() >= Duration::from_millis(100));
    assert_eq!(l.ttl(), l.negotiated_timeout());
    let name = LockName::new("orders/42").unwrap();
    let parent = l.lock_path(&name);
    assert!(parent.ends_with("/orders%2F42"), "{parent}");

    let lease = l
        .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    let z = raw(connect).await;
    let kids = contenders(&z, &parent).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    let node = &kids[0];
    assert!(
        node.starts_with("_c_") && node.contains("-lock-"),
        "Curator layout: {node}"
    );
    let stat = z
        .check_stat(&format!("{parent}/{node}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        lease.token().get(),
        u64::try_from(stat.czxid).unwrap(),
        "token = czxid"
    );
    assert_eq!(stat.ephemeral_owner, l.session_id().unwrap());

    let first = lease.token();
    lease.release().await.unwrap();
    assert!(contenders(&z, &parent).await.is_empty());
    let again = l
        .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(again.token() > first, "tokens increase");
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_on_held_leaves_nothing() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("try");
    let a = locker(connect, &ns, TTL).await;
    let b = locker(connect, &ns, TTL).await;
    let name = LockName::new("t").unwrap();
    let held = a
        .try_acquire(&name)
        .await
        .unwrap()
        .expect("free lock is granted");
    assert!(b.try_acquire(&name).await.unwrap().is_none());
    assert!(
        a.try_acquire(&name).await.unwrap().is_none(),
        "not re-entrant"
    );
    let z = raw(connect).await;
    assert_eq!(
        contenders(&z, &a.lock_path(&name)).await.len(),
        1,
        "failed tries removed their nodes"
    );
    held.release().await.unwrap();
    let got = b
        .try_acquire(&name)
        .await
        .unwrap()
        .expect("free after release");
    got.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_and_cancel_leave_nothing() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("cancel");
    let a = locker(connect, &ns, TTL).await;
    let b = Arc::new(locker(connect, &ns, TTL).await);
    let name = LockName::new("c").unwrap();
    let parent = a.lock_path(&name);
    let held = a.acquire(&name, AcquireOptions::forever()).await.unwrap();

    let err = b
        .acquire(&name, AcquireOptions::wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    let z = raw(connect).await;
    assert_eq!(
        contenders(&z, &parent).await.len(),
        1,
        "timed-out waiter removed its node"
    );

    let b2 = Arc::clone(&b);
    let n2 = name.clone();
    let waiter = tokio::spawn(async move { b2.acquire(&n2, AcquireOptions::forever()).await });
    assert!(
        eventually(Duration::from_secs(5), || async {
            contenders(&z, &parent).await.len() == 2
        })
        .await
    );
    waiter.abort();
    assert!(
        eventually(Duration::from_secs(5), || async {
            contenders(&z, &parent).await.len() == 1
        })
        .await,
        "cancelled waiter's node must be removed"
    );
    held.release().await.unwrap();
    assert!(contenders(&z, &parent).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_fifo_and_one_wakeup_per_release() {
    let Some(c) = shared(1) else { return };
    let connect = c.endpoints()[0].clone();
    let ns = namespace("mutex");
    let name = LockName::new("m").unwrap();
    const WORKERS: usize = 6;
    const ROUNDS: usize = 10;
    let mut lockers = Vec::new();
    for _ in 0..WORKERS {
        lockers.push(Arc::new(locker(&connect, &ns, TTL).await));
    }
    let inside = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicU64::new(0));
    let fence = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for l in &lockers {
        let (l, name, inside, violations, fence) = (
            Arc::clone(l),
            name.clone(),
            Arc::clone(&inside),
            Arc::clone(&violations),
            Arc::clone(&fence),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lease = l
                    .acquire(&name, AcquireOptions::wait(Duration::from_secs(20)))
                    .await
                    .unwrap();
                if inside.swap(true, Ordering::SeqCst) {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                let t = lease.token().get();
                if fence.fetch_max(t, Ordering::SeqCst) >= t {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.store(false, Ordering::SeqCst);
                lease.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    let (mut grants, mut wakeups, mut waits) = (0, 0, 0);
    for l in &lockers {
        let s = l.stats();
        grants += s.grants;
        wakeups += s.wakeups;
        waits += s.waits;
    }
    assert_eq!(grants, (WORKERS * ROUNDS) as u64);
    // Each release wakes at most its one successor (a waiter also wakes when its predecessor
    // left the queue, which is also a release of that node).
    assert!(
        wakeups <= grants,
        "wakeups {wakeups} > grants {grants}: herd effect"
    );
    assert!(waits > 0, "the test must contend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_isolated() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("iso");
    let l = locker(connect, &ns, TTL).await;
    let a = l
        .try_acquire(&LockName::new("a").unwrap())
        .await
        .unwrap()
        .unwrap();
    let ab = l.try_acquire(&LockName::new("a/b").unwrap()).await.unwrap();
    let abare = l.try_acquire(&LockName::new("ab").unwrap()).await.unwrap();
    assert!(ab.is_some() && abare.is_some());
    for x in [Some(a), ab, abare].into_iter().flatten() {
        x.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_loses_every_lease_and_a_new_session_follows() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("expiry");
    let proxy = Proxy::start(c.addrs()[0]).unwrap();
    let l = locker(&proxy.addr().to_string(), &ns, TTL).await;
    let n1 = LockName::new("x1").unwrap();
    let n2 = LockName::new("x2").unwrap();
    let a = l.acquire(&n1, AcquireOptions::forever()).await.unwrap();
    let b = l.acquire(&n2, AcquireOptions::forever()).await.unwrap();
    let old = l.session_id().unwrap();
    let (la, lb) = (a.lost(), b.lost());
    expire_session(&l, connect, &proxy, &l.lock_path(&n1)).await;
    // The client hears of the expiry when it reconnects; either the session end or the local
    // timer (whichever comes first) declares the loss, within the TTL.
    let ra = tokio::time::timeout(TTL, la).await.expect("lost fires");
    let rb = tokio::time::timeout(TTL, lb).await.expect("lost fires");
    for r in [&ra, &rb] {
        assert!(
            matches!(r, LossReason::SessionEnded(_) | LossReason::Expired),
            "{r:?}"
        );
    }
    assert!(a.check().is_err());
    let again = l
        .acquire(&n1, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_ne!(l.session_id().unwrap(), old, "a new session was opened");
    assert!(again.token() > a.token());
    again.release().await.unwrap();
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_lease_past_several_ttls() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("renew");
    let l = locker(connect, &ns, Duration::from_millis(800)).await;
    let ttl = l.negotiated_timeout();
    let lease = l
        .acquire(&LockName::new("r").unwrap(), AcquireOptions::forever())
        .await
        .unwrap();
    tokio::time::sleep(ttl * 4).await;
    lease.check().unwrap();
    assert!(l.stats().renewals >= 3, "{:?}", l.stats());
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_rejected_before_io() {
    // No server at this address: only validation can answer.
    let err = dlock_zk::ZkLocker::builder()
        .connect_string("127.0.0.1:1")
        .ttl(Duration::ZERO)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidOption { option: "ttl", .. }),
        "{err}"
    );
    let err = dlock_zk::ZkLocker::builder()
        .connect_string("nohostport")
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOption {
                option: "connect",
                ..
            }
        ),
        "{err}"
    );
    let err = dlock_zk::ZkLocker::builder()
        .connect_string("127.0.0.1:1")
        .prefix("/zookeeper")
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOption {
                option: "prefix",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_ensemble_is_unavailable() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let err = dlock_zk::ZkLocker::builder()
        .connect_string(format!("127.0.0.1:{port}"))
        .ttl(Duration::from_secs(1))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A create whose reply was lost is recovered by its uuid: our own node is adopted (same
/// czxid), a node with our uuid left by ANOTHER (older) session is deleted, never adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_create_adopts_only_our_session_and_deletes_older_ones() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("protected");
    let l = locker(connect, &ns, TTL).await;
    let name = LockName::new("p").unwrap();
    let parent = l.lock_path(&name);
    let lease = l.acquire(&name, AcquireOptions::forever()).await.unwrap();
    let z = raw(connect).await;
    let ours = contenders(&z, &parent).await.pop().unwrap();
    let uuid = ours
        .strip_prefix("_c_")
        .unwrap()
        .split("-lock-")
        .next()
        .unwrap()
        .to_owned();
    let found = l.recover_protected_for_test(&name, &uuid).await.unwrap();
    let (path, czxid) = found.expect("our own node is found");
    assert_eq!(path, format!("{parent}/{ours}"));
    assert_eq!(u64::try_from(czxid).unwrap(), lease.token().get());

    // An "older session" (another session) left a node with the uuid we are recovering.
    let stale_uuid = "00000000-0000-4000-8000-000000000000";
    let older = raw(connect).await;
    older
        .create(
            &format!("{parent}/_c_{stale_uuid}-lock-"),
            b"",
            &zookeeper_client::CreateMode::EphemeralSequential
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    assert_eq!(contenders(&z, &parent).await.len(), 2);
    let found = l
        .recover_protected_for_test(&name, stale_uuid)
        .await
        .unwrap();
    assert!(
        found.is_none(),
        "a node of another session must never be adopted: {found:?}"
    );
    let left = contenders(&z, &parent).await;
    assert_eq!(left, vec![ours], "the other session's node was deleted");
    lease.check().unwrap();
    lease.release().await.unwrap();
}

/// Interop: zookeeper-client's Curator-style lock recipe (`_c_<uuid>-lock-` under the same
/// parent, as Curator's InterProcessMutex lays it out) and this locker exclude each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excludes_a_curator_style_peer_on_the_same_path() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("interop");
    let l = locker(connect, &ns, TTL).await;
    let name = LockName::new("shared/resource").unwrap();
    let parent = l.lock_path(&name);
    let peer = raw(connect).await;
    let options = || {
        zookeeper_client::LockOptions::new(zookeeper_client::Acls::anyone_all())
            .with_ancestor_options(
                zookeeper_client::CreateMode::Persistent
                    .with_acls(zookeeper_client::Acls::anyone_all()),
            )
            .unwrap()
    };

    // We hold: the peer must wait.
    let ours = l.acquire(&name, AcquireOptions::forever()).await.unwrap();
    let prefix = zookeeper_client::LockPrefix::new_curator(&parent, "lock-").unwrap();
    let blocked = tokio::time::timeout(
        Duration::from_millis(500),
        peer.lock(prefix, b"", options()),
    )
    .await;
    assert!(blocked.is_err(), "the peer got the lock while we hold it");
    assert!(
        eventually(Duration::from_secs(2), || async {
            contenders(&raw(connect).await, &parent).await.len() == 1
        })
        .await,
        "the cancelled peer removed its node"
    );
    ours.release().await.unwrap();

    // The peer holds: we must not get it.
    let prefix = zookeeper_client::LockPrefix::new_curator(&parent, "lock-").unwrap();
    let held = peer.lock(prefix, b"", options()).await.unwrap();
    assert!(
        l.try_acquire(&name).await.unwrap().is_none(),
        "we got the lock while the peer holds it"
    );
    let err = l
        .acquire(&name, AcquireOptions::wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    let (l2, n2) = (Arc::new(l), name.clone());
    let l3 = Arc::clone(&l2);
    let waiting = tokio::spawn(async move {
        l3.acquire(&n2, AcquireOptions::wait(Duration::from_secs(10)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    peer.delete(held.lock_path(), None).await.unwrap();
    std::mem::forget(held);
    let got = waiting.await.unwrap().unwrap();
    got.release().await.unwrap();
    drop(l2);
}
