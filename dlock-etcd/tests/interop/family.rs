//! The read-write lock and the semaphore on etcd: the edges the conformance scenarios
//! (`family_edges`, `family_cancel`, …) do not reach: a refused count's key, a foreign count,
//! permits released out of order, one locker's several requests, the key layout, and a writer
//! of etcd's recipes `RWMutex`.

use crate::support;

use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, RwLocker, Semaphore};

const WAIT: Duration = Duration::from_secs(10);

fn wait() -> AcquireOptions {
    AcquireOptions::wait(WAIT)
}

/// Issue 8: a permit key refused for its count must never be seen by others. Before the fix it
/// was created, then deleted once its owner read the refusal: in between, with the holder
/// gone, it was the earliest key and a correct acquire was refused with the wrong count's
/// reason (and another client of the wrong count would have been admitted).
#[test]
fn a_refused_permit_count_is_never_seen_by_correct_acquires() {
    use dlock_conformance::faults::{Direction, Mode, Proxy};
    support::on_single("sem-refused-window", |cluster, ns| async move {
        let holder = support::locker(&cluster, &ns).await;
        let correct = support::locker(&cluster, &ns).await;
        // The wrong-count client's requests reach etcd 1 s late: its refused key (if it is
        // created) lives a second before its delete lands.
        let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
        let wrong = support::builder(vec![format!("http://{}", proxy.addr())], &ns)
            .request_timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("build the proxied locker");
        let name = support::name("pool");
        // Open the wrong client's session before the delay.
        support::warm_up(&wrong).await;
        let held = holder
            .acquire_permit(&name, 1, wait())
            .await
            .expect("the permit");
        proxy.set_direction(Direction::Upstream, Mode::Delay(Duration::from_secs(1)));
        let (w, n) = (wrong.clone(), name.clone());
        let refused = tokio::spawn(async move { w.acquire_permit(&n, 2, wait()).await });
        // Wait until the refused key is in the range, or the refusal came without one.
        let permit_keys =
            |keys: Vec<String>| keys.into_iter().filter(|k| k.contains("/permit/")).count();
        let began = tokio::time::Instant::now();
        while permit_keys(support::keys_under(&correct, &ns).await) < 2 && !refused.is_finished() {
            assert!(
                began.elapsed() < WAIT,
                "the wrong count's acquire never ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        held.release().await.expect("release");
        let granted = correct.acquire_permit(&name, 1, wait()).await;
        let refused = refused.await.expect("task");
        proxy.set_direction(Direction::Upstream, Mode::Pass);
        assert_eq!(
            refused.as_ref().err().map(dlock_core::Error::kind),
            Some(ErrorKind::InvalidInput),
            "{refused:?}"
        );
        let granted = granted.expect("a correct count is served whatever a refused one did");
        granted.release().await.expect("release");
        support::assert_no_keys(&holder, &ns).await;
    });
}

/// A later permit key with another count (one a client that does not guard its put left)
/// does not refuse a count the earliest key agrees with: the enqueue falls back to a put
/// guarded by the earliest key.
#[test]
fn a_later_key_with_another_count_does_not_refuse_the_earliest_count() {
    support::on_single("sem-foreign-count", |cluster, ns| async move {
        let a = support::locker(&cluster, &ns).await;
        let name = support::name("pool");
        let held = a.acquire_permit(&name, 3, wait()).await.expect("a permit");
        let keys = support::keys_under(&a, &ns).await;
        let range = keys[0]
            .rsplit_once("/permit/")
            .map(|(base, _)| format!("{base}/permit/"))
            .expect("a permit key");
        let mut c = a.client().clone();
        let foreign = format!("{range}ffffffff/foreign");
        c.put(foreign.as_str(), "5", None)
            .await
            .expect("put a foreign key");
        let b = support::locker(&cluster, &ns).await;
        let second = b
            .acquire_permit(&name, 3, wait())
            .await
            .expect("the earliest key agrees: 2 of 3 ahead, granted");
        c.delete(foreign.as_str(), None).await.expect("delete");
        for lease in [second, held] {
            lease.release().await.expect("release");
        }
        support::assert_no_keys(&a, &ns).await;
    });
}

/// Permits are released in any order: a waiter gets in when ANY holder releases, not only
/// the earliest.
#[test]
fn a_permit_waiter_gets_in_when_any_holder_releases() {
    support::on_single("sem-any-order", |cluster, ns| async move {
        let lockers = [
            support::locker(&cluster, &ns).await,
            support::locker(&cluster, &ns).await,
            support::locker(&cluster, &ns).await,
        ];
        let name = support::name("pool");
        let oldest = lockers[0]
            .acquire_permit(&name, 2, wait())
            .await
            .expect("1 of 2");
        let newer = lockers[1]
            .acquire_permit(&name, 2, wait())
            .await
            .expect("2 of 2");
        let (l, n) = (lockers[2].clone(), name.clone());
        let waiting = tokio::spawn(async move { l.acquire_permit(&n, 2, wait()).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "a third permit of 2");
        let newer_token = newer.token();
        newer.release().await.expect("release the newer permit");
        let third = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("the waiter got in after the newer holder released")
            .expect("task")
            .expect("permit");
        assert!(third.token() > newer_token);
        third.release().await.expect("release");
        oldest.release().await.expect("release");
        support::assert_no_keys(&lockers[0], &ns).await;
    });
}

/// The keys lie where etcd's recipes `RWMutex` (created with `etcd_mutex_name`) puts its own,
/// and the permit keys apart from the mutex's (one name is one primitive: the names differ):
/// `<sub-range><request number hex>/<session lease hex>`.
#[test]
fn keys_follow_the_documented_layout() {
    support::on_single("family-layout", |cluster, ns| async move {
        let locker = support::locker(&cluster, &ns).await;
        let rw = support::name("a/b");
        let sem = support::name("c");
        let read = locker.read(&rw, wait()).await.expect("read");
        let permit = locker
            .acquire_permit(&sem, 4, wait())
            .await
            .expect("permit");
        let lease = locker.session_lease().await.expect("a session");
        let (rw_base, sem_base) = (locker.etcd_mutex_name(&rw), locker.etcd_mutex_name(&sem));
        let is_key = |key: &str, sub: &str| {
            key.strip_prefix(sub)
                .and_then(|rest| rest.strip_suffix(&format!("/{lease:x}")))
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_hexdigit()))
        };
        let keys = support::keys_under(&locker, &ns).await;
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(is_key(&keys[0], &format!("{rw_base}/read/")), "{keys:?}");
        assert!(is_key(&keys[1], &format!("{sem_base}/permit/")), "{keys:?}");
        let value = locker
            .client()
            .clone()
            .get(keys[1].as_str(), None)
            .await
            .expect("read the permit key");
        assert_eq!(value.kvs().first().map(|kv| kv.value()), Some(&b"4"[..]));
        read.release().await.expect("release");
        let write = locker.write(&rw, wait()).await.expect("write");
        let keys = support::keys_under(&locker, &ns).await;
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(is_key(&keys[0], &format!("{rw_base}/write/")), "{keys:?}");
        write.release().await.expect("release");
        permit.release().await.expect("release");
        support::assert_no_keys(&locker, &ns).await;
    });
}

/// Requests of one locker have keys of their own: it holds several reads, or several
/// permits, of one name at once, and its own writer waits for its readers.
#[test]
fn one_locker_holds_several_reads_and_permits() {
    support::on_single("family-one-locker", |cluster, ns| async move {
        let locker = support::locker(&cluster, &ns).await;
        let rw = support::name("doc");
        let quick = AcquireOptions::wait(Duration::from_secs(2));
        let r1 = locker.read(&rw, quick).await.expect("read 1");
        let r2 = locker.read(&rw, quick).await.expect("read 2 beside read 1");
        support::kept_out(
            locker
                .write(&rw, AcquireOptions::wait(Duration::from_millis(300)))
                .await,
            "its own writer beside its readers",
        );
        let sem = support::name("pool");
        let p1 = locker.acquire_permit(&sem, 2, quick).await.expect("1 of 2");
        let p2 = locker.acquire_permit(&sem, 2, quick).await.expect("2 of 2");
        support::kept_out(
            locker
                .acquire_permit(&sem, 2, AcquireOptions::wait(Duration::from_millis(300)))
                .await,
            "a third permit of 2",
        );
        for lease in [r1, r2, p1, p2] {
            lease.release().await.expect("release");
        }
        let w = locker
            .write(&rw, quick)
            .await
            .expect("write once the reads are gone");
        w.release().await.expect("release");
        support::assert_no_keys(&locker, &ns).await;
    });
}

/// A writer of etcd's recipes `RWMutex` (its key `<pfx>/write/<nanos>`, put here by hand on a
/// lease of its own) holds the name: dlock's readers and writers wait for it, and get in once
/// it is deleted.
#[test]
fn a_recipes_rwmutex_writer_key_blocks_dlock_readers_and_writers() {
    support::on_single("family-recipes", |cluster, ns| async move {
        let (r, w) = (
            support::locker(&cluster, &ns).await,
            support::locker(&cluster, &ns).await,
        );
        let name = support::name("doc");
        let foreign = format!("{}/write/1700000000000000000", r.etcd_mutex_name(&name));
        let mut c = r.client().clone();
        let put = c
            .put(foreign.as_str(), "", None)
            .await
            .expect("the recipe's key");
        let foreign_rev = put.header().map(|h| h.revision()).expect("a header");
        let (rl, n) = (r.clone(), name.clone());
        let reading = tokio::spawn(async move { rl.read(&n, wait()).await });
        // The reader queues first, the writer behind it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (wl, n) = (w.clone(), name.clone());
        let writing = tokio::spawn(async move { wl.write(&n, wait()).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !reading.is_finished(),
            "a reader beside the recipe's writer"
        );
        assert!(
            !writing.is_finished(),
            "a writer beside the recipe's writer"
        );
        c.delete(foreign.as_str(), None)
            .await
            .expect("the recipe unlocks");
        let read = reading.await.expect("task").expect("read");
        assert!(read.token().get() > foreign_rev.unsigned_abs());
        read.release().await.expect("release");
        let write = writing.await.expect("task").expect("write");
        write.release().await.expect("release");
        support::assert_no_keys(&r, &ns).await;
    });
}
