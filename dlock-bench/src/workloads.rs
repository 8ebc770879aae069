//! The workloads. Every one runs its contenders interleaved (round r runs them in a rotated
//! order), so that machine load drifts hit all of them alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::impls::{Client, Dlock, Impl};
use crate::probe::Probe;
use crate::stats::{Sink, rss_bytes};

/// TTL of the leases in every workload but the renewal one.
pub const TTL: Duration = Duration::from_secs(10);

/// How long the end of a contended round may take before its tasks are aborted.
const DRAIN: Duration = Duration::from_secs(15);

fn order(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + round) % n)
}

async fn clients(imp: &dyn Impl, n: usize) -> Result<Vec<Arc<dyn Client>>, String> {
    let made = futures::future::join_all((0..n).map(|_| imp.client(TTL))).await;
    made.into_iter().collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn requests(clients: &[Arc<dyn Client>]) -> Option<u64> {
    clients
        .iter()
        .map(|c| c.stats().map(|s| s.requests))
        .sum::<Option<u64>>()
}

/// Uncontended acquire + release by one client, `per_round` pairs per contender per round.
pub async fn uncontended(
    sink: &mut Sink<'_>,
    impls: &[Arc<dyn Impl>],
    rounds: usize,
    per_round: usize,
) -> Result<(), String> {
    let mut cs = Vec::new();
    for i in impls {
        cs.push(i.client(TTL).await?);
    }
    let mut samples = vec![Vec::new(); impls.len()];
    let mut busy = vec![Duration::ZERO; impls.len()];
    for r in 0..rounds {
        for i in order(impls.len(), r) {
            for _ in 0..per_round {
                let t = Instant::now();
                let h = cs[i].acquire("uncontended").await?;
                cs[i].release(h).await?;
                let d = t.elapsed();
                samples[i].push(d);
                busy[i] += d;
            }
        }
    }
    for (i, imp) in impls.iter().enumerate() {
        let n = samples[i].len() as f64;
        sink.add(
            "uncontended",
            imp.name(),
            "ops_per_s",
            n / busy[i].as_secs_f64(),
            "1/s",
        );
        sink.percentiles("uncontended", imp.name(), "latency", &mut samples[i]);
    }
    Ok(())
}

#[derive(Default)]
struct Track {
    last: Option<usize>,
    release_start: Option<Instant>,
    switches: u64,
    grants: Vec<u64>,
    handoffs: Vec<Duration>,
    waits: Vec<Duration>,
}

#[derive(Default)]
struct Contention {
    switches: u64,
    elapsed: Duration,
    grants: Vec<u64>,
    handoffs: Vec<Duration>,
    waits: Vec<Duration>,
    violations: u64,
    errors: u64,
}

/// `workers` clients loop acquire → release on one lock for `secs`.
async fn contention_round(
    imp: &dyn Impl,
    workers: usize,
    secs: Duration,
    name: String,
) -> Result<Contention, String> {
    let cs = clients(imp, workers).await?;
    let track = Arc::new(Mutex::new(Track {
        grants: vec![0; workers],
        ..Track::default()
    }));
    let held = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (w, c) in cs.into_iter().enumerate() {
        let (track, held, stop, violations, errors, name) = (
            Arc::clone(&track),
            Arc::clone(&held),
            Arc::clone(&stop),
            Arc::clone(&violations),
            Arc::clone(&errors),
            name.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let h = match c.acquire(&name).await {
                    Ok(h) => h,
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("  acquire failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let granted = Instant::now();
                if held.swap(true, Ordering::SeqCst) {
                    violations.fetch_add(1, Ordering::Relaxed);
                }
                if !stop.load(Ordering::Relaxed) {
                    let mut t = lock(&track);
                    t.grants[w] += 1;
                    t.waits.push(granted - asked);
                    if t.last != Some(w) {
                        if let Some(rs) = t.release_start {
                            t.handoffs.push(granted.saturating_duration_since(rs));
                            t.switches += 1;
                        }
                    }
                    t.last = Some(w);
                }
                lock(&track).release_start = Some(Instant::now());
                held.store(false, Ordering::SeqCst);
                if let Err(e) = c.release(h).await {
                    errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("  release failed: {e}");
                }
            }
        }));
    }
    tokio::time::sleep(secs).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    let all = futures::future::join_all(tasks.iter_mut());
    if tokio::time::timeout(DRAIN, all).await.is_err() {
        eprintln!(
            "  {}: workers still waiting {DRAIN:?} after the end; aborted",
            imp.name()
        );
        for t in &tasks {
            t.abort();
        }
    }
    let mut t = lock(&track);
    Ok(Contention {
        switches: t.switches,
        elapsed,
        grants: std::mem::take(&mut t.grants),
        handoffs: std::mem::take(&mut t.handoffs),
        waits: std::mem::take(&mut t.waits),
        violations: violations.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
    })
}

/// 8-way (or `workers`-way) contention, `rounds` interleaved rounds of `secs` per contender.
pub async fn contention(
    sink: &mut Sink<'_>,
    impls: &[Arc<dyn Impl>],
    workers: usize,
    rounds: usize,
    secs: Duration,
) -> Result<(), String> {
    let impls: Vec<&Arc<dyn Impl>> = impls.iter().filter(|i| i.contends()).collect();
    let mut acc: Vec<Contention> = impls
        .iter()
        .map(|_| Contention {
            grants: vec![0; workers],
            ..Contention::default()
        })
        .collect();
    for r in 0..rounds {
        for i in order(impls.len(), r) {
            let name = format!("contended-{r}");
            let c = contention_round(impls[i].as_ref(), workers, secs, name).await?;
            let a = &mut acc[i];
            a.switches += c.switches;
            a.elapsed += c.elapsed;
            for (g, n) in a.grants.iter_mut().zip(&c.grants) {
                *g += n;
            }
            a.handoffs.extend(c.handoffs);
            a.waits.extend(c.waits);
            a.violations += c.violations;
            a.errors += c.errors;
        }
    }
    let wl = format!("contention-{workers}");
    for (imp, a) in impls.iter().zip(&mut acc) {
        let name = imp.name();
        let secs = a.elapsed.as_secs_f64();
        let grants: u64 = a.grants.iter().sum();
        sink.add(&wl, name, "handoffs_per_s", a.switches as f64 / secs, "1/s");
        sink.add(&wl, name, "acquisitions_per_s", grants as f64 / secs, "1/s");
        let min = a.grants.iter().copied().min().unwrap_or(0) as f64;
        let max = a.grants.iter().copied().max().unwrap_or(0) as f64;
        sink.add(&wl, name, "client_grants_min", min, "grants");
        sink.add(&wl, name, "client_grants_max", max, "grants");
        sink.add(
            &wl,
            name,
            "fairness_min_over_max",
            if max > 0.0 { min / max } else { 0.0 },
            "ratio",
        );
        sink.percentiles(&wl, name, "handoff", &mut a.handoffs);
        sink.percentiles(&wl, name, "wait", &mut a.waits);
        sink.add(
            &wl,
            name,
            "exclusion_violations",
            a.violations as f64,
            "count",
        );
        sink.add(&wl, name, "errors", a.errors as f64, "count");
    }
    Ok(())
}

struct Queue {
    handoffs: Vec<Duration>,
    server_requests: Option<u64>,
    client_requests: Option<u64>,
    violations: u64,
}

/// One holder, `n` waiters queued behind it; the holder releases, each waiter releases as soon
/// as it is granted. Measures each handoff and the requests the whole chain cost.
async fn queue_round(
    imp: &dyn Impl,
    n: usize,
    name: String,
    probe: &Probe,
) -> Result<Queue, String> {
    let cs = clients(imp, n + 1).await?;
    let holder = Arc::clone(&cs[0]);
    let h = holder.acquire(&name).await?;
    let last_release = Arc::new(Mutex::new(Instant::now()));
    let handoffs = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let held = Arc::new(AtomicBool::new(true));
    let violations = Arc::new(AtomicU64::new(0));
    let go = Arc::new(AtomicBool::new(false));
    // The last waiter granted holds on until the counters are read: the window covers the
    // holder's release, N grants and N - 1 releases, i.e. exactly N handoffs.
    let granted_count = Arc::new(AtomicU64::new(0));
    let last_granted = Arc::new(tokio::sync::Notify::new());
    let counted = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for c in cs.iter().skip(1) {
        let (c, last_release, handoffs, held, violations, go, name) = (
            Arc::clone(c),
            Arc::clone(&last_release),
            Arc::clone(&handoffs),
            Arc::clone(&held),
            Arc::clone(&violations),
            Arc::clone(&go),
            name.clone(),
        );
        let (granted_count, last_granted, counted) = (
            Arc::clone(&granted_count),
            Arc::clone(&last_granted),
            Arc::clone(&counted),
        );
        tasks.push(tokio::spawn(async move {
            let h = c.acquire(&name).await?;
            let granted = Instant::now();
            if held.swap(true, Ordering::SeqCst) || !go.load(Ordering::SeqCst) {
                violations.fetch_add(1, Ordering::Relaxed);
            }
            {
                let mut lr = lock(&last_release);
                lock(&handoffs).push(granted.saturating_duration_since(*lr));
                *lr = Instant::now();
            }
            if granted_count.fetch_add(1, Ordering::SeqCst) + 1 == n as u64 {
                let wait = counted.notified();
                last_granted.notify_one();
                wait.await;
            }
            held.store(false, Ordering::SeqCst);
            c.release(h).await
        }));
    }
    // Let every waiter queue up (they spin for the peers that have no queue).
    tokio::time::sleep(Duration::from_millis(300 + 10 * n as u64)).await;
    let before = (probe.count().await, requests(&cs));
    go.store(true, Ordering::SeqCst);
    *lock(&last_release) = Instant::now();
    held.store(false, Ordering::SeqCst);
    holder.release(h).await?;
    let after = if tokio::time::timeout(Duration::from_secs(60), last_granted.notified())
        .await
        .is_ok()
    {
        (probe.count().await, requests(&cs))
    } else {
        (None, None)
    };
    counted.notify_one();
    let all = futures::future::join_all(tasks.iter_mut());
    match tokio::time::timeout(Duration::from_secs(60), all).await {
        Ok(results) => {
            for r in results {
                r.map_err(|e| format!("waiter task: {e}"))??;
            }
        }
        Err(_) => {
            for t in &tasks {
                t.abort();
            }
            return Err(format!(
                "{}: {n} waiters not all served in 60 s",
                imp.name()
            ));
        }
    }
    let handoffs = std::mem::take(&mut *lock(&handoffs));
    Ok(Queue {
        handoffs,
        server_requests: after.0.zip(before.0).map(|(a, b)| a.saturating_sub(b)),
        client_requests: after.1.zip(before.1).map(|(a, b)| a.saturating_sub(b)),
        violations: violations.load(Ordering::Relaxed),
    })
}

/// N waiters behind a holder, for every N in `ns`, `rounds` interleaved rounds.
pub async fn waiters(
    sink: &mut Sink<'_>,
    impls: &[Arc<dyn Impl>],
    ns: &[usize],
    rounds: usize,
    probe: &Probe,
) -> Result<(), String> {
    waiters_as(sink, "waiters", impls, ns, rounds, probe).await
}

/// [`waiters`] reported under the workload names `<label>-N` (e.g. `election-8` for leadership
/// handoffs, where an acquire is a campaign and a release a resignation).
pub async fn waiters_as(
    sink: &mut Sink<'_>,
    label: &str,
    impls: &[Arc<dyn Impl>],
    ns: &[usize],
    rounds: usize,
    probe: &Probe,
) -> Result<(), String> {
    let impls: Vec<&Arc<dyn Impl>> = impls.iter().filter(|i| i.contends()).collect();
    for &n in ns {
        let wl = format!("{label}-{n}");
        let mut handoffs = vec![Vec::new(); impls.len()];
        // The first handoff of a round follows 300 ms of idleness; the later ones follow a
        // handoff at once. Split, they tell a cold path from a slow one.
        let mut firsts = vec![Vec::new(); impls.len()];
        let mut later = vec![Vec::new(); impls.len()];
        let mut server = vec![Some(0u64); impls.len()];
        let mut client = vec![Some(0u64); impls.len()];
        let mut violations = vec![0u64; impls.len()];
        for r in 0..rounds {
            for i in order(impls.len(), r) {
                let q = queue_round(
                    impls[i].as_ref(),
                    n,
                    format!("{label}-queue-{n}-{r}"),
                    probe,
                )
                .await?;
                if let Some((first, rest)) = q.handoffs.split_first() {
                    firsts[i].push(*first);
                    later[i].extend_from_slice(rest);
                }
                handoffs[i].extend(q.handoffs);
                server[i] = server[i].zip(q.server_requests).map(|(a, b)| a + b);
                client[i] = client[i].zip(q.client_requests).map(|(a, b)| a + b);
                violations[i] += q.violations;
            }
        }
        for (i, imp) in impls.iter().enumerate() {
            let name = imp.name();
            let count = handoffs[i].len() as f64;
            let mean = handoffs[i].iter().sum::<Duration>().as_secs_f64() * 1e6 / count;
            sink.add(&wl, name, "handoff_mean", mean, "us");
            sink.percentiles(&wl, name, "handoff", &mut handoffs[i]);
            if n > 1 {
                sink.percentiles(&wl, name, "handoff_first", &mut firsts[i]);
                sink.percentiles(&wl, name, "handoff_later", &mut later[i]);
            }
            if let Some(s) = server[i] {
                sink.add(
                    &wl,
                    name,
                    probe.metric("per_handoff").as_str(),
                    s as f64 / count,
                    "requests",
                );
            }
            if let Some(c) = client[i] {
                sink.add(
                    &wl,
                    name,
                    "client_requests_per_handoff",
                    c as f64 / count,
                    "requests",
                );
            }
            sink.add(
                &wl,
                name,
                "exclusion_violations",
                violations[i] as f64,
                "count",
            );
        }
    }
    Ok(())
}

/// `count` distinct locks on one client: acquire all (concurrently), then release all.
pub async fn many_locks(
    sink: &mut Sink<'_>,
    impls: &[Arc<dyn Impl>],
    count: usize,
    rounds: usize,
) -> Result<(), String> {
    let mut cs = Vec::new();
    for i in impls {
        cs.push(i.client(TTL).await?);
    }
    let names: Vec<String> = (0..count).map(|k| format!("many-{k}")).collect();
    let mut acq = vec![Duration::ZERO; impls.len()];
    let mut rel = vec![Duration::ZERO; impls.len()];
    // Round 0 is a warm-up (parents created on first use are not measured).
    for r in 0..=rounds {
        for i in order(impls.len(), r) {
            let c = &cs[i];
            let t0 = Instant::now();
            let held = futures::future::join_all(names.iter().map(|n| c.acquire(n))).await;
            let t1 = Instant::now();
            let held: Vec<_> = held.into_iter().collect::<Result<_, _>>()?;
            let released = futures::future::join_all(held.into_iter().map(|h| c.release(h))).await;
            let t2 = Instant::now();
            released.into_iter().collect::<Result<Vec<()>, _>>()?;
            if r > 0 {
                acq[i] += t1 - t0;
                rel[i] += t2 - t1;
            }
        }
    }
    let wl = format!("locks-{count}");
    let total = (count * rounds) as f64;
    for (i, imp) in impls.iter().enumerate() {
        let name = imp.name();
        sink.add(
            &wl,
            name,
            "pairs_per_s",
            total / (acq[i] + rel[i]).as_secs_f64(),
            "1/s",
        );
        sink.add(
            &wl,
            name,
            "acquire_ops_per_s",
            total / acq[i].as_secs_f64(),
            "1/s",
        );
        sink.add(
            &wl,
            name,
            "release_ops_per_s",
            total / rel[i].as_secs_f64(),
            "1/s",
        );
    }
    Ok(())
}

/// The TTL a renewal driver counts with, from a lease's validity (`ttl − drift(ttl)`, where
/// drift = ttl/100 + 2 ms): the driver renews every third of it. A validity measured from
/// before the acquire began is at most the acquire's latency long, which errs towards a window
/// of slightly more than whole periods (k or k + 1 rounds, never k − 1).
fn driver_ttl(validity: Duration) -> Duration {
    (validity + Duration::from_millis(2)).mul_f64(100.0 / 99.0)
}

/// How many renewal periods the held-leases window spans.
const LEASE_PERIODS: u32 = 6;

/// `count` leases held on one dlock locker: renewal rounds and requests per renewal period
/// over a window of 6 periods, and resident memory per lease. The period is a third of the TTL
/// the renewal driver counts with, found from a lease's validity (the warm-up lease's deadline
/// less the instant its acquire began, see [`driver_ttl`]): the TTL the server granted (etcd
/// rounds up to whole seconds, ZooKeeper negotiates the session timeout), on ZooKeeper less a
/// server-tick margin (its leases are valid for about 70 % of the session timeout and renewed
/// that much more often). A period taken from the TTL asked for, or from the session timeout,
/// would misjudge the rounds per period by the ratio of the two.
pub async fn held_leases(
    sink: &mut Sink<'_>,
    dlock: &Dlock,
    count: usize,
    ttl: Duration,
    probe: &Probe,
) -> Result<(), String> {
    let locker = dlock.locker(ttl).await?;
    let warm = dlock_core::LockName::new("warm-up").map_err(|e| e.to_string())?;
    let began = tokio::time::Instant::now();
    let lease = locker
        .acquire(&warm, dlock_core::AcquireOptions::forever())
        .await
        .map_err(|e| e.to_string())?;
    // At most the acquire's own latency above the validity the driver counts from the
    // request's start.
    let validity = lease.deadline().saturating_duration_since(began);
    lease.release().await.map_err(|e| e.to_string())?;
    let names = (0..count)
        .map(|k| dlock_core::LockName::new(format!("lease-{k}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let granted = locker.ttl();
    let period = driver_ttl(validity) / 3;
    if period.is_zero() {
        return Err(format!("the warm-up lease had no validity ({validity:?})"));
    }
    let window = period * LEASE_PERIODS;
    let rss0 = rss_bytes();
    let t0 = Instant::now();
    let leases: Vec<_> = futures::stream::iter(names.iter())
        .map(|n| locker.acquire(n, dlock_core::AcquireOptions::forever()))
        .buffer_unordered(256)
        .collect()
        .await;
    let acquire_time = t0.elapsed();
    let leases = leases
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("acquire of {count} leases: {e}"))?;
    let rss1 = rss_bytes();
    // Let the first renewals of the freshly acquired leases pass: each is due a period after
    // its own grant, so the last ones come a period after the acquiring ended, and their
    // rounds (a few, while grants keep arriving) settle into one cadence after that.
    tokio::time::sleep(period * 2).await;
    let (s0, p0) = (locker.stats(), probe.count().await);
    let w0 = Instant::now();
    tokio::time::sleep(window).await;
    // The window as it was (a sleep overshoots on a loaded machine), in periods.
    let periods = w0.elapsed().as_secs_f64() / period.as_secs_f64();
    let (s1, p1) = (locker.stats(), probe.count().await);
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    let released: Vec<_> = futures::stream::iter(leases)
        .map(|l| l.release())
        .buffer_unordered(256)
        .collect()
        .await;
    let release_errors = released.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = released.iter().find(|r| r.is_err()) {
        eprintln!("  {release_errors} of {count} releases failed; first: {e}");
    }
    let wl = format!("leases-{count}");
    sink.add(
        &wl,
        "dlock",
        "lease_ttl_granted",
        granted.as_secs_f64() * 1e6,
        "us",
    );
    sink.add(
        &wl,
        "dlock",
        "lease_validity",
        validity.as_secs_f64() * 1e6,
        "us",
    );
    sink.add(
        &wl,
        "dlock",
        "acquire_ops_per_s",
        count as f64 / acquire_time.as_secs_f64(),
        "1/s",
    );
    sink.add(
        &wl,
        "dlock",
        "renewal_rounds_per_period",
        (s1.renewals - s0.renewals) as f64 / periods,
        "rounds",
    );
    sink.add(
        &wl,
        "dlock",
        "client_requests_per_period",
        (s1.requests - s0.requests) as f64 / periods,
        "requests",
    );
    if let (Some(a), Some(b)) = (p1, p0) {
        sink.add(
            &wl,
            "dlock",
            probe.metric("per_period").as_str(),
            a.saturating_sub(b) as f64 / periods,
            "requests",
        );
    }
    if let (Some(a), Some(b)) = (rss1, rss0) {
        sink.add(
            &wl,
            "dlock",
            "rss_per_lease",
            a.saturating_sub(b) as f64 / count as f64,
            "bytes",
        );
    }
    sink.add(&wl, "dlock", "leases_lost", lost as f64, "count");
    sink.add(
        &wl,
        "dlock",
        "release_errors",
        release_errors as f64,
        "count",
    );
    Ok(())
}
