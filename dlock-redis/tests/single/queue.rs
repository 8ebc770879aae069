//! The fair queue on one node: the head, not a newcomer, gets a released lock, granted by the
//! release itself (no request of the head's); a head waiter
//! takes over an expired holder on its timer; a crashed head stalls the queue for seconds, not
//! TTLs; a short-TTL waiter never shortens the queue's life; and polling waiters (spin mode,
//! Redlock) write nothing while the lock stays held (a refused attempt must not bump the
//! fencing counter: one write per poll would load the server and its replicas for nothing).

use std::time::Duration;

use dlock_conformance::faults::{Mode, Proxy};
use dlock_core::{AcquireOptions, Error, Locker};
use dlock_redis::{RedisLocker, RedlockLocker};
use tokio::time::Instant;

use super::{acquiring, conn, granted, locker, name, queued, shared, url};

/// A fair waiter whose holder crashed (key left to expire, no release message) gets the lock
/// through its timer at the holder's expiry, not a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_waiter_takes_over_an_expired_holder() {
    let ttl = Duration::from_secs(1);
    let ns = "dlock-test/single/expired";
    let holder = locker(&url(), ns, ttl).await;
    let waiter = locker(&url(), ns, ttl).await;
    let lease = holder
        .acquire(&name("e"), AcquireOptions::forever())
        .await
        .expect("acquire");
    lease.stop_renewal_for_test();
    let began = Instant::now();
    let got = granted(&waiter, &name("e"), ttl * 3, "the waiter takes over").await;
    let took = began.elapsed();
    assert!(took < ttl + Duration::from_millis(300), "took {took:?}");
    assert!(lease.is_lost());
    let wakeups = waiter.stats().wakeups;
    assert!(wakeups <= 3, "{wakeups} wakeups: the waiter polled");
    got.release().await.expect("release");
    drop(lease);
}

/// A release with waiters queued reserves the lock for the head: a newcomer's `try_acquire`
/// right after the release never barges in, and the head gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_head_not_to_a_newcomer() {
    let ns = "dlock-test/single/no-barging";
    let build = async || locker(&url(), ns, Duration::from_secs(2)).await;
    let (holder, waiter, newcomer) = (build().await, build().await, build().await);
    let mut conn = conn(&url()).await;
    let lock = name("handoff");
    let queue = format!("{ns}/dlock:{{handoff}}:q");
    for round in 0..20 {
        let held = granted(&holder, &lock, Duration::from_secs(5), "holder acquires").await;
        let waiting = acquiring(&waiter, &lock, AcquireOptions::wait(Duration::from_secs(5)));
        queued(&mut conn, &queue, 1).await;
        held.release().await.expect("release");
        let barged = newcomer.try_acquire(&lock).await.expect("try_acquire");
        assert!(
            barged.is_none(),
            "round {round}: a newcomer took the lock from the queued head"
        );
        let got = waiting
            .await
            .expect("join")
            .expect("the head gets the lock");
        got.release().await.expect("release");
    }
}

/// A release with a live head waiter grants the lock to it in the release script itself: the
/// head, woken by the release, gets its lease without sending a request of its own (only its
/// own timer, or a renewal, may send one meanwhile), and its token is above the holder's. At
/// the lab's TTL (2 s), the bench's and etcd's and ZooKeeper's default (10 s) and Redis's
/// default (30 s): the queue entry's lifetime caps the grant at 3 s whatever the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_head_without_a_request_of_its_own() {
    for secs in [2, 10, 30] {
        direct_grant_at(Duration::from_secs(secs)).await;
    }
}

async fn direct_grant_at(ttl: Duration) {
    let ns = &format!("dlock-test/single/direct-grant-{}", ttl.as_secs());
    let build = async || locker(&url(), ns, ttl).await;
    let (holder, waiter) = (build().await, build().await);
    let mut conn = conn(&url()).await;
    let lock = name("direct");
    let queue = format!("{ns}/dlock:{{direct}}:q");
    // Round 0 only warms up: the waiter's notification channel is subscribed at its first wait,
    // and a subscription wakes every waiter to look again (an attempt of its own).
    for round in 0..6 {
        let held = granted(&holder, &lock, Duration::from_secs(5), "holder acquires").await;
        let waiting = acquiring(&waiter, &lock, AcquireOptions::wait(Duration::from_secs(5)));
        queued(&mut conn, &queue, 1).await;
        let before = waiter.stats();
        let held_token = held.token();
        held.release().await.expect("release");
        let got = waiting
            .await
            .expect("join")
            .expect("the head gets the lock");
        // A renewal may be sent meanwhile: its request is counted when sent, the renewal when
        // answered, so look until they agree.
        let settled = Instant::now() + Duration::from_secs(2);
        let (requests, allowed) = loop {
            let after = waiter.stats();
            let requests = after.requests - before.requests;
            let allowed =
                (after.timer_wakeups - before.timer_wakeups) + (after.renewals - before.renewals);
            if requests <= allowed || Instant::now() >= settled {
                break (requests, allowed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            round == 0 || requests <= allowed,
            "TTL {ttl:?}, round {round}: the head sent {requests} requests to take a released \
             lock ({allowed} timer wake-ups and renewals)"
        );
        assert!(
            got.token() > held_token,
            "round {round}: tokens must increase"
        );
        if round == 5 {
            // Held past the validity the handed-over grant started with: renewed, not lost.
            let first = got.deadline();
            tokio::time::sleep_until(first + Duration::from_millis(500)).await;
            assert!(
                got.check().is_ok() && got.deadline() > first,
                "TTL {ttl:?}: the handed-over lease was not renewed past its first deadline"
            );
        }
        got.release().await.expect("release");
    }
}

/// A release's grant to the queue's head is announced over pub/sub, which may arrive late. If
/// the head meanwhile sent another queued attempt (its timer fired first), that attempt may
/// have found the announced grant expired and someone else holding the lock: the late
/// announcement must not be taken then. Here the holder holds throughout; the test publishes,
/// on the waiter's own channel, the announcement an earlier release would have sent (the
/// waiter's entry and owner value as the queue stores them, from before its last attempt).
/// The waiter must keep waiting, and get the lock only from the holder's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_announced_before_the_heads_last_attempt_is_not_taken() {
    let ns = "dlock-test/single/stale-grant";
    let ttl = Duration::from_secs(10);
    let (holder, waiter) = (locker(&url(), ns, ttl).await, locker(&url(), ns, ttl).await);
    let mut conn = conn(&url()).await;
    let lock = name("stale");
    let queue = format!("{ns}/dlock:{{stale}}:q");
    let deadlines = format!("{queue}t");
    let held = granted(&holder, &lock, Duration::from_secs(5), "holder acquires").await;
    let waiting = acquiring(
        &waiter,
        &lock,
        AcquireOptions::wait(Duration::from_secs(20)),
    );
    let entry = queued(&mut conn, &queue, 1).await.remove(0);
    // What the head's last attempt left for a release: `<ttl ms>:<owner>[:<attempt>]`.
    let details: String = redis::cmd("HGET")
        .arg(&deadlines)
        .arg(format!("g:{entry}"))
        .query_async(&mut conn)
        .await
        .expect("HGET");
    let mut fields = details.split(':').skip(1);
    let owner = fields.next().expect("an owner value");
    // An attempt before the last one (the first is numbered 1).
    let earlier = fields.next().map(|n| {
        n.parse::<u64>()
            .expect("an attempt number")
            .saturating_sub(1)
    });
    let locker_id = entry.split('.').next().expect("a locker id");
    let token = held.token().0 + 1;
    let message = match earlier {
        Some(n) => format!("{entry} {token} {owner} {n}"),
        None => format!("{entry} {token} {owner}"),
    };
    let receivers: i64 = redis::cmd("PUBLISH")
        .arg(format!("{ns}/dlock:notify:{locker_id}"))
        .arg(&message)
        .query_async(&mut conn)
        .await
        .expect("PUBLISH");
    assert_eq!(receivers, 1, "the waiter's locker listens on its channel");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter took a grant announced before its last attempt while the holder holds: {:?}",
        waiting.await
    );
    assert!(held.check().is_ok(), "the holder still holds");
    let held_token = held.token();
    held.release().await.expect("release");
    let got = waiting
        .await
        .expect("join")
        .expect("the waiter gets the lock from the release");
    assert!(got.token() > held_token, "tokens must increase");
    got.release().await.expect("release");
}

/// The bound on how long a crashed head waiter can stall the queue after a release: its
/// entry's lifetime (3 s) plus the next waiter's refresh period (1 s), both independent of the
/// TTL, plus 2 s of scheduling slack for a loaded host.
const CRASHED_HEAD_STALL_BOUND: Duration = Duration::from_secs(6);

/// A waiter at the head of the queue crashes (here: its link goes silent), then the holder
/// releases, reserving the lock for that dead head. With a 30 s TTL, the next waiter must
/// still get the lock within a few seconds, not after one or more TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_head_stalls_the_queue_for_seconds_not_ttls() {
    let cluster = shared();
    let url = cluster.endpoints().remove(0);
    let ns = "dlock-test/fair/crashed-head";
    let ttl = Duration::from_secs(30);
    let lock = name("stall");
    let queue = format!("{ns}/dlock:{{stall}}:q");
    let mut conn = conn(&url).await;
    let holder = locker(&url, ns, ttl).await;
    let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
    let doomed = locker(&format!("redis://{}", proxy.addr()), ns, ttl).await;
    let next = locker(&url, ns, ttl).await;
    let held = granted(&holder, &lock, Duration::from_secs(5), "holder acquires").await;
    let crashed = acquiring(&doomed, &lock, AcquireOptions::forever());
    queued(&mut conn, &queue, 1).await;
    proxy.set(Mode::Blackhole);
    let waiting = acquiring(&next, &lock, AcquireOptions::wait(Duration::from_secs(40)));
    queued(&mut conn, &queue, 2).await;
    held.release().await.expect("release");
    let released = Instant::now();
    let got = waiting
        .await
        .expect("join")
        .expect("the next waiter gets the lock");
    let stalled = released.elapsed();
    crashed.abort();
    got.release().await.expect("release");
    assert!(
        stalled <= CRASHED_HEAD_STALL_BOUND,
        "a crashed head stalled the queue for {stalled:?} (TTL {ttl:?})"
    );
}

/// A locker with a short TTL queueing on a name never shortens the queue keys' life below a
/// long-TTL waiter's entry deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_ttl_waiter_never_shortens_the_queue() {
    let url = shared().endpoints().remove(0);
    let ns = "dlock-test/fair/mixed-ttl";
    let lock = name("mixed");
    let queue = format!("{ns}/dlock:{{mixed}}:q");
    let deadlines = format!("{ns}/dlock:{{mixed}}:qt");
    let mut conn = conn(&url).await;
    let long = Duration::from_secs(30);
    let holder = locker(&url, ns, long).await;
    let patient = locker(&url, ns, long).await;
    let hasty = locker(&url, ns, Duration::from_millis(200)).await;
    let held = granted(&holder, &lock, Duration::from_secs(5), "holder acquires").await;
    let waiting = acquiring(
        &patient,
        &lock,
        AcquireOptions::wait(Duration::from_secs(20)),
    );
    let first = queued(&mut conn, &queue, 1).await.remove(0);
    let short = acquiring(&hasty, &lock, AcquireOptions::wait(Duration::from_secs(5)));
    queued(&mut conn, &queue, 2).await;
    // One MULTI: the server's clock, the entry's deadline and both keys' TTLs, read at one
    // instant (separate reads let the clock move on between them under load).
    let ((secs, micros), entry_deadline, ttls): ((u64, u64), u64, [i64; 2]) = {
        let (time, deadline, q_ttl, qt_ttl): ((u64, u64), u64, i64, i64) = redis::pipe()
            .atomic()
            .cmd("TIME")
            .cmd("HGET")
            .arg(&deadlines)
            .arg(&first)
            .cmd("PTTL")
            .arg(&queue)
            .cmd("PTTL")
            .arg(&deadlines)
            .query_async(&mut conn)
            .await
            .expect("MULTI TIME HGET PTTL PTTL");
        (time, deadline, [q_ttl, qt_ttl])
    };
    let now_ms = secs * 1000 + micros / 1000;
    for (key, pttl) in [&queue, &deadlines].into_iter().zip(ttls) {
        // Both round to milliseconds: 2 ms of slack.
        let expires = now_ms + u64::try_from(pttl).unwrap_or(0) + 2;
        assert!(
            pttl == -1 || expires >= entry_deadline,
            "{key} expires {} ms before the long-TTL waiter's entry",
            entry_deadline.saturating_sub(expires)
        );
    }
    short.abort();
    held.release().await.expect("release");
    let got = waiting
        .await
        .expect("join")
        .expect("the patient waiter gets the lock");
    got.release().await.expect("release");
}

/// The fencing counter on `url`.
async fn fence(url: &str, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn(url).await)
        .await
        .expect("GET")
}

/// Many failed polls of `waiter` while `holder` holds the lock `held` (both under `ns`) leave
/// every node's fence as the grant left it.
async fn polls_leave_the_fence_alone(
    holder: &dyn Locker,
    waiter: &dyn Locker,
    urls: &[String],
    ns: &str,
) {
    let lock = name("held");
    let fence_key = &format!("{ns}/dlock:{{held}}:fence");
    let lease = granted(holder, &lock, Duration::from_secs(5), "holder acquires").await;
    let mut before = Vec::new();
    for url in urls {
        before.push(fence(url, fence_key).await);
    }
    let polls_before = waiter.stats().requests;
    let got = waiter
        .acquire(&lock, AcquireOptions::wait(Duration::from_millis(400)))
        .await;
    assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
    let polls = waiter.stats().requests - polls_before;
    assert!(polls >= 5, "only {polls} polls: the test proves nothing");
    for (url, was) in urls.iter().zip(before) {
        assert_eq!(
            fence(url, fence_key).await,
            was,
            "{polls} failed polls changed the fence on {url}"
        );
    }
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spin_mode_polls_do_not_write() {
    let url = url();
    let ns = "dlock-test/polling/spin";
    let build = async || {
        RedisLocker::builder()
            .url(&url)
            .ttl(Duration::from_secs(2))
            .fair(false)
            .retry_delay(Duration::from_millis(10))
            .namespace(ns)
            .build()
            .await
            .expect("builds")
    };
    let (holder, waiter) = (build().await, build().await);
    polls_leave_the_fence_alone(&holder, &waiter, std::slice::from_ref(&url), ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_polls_do_not_write() {
    let cluster = dlock_conformance::servers::Cluster::shared(
        dlock_conformance::servers::ServerKind::Redis,
        3,
    )
    .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let urls = cluster.endpoints();
    let ns = "dlock-test/polling/redlock";
    let build = async || {
        RedlockLocker::builder()
            .nodes(urls.clone())
            .ttl(Duration::from_secs(2))
            .retry_delay(Duration::from_millis(10))
            .namespace(ns)
            .build()
            .await
            .expect("builds")
    };
    let (holder, waiter) = (build().await, build().await);
    polls_leave_the_fence_alone(&holder, &waiter, &urls, ns).await;
}
