//! How late `Lease::lost()` resolves against `Lease::deadline()` on a real clock, in a
//! multi-thread runtime whose CPUs are oversubscribed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Counters, RenewBackend, Renewal, RenewalDriver};
use dlock_core::{Error, FencingToken, LockName, LossReason};
use tokio::time::Instant;

/// Every renewal fails, so every lease runs into its deadline.
struct Down;

#[async_trait]
impl RenewBackend for Down {
    type Entry = ();
    async fn renew(&self, _entries: &[Arc<()>]) -> Result<Vec<Renewal>, Error> {
        Err(Error::unavailable("down", None))
    }
    async fn release(&self, _entry: &()) -> Result<(), Error> {
        Ok(())
    }
}

/// Burns CPU until `stop`.
fn spin(stop: &AtomicBool) {
    let mut x: u64 = 1;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..10_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
    }
}

/// Under twice as many busy threads as CPUs, `lost()` must resolve by `deadline()` for most
/// leases (p50; a timer aimed at the deadline itself is late for nearly all of them), and never
/// earlier than its margin. p90, p99 and the maximum are reported, not asserted: they measure
/// the machine's stalls (p90 reached 60 ms with the whole suite sharing the CPUs). Run with `--nocapture` to see the figures.
#[test]
fn lost_resolves_by_the_deadline_under_cpu_load() {
    const TTL: Duration = Duration::from_secs(2);
    const LEASES: u32 = 300;
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..cpus * 2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || spin(&stop))
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut late: Vec<(Duration, Duration)> = rt.block_on(async {
        let driver = RenewalDriver::new(Arc::new(Down), TTL, Arc::new(Counters::default()));
        let name = LockName::new("timing").expect("valid");
        let mut watchers = Vec::new();
        let now = Instant::now();
        for i in 0..LEASES {
            // Grants whose requests started long ago: deadlines 400..1400 ms from now (past
            // the loss margin), spread off the millisecond grid.
            let start =
                now + Duration::from_millis(400) + Duration::from_micros(u64::from(i) * 3_331)
                    - TTL;
            let lease = driver.register(name.clone(), FencingToken(u64::from(i) + 1), start, ());
            let deadline = lease.deadline();
            let lost = lease.lost();
            watchers.push(tokio::spawn(async move {
                let reason = lost.await;
                let at = Instant::now();
                drop(lease);
                (
                    reason,
                    at.saturating_duration_since(deadline),
                    deadline.saturating_duration_since(at),
                )
            }));
        }
        let mut late = Vec::new();
        for w in watchers {
            let (reason, late_by, early_by) = w.await.expect("watcher");
            assert_eq!(reason, LossReason::Expired);
            late.push((late_by, early_by));
        }
        late
    });
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        s.join().expect("spinner");
    }
    late.sort();
    let pct = |p: usize| late[(late.len() - 1) * p / 100].0;
    let (p50, p90, p99, max) = (pct(50), pct(90), pct(99), late[late.len() - 1].0);
    let earliest = late.iter().map(|l| l.1).max().unwrap_or_default();
    println!(
        "lost() past deadline(), TTL {TTL:?}, {LEASES} leases, {} busy threads on {cpus} CPUs: \
         p50 {p50:?} p90 {p90:?} p99 {p99:?} max {max:?}; earliest {earliest:?} before it",
        cpus * 2
    );
    let margin = dlock_core::backend::loss_margin(TTL);
    // Against the instant lost() aims at: the loss margin before the deadline.
    let mut vs_aim: Vec<Duration> = late
        .iter()
        .map(|&(late_by, early_by)| (late_by + margin).saturating_sub(early_by))
        .collect();
    vs_aim.sort();
    let aim = |p: usize| vs_aim[(vs_aim.len() - 1) * p / 100];
    println!(
        "  past deadline() − loss margin: p50 {:?} p90 {:?} p99 {:?} max {:?}",
        aim(50),
        aim(90),
        aim(99),
        aim(100)
    );
    assert_eq!(
        p50,
        Duration::ZERO,
        "lost() resolved after deadline() for half the leases (p50 {p50:?}, p90 {p90:?})"
    );
    // p90 is reported, not asserted: with other test processes sharing the two CPUs (the
    // whole suite under `cargo xtask test`), process-wide stalls of 60 ms and more were seen,
    // which no timer can beat; the p50 above is what tells a timer aimed at the deadline
    // (late for nearly every lease) from one aimed the loss margin before it.
    assert!(
        earliest <= margin,
        "lost() resolved {earliest:?} before deadline(): earlier than its margin {margin:?}"
    );
}
