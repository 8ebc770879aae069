//! The herd effect, judged by the clients' own counters and by the server: on a private server
//! (no other test's traffic), each release sends about one wake signal, however many wait.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, Locker, Stats};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::private::private;
use super::util::{name, within};
use super::{Ctx, Verdict, ensure};
use crate::{ClientOptions, TestBackend};

/// Waiter counts measured.
pub(crate) const NS: [usize; 3] = [1, 8, 32];
/// The TTL of the herd phases' clients: long, so that fewer TTL-driven re-checks (the memory
/// waiter's at the holder's expiry, a Redis waiter's queue-entry refresh every TTL, at most
/// 1 s) fall inside a measured run. Those that do are counted apart by backends that can tell
/// ([`Stats::timer_wakeups`]).
pub(crate) const HERD_TTL: Duration = Duration::from_secs(30);
/// Settling after the last waiter queued, before the counters are read: longer than etcd's
/// 100 ms watch resync, during which a waiter whose watch opened unsynced re-reads its queue
/// (a cost of queueing, not of a handoff).
pub(crate) const ENQUEUE_SETTLE: Duration = Duration::from_millis(150);
/// How long a waiter may wait.
const WAITER_WAIT: Duration = Duration::from_secs(20);
/// The idle window before each release: the waiters are queued and nobody releases, so every
/// wake-up in it (not counted apart as a timer's) is a re-check that comes with time waited.
pub(crate) const IDLE: Duration = Duration::from_secs(1);

/// What one herd run counted, over its `n` handoffs (the holder's release and each waiter's
/// but the last, which wakes nobody).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    /// Waiters.
    pub n: usize,
    /// Wake-ups of all waiters, by their counters.
    pub wakeups: u64,
    /// Of them, on the waiters' own timers ([`Stats::timer_wakeups`]).
    pub timer_wakeups: u64,
    /// Requests of all waiters, by their counters.
    pub requests: u64,
    /// Wake-ups not counted apart as timers' during the [`IDLE`] window before the release,
    /// when nobody released (all `n` waiters queued).
    pub idle_wakeups: u64,
    /// The waiters' waits from the release to each one's grant, summed.
    pub waited: Duration,
}

impl Run {
    /// Records the run's figures under `prefix`.
    pub(crate) fn figures(&self, ctx: &Ctx, prefix: &str) {
        let n = self.n as f64;
        ctx.figure(
            &format!("{prefix}wakeups_per_release_n{}", self.n),
            round(self.wakeups as f64 / n),
        );
        ctx.figure(
            &format!("{prefix}requests_per_handoff_n{}", self.n),
            round(self.requests as f64 / n),
        );
        ctx.figure(
            &format!("{prefix}timer_wakeups_n{}", self.n),
            self.timer_wakeups,
        );
        ctx.figure(
            &format!("{prefix}idle_wakeups_n{}", self.n),
            self.idle_wakeups,
        );
        ctx.figure(
            &format!("{prefix}timed_allowance_n{}", self.n),
            self.timed_allowance(),
        );
    }

    /// The wake-ups releases caused: all but the timers'.
    fn released(&self) -> u64 {
        self.wakeups.saturating_sub(self.timer_wakeups)
    }

    /// The wake-ups time alone explains: the idle window's rate of wake-ups per waiter-second
    /// (zero for a backend whose waiters sleep until told, or that counts its timers apart),
    /// times the waiter-seconds waited after the release, rounded up.
    fn timed_allowance(&self) -> u64 {
        let per_waiter_s = self.idle_wakeups as f64 / (self.n as f64 * IDLE.as_secs_f64());
        (per_waiter_s * self.waited.as_secs_f64()).ceil() as u64
    }
}

/// Herd at one: every run wakes at most one waiter per release — wake-ups ≤ n, not counting
/// those the backend counts as its timers' nor those the time waited explains at the rate
/// measured while nobody released ([`Run::timed_allowance`]: a Redis waiter refreshes its
/// queue entry every second and counts it as a wake-up) — and costs at most one request per
/// handoff more than the single-waiter run (requests ≤ n × (r1 + 1), re-checks included).
/// `runs[0]` is the single-waiter run.
pub(crate) fn judge(runs: &[Run]) -> Result<(), Verdict> {
    let Some(single) = runs.first() else {
        return Ok(());
    };
    let r1 = single.requests as f64 / single.n.max(1) as f64;
    for run in runs {
        let n = run.n as u64;
        ensure!(
            run.released() <= n + run.timed_allowance(),
            "{} wake-ups ({} more on timers, {} explained by time waited) for {n} releases with {n} waiters ({:.2} per release): a release wakes more than one waiter",
            run.released(),
            run.timer_wakeups,
            run.timed_allowance(),
            run.released() as f64 / n as f64
        );
        ensure!(
            run.requests * single.n as u64 <= n * (single.requests + single.n as u64),
            "{:.2} requests per handoff with {n} waiters vs {r1:.2} with one: more than one request \
             above the single-waiter figure, not flat",
            run.requests as f64 / n as f64
        );
    }
    Ok(())
}

/// The counters' totals over the waiters.
fn total(stats: &[Stats], f: fn(&Stats) -> u64) -> u64 {
    stats.iter().map(f).sum()
}

/// The run of `n` waiters: counters snapshotted when the idle window began (`idle`), at the
/// release (`before`) and after the last grant (`after`); `released` the release's instant
/// and `grants` each waiter's.
pub(crate) fn run_between(
    n: usize,
    [idle, before, after]: [&[Stats]; 3],
    released: Instant,
    grants: &[Instant],
) -> Run {
    let untimed = |s: &Stats| s.wakeups.saturating_sub(s.timer_wakeups);
    Run {
        n,
        wakeups: total(after, |s| s.wakeups) - total(before, |s| s.wakeups),
        timer_wakeups: total(after, |s| s.timer_wakeups) - total(before, |s| s.timer_wakeups),
        requests: total(after, |s| s.requests) - total(before, |s| s.requests),
        idle_wakeups: total(before, untimed).saturating_sub(total(idle, untimed)),
        waited: grants
            .iter()
            .map(|g| g.saturating_duration_since(released))
            .sum(),
    }
}

/// How many connections one wake signal reaches at most, read at the private servers: for
/// Redis, the busiest notification channel's subscribers plus the pattern subscriptions
/// ([`crate::servers::stats::redis_fanout`]), the most over the nodes; 1 for servers whose
/// signals are counted per delivery already (etcd watch events, ZooKeeper notifications).
async fn fanout(p: &super::private::Private) -> Result<u64, String> {
    if p.backend.topology().map(|(kind, _)| kind) != Some(crate::servers::ServerKind::Redis) {
        return Ok(1);
    }
    let cluster = Arc::clone(&p.cluster);
    tokio::task::spawn_blocking(move || {
        let mut most = 1;
        for (i, node) in cluster.nodes().iter().enumerate() {
            let reach = node
                .redis_fanout()
                .ok_or_else(|| format!("node {i} did not answer PUBSUB"))?;
            most = most.max(reach);
        }
        Ok(most)
    })
    .await
    .map_err(|e| format!("reading the fanout panicked: {e}"))?
}

/// Reads the private servers' wake-signal counter off the runtime's threads.
async fn signals(backend: &Arc<dyn TestBackend>) -> Result<u64, String> {
    let b = Arc::clone(backend);
    tokio::task::spawn_blocking(move || b.wake_signals())
        .await
        .map_err(|e| format!("reading wake signals panicked: {e}"))?
}

type Waiter = JoinHandle<Result<Instant, dlock_core::Error>>;

fn spawn_waiter(c: Arc<dyn Locker>, lock: dlock_core::LockName) -> Waiter {
    tokio::spawn(async move {
        let lease = c.acquire(&lock, AcquireOptions::wait(WAITER_WAIT)).await?;
        let at = Instant::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
        lease.release().await?;
        Ok(at)
    })
}

/// The clients' view on the shared servers first ([`queue::herd`](super::queue::herd)), then
/// with N = 1, 8, 32 queued waiters on a private server: herd at one — each release wakes at
/// most one waiter by the clients' counters and costs at most one request per handoff above
/// the single-waiter run (see [`judge`]), and the server sends at most one wake signal per
/// release. The signals are counted at the server: etcd watch events and ZooKeeper watch
/// notifications sent; Redis `PUBLISH` calls times the most connections one reaches (the
/// busiest channel's subscribers plus pattern subscriptions, read while every waiter is
/// queued), so a channel shared by the waiters is a herd even when one `PUBLISH` wakes it.
pub(crate) async fn herd(ctx: &Ctx) -> Result<(), Verdict> {
    super::queue::herd(ctx).await?;
    let p = match private(ctx).await {
        Ok(p) => p,
        Err(Verdict::Skip(why)) => {
            ctx.skip_part(format!("server-side wake signals not checked: {why}"));
            return Ok(());
        }
        Err(fail) => return Err(fail),
    };
    let opts = || ClientOptions::new(ctx.ns(), HERD_TTL);
    let holder = p.client_with(opts()).await?;
    let mut runs = Vec::new();
    let mut signals_per = Vec::new();
    let mut unreadable = None;
    for n in NS {
        let lock = name(&format!("herd-{n}"))?;
        let mut waiters = Vec::with_capacity(n);
        for _ in 0..n {
            waiters.push(p.client_with(opts()).await?);
        }
        let lh = holder
            .acquire(&lock, AcquireOptions::wait(ctx.ttl()))
            .await?;
        let mut tasks = Vec::with_capacity(n);
        for w in &waiters {
            let base = p
                .backend
                .leftovers(ctx.ns())
                .await
                .map(|l| l.len())
                .unwrap_or(0);
            tasks.push(spawn_waiter(Arc::clone(w), lock.clone()));
            grow(ctx, &p.backend, base).await?;
        }
        tokio::time::sleep(ENQUEUE_SETTLE).await;
        let idle: Vec<Stats> = waiters.iter().map(|w| w.stats()).collect();
        // Read while every waiter is queued: a wake-up scheme that subscribes them all to one
        // channel shows here.
        let reach = fanout(&p).await;
        tokio::time::sleep(IDLE).await;
        let before: Vec<Stats> = waiters.iter().map(|w| w.stats()).collect();
        let s0 = signals(&p.backend).await;
        let released = Instant::now();
        lh.release().await?;
        let mut grants = Vec::with_capacity(n);
        for (i, t) in tasks.into_iter().enumerate() {
            match within(WAITER_WAIT * 2, t).await {
                Some(Ok(Ok(at))) => grants.push(at),
                Some(Ok(Err(e))) => {
                    return Err(Verdict::Fail(format!("waiter {i} of {n} failed: {e}")));
                }
                Some(Err(e)) => {
                    return Err(Verdict::Fail(format!("waiter {i} of {n} panicked: {e}")));
                }
                None => {
                    return Err(Verdict::Fail(format!(
                        "waiter {i} of {n} never got the lock"
                    )));
                }
            }
        }
        // Signals of the last release may still be on their way out of the server.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let s1 = signals(&p.backend).await;
        let after: Vec<Stats> = waiters.iter().map(|w| w.stats()).collect();
        let run = run_between(n, [&idle, &before, &after], released, &grants);
        run.figures(ctx, "private_");
        runs.push(run);
        match (s0, s1, reach) {
            (Ok(a), Ok(b), Ok(reach)) => {
                // n + 1 releases: the holder's and each waiter's (the last one wakes nobody).
                // Each signal reaches at most `reach` connections (one, unless several share
                // the channel it is sent on).
                let sent = delivered(b.saturating_sub(a), reach);
                ctx.figure(&format!("server_fanout_n{n}"), reach);
                ctx.figure(
                    &format!("server_wake_signals_per_release_n{n}"),
                    round(sent as f64 / n as f64),
                );
                signals_per.push((n, sent));
            }
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => unreadable = Some(e),
        }
    }
    if let Some(reason) = unreadable {
        ctx.skip_part(format!("server-side wake signals not checked: {reason}"));
    }
    judge(&runs)?;
    judge_signals(&signals_per)?;
    drop(p);
    Ok(())
}

/// The wake signals `sent` signals delivered at most, each reaching `reach` connections (at
/// least one).
fn delivered(sent: u64, reach: u64) -> u64 {
    sent * reach.max(1)
}

/// At most one delivered wake signal per release: for each run, (waiters = releases, signals
/// delivered).
fn judge_signals(runs: &[(usize, u64)]) -> Result<(), Verdict> {
    for &(n, sent) in runs {
        ensure!(
            sent <= n as u64,
            "the server delivered up to {sent} wake signals for {n} releases with {n} waiters: a release wakes more than one waiter"
        );
    }
    Ok(())
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Waits until the private server's namespace holds more than `base` entries (the waiter has
/// queued) or a second passed, then lets its watch settle.
async fn grow(ctx: &Ctx, backend: &Arc<dyn TestBackend>, base: usize) -> Result<(), Verdict> {
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        let n = backend
            .leftovers(ctx.ns())
            .await
            .map_err(|e| Verdict::Fail(format!("leak audit cannot read the server: {e}")))?
            .len();
        if n > base || Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: usize, wakeups: u64, requests: u64, idle_wakeups: u64, waited_ms: u64) -> Run {
        Run {
            n,
            wakeups,
            timer_wakeups: 0,
            requests,
            idle_wakeups,
            waited: Duration::from_millis(waited_ms),
        }
    }

    #[test]
    fn the_time_waited_explains_a_refresh_timer_but_not_a_second_wakeup_per_release() {
        // A Redis-like waiter refreshing every second: 8 idle wake-ups of 8 waiters in 1 s.
        let single = run(1, 1, 2, 1, 10);
        let refreshing = run(32, 35, 67, 32, 3_500);
        assert_eq!(refreshing.timed_allowance(), 4);
        assert!(judge(&[single, refreshing]).is_ok());
        // The same timers, and two wake-ups per release: caught.
        let two = run(32, 63, 67, 32, 3_500);
        let Err(Verdict::Fail(why)) = judge(&[single, two]) else {
            panic!("two wake-ups per release passed");
        };
        assert!(why.contains("wakes more than one waiter"), "{why}");
        // Sleeping until told: no allowance at all.
        assert_eq!(run(8, 9, 16, 0, 400).timed_allowance(), 0);
        assert!(judge(&[run(1, 1, 2, 0, 10), run(8, 9, 16, 0, 400)]).is_err());
    }

    #[test]
    fn one_request_above_the_single_waiter_figure_is_the_bound() {
        let single = run(1, 1, 2, 0, 10);
        assert!(judge(&[single, run(8, 8, 24, 0, 400)]).is_ok());
        assert!(judge(&[single, run(8, 8, 25, 0, 400)]).is_err());
    }

    #[test]
    fn one_publish_that_reaches_every_waiter_is_a_herd_at_the_server() {
        // One signal per release, each on its waiter's own channel: herd at one.
        assert!(judge_signals(&[(8, delivered(8, 1))]).is_ok());
        // The same calls on a channel all 8 waiters subscribe to: caught.
        let Err(Verdict::Fail(why)) = judge_signals(&[(8, delivered(8, 8))]) else {
            panic!("a shared channel passed");
        };
        assert!(why.contains("wakes more than one waiter"), "{why}");
        // A reach read as zero (no subscriber) counts each signal once, never as free.
        assert_eq!(delivered(9, 0), 9);
        assert!(judge_signals(&[(8, delivered(9, 0))]).is_err());
    }
}
