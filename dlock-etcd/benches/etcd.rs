//! dlock-etcd benches, side by side with etcd's server-side lock API (etcd-client `lock` /
//! `unlock`, one pre-granted lease per contender) on the same server in the same run.
//!
//! `cargo bench -p dlock-etcd` runs the criterion groups (uncontended acquire+release,
//! try_acquire on a held lock), then prints the contention report: 8-way handoffs/s and
//! handoff latency, requests and wakeups per handoff for N = 1, 8, 32, 64 waiters, and the
//! renewal cost of 10,000 held leases on one session. Set `DLOCK_ETCD_ENDPOINTS` to bench an
//! external etcd; otherwise one is started (see dlock-conformance's server harness).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use criterion::Criterion;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_etcd::EtcdLocker;
use dlock_etcd::etcd_client::{Client, LockOptions};
use tokio::runtime::Runtime;
use tokio::sync::Mutex;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
/// TTL of the leases pre-granted to the etcd lock API's contenders (longer than any run).
const PEER_LEASE_TTL: i64 = 600;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn ns(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "dlock-bench/{}-{}/{what}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn locker(endpoints: &[String], ns: &str) -> EtcdLocker {
    EtcdLocker::builder()
        .endpoints(endpoints.to_vec())
        .ttl(TTL)
        .prefix(ns)
        .build()
        .await
        .expect("locker")
}

/// Opens the locker's session outside any measurement.
async fn warm(l: &EtcdLocker) {
    if let Some(lease) = l
        .try_acquire(&LockName::new("warm").expect("valid"))
        .await
        .expect("warm")
    {
        lease.release().await.expect("release");
    }
}

/// A client of etcd's lock API with its own pre-granted lease.
async fn peer(endpoints: &[String]) -> (Client, i64) {
    let mut c = Client::connect(endpoints, None).await.expect("etcd client");
    let lease = c
        .lease_grant(PEER_LEASE_TTL, None)
        .await
        .expect("lease")
        .id();
    (c, lease)
}

fn uncontended(c: &mut Criterion, rt: &Runtime, endpoints: &[String]) {
    let mut g = c.benchmark_group("uncontended_acquire_release");
    let l = rt.block_on(locker(endpoints, &ns("uncontended")));
    let name = LockName::new("u").expect("valid");
    // Open the session outside the measurement.
    rt.block_on(async {
        l.try_acquire(&name)
            .await
            .expect("warm")
            .expect("free")
            .release()
            .await
            .expect("release")
    });
    g.bench_function("dlock", |b| {
        b.to_async(rt).iter(|| async {
            let lease = l
                .acquire(&name, AcquireOptions::forever())
                .await
                .expect("acquire");
            lease.release().await.expect("release");
        })
    });
    let (client, lease) = rt.block_on(peer(endpoints));
    let peer_name = ns("uncontended-peer");
    g.bench_function("etcd_lock_api", |b| {
        b.to_async(rt).iter(|| async {
            let mut c = client.clone();
            let key = c
                .lock(
                    peer_name.as_str(),
                    Some(LockOptions::new().with_lease(lease)),
                )
                .await
                .expect("lock")
                .key()
                .to_vec();
            c.unlock(key).await.expect("unlock");
        })
    });
    g.finish();
}

fn try_acquire_held(c: &mut Criterion, rt: &Runtime, endpoints: &[String]) {
    let mut g = c.benchmark_group("try_acquire_on_held");
    let space = ns("try-held");
    let holder = rt.block_on(locker(endpoints, &space));
    let tryer = rt.block_on(locker(endpoints, &space));
    let name = LockName::new("held").expect("valid");
    let held = rt
        .block_on(holder.acquire(&name, AcquireOptions::forever()))
        .expect("hold");
    rt.block_on(async { assert!(tryer.try_acquire(&name).await.expect("warm").is_none()) });
    g.bench_function("dlock", |b| {
        b.to_async(rt).iter(|| async {
            let got = tryer.try_acquire(&name).await.expect("try_acquire");
            assert!(got.is_none());
        })
    });
    g.finish();
    rt.block_on(held.release()).expect("release");
}

/// Percentile of sorted durations.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[derive(Default)]
struct Handoffs {
    /// (worker that released last, when its release started)
    last: Option<(usize, Instant)>,
    latencies: Vec<Duration>,
    grants: u64,
    holders: u64,
    violations: u64,
}

struct ContentionResult {
    /// Handoffs slower than 50 ms, and the slowest.
    stalls: (usize, Duration),
    handoffs_per_s: f64,
    p50: Duration,
    p99: Duration,
    grants: u64,
    violations: u64,
    min_max: (u64, u64),
}

async fn record_grant(state: &Mutex<Handoffs>, worker: usize) {
    let mut s = state.lock().await;
    s.grants += 1;
    s.holders += 1;
    if s.holders > 1 {
        s.violations += 1;
    }
    if let Some((prev, at)) = s.last {
        if prev != worker {
            let d = at.elapsed();
            s.latencies.push(d);
        }
    }
}

async fn record_release(state: &Mutex<Handoffs>, worker: usize) {
    let mut s = state.lock().await;
    s.holders -= 1;
    s.last = Some((worker, Instant::now()));
}

fn summarize(state: Handoffs, per_worker: Vec<u64>, secs: f64) -> ContentionResult {
    let mut l = state.latencies;
    l.sort();
    ContentionResult {
        stalls: (
            l.iter().filter(|d| **d > Duration::from_millis(50)).count(),
            l.last().copied().unwrap_or_default(),
        ),
        handoffs_per_s: l.len() as f64 / secs,
        p50: pct(&l, 0.5),
        p99: pct(&l, 0.99),
        grants: state.grants,
        violations: state.violations,
        min_max: (
            per_worker.iter().copied().min().unwrap_or(0),
            per_worker.iter().copied().max().unwrap_or(0),
        ),
    }
}

/// `workers` lockers loop acquire → release on one name for `secs`.
async fn contention_dlock(endpoints: &[String], workers: usize, secs: f64) -> ContentionResult {
    let space = ns("contention");
    let name = LockName::new("hot").expect("valid");
    let mut lockers = Vec::new();
    for _ in 0..workers {
        let l = locker(endpoints, &space).await;
        // Open each session before the clock starts.
        warm(&l).await;
        lockers.push(l);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let state = Arc::new(Mutex::new(Handoffs::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (w, l) in lockers.into_iter().enumerate() {
        let (state, stop, name) = (Arc::clone(&state), Arc::clone(&stop), name.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let lease = l
                    .acquire(&name, AcquireOptions::wait(Duration::from_secs(30)))
                    .await
                    .expect("acquire");
                record_grant(&state, w).await;
                mine += 1;
                record_release(&state, w).await;
                lease.release().await.expect("release");
            }
            mine
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut per_worker = Vec::new();
    for t in tasks {
        per_worker.push(t.await.expect("task"));
    }
    let state = Arc::try_unwrap(state)
        .ok()
        .expect("sole owner")
        .into_inner();
    summarize(state, per_worker, secs)
}

/// The same loop on etcd's lock API, one pre-granted lease per worker.
async fn contention_peer(endpoints: &[String], workers: usize, secs: f64) -> ContentionResult {
    let name = ns("contention-peer");
    let state = Arc::new(Mutex::new(Handoffs::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (mut c, lease) = peer(endpoints).await;
        let (state, stop, name) = (Arc::clone(&state), Arc::clone(&stop), name.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = c
                    .lock(name.as_str(), Some(LockOptions::new().with_lease(lease)))
                    .await
                    .expect("lock")
                    .key()
                    .to_vec();
                record_grant(&state, w).await;
                mine += 1;
                record_release(&state, w).await;
                c.unlock(key).await.expect("unlock");
            }
            mine
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut per_worker = Vec::new();
    for t in tasks {
        per_worker.push(t.await.expect("task"));
    }
    let state = Arc::try_unwrap(state)
        .ok()
        .expect("sole owner")
        .into_inner();
    summarize(state, per_worker, secs)
}

/// N waiters queue behind a holder; the holder releases and each waiter releases as soon as
/// it is granted. Returns (requests per handoff, wakeups per handoff, handoffs/s) over the N
/// handoffs, counted by the lockers themselves.
async fn queue_chain(endpoints: &[String], n: usize) -> (f64, f64, f64) {
    let space = ns("chain");
    let name = LockName::new("chain").expect("valid");
    let holder = locker(endpoints, &space).await;
    let lease = holder
        .acquire(&name, AcquireOptions::forever())
        .await
        .expect("hold");
    let mut waiters = Vec::new();
    for _ in 0..n {
        let l = locker(endpoints, &space).await;
        warm(&l).await;
        waiters.push(l);
    }
    let before: Vec<_> = waiters.iter().map(Locker::stats).collect();
    let mut tasks = Vec::new();
    for l in &waiters {
        let (l, name) = (l.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let lease = l
                .acquire(&name, AcquireOptions::wait(Duration::from_secs(60)))
                .await
                .expect("acquire");
            let granted = Instant::now();
            lease.release().await.expect("release");
            (granted, Instant::now())
        }));
        // Enqueue in order.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Let every waiter enqueue and start watching.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let h_before = holder.stats();
    let t = Instant::now();
    lease.release().await.expect("release");
    let mut times = Vec::new();
    for task in tasks {
        times.push(task.await.expect("task"));
    }
    let secs = t.elapsed().as_secs_f64();
    if std::env::var_os("DLOCK_BENCH_VERBOSE").is_some() {
        times.sort();
        let mut prev = t;
        let hops: Vec<String> = times
            .iter()
            .map(|(g, r)| {
                let s = format!(
                    "{:.2}/{:.2}",
                    (*g - prev).as_secs_f64() * 1e3,
                    (*r - *g).as_secs_f64() * 1e3
                );
                prev = *r;
                s
            })
            .collect();
        println!(
            "  hops (ms, release-start→grant / grant→released): {}",
            hops.join(" ")
        );
    }
    let h_after = holder.stats();
    let mut requests = (h_after.requests - h_before.requests) as f64;
    let mut wakeups = 0.0;
    for (l, b) in waiters.iter().zip(before) {
        let a = l.stats();
        requests += (a.requests - b.requests) as f64;
        wakeups += (a.wakeups - b.wakeups) as f64;
    }
    (requests / n as f64, wakeups / n as f64, n as f64 / secs)
}

/// One locker holds `n` leases; over `hold`, how many renewal rounds and requests does it
/// send?
async fn many_held(endpoints: &[String], n: usize, hold: Duration) -> (Duration, u64, u64, f64) {
    let l = EtcdLocker::builder()
        .endpoints(endpoints.to_vec())
        .ttl(Duration::from_secs(3))
        .prefix(ns("many-held"))
        .build()
        .await
        .expect("locker");
    let t = Instant::now();
    let mut leases = Vec::with_capacity(n);
    let names: Vec<LockName> = (0..n)
        .map(|i| LockName::new(format!("l{i}")).expect("valid"))
        .collect();
    for chunk in names.chunks(64) {
        let got = futures::future::join_all(
            chunk
                .iter()
                .map(|name| l.acquire(name, AcquireOptions::forever())),
        )
        .await;
        for g in got {
            leases.push(g.expect("acquire"));
        }
    }
    let acquire_time = t.elapsed();
    let before = l.stats();
    tokio::time::sleep(hold).await;
    let after = l.stats();
    let live = leases.iter().filter(|x| x.check().is_ok()).count() as f64 / n as f64;
    futures::future::join_all(leases.into_iter().map(|x| x.release())).await;
    (
        acquire_time,
        after.renewals - before.renewals,
        after.requests - before.requests,
        live,
    )
}

/// Interleaved rounds of `per_round` sequential pairs each: dlock acquire+release, etcd lock
/// API lock+unlock, and the floor (put + delete). Returns sorted latencies per contender.
async fn uncontended_interleaved(
    endpoints: &[String],
    rounds: usize,
    per_round: usize,
) -> [Vec<Duration>; 5] {
    let l = locker(endpoints, &ns("pairs")).await;
    let name = LockName::new("p").expect("valid");
    warm(&l).await;
    let (client, lease) = peer(endpoints).await;
    let peer_name = ns("pairs-peer");
    let floor_key = ns("pairs-floor");
    // pairs: dlock, lock API, floor; then the acquire halves: dlock, lock API.
    let mut out: [Vec<Duration>; 5] = Default::default();
    for _ in 0..rounds {
        for _ in 0..per_round {
            let t = Instant::now();
            let g = l
                .acquire(&name, AcquireOptions::forever())
                .await
                .expect("acquire");
            out[3].push(t.elapsed());
            g.release().await.expect("release");
            out[0].push(t.elapsed());
        }
        for _ in 0..per_round {
            let mut c = client.clone();
            let t = Instant::now();
            let key = c
                .lock(
                    peer_name.as_str(),
                    Some(LockOptions::new().with_lease(lease)),
                )
                .await
                .expect("lock")
                .key()
                .to_vec();
            out[4].push(t.elapsed());
            c.unlock(key).await.expect("unlock");
            out[1].push(t.elapsed());
        }
        for _ in 0..per_round {
            let mut c = client.clone();
            let t = Instant::now();
            c.put(floor_key.as_str(), "", None).await.expect("put");
            c.delete(floor_key.as_str(), None).await.expect("delete");
            out[2].push(t.elapsed());
        }
    }
    for v in &mut out {
        v.sort();
    }
    out
}

fn report(rt: &Runtime, endpoints: &[String]) {
    println!("\n==== report (one run, same server) ====");
    let pairs = rt.block_on(uncontended_interleaved(endpoints, 10, 200));
    for (who, v) in [
        "dlock-etcd acquire+release",
        "etcd lock API lock+unlock",
        "floor put+delete",
        "dlock-etcd acquire only",
        "etcd lock API lock only",
    ]
    .iter()
    .zip(&pairs)
    {
        println!(
            "uncontended {who:>27}: p50 {:>9.3?}  p99 {:>9.3?}  n {}",
            pct(v, 0.5),
            pct(v, 0.99),
            v.len()
        );
    }
    println!(
        "uncontended ratio dlock/etcd-lock-api p50 x{:.3}, dlock/floor p50 x{:.3}",
        pct(&pairs[0], 0.5).as_secs_f64() / pct(&pairs[1], 0.5).as_secs_f64(),
        pct(&pairs[0], 0.5).as_secs_f64() / pct(&pairs[2], 0.5).as_secs_f64()
    );
    let secs = 3.0;
    let d = rt.block_on(contention_dlock(endpoints, 8, secs));
    let p = rt.block_on(contention_peer(endpoints, 8, secs));
    for (who, r) in [("dlock-etcd", &d), ("etcd lock API", &p)] {
        println!(
            "8-way {who:>14}: {:>8.1} handoffs/s  p50 {:>9.3?}  p99 {:>9.3?}  >50ms {} (max {:.1?})  grants {}  per-worker {}..{}  violations {}",
            r.handoffs_per_s,
            r.p50,
            r.p99,
            r.stalls.0,
            r.stalls.1,
            r.grants,
            r.min_max.0,
            r.min_max.1,
            r.violations
        );
    }
    println!(
        "8-way ratio dlock/etcd-lock-api: handoffs/s x{:.1}, p99 x{:.3}",
        d.handoffs_per_s / p.handoffs_per_s.max(1e-9),
        d.p99.as_secs_f64() / p.p99.as_secs_f64().max(1e-9)
    );
    for n in [1usize, 8, 32, 64] {
        let (req, wake, rate) = rt.block_on(queue_chain(endpoints, n));
        println!(
            "queue N={n:>2}: {req:.2} requests/handoff, {wake:.2} wakeups/handoff, {rate:.0} handoffs/s"
        );
    }
    let (acq, renewals, requests, live) =
        rt.block_on(many_held(endpoints, 10_000, Duration::from_secs(3)));
    println!(
        "10,000 held leases on one session (TTL 3 s): acquired in {acq:.2?}; during 3 s held: {renewals} renewal rounds, {requests} other requests, {:.1}% live",
        live * 100.0
    );
}

fn main() {
    let cluster = Cluster::shared(ServerKind::Etcd, 1).expect("etcd for the benches");
    let endpoints = cluster.endpoints();
    let rt = runtime();
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    uncontended(&mut c, &rt, &endpoints);
    try_acquire_held(&mut c, &rt, &endpoints);
    c.final_summary();
    report(&rt, &endpoints);
}
