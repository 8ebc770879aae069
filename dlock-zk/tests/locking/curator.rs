//! Interop with real Curator recipes (Apache Curator 5, Debian's `libcurator-recipes-java`):
//! a Java peer (`tests/curator/CuratorPeer.java`, see `support::java`) contends with dlock on
//! the very path `ZkLocker::lock_path` names, both ways, for `LeaderLatch`,
//! `InterProcessReadWriteLock` and `InterProcessSemaphoreV2`. Each side must see the other's
//! nodes: a holder on one side keeps the other side out (a short wait elapses), and the waiter
//! is granted once the holder lets go.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    AcquireOptions, Election, Error, FencingToken, Leader, LeaderChanges, RwLocker, Semaphore,
};
use dlock_zk::ZkLocker;
use tokio::task::JoinHandle;

use crate::support::java::{Curator, curator};
use crate::support::{
    OnLock, Zk, children_become, contenders, eventually, kept_out, leader, next_change, node_of,
};

const TTL: Duration = Duration::from_secs(4);
/// How long a reply of the peer may take (a JVM starting on a loaded machine, a long wait).
const REPLY: Duration = Duration::from_secs(90);
/// A wait that must elapse, in milliseconds (the peer's unit).
const SHORT_MS: u64 = 1_500;
/// A wait that must elapse.
const SHORT: Duration = Duration::from_millis(SHORT_MS);
/// A wait that must end in a grant, in milliseconds.
const LONG_MS: u64 = 60_000;
/// A wait that must end in a grant.
const LONG: Duration = Duration::from_millis(LONG_MS);

/// The test `test` on the lock `lock` of the shared server: the server, the compiled peer,
/// and [`Zk::on_lock`]'s locker, lock, parent node and plain session; `None` (printed) when
/// the server or the peer is missing outside CI.
async fn setup(test: &str, lock: &str) -> Option<(Zk, &'static Curator, OnLock)> {
    let zk = Zk::new(test)?;
    let curator = curator()?;
    let on_lock = zk.on_lock(lock, TTL).await;
    Some((zk, curator, on_lock))
}

/// Waits until `parent` has exactly `n` children.
async fn queued(z: &zookeeper_client::Client, parent: &str, n: usize) {
    let ok = children_become(z, parent, n, Duration::from_secs(30)).await;
    assert!(ok, "{parent} never had {n} children: {:?}", {
        contenders(z, parent).await
    });
}

/// Waits until the session `session` has a node under `parent` (a dlock waiter is queued).
async fn queued_by(z: &zookeeper_client::Client, parent: &str, session: i64) {
    let ok = eventually(Duration::from_secs(30), || async move {
        node_of(z, parent, session).await.is_some()
    })
    .await;
    assert!(ok, "session {session:#x} never queued under {parent}");
}

async fn next(changes: &mut Box<dyn LeaderChanges>) -> Leader {
    next_change(changes, Duration::from_secs(30)).await
}

/// Runs a dlock request of `b` in a task and returns it once the request queued under
/// `parent` (a node of `b`'s session there, `n` children in all).
async fn waiter<T: Send + 'static, F: Future<Output = Result<T, Error>> + Send + 'static>(
    z: &zookeeper_client::Client,
    parent: &str,
    n: usize,
    b: &Arc<ZkLocker>,
    request: impl FnOnce(Arc<ZkLocker>) -> F,
) -> JoinHandle<Result<T, Error>> {
    let session = b.session_id().expect("a session");
    let task = tokio::spawn(request(Arc::clone(b)));
    queued_by(z, parent, session).await;
    queued(z, parent, n).await;
    task
}

/// What the request of [`waiter`] was granted, once `what` happened.
async fn granted<T>(task: JoinHandle<Result<T, Error>>, what: &str) -> T {
    let got = tokio::time::timeout(REPLY, task).await;
    let got = got.unwrap_or_else(|_| panic!("not granted once {what}"));
    got.unwrap()
        .unwrap_or_else(|e| panic!("not granted once {what}: {e}"))
}

/// The term and value dlock must report for the node `node` of `parent`: its czxid and data.
async fn leader_of(z: &zookeeper_client::Client, parent: &str, node: &str) -> Leader {
    let (value, stat) = z.get_data(&format!("{parent}/{node}")).await.unwrap();
    leader(FencingToken(u64::try_from(stat.czxid).unwrap()), &value)
}

/// A Curator `LeaderLatch` leads: dlock reads and observes it (its participant id is the
/// value), a dlock campaign waits behind it, and wins once the latch closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latch_a_curator_leader_keeps_dlock_campaigns_waiting_until_it_closes() {
    let Some((zk, curator, (l, name, path, z))) = setup("curator-latch-java-leads", "latch").await
    else {
        return;
    };
    let b = Arc::new(zk.locker(TTL).await);
    let mut java = curator.spawn(&zk.connect, &["latch", &path]).await;
    assert_eq!(java.ask("start j java-1", REPLY).await, "STARTED j");
    assert_eq!(
        java.ask(&format!("await j {LONG_MS}"), REPLY).await,
        "LEADER j"
    );

    // dlock sees the Curator leader: its node's czxid, its participant id as the value.
    let kids = contenders(&z, &path).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    assert!(kids[0].contains("-latch-"), "{kids:?}");
    let java_leader = leader_of(&z, &path, &kids[0]).await;
    assert_eq!(java_leader.value, b"java-1");
    assert_eq!(l.leader(&name).await.unwrap(), Some(java_leader.clone()));
    let mut changes = l.observe(&name).await.unwrap();
    assert_eq!(next(&mut changes).await, java_leader);

    // A dlock campaign cannot win while the latch leads...
    kept_out(
        l.campaign(&name, b"dlock-a", AcquireOptions::wait(SHORT))
            .await,
        "dlock led while the Curator latch did",
    );

    // ...and one that waits wins once the latch closes, not before.
    let n = name.clone();
    let waiting = waiter(&z, &path, 2, &b, |b| async move {
        b.campaign(&n, b"dlock-b", AcquireOptions::wait(LONG)).await
    })
    .await;
    assert!(
        !waiting.is_finished(),
        "dlock led while the Curator latch did"
    );
    assert_eq!(
        java.ask("state j", REPLY).await,
        "STATE j has=true gained=1 lost=0"
    );
    assert_eq!(java.ask("close j", REPLY).await, "CLOSED j");
    let lead = granted(waiting, "the latch closed").await;
    assert!(lead.term() > java_leader.term);
    let dlock_leader = leader(lead.term(), b"dlock-b");
    assert_eq!(next(&mut changes).await, dlock_leader);
    assert_eq!(l.leader(&name).await.unwrap(), Some(dlock_leader));
    lead.resign().await.unwrap();
    java.quit(REPLY).await;
}

/// dlock leads: a Curator `LeaderLatch` started behind it names dlock's campaign value as the
/// leader's participant id and does not lead (`hasLeadership()` false, no `isLeader` callback)
/// until dlock resigns, even after dlock proclaimed; then it leads, and dlock reads and
/// observes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latch_a_dlock_leader_keeps_a_curator_latch_out_until_it_resigns() {
    let Some((zk, curator, (l, name, path, z))) = setup("curator-latch-dlock-leads", "latch").await
    else {
        return;
    };
    let lead = l
        .campaign(&name, b"dlock-1", AcquireOptions::wait(LONG))
        .await
        .unwrap();
    let mut changes = l.observe(&name).await.unwrap();
    let dlock_leader = leader(lead.term(), b"dlock-1");
    assert_eq!(next(&mut changes).await, dlock_leader);

    let mut java = curator.spawn(&zk.connect, &["latch", &path]).await;
    assert_eq!(java.ask("start j java-2", REPLY).await, "STARTED j");
    assert_eq!(
        java.ask(&format!("await j {SHORT_MS}"), REPLY).await,
        "TIMEOUT j"
    );
    queued(&z, &path, 2).await;
    assert_eq!(
        java.ask("leader j", REPLY).await,
        "LEADER_ID j dlock-1",
        "Curator names dlock's leader"
    );
    assert_eq!(
        java.ask("state j", REPLY).await,
        "STATE j has=false gained=0 lost=0"
    );
    assert_eq!(l.leader(&name).await.unwrap(), Some(dlock_leader.clone()));
    // A proclamation goes to the parent's record, which dlock reads and Curator does not: the
    // leader's node keeps the value it campaigned with (writing it would use up the data watch
    // of the Curator latch behind it, which then never notices the resignation).
    lead.proclaim(b"dlock-2").await.unwrap();
    let dlock_leader = leader(lead.term(), b"dlock-2");
    assert_eq!(next(&mut changes).await, dlock_leader);
    assert_eq!(l.leader(&name).await.unwrap(), Some(dlock_leader.clone()));
    assert_eq!(java.ask("leader j", REPLY).await, "LEADER_ID j dlock-1");
    assert_eq!(
        java.ask("state j", REPLY).await,
        "STATE j has=false gained=0 lost=0"
    );

    lead.resign().await.unwrap();
    assert_eq!(
        java.ask(&format!("await j {LONG_MS}"), REPLY).await,
        "LEADER j"
    );
    assert_eq!(
        java.ask("state j", REPLY).await,
        "STATE j has=true gained=1 lost=0"
    );
    assert_eq!(java.ask("leader j", REPLY).await, "LEADER_ID j java-2");
    let java_leader = next(&mut changes).await;
    assert_eq!(java_leader.value, b"java-2");
    assert!(java_leader.term > dlock_leader.term);
    let kids = contenders(&z, &path).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    assert_eq!(java_leader, leader_of(&z, &path, &kids[0]).await);
    assert_eq!(l.leader(&name).await.unwrap(), Some(java_leader));
    assert_eq!(java.ask("close j", REPLY).await, "CLOSED j");
    java.quit(REPLY).await;
}

/// A Curator `InterProcessReadWriteLock` write lock keeps dlock readers and writers out; a
/// waiting dlock reader is granted once Curator releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_a_curator_writer_keeps_dlock_readers_and_writers_out() {
    let Some((zk, curator, (l, name, path, z))) = setup("curator-rw-java-writes", "rw").await
    else {
        return;
    };
    let b = Arc::new(zk.locker(TTL).await);
    let mut java = curator.spawn(&zk.connect, &["rw", &path]).await;
    assert_eq!(
        java.ask(&format!("write w {LONG_MS}"), REPLY).await,
        "ACQUIRED w"
    );
    let kids = contenders(&z, &path).await;
    assert!(
        kids.len() == 1 && kids[0].contains("__WRIT__"),
        "Curator's write node: {kids:?}"
    );

    kept_out(
        l.read(&name, AcquireOptions::wait(SHORT)).await,
        "dlock read while Curator wrote",
    );
    kept_out(
        l.write(&name, AcquireOptions::wait(SHORT)).await,
        "dlock wrote while Curator wrote",
    );

    let n = name.clone();
    let waiting = waiter(&z, &path, 2, &b, |b| async move {
        b.read(&n, AcquireOptions::wait(LONG)).await
    })
    .await;
    assert!(!waiting.is_finished(), "dlock read while Curator wrote");
    assert_eq!(java.ask("release w", REPLY).await, "RELEASED w");
    let read = granted(waiting, "Curator released").await;
    read.release().await.unwrap();
    assert!(contenders(&z, &path).await.is_empty());
    java.quit(REPLY).await;
}

/// A dlock write lease keeps Curator readers and writers out (their `acquire(time)` fails); a
/// waiting Curator reader is granted once dlock releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_a_dlock_writer_keeps_curator_readers_and_writers_out() {
    let Some((zk, curator, (l, name, path, z))) = setup("curator-rw-dlock-writes", "rw").await
    else {
        return;
    };
    let w = l.write(&name, AcquireOptions::wait(LONG)).await.unwrap();
    let mut java = curator.spawn(&zk.connect, &["rw", &path]).await;
    assert_eq!(
        java.ask(&format!("read r {SHORT_MS}"), REPLY).await,
        "TIMEOUT r",
        "Curator read while dlock wrote"
    );
    assert_eq!(
        java.ask(&format!("write x {SHORT_MS}"), REPLY).await,
        "TIMEOUT x",
        "Curator wrote while dlock wrote"
    );
    // Curator removed the nodes of its timed-out attempts.
    queued(&z, &path, 1).await;

    java.send(&format!("read r2 {LONG_MS}"));
    queued(&z, &path, 2).await;
    assert_eq!(java.printed(), None, "Curator read while dlock wrote");
    w.release().await.unwrap();
    assert_eq!(java.reply(REPLY).await, "ACQUIRED r2");
    assert_eq!(java.ask("release r2", REPLY).await, "RELEASED r2");
    queued(&z, &path, 0).await;
    java.quit(REPLY).await;
}

/// Curator and dlock readers hold the lock at once, whoever came first; a dlock writer waits
/// for both, and a Curator reader arriving behind that waiting writer queues behind it (FIFO
/// across modes holds across the two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_curator_and_dlock_readers_share_and_queue_behind_a_waiting_writer() {
    let Some((zk, curator, (l, name, path, z))) = setup("curator-rw-readers", "rw").await else {
        return;
    };
    let b = Arc::new(zk.locker(TTL).await);
    let mut java = curator.spawn(&zk.connect, &["rw", &path]).await;
    assert_eq!(
        java.ask(&format!("read r1 {LONG_MS}"), REPLY).await,
        "ACQUIRED r1"
    );
    // A dlock reader joins a Curator reader...
    let read = tokio::time::timeout(REPLY, l.read(&name, AcquireOptions::wait(LONG)))
        .await
        .expect("dlock reads beside Curator")
        .expect("dlock reads beside Curator");
    // ...and a Curator reader joins a dlock reader.
    assert_eq!(
        java.ask(&format!("read r2 {LONG_MS}"), REPLY).await,
        "ACQUIRED r2"
    );
    let kids = contenders(&z, &path).await;
    assert!(
        kids.len() == 3 && kids.iter().all(|k| k.contains("__READ__")),
        "three read nodes: {kids:?}"
    );

    // A writer of either side waits for the readers of both.
    assert_eq!(
        java.ask(&format!("write x {SHORT_MS}"), REPLY).await,
        "TIMEOUT x",
        "Curator wrote while readers held"
    );
    let n = name.clone();
    let writer = waiter(&z, &path, 4, &b, |b| async move {
        b.write(&n, AcquireOptions::wait(LONG)).await
    })
    .await;
    // A Curator reader behind the waiting dlock writer waits too.
    assert_eq!(
        java.ask(&format!("read r3 {SHORT_MS}"), REPLY).await,
        "TIMEOUT r3",
        "a Curator reader overtook a waiting dlock writer"
    );
    assert!(!writer.is_finished(), "dlock wrote while readers held");

    assert_eq!(java.ask("release r1", REPLY).await, "RELEASED r1");
    assert_eq!(java.ask("release r2", REPLY).await, "RELEASED r2");
    read.release().await.unwrap();
    let w = granted(writer, "the readers left").await;
    w.release().await.unwrap();
    queued(&z, &path, 0).await;
    java.quit(REPLY).await;
}

/// A Curator `InterProcessSemaphoreV2` with 3 leases and dlock's semaphore with 3 permits on
/// one path share the 3: Curator holds 2 and dlock takes the third; a 4th request from either
/// side is kept out; a waiting dlock request is granted when Curator returns a lease, a
/// waiting Curator request when dlock returns a permit; a request of either side waits for the
/// other side's guard (`locks`); never more than 3 lease nodes are held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_curator_and_dlock_share_the_permits() {
    const N: u32 = 3;
    let Some((zk, curator, (l, name, path, z))) = setup("curator-semaphore", "pool").await else {
        return;
    };
    let b = Arc::new(zk.locker(TTL).await);
    let leases = format!("{path}/leases");
    let locks = format!("{path}/locks");
    let mut java = curator
        .spawn(&zk.connect, &["semaphore", &path, &N.to_string()])
        .await;
    for h in ["a", "b"] {
        assert_eq!(
            java.ask(&format!("acquire {h} {LONG_MS}"), REPLY).await,
            format!("ACQUIRED {h}")
        );
    }
    let p1 = tokio::time::timeout(
        REPLY,
        l.acquire_permit(&name, N, AcquireOptions::wait(LONG)),
    )
    .await
    .expect("dlock takes the third permit")
    .expect("dlock takes the third permit");
    assert_eq!(contenders(&z, &leases).await.len(), 3);

    // All 3 are held: a 4th from either side is kept out.
    assert_eq!(
        java.ask(&format!("acquire c {SHORT_MS}"), REPLY).await,
        "TIMEOUT c",
        "Curator took a 4th permit"
    );
    kept_out(
        l.acquire_permit(&name, N, AcquireOptions::wait(SHORT))
            .await,
        "dlock took a 4th permit",
    );
    queued(&z, &leases, 3).await;
    queued(&z, &locks, 0).await;

    // A waiting dlock request is granted when Curator returns a lease.
    let n = name.clone();
    let waiting = waiter(&z, &leases, 4, &b, |b| async move {
        b.acquire_permit(&n, N, AcquireOptions::wait(LONG)).await
    })
    .await;
    // It holds the guard meanwhile: a Curator request waits for it in `locks`.
    assert_eq!(
        java.ask(&format!("acquire c {SHORT_MS}"), REPLY).await,
        "TIMEOUT c",
        "Curator passed dlock's guard"
    );
    assert_eq!(contenders(&z, &locks).await.len(), 1);
    assert!(!waiting.is_finished(), "dlock took a 4th permit");
    assert_eq!(java.ask("release a", REPLY).await, "RELEASED a");
    let p2 = granted(waiting, "Curator returned a lease").await;
    assert!(p2.token() > p1.token());
    queued(&z, &leases, 3).await;

    // A waiting Curator request is granted when dlock returns a permit.
    java.send(&format!("acquire d {LONG_MS}"));
    queued(&z, &leases, 4).await;
    // It holds the guard meanwhile: a dlock request waits for it in `locks`.
    kept_out(
        l.acquire_permit(&name, N, AcquireOptions::wait(SHORT))
            .await,
        "dlock passed Curator's guard",
    );
    assert_eq!(contenders(&z, &locks).await.len(), 1);
    assert_eq!(java.printed(), None, "Curator took a 4th permit");
    p1.release().await.unwrap();
    assert_eq!(java.reply(REPLY).await, "ACQUIRED d");
    assert_eq!(contenders(&z, &leases).await.len(), 3);

    for h in ["b", "d"] {
        assert_eq!(
            java.ask(&format!("release {h}"), REPLY).await,
            format!("RELEASED {h}")
        );
    }
    p2.release().await.unwrap();
    queued(&z, &leases, 0).await;
    java.quit(REPLY).await;
}
