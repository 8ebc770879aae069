//! Enqueue replies slower than the request timeout (only the server→client direction): the
//! acquire sends the enqueue again within its wait and finds its own key (the first attempt
//! applied); when the wait ends first, nothing of the acquire stays on the server.

use crate::support;

use std::time::Duration;

use dlock_conformance::faults::{Direction, Mode, Proxy};
use dlock_core::{AcquireOptions, ErrorKind, Lease, LockName, Locker};
use dlock_etcd::EtcdLocker;
use dlock_etcd::etcd_client::GetOptions;
use tokio::time::Instant;

/// The proxied locker's request timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);
/// Scheduling slack on a loaded test machine: the bound is "within the wait", never a hang.
const SLACK: Duration = Duration::from_millis(800);

/// A locker whose link to the single etcd goes through `proxy`, with a short request timeout.
async fn proxied(proxy: &Proxy, ns: &str, ttl: Duration) -> EtcdLocker {
    support::builder(vec![format!("http://{}", proxy.addr())], ns)
        .ttl(ttl)
        .request_timeout(REQUEST_TIMEOUT)
        .build()
        .await
        .expect("build the locker")
}

/// `locker` acquires `name` while every reply comes twice the request timeout late (for three
/// request timeouts): the first request applies at once, its reply comes after the client
/// gave up on it, and it must be sent again within the wait.
async fn acquire_through_late_replies(
    proxy: &Proxy,
    locker: &EtcdLocker,
    name: &LockName,
) -> Lease {
    proxy.set_direction(Direction::Downstream, Mode::Delay(REQUEST_TIMEOUT * 2));
    let acquire =
        support::spawn_acquire(locker, name, AcquireOptions::wait(Duration::from_secs(8)));
    tokio::time::sleep(REQUEST_TIMEOUT * 3).await;
    proxy.set(Mode::Pass);
    acquire
        .await
        .expect("the acquire task")
        .expect("a request without a reply in time is sent again within the wait")
}

/// The keys of `name`'s range, with their create revisions, read past the proxy.
async fn range_keys(direct: &EtcdLocker, name: &LockName) -> Vec<(String, i64)> {
    let range = format!("{}/", direct.etcd_mutex_name(name));
    let mut c = direct.client().clone();
    c.get(range.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .expect("read the range")
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.create_revision(),
            )
        })
        .collect()
}

#[test]
fn late_enqueue_replies_are_retried_and_reuse_our_key() {
    support::on_single("late-enqueue", |cluster, ns| async move {
        let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
        let a = proxied(&proxy, &ns, Duration::from_secs(2)).await;
        support::warm_up(&a).await;
        let direct = support::locker(&cluster, &ns).await;
        let session = a.session_lease().await.expect("a live session");
        let name = support::name("late");
        let lease = acquire_through_late_replies(&proxy, &a, &name).await;
        // The retry found the first attempt's key and kept it: one key, ours, whose create
        // revision is the token.
        let keys = range_keys(&direct, &name).await;
        let ours = format!("{}/{session:x}", a.etcd_mutex_name(&name));
        let token = i64::try_from(lease.token().0).expect("token fits");
        assert_eq!(keys, vec![(ours, token)], "the range holds exactly our key");
        lease.release().await.expect("release");
        assert!(range_keys(&direct, &name).await.is_empty());
    });
}

/// No session yet: the first request of the acquire is the lease grant, and its reply comes
/// late (the lease it granted is never used; it expires).
#[test]
fn late_session_grant_reply_is_retried_within_the_wait() {
    support::on_single("late-session-grant", |cluster, ns| async move {
        let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
        let a = proxied(&proxy, &ns, Duration::from_secs(2)).await;
        let lease = acquire_through_late_replies(&proxy, &a, &support::name("late-session")).await;
        lease.check().expect("held");
        lease.release().await.expect("release");
    });
}

#[test]
fn wait_ending_while_enqueue_replies_are_late_leaves_nothing() {
    support::on_single("late-enqueue-wait-ends", |cluster, ns| async move {
        let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
        // A TTL long enough that the session outlives the delay: only the acquire's own
        // cleanup (or the keep-alive round's reconciling) can remove its key.
        let ttl = Duration::from_secs(5);
        let a = proxied(&proxy, &ns, ttl).await;
        support::warm_up(&a).await;
        let direct = support::locker(&cluster, &ns).await;
        let name = support::name("late");

        // Replies later than the whole wait: the enqueue applies, no reply comes in time.
        let wait = Duration::from_secs(1);
        proxy.set_direction(Direction::Downstream, Mode::Delay(wait * 2));
        let t = Instant::now();
        let err = a
            .acquire(&name, AcquireOptions::wait(wait))
            .await
            .expect_err("no reply within the wait");
        let took = t.elapsed();
        proxy.set(Mode::Pass);
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(took <= wait + SLACK, "took {took:?}");

        // Nothing of it blocks another contender (a's session lives on).
        let lease = direct
            .acquire(&name, AcquireOptions::wait(ttl * 2))
            .await
            .expect("the abandoned acquire's key must not block other contenders");
        let keys = range_keys(&direct, &name).await;
        assert_eq!(keys.len(), 1, "only the contender's key: {keys:?}");
        assert!(a.session_lease().await.is_some(), "a's session ended");
        lease.release().await.expect("release");
    });
}
