//! The renewal driver against a scripted fake backend, on tokio's paused clock.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Counters, RenewBackend, Renewal, RenewalDriver};
use dlock_core::{Error, FencingToken, Lease, LockName, LossReason};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Script {
    /// Every renewal succeeds at once.
    Ok,
    /// Every renewal fails.
    Fail,
    /// Every renewal succeeds after this delay.
    Slow(Duration),
    /// Every renewal says the lease is gone.
    Gone,
    /// Every renewal succeeds at once, proven only until its send instant + this.
    Capped(Duration),
}

struct Fake {
    script: Mutex<Script>,
    /// (send instant, entries) of every renew call.
    calls: Mutex<Vec<(Instant, Vec<u32>)>>,
    releases: AtomicUsize,
    /// Entries answered with `Renewal::Retry` while listed.
    undecided: Mutex<HashSet<u32>>,
    /// A call holding one of these entries takes this long (before the script applies).
    slow: Mutex<HashMap<u32, Duration>>,
    /// `renew` panics while set.
    panics: AtomicBool,
    /// Answers `abandon_slow_rounds` with `false` while set (a backend answering in order).
    in_order: AtomicBool,
}

impl Fake {
    fn new(script: Script) -> Arc<Self> {
        Arc::new(Fake {
            script: Mutex::new(script),
            calls: Mutex::new(Vec::new()),
            releases: AtomicUsize::new(0),
            undecided: Mutex::new(HashSet::new()),
            slow: Mutex::new(HashMap::new()),
            panics: AtomicBool::new(false),
            in_order: AtomicBool::new(false),
        })
    }
    fn set(&self, s: Script) {
        *self.script.lock().expect("lock") = s;
    }
    fn calls(&self) -> Vec<(Instant, Vec<u32>)> {
        self.calls.lock().expect("lock").clone()
    }
    /// The send instants of the calls that renewed `entry`.
    fn calls_with(&self, entry: u32) -> Vec<Instant> {
        self.calls()
            .into_iter()
            .filter(|(_, e)| e.contains(&entry))
            .map(|(t, _)| t)
            .collect()
    }
    fn undecided(&self, entry: u32, on: bool) {
        let mut set = self.undecided.lock().expect("lock");
        if on {
            set.insert(entry);
        } else {
            set.remove(&entry);
        }
    }
    fn slow(&self, entry: u32, d: Duration) {
        self.slow.lock().expect("lock").insert(entry, d);
    }
}

#[async_trait]
impl RenewBackend for Fake {
    type Entry = u32;

    async fn renew(&self, entries: &[Arc<u32>]) -> Result<Vec<Renewal>, Error> {
        let ids: Vec<u32> = entries.iter().map(|e| **e).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        {
            let mut calls = self.calls.lock().expect("lock");
            // A driver stuck in a loop of rounds would otherwise hang the test.
            assert!(calls.len() < 20_000, "runaway renewal loop");
            calls.push((Instant::now(), sorted));
        }
        assert!(
            !self.panics.load(Ordering::SeqCst),
            "scripted panic in renew"
        );
        let delay = {
            let slow = self.slow.lock().expect("lock");
            ids.iter().filter_map(|e| slow.get(e)).max().copied()
        };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let script = *self.script.lock().expect("lock");
        let sent = Instant::now();
        let extended = || {
            let undecided = self.undecided.lock().expect("lock");
            ids.iter()
                .map(|e| match script {
                    _ if undecided.contains(e) => Renewal::Retry,
                    Script::Capped(proof) => Renewal::ExtendedUntil(sent + proof),
                    _ => Renewal::Extended,
                })
                .collect()
        };
        match script {
            Script::Ok | Script::Capped(_) => Ok(extended()),
            Script::Fail => Err(Error::unavailable("scripted failure", None)),
            Script::Slow(d) => {
                tokio::time::sleep(d).await;
                Ok(extended())
            }
            Script::Gone => Ok(vec![
                Renewal::Lost(LossReason::Gone("scripted".into()));
                entries.len()
            ]),
        }
    }

    async fn release(&self, _entry: &u32) -> Result<(), Error> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn abandon_slow_rounds(&self) -> bool {
        !self.in_order.load(Ordering::SeqCst)
    }

    fn is_internal(&self, entry: &u32) -> bool {
        *entry >= INTERNAL
    }
}

/// Entries from this one up are the fake backend's own bookkeeping (like a session sentinel).
const INTERNAL: u32 = 1000;

fn driver(fake: &Arc<Fake>) -> RenewalDriver<Fake> {
    RenewalDriver::new(Arc::clone(fake), TTL, Arc::new(Counters::default()))
}

/// A fake backend following `script`, and a driver over it.
fn fake_driver(script: Script) -> (Arc<Fake>, RenewalDriver<Fake>) {
    let fake = Fake::new(script);
    let d = driver(&fake);
    (fake, d)
}

/// As [`fake_driver`], with the driver's counters.
fn counted_driver(script: Script) -> (Arc<Fake>, RenewalDriver<Fake>, Arc<Counters>) {
    let fake = Fake::new(script);
    let counters = Arc::new(Counters::default());
    let d = RenewalDriver::new(Arc::clone(&fake), TTL, Arc::clone(&counters));
    (fake, d, counters)
}

/// Registers a grant of the lock `job` with fencing token `token`, whose request started at
/// `start`, renewed as the fake's `entry`.
fn grant(d: &RenewalDriver<Fake>, token: u64, start: Instant, entry: u32) -> Lease {
    d.register(name(), FencingToken(token), start, entry)
}

/// Releases every lease, each of which must succeed.
async fn release_all(leases: impl IntoIterator<Item = Lease>) {
    for lease in leases {
        lease.release().await.expect("release");
    }
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

fn name() -> LockName {
    LockName::new("job").expect("valid")
}

fn drift() -> Duration {
    dlock_core::backend::drift(TTL)
}

/// How long before its deadline a lease that was not extended counts as lost.
fn margin() -> Duration {
    dlock_core::backend::loss_margin(TTL)
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl() {
    let (fake, d) = fake_driver(Script::Ok);
    let t0 = Instant::now();
    let lease = grant(&d, 1, t0, 7);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls = fake.calls();
    // One round per TTL/3 = 1 s: rounds at 1 s, 2 s, …, 10 s.
    assert!((9..=10).contains(&calls.len()), "calls: {}", calls.len());
    for pair in calls.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, TTL / 3, "cadence");
    }
    assert!(!lease.is_lost());
    lease.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn deadline_counts_from_the_request_start_not_the_reply() {
    let (fake, d) = fake_driver(Script::Slow(Duration::from_millis(400)));
    let t0 = Instant::now();
    let lease = grant(&d, 1, t0, 7);
    assert_eq!(lease.deadline(), t0 + TTL - drift());
    // First round is sent at t0 + 1 s and answered 400 ms later.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sent = fake.calls()[0].0;
    assert_eq!(sent, t0 + TTL / 3);
    assert_eq!(
        lease.deadline(),
        sent + TTL - drift(),
        "deadline must count from the send time"
    );
    lease.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn a_capped_extension_moves_the_deadline_only_to_its_bound_and_renews_in_time() {
    // Proven for half the TTL only: the deadline is the bound less the drift, not send + TTL.
    let (fake, d) = fake_driver(Script::Capped(TTL / 2));
    let t0 = Instant::now();
    let lease = grant(&d, 1, t0, 7);
    tokio::time::sleep(TTL / 3 + Duration::from_millis(1)).await;
    let sent = fake.calls()[0].0;
    assert_eq!(lease.deadline(), t0 + TTL - drift(), "never moved back");
    tokio::time::sleep(TTL / 3).await;
    let calls = fake.calls_with(7);
    let last = *calls.last().expect("renewed");
    assert!(calls.len() >= 2, "calls: {calls:?}");
    assert_eq!(
        lease.deadline(),
        last + TTL / 2 - drift(),
        "capped at the bound"
    );
    // The driver renews before each capped deadline's loss: the lease survives 10 TTLs.
    tokio::time::sleep(TTL * 10).await;
    assert!(!lease.is_lost(), "a capped lease must be renewed in time");
    for pair in fake.calls_with(7).windows(2) {
        assert!(
            pair[1] - pair[0] < TTL / 2 - drift() - margin(),
            "gap {:?}",
            pair[1] - pair[0]
        );
    }
    assert!(sent >= t0 + TTL / 3);
    lease.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn a_bound_beyond_the_ttl_does_not_lengthen_the_lease() {
    let (fake, d) = fake_driver(Script::Capped(TTL * 2));
    let lease = grant(&d, 1, Instant::now(), 7);
    tokio::time::sleep(TTL / 3 + Duration::from_millis(1)).await;
    let sent = fake.calls()[0].0;
    assert_eq!(lease.deadline(), sent + TTL - drift());
    lease.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_fire_lost_exactly_a_margin_before_the_deadline() {
    let (fake, d) = fake_driver(Script::Fail);
    let t0 = Instant::now();
    let lease = grant(&d, 1, t0, 7);
    let deadline = lease.deadline();
    let reason = lease.lost().await;
    assert_eq!(reason, LossReason::Expired);
    assert_eq!(
        Instant::now(),
        deadline - margin(),
        "lost() must fire the loss margin before the deadline, not later or earlier"
    );
    assert!(lease.is_lost());
    assert!(matches!(
        lease.check(),
        Err(Error::Lost(LossReason::Expired))
    ));
    // It retried inside the validity window rather than giving up after one failure, and no
    // gap between retries exceeded TTL/12, so a recovery is noticed well before the deadline.
    let calls = fake.calls();
    assert!(calls.len() >= 5, "retries: {}", calls.len());
    for pair in calls.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(gap <= TTL / 12, "gap between retries {gap:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_recovered_backend_keeps_the_lease() {
    let (fake, d) = fake_driver(Script::Fail);
    let lease = grant(&d, 1, Instant::now(), 7);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fake.set(Script::Ok);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!lease.is_lost());
    assert!(lease.remaining() > Duration::ZERO);
    lease.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn a_reply_after_the_deadline_never_extends_the_lease() {
    // Replies take longer than the whole TTL: the lease must expire, never be extended late.
    let (_, d) = fake_driver(Script::Slow(TTL * 2));
    let t0 = Instant::now();
    let lease = grant(&d, 1, t0, 7);
    let reason = lease.lost().await;
    assert_eq!(reason, LossReason::Expired);
    assert_eq!(Instant::now(), t0 + TTL - drift() - margin());
    tokio::time::sleep(TTL * 3).await;
    assert!(lease.is_lost());
    assert!(
        lease.deadline() <= t0 + TTL,
        "deadline {:?} past start+TTL",
        lease.deadline() - t0
    );
}

#[tokio::test(start_paused = true)]
async fn server_says_gone_fires_lost_with_the_reason() {
    let (_, d) = fake_driver(Script::Gone);
    let t0 = Instant::now();
    let lease = grant(&d, 1, t0, 7);
    let reason = lease.lost().await;
    assert!(matches!(reason, LossReason::Gone(_)), "{reason:?}");
    assert_eq!(
        Instant::now(),
        t0 + TTL / 3,
        "reported at the first renewal"
    );
    assert!(d.is_empty());
}

#[tokio::test(start_paused = true)]
async fn release_stops_renewal() {
    let (fake, d) = fake_driver(Script::Ok);
    let lease = grant(&d, 1, Instant::now(), 7);
    let lost = lease.lost();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = fake.calls().len();
    lease.release().await.expect("release");
    assert_eq!(fake.releases.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(fake.calls().len(), before, "no renewal after release");
    assert_eq!(lost.await, LossReason::Released);
}

#[tokio::test(start_paused = true)]
async fn drop_stops_renewal_and_releases_in_the_background() {
    let (fake, d) = fake_driver(Script::Ok);
    let lease = grant(&d, 1, Instant::now(), 7);
    drop(lease);
    assert!(d.is_empty(), "dropping must unregister at once");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(fake.calls().is_empty());
    assert_eq!(fake.releases.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn release_during_an_inflight_renewal_does_not_resurrect() {
    let (fake, d) = fake_driver(Script::Slow(Duration::from_millis(500)));
    let lease = grant(&d, 1, Instant::now(), 7);
    let lost = lease.lost();
    // The first round is sent at 1 s and answered at 1.5 s; release at 1.2 s.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(fake.calls().len(), 1);
    lease.release().await.expect("release");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        fake.calls().len(),
        1,
        "the in-flight reply must not re-register the lease"
    );
    assert!(d.is_empty());
    assert_eq!(lost.await, LossReason::Released);
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_leases_one_task_one_call_per_period() {
    let (fake, d) = fake_driver(Script::Ok);
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let t0 = Instant::now();
    let leases: Vec<_> = (0..10_000).map(|i| grant(&d, i, t0, 0)).collect();
    let tasks_after = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    assert_eq!(
        tasks_after - tasks_before,
        1,
        "one driver task for all leases"
    );
    tokio::time::sleep(TTL / 3 + Duration::from_millis(10)).await;
    let calls = fake.calls();
    assert_eq!(calls.len(), 1, "one round trip per period");
    assert_eq!(calls[0].1.len(), 10_000, "that one call renews every lease");
    assert!(leases.iter().all(|l| !l.is_lost()));
    release_all(leases).await;
}

#[tokio::test(start_paused = true)]
async fn stopped_renewal_expires_at_the_deadline() {
    let (fake, d) = fake_driver(Script::Ok);
    let t0 = Instant::now();
    let keep = grant(&d, 1, t0, 1);
    let stop = grant(&d, 2, t0, 2);
    stop.stop_renewal_for_test();
    assert_eq!(stop.lost().await, LossReason::Expired);
    assert_eq!(
        Instant::now(),
        t0 + TTL - drift() - margin(),
        "a margin before the deadline"
    );
    assert!(!keep.is_lost());
    assert!(
        fake.calls().iter().all(|(_, e)| e == &[1]),
        "only the live lease is renewed"
    );
    keep.release().await.expect("release");
}

#[test]
fn dropping_a_lease_after_its_runtime_shut_down_does_not_panic() {
    let fake = Fake::new(Script::Ok);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (lease, d) = rt.block_on(async {
        let d = driver(&fake);
        (grant(&d, 1, Instant::now(), 7), d)
    });
    drop(rt);
    drop(lease);
    drop(d);
}

#[tokio::test(start_paused = true)]
async fn a_lease_near_its_deadline_pulls_the_round_forward() {
    let (fake, d) = fake_driver(Script::Ok);
    let t0 = Instant::now();
    let early = grant(&d, 1, t0, 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A grant whose request started 2.5 s ago (a slow acquire): 0.47 s of validity left, less
    // than the 0.9 s until the driver's planned round.
    let start = Instant::now() - Duration::from_millis(2500);
    let late = grant(&d, 2, start, 2);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !late.is_lost(),
        "the slow grant expired before the driver renewed it"
    );
    assert!(!early.is_lost());
    // And ordinary grants do not cause extra rounds: about one per TTL/3.
    assert!(fake.calls().len() <= 5, "rounds: {}", fake.calls().len());
    release_all([early, late]).await;
}

#[tokio::test(start_paused = true)]
async fn a_reply_delayed_past_a_third_of_the_ttl_still_renews() {
    // Every reply takes 1.1 s (a blip, a loaded server): longer than TTL/3 = 1 s, well inside
    // the remaining validity. The driver must wait for it rather than give up and re-send.
    let (_, d) = fake_driver(Script::Slow(Duration::from_millis(1100)));
    let lease = grant(&d, 1, Instant::now(), 7);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        !lease.is_lost(),
        "a slow but answered renewal must keep the lease"
    );
    lease.release().await.expect("release");
}

/// After an outage that lost every lease, the driver goes idle; a grant that then arrives with
/// a quarter of the TTL left must be renewed before it runs out (the failures of the outage
/// must not set the pace any more).
#[tokio::test(start_paused = true)]
async fn a_short_grant_after_an_outage_is_renewed_in_time() {
    let (fake, d) = fake_driver(Script::Fail);
    let a = grant(&d, 1, Instant::now(), 1);
    let b = grant(&d, 2, Instant::now(), 2);
    assert_eq!(a.lost().await, LossReason::Expired);
    assert_eq!(b.lost().await, LossReason::Expired);
    tokio::time::sleep(TTL).await;
    assert!(d.is_empty(), "the driver forgot the lost leases");
    fake.set(Script::Ok);
    let start = Instant::now() - TTL * 3 / 4;
    let late = grant(&d, 3, start, 3);
    tokio::time::sleep(TTL).await;
    assert!(
        !late.is_lost(),
        "a grant with TTL/4 left expired before its first renewal"
    );
    late.release().await.expect("release");
}

/// A grant with a quarter of the TTL left, registered while a slow round for another lease is
/// in flight, is renewed at once rather than after that round's reply.
#[tokio::test(start_paused = true)]
async fn a_short_grant_during_a_slow_round_is_renewed_in_time() {
    let (fake, d) = fake_driver(Script::Ok);
    fake.slow(1, Duration::from_millis(1100));
    let a = grant(&d, 1, Instant::now(), 1);
    // The first round (for `a`) is sent at 1 s and answered at 2.1 s.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(fake.calls().len(), 1, "the slow round is in flight");
    let start = Instant::now() - TTL * 3 / 4;
    let late = grant(&d, 2, start, 2);
    let late_deadline = late.deadline();
    tokio::time::sleep(TTL).await;
    assert!(
        !late.is_lost(),
        "a grant with TTL/4 left waited for another lease's slow round"
    );
    assert!(
        fake.calls_with(2)[0] < late_deadline,
        "the short grant was renewed in time"
    );
    assert!(!a.is_lost());
    release_all([late, a]).await;
}

// ---- supervision of the driver task ----

/// A backend whose `renew` panics fails that round only: the failure is counted, and once the
/// backend behaves again the driver (still alive) keeps the lease.
#[tokio::test(start_paused = true)]
async fn a_panicking_backend_fails_the_round_and_the_driver_survives() {
    let (fake, d, counters) = counted_driver(Script::Ok);
    fake.panics.store(true, Ordering::SeqCst);
    let lease = grant(&d, 1, Instant::now(), 1);
    tokio::time::sleep(TTL / 3 + Duration::from_millis(100)).await;
    assert!(
        counters.snapshot().renewal_failures >= 1,
        "a panicking round must count as a failed round: {:?}",
        counters.snapshot()
    );
    fake.panics.store(false, Ordering::SeqCst);
    tokio::time::sleep(TTL * 3).await;
    assert!(!lease.is_lost(), "the driver died with the panicking round");
    assert_eq!(counters.snapshot().driver_restarts, 0, "it never died");
    lease.release().await.expect("release");
}

/// A locker used from two runtimes: the driver task dies with the first; the next
/// registration (on the second) restarts it, counts the restart, and every lease is renewed.
#[test]
fn a_driver_whose_runtime_shut_down_restarts_on_the_next_registration() {
    let (_, d, counters) = counted_driver(Script::Ok);
    let first_rt = paused_runtime();
    let first = first_rt.block_on(async { grant(&d, 1, Instant::now(), 1) });
    drop(first_rt);
    paused_runtime().block_on(async {
        let second = grant(&d, 2, Instant::now(), 2);
        tokio::time::sleep(TTL * 3).await;
        assert!(
            !second.is_lost(),
            "a lease granted after the driver's runtime shut down was never renewed"
        );
        assert!(
            !first.is_lost(),
            "the earlier lease is renewed by the new task"
        );
        assert_eq!(counters.snapshot().driver_restarts, 1);
        assert_eq!(counters.snapshot().losses, 0);
        release_all([second, first]).await;
    });
}

/// A first registration outside any runtime cannot start the task; the next one inside a
/// runtime must, and then both leases are renewed.
#[test]
fn a_first_registration_outside_a_runtime_does_not_leave_the_driver_dead() {
    let (_, d, counters) = counted_driver(Script::Ok);
    let outside = grant(&d, 1, Instant::now(), 1);
    paused_runtime().block_on(async {
        let inside = grant(&d, 2, Instant::now(), 2);
        tokio::time::sleep(TTL * 3).await;
        assert!(!inside.is_lost(), "the driver never started");
        assert!(!outside.is_lost());
        assert_eq!(counters.snapshot().losses, 0);
        release_all([inside, outside]).await;
    });
}

// ---- per-lease outcomes ----

/// One lease left undecided is retried alone and soon; it keeps its deadline meanwhile. The
/// lease extended in the same round is not re-sent and keeps the regular cadence.
#[tokio::test(start_paused = true)]
async fn only_the_undecided_lease_is_retried() {
    let (fake, d) = fake_driver(Script::Ok);
    let t0 = Instant::now();
    let a = grant(&d, 1, t0, 1);
    let b = grant(&d, 2, t0, 2);
    fake.undecided(2, true);
    tokio::time::sleep(TTL / 3 + Duration::from_millis(1)).await;
    assert_eq!(a.deadline(), t0 + TTL / 3 + TTL - drift(), "a was extended");
    assert_eq!(
        b.deadline(),
        t0 + TTL - drift(),
        "an undecided lease keeps its deadline"
    );
    fake.undecided(2, false);
    // The retry comes within TTL/12.
    tokio::time::sleep(TTL / 12).await;
    let calls = fake.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0], (t0 + TTL / 3, vec![1, 2]), "one regular round");
    assert_eq!(calls[1].1, vec![2], "only the undecided lease is retried");
    assert_eq!(
        b.deadline(),
        calls[1].0 + TTL - drift(),
        "the retry extended it"
    );
    tokio::time::sleep(TTL / 3).await;
    assert_eq!(
        fake.calls_with(1),
        vec![t0 + TTL / 3, t0 + TTL * 2 / 3],
        "the extended lease keeps the regular cadence"
    );
    release_all([a, b]).await;
}

/// A lease that stays undecided is retried inside its validity and lost exactly when it
/// expires (a margin before its deadline); the other lease is renewed every TTL/3 throughout, never more often.
#[tokio::test(start_paused = true)]
async fn an_undecided_lease_expires_at_its_deadline_while_the_others_keep_their_cadence() {
    let (fake, d) = fake_driver(Script::Ok);
    let t0 = Instant::now();
    let a = grant(&d, 1, t0, 1);
    let b = grant(&d, 2, t0, 2);
    fake.undecided(2, true);
    assert_eq!(b.lost().await, LossReason::Expired);
    let expiry = t0 + TTL - drift() - margin();
    assert_eq!(Instant::now(), expiry);
    let retries = fake.calls_with(2);
    assert!(retries.len() >= 4, "retries: {retries:?}");
    assert!(retries.iter().all(|t| *t < expiry));
    tokio::time::sleep(TTL).await;
    assert!(!a.is_lost());
    let rounds = fake.calls_with(1);
    assert!(rounds.len() >= 3, "rounds: {}", rounds.len());
    for pair in rounds.windows(2) {
        assert_eq!(pair[1] - pair[0], TTL / 3, "cadence of the decided lease");
    }
    a.release().await.expect("release");
}

// ---- grants slowed by a busy server ----

/// A grant whose reply took 0.3 × TTL (a session's queue of writes under load), on a backend
/// whose rounds take 0.36 × TTL: its first renewal must start while a round that slow still fits
/// in the validity left. Counting the first renewal from the reply (due a third of the TTL
/// before the deadline) left a one-round budget of TTL/3 and lost the lease
/// (`zk-cluster::many_leases_break`: the first leases of a 1,000-acquire burst were lost).
#[tokio::test(start_paused = true)]
async fn a_grant_slowed_by_a_busy_server_is_renewed_in_time_by_slow_rounds() {
    let (fake, d) = fake_driver(Script::Slow(TTL * 36 / 100));
    let start = Instant::now() - TTL * 3 / 10;
    let lease = grant(&d, 1, start, 1);
    tokio::time::sleep(TTL * 4).await;
    assert!(
        !lease.is_lost(),
        "a grant that arrived 0.3 × TTL late was lost to rounds of 0.36 × TTL: {:?}",
        fake.calls()
            .iter()
            .map(|(t, _)| *t - start)
            .collect::<Vec<_>>()
    );
    lease.release().await.expect("release");
}

/// Grants arriving one after another (a burst of acquires on one locker), each already due for
/// renewal, are renewed in shared rounds, not in one round each.
#[tokio::test(start_paused = true)]
async fn a_burst_of_late_grants_is_renewed_in_a_few_rounds() {
    let (fake, d) = fake_driver(Script::Slow(Duration::from_millis(200)));
    let mut leases = Vec::new();
    for i in 0..100u32 {
        let start = Instant::now() - TTL / 3;
        leases.push(grant(&d, u64::from(i) + 1, start, i));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // 100 grants over 1 s (a third of the TTL).
    let rounds = fake.calls().len();
    assert!(
        rounds <= 6,
        "{rounds} rounds for 100 grants in a third of the TTL"
    );
    tokio::time::sleep(TTL).await;
    assert!(leases.iter().all(|l| !l.is_lost()));
    release_all(leases).await;
}

/// A backend that answers in order (a retry would only queue behind the slow call) has its
/// rounds run to the deadline: rounds of 0.45 × TTL, back to back, keep the lease. Abandoned at
/// three quarters of the remaining validity, the same rounds lose it.
#[tokio::test(start_paused = true)]
async fn rounds_of_an_in_order_backend_run_to_the_deadline() {
    for in_order in [true, false] {
        let (fake, d) = fake_driver(Script::Slow(TTL * 45 / 100));
        fake.in_order.store(in_order, Ordering::SeqCst);
        let lease = grant(&d, 1, Instant::now(), 1);
        tokio::time::sleep(TTL * 4).await;
        assert_eq!(
            !lease.is_lost(),
            in_order,
            "in order: {in_order}; rounds at {:?}",
            fake.calls().iter().map(|(t, _)| *t).collect::<Vec<_>>()
        );
        let _ = lease.release().await;
    }
}

// ---- counting ----

/// A loss is counted by the time `lost()` resolves, whichever path ends the lease: here the
/// lease's own timer (failing renewals), then the server's answer (gone). Counted once each.
#[tokio::test(start_paused = true)]
async fn every_loss_is_counted_once_before_lost_fires() {
    let (fake, d, counters) = counted_driver(Script::Fail);
    let expiring = grant(&d, 1, Instant::now(), 1);
    assert_eq!(expiring.lost().await, LossReason::Expired);
    assert_eq!(
        counters.snapshot().losses,
        1,
        "expiry on the lease's own timer"
    );

    fake.set(Script::Gone);
    let a = grant(&d, 2, Instant::now(), 2);
    let b = grant(&d, 3, Instant::now(), 3);
    for lease in [&a, &b] {
        assert!(matches!(lease.lost().await, LossReason::Gone(_)));
    }
    assert_eq!(
        counters.snapshot().losses,
        3,
        "two leases the server says are gone"
    );
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(counters.snapshot().losses, 3, "no loss counted twice");
    assert_eq!(counters.snapshot().grants, 3);
}

/// A backend's internal lease (a session sentinel) is renewed and lost like the others, but
/// counts neither as a grant nor as a loss.
#[tokio::test(start_paused = true)]
async fn an_internal_lease_counts_neither_its_grant_nor_its_loss() {
    let (_, d, counters) = counted_driver(Script::Gone);
    let sentinel = grant(&d, 0, Instant::now(), INTERNAL);
    let user = grant(&d, 1, Instant::now(), 1);
    assert!(matches!(sentinel.lost().await, LossReason::Gone(_)));
    assert!(matches!(user.lost().await, LossReason::Gone(_)));
    let stats = counters.snapshot();
    assert_eq!((stats.grants, stats.losses), (1, 1), "{stats:?}");
}

/// A lease whose own round is still in flight when the regular round starts misses that round;
/// its next renewal must join the regular cadence, not keep a second round per period going
/// just before each regular one (seen as 2 rounds per period holding 10,000 leases in
/// `cargo xtask bench`).
#[tokio::test(start_paused = true)]
async fn a_lease_in_flight_at_the_regular_round_joins_the_next_one() {
    let (fake, d) = fake_driver(Script::Ok);
    // Every round that carries `b` takes 50 ms.
    fake.slow(2, Duration::from_millis(50));
    let t0 = Instant::now();
    let a = grant(&d, 1, t0, 1);
    // `b`'s first renewal is due 10 ms before the regular round: it is in flight then.
    let b = grant(&d, 2, t0 - Duration::from_millis(10), 2);
    let period = TTL / 3;
    tokio::time::sleep(period * 3).await;
    let before = fake.calls().len();
    tokio::time::sleep(period * 6).await;
    let rounds = fake.calls().len() - before;
    assert!(!a.is_lost() && !b.is_lost());
    assert!(
        rounds <= 7,
        "{rounds} rounds in 6 periods: {:?}",
        fake.calls()
            .iter()
            .map(|(t, ids)| (*t - t0, ids.clone()))
            .collect::<Vec<_>>()
    );
    release_all([a, b]).await;
}
