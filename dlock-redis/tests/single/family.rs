//! The family and the election on one node, beyond the shared scenarios: a family holder
//! deleted from outside is lost at its next renewal (while a mutex lease of the same rounds is
//! kept), and an observer that missed announcements fails instead of skipping them (mutex and
//! family leases renewed in one round trip are `server::many_leases_renew_in_one_request_per_period`'s).

use std::time::Duration;

use dlock_core::{AcquireOptions, Election, ErrorKind, LossReason, RwLocker, Semaphore};
use tokio::time::Instant;

use super::{conn, granted, locker, name, url};

const WAIT: Duration = Duration::from_secs(10);

fn ns(test: &str) -> String {
    format!("dlock-test/redis-family-{}/{test}", std::process::id())
}

/// A read, a write or a permit lease whose entry was deleted from outside is lost at its next
/// renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_deleted_from_outside_is_lost_at_its_next_renewal() {
    let ns = ns("deleted");
    let ttl = Duration::from_millis(900);
    let l = locker(&url(), &ns, ttl).await;
    let leases = [
        l.read(&name("r"), AcquireOptions::wait(WAIT))
            .await
            .expect("read"),
        l.write(&name("w"), AcquireOptions::wait(WAIT))
            .await
            .expect("write"),
        l.acquire_permit(&name("p"), 3, AcquireOptions::wait(WAIT))
            .await
            .expect("permit"),
    ];
    // A mutex lease on the same locker, renewed in the same rounds, stays held.
    let mutex = granted(&l, &name("m"), WAIT, "mutex").await;
    let mut c = conn(&url()).await;
    for lock in ["r", "w", "p"] {
        let deleted: i64 = redis::cmd("DEL")
            .arg(format!("{ns}/dlock:{{{lock}}}:holders"))
            .query_async(&mut c)
            .await
            .expect("DEL");
        assert_eq!(deleted, 1, "{lock}");
    }
    let deleted_at = Instant::now();
    for lease in &leases {
        let reason = tokio::time::timeout(ttl, lease.lost())
            .await
            .expect("lost within one TTL");
        assert!(
            matches!(reason, LossReason::Gone(_)),
            "{}: {reason}",
            lease.name()
        );
    }
    assert!(deleted_at.elapsed() < ttl);
    assert!(
        !mutex.is_lost(),
        "the mutex lease of the same rounds is kept"
    );
    mutex.release().await.expect("release");
    super::nothing_left(&ns).await;
}

/// Announcements trimmed from the stream before an observer read them: its next read fails as
/// `Unavailable` ("missed"), never skipping silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_that_missed_announcements_fails_instead_of_skipping() {
    let ns = ns("gap");
    let l = locker(&url(), &ns, Duration::from_secs(2)).await;
    let name = name("leader");
    let mut changes = l.observe(&name).await.expect("observe");
    let leading = l
        .campaign(&name, b"v1", AcquireOptions::wait(WAIT))
        .await
        .expect("lead");
    let first = tokio::time::timeout(WAIT, changes.next())
        .await
        .expect("in time")
        .expect("first change");
    assert_eq!(first.value, b"v1");
    // Announcements the observer never sees: trimmed from the stream, as MAXLEN would after
    // many changes.
    leading.proclaim(b"v2").await.expect("proclaim");
    let stream = format!("{}dlock:{{leader}}:changes", l.prefix());
    let _: i64 = redis::cmd("XTRIM")
        .arg(&stream)
        .arg("MAXLEN")
        .arg(0)
        .query_async(&mut conn(&url()).await)
        .await
        .expect("trim");
    leading.proclaim(b"v3").await.expect("proclaim");
    let err = tokio::time::timeout(WAIT, changes.next())
        .await
        .expect("in time")
        .expect_err("a change was missed");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("missed"), "{err}");
    leading.resign().await.expect("resign");
}
