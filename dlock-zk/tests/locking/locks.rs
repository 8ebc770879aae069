//! The mutex on ZooKeeper, beyond the conformance scenarios: Curator's node layout, the token
//! as the node's czxid, the node's payload and what `inspect` shows of it, session expiry,
//! builder checks, protected create, and a Curator-style peer on the same path.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, Error, Lease, LockName, Locker, LossReason};
use dlock_zk::ZkLocker;

use crate::TTL;
use crate::support::{Zk, contenders, eventually, expire_session, protected, raw};

fn wait() -> AcquireOptions {
    AcquireOptions::wait(Duration::from_secs(5))
}

/// `l` takes `name` (free): its lease, its node's full path, and what the node stores.
async fn hold(zk: &Zk, l: &ZkLocker, name: &LockName) -> (Lease, String, Vec<u8>) {
    let parent = l.lock_path(name);
    let lease = l.acquire(name, wait()).await.unwrap();
    let kids = contenders(&zk.raw().await, &parent).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    let node = format!("{parent}/{}", kids[0]);
    let (data, _) = zk.raw().await.get_data(&node).await.unwrap();
    (lease, node, data)
}

/// The node is Curator's `InterProcessMutex` node, owned by the locker's session; the token is
/// its czxid; the locker is not re-entrant; a release deletes the node and a new grant has a
/// higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_layout_token_and_release() {
    let Some(zk) = Zk::new("layout") else { return };
    let l = zk.locker(TTL).await;
    assert!(l.negotiated_timeout() >= Duration::from_millis(100));
    assert_eq!(l.ttl(), l.negotiated_timeout());
    let name = LockName::new("orders/42").unwrap();
    let parent = l.lock_path(&name);
    assert!(parent.ends_with("/orders%2F42"), "{parent}");

    let lease = l.acquire(&name, wait()).await.unwrap();
    assert!(l.try_acquire(&name).await.unwrap().is_none(), "re-entrant");
    let z = zk.raw().await;
    let kids = contenders(&z, &parent).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    protected(&kids[0], "lock-");
    let stat = z
        .check_stat(&format!("{parent}/{}", kids[0]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease.token().get(), u64::try_from(stat.czxid).unwrap());
    assert_eq!(stat.ephemeral_owner, l.session_id().unwrap());

    let first = lease.token();
    lease.release().await.unwrap();
    assert!(contenders(&z, &parent).await.is_empty());
    let again = l.acquire(&name, wait()).await.unwrap();
    assert!(again.token() > first, "tokens increase");
    again.release().await.unwrap();
}

/// A lock node holds `host=… pid=… locker=…`, text that operators' tools (and Curator-side
/// tools) can display.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_node_names_host_pid_and_locker() {
    let Some(zk) = Zk::new("payload") else { return };
    let l = zk.locker(TTL).await;
    let (lease, _, data) = hold(&zk, &l, &LockName::new("who").unwrap()).await;
    let text = String::from_utf8(data).expect("the payload is text");
    let f: Vec<(&str, &str)> = text.split(' ').filter_map(|f| f.split_once('=')).collect();
    let keys: Vec<&str> = f.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, ["host", "pid", "locker"], "payload {text:?}");
    assert!(!f[0].1.is_empty(), "no host in {text:?}");
    assert_eq!(f[1].1, std::process::id().to_string(), "payload {text:?}");
    assert_eq!(f[2].1, l.locker_id(), "payload {text:?}");
    lease.release().await.unwrap();
}

/// `inspect` shows the holder's node (its full path) and what it stores, read from the server
/// by another locker: what the conformance scenario cannot see (it checks only the token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_holder_node_and_its_payload() {
    let Some(zk) = Zk::new("payload-inspect") else {
        return;
    };
    let (l, eye) = (zk.locker(TTL).await, zk.locker(TTL).await);
    let name = LockName::new("shown").unwrap();
    let (lease, node, data) = hold(&zk, &l, &name).await;
    let state = eye.inspect(&name).await.unwrap();
    let holder = state.holder.expect("a holder");
    assert_eq!(holder.entry, node);
    assert_eq!(holder.value.as_bytes(), data.as_slice());
    assert!(holder.value.ends_with(&format!("locker={}", l.locker_id())));
    assert_eq!(holder.token, Some(lease.token()));
    assert_eq!(holder.expires_within, None);
    assert_eq!(state.waiting, Some(0));
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_loses_every_lease_and_a_new_session_follows() {
    let Some(zk) = Zk::new("expiry") else { return };
    let (l, proxy) = zk.proxied(TTL).await;
    let n1 = LockName::new("x1").unwrap();
    let n2 = LockName::new("x2").unwrap();
    let a = l.acquire(&n1, AcquireOptions::forever()).await.unwrap();
    let b = l.acquire(&n2, AcquireOptions::forever()).await.unwrap();
    let old = l.session_id().unwrap();
    let (la, lb) = (a.lost(), b.lost());
    expire_session(&l, &zk.connect, &proxy, &l.lock_path(&n1)).await;
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
    let again = l.acquire(&n1, wait()).await.unwrap();
    assert_ne!(l.session_id().unwrap(), old, "a new session was opened");
    assert!(again.token() > a.token());
    again.release().await.unwrap();
    drop((a, b));
}

/// The builder's own checks (the TTL's is core's) fail before any I/O: there is no server at
/// these addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_rejected_before_io() {
    let at = |connect: &str| ZkLocker::builder().connect_string(connect);
    for (builder, option) in [
        (at("127.0.0.1:1").ttl(Duration::ZERO), "ttl"),
        (at("nohostport"), "connect"),
        (at("127.0.0.1:1").prefix("/zookeeper"), "prefix"),
    ] {
        let err = builder.build().await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidOption { option: o, .. } if o == option),
            "{option}: {err}"
        );
    }
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
    let err = ZkLocker::builder()
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
    let Some(zk) = Zk::new("protected") else {
        return;
    };
    let (l, name, parent, z) = zk.on_lock("p", TTL).await;
    let lease = l.acquire(&name, AcquireOptions::forever()).await.unwrap();
    let ours = contenders(&z, &parent).await.pop().unwrap();
    let uuid = protected(&ours, "lock-").0;
    let found = l.recover_protected_for_test(&name, uuid).await.unwrap();
    let (path, czxid) = found.expect("our own node is found");
    assert_eq!(path, format!("{parent}/{ours}"));
    assert_eq!(u64::try_from(czxid).unwrap(), lease.token().get());

    // An "older session" (another session) left a node with the uuid we are recovering. The
    // session stays open to the end: its node is ephemeral.
    let stale_uuid = "00000000-0000-4000-8000-000000000000";
    let older = zk.raw().await;
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
    let Some(zk) = Zk::new("interop") else { return };
    let l = zk.locker(TTL).await;
    let name = LockName::new("shared/resource").unwrap();
    let parent = l.lock_path(&name);
    let peer = zk.raw().await;
    let options = || {
        zookeeper_client::LockOptions::new(zookeeper_client::Acls::anyone_all())
            .with_ancestor_options(
                zookeeper_client::CreateMode::Persistent
                    .with_acls(zookeeper_client::Acls::anyone_all()),
            )
            .unwrap()
    };
    let prefix = || zookeeper_client::LockPrefix::new_curator(&parent, "lock-").unwrap();

    // We hold: the peer must wait.
    let ours = l.acquire(&name, AcquireOptions::forever()).await.unwrap();
    let blocked = tokio::time::timeout(
        Duration::from_millis(500),
        peer.lock(prefix(), b"", options()),
    )
    .await;
    assert!(blocked.is_err(), "the peer got the lock while we hold it");
    assert!(
        eventually(Duration::from_secs(2), || async {
            contenders(&raw(&zk.connect).await, &parent).await.len() == 1
        })
        .await,
        "the cancelled peer removed its node"
    );
    ours.release().await.unwrap();

    // The peer holds: we must not get it.
    let held = peer.lock(prefix(), b"", options()).await.unwrap();
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
