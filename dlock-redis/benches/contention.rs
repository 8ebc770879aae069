//! Contention: 8 clients handing one fair lock around (handoffs/s, wait p99, true handoffs) vs
//! rslock 0.10, and the herd figure: server commands per handoff (`INFO commandstats`) with
//! N = 1, 8, 32, 64 queued waiters.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_redis::RedisLocker;

const TTL: Duration = Duration::from_secs(10);
const WORKERS: usize = 8;

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap_or_else(|e| panic!("{e}"))
}

/// What a fixed-duration contention run saw.
#[derive(Debug, Default)]
struct Run {
    grants: u64,
    switches: u64,
    waits: Vec<Duration>,
    per_worker: Vec<u64>,
    elapsed: Duration,
}

impl Run {
    fn print(&self, who: &str) {
        let mut w = self.waits.clone();
        w.sort();
        let secs = self.elapsed.as_secs_f64();
        eprintln!(
            "[contention] {who}: {:.0} grants/s, {:.0} true handoffs/s ({} of {}), wait p50 {:?} p99 {:?} max {:?}, per worker {:?}",
            self.grants as f64 / secs,
            self.switches as f64 / secs,
            self.switches,
            self.grants,
            common::percentile(&w, 0.5),
            common::percentile(&w, 0.99),
            w.last().copied().unwrap_or_default(),
            self.per_worker
        );
    }
}

/// Last holder, true handoffs, waits, grants per worker.
type Tally = (Option<usize>, u64, Vec<Duration>, Vec<u64>);

struct Shared {
    stop: AtomicBool,
    grants: AtomicU64,
    target: u64,
    last: Mutex<Tally>,
    reached: Mutex<Option<Instant>>,
}

impl Shared {
    fn new(target: u64) -> Arc<Self> {
        Arc::new(Shared {
            stop: AtomicBool::new(false),
            grants: AtomicU64::new(0),
            target,
            last: Mutex::new((None, 0, Vec::new(), vec![0; WORKERS])),
            reached: Mutex::new(None),
        })
    }

    /// Records a grant; returns false once the run is over.
    fn granted(&self, worker: usize, wait: Duration) -> bool {
        let n = self.grants.fetch_add(1, Ordering::SeqCst) + 1;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.0.is_some_and(|w| w != worker) {
            last.1 += 1;
        }
        last.0 = Some(worker);
        last.2.push(wait);
        last.3[worker] += 1;
        if n == self.target {
            *self.reached.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
        n <= self.target && !self.stop.load(Ordering::SeqCst)
    }
}

/// 8 dlock clients hand the lock around until `target` grants (or `stop`).
async fn dlock_run(
    lockers: &[RedisLocker],
    lock: &LockName,
    target: u64,
    duration: Option<Duration>,
) -> Run {
    let shared = Shared::new(target);
    let began = Instant::now();
    let mut tasks = Vec::new();
    for (i, l) in lockers.iter().enumerate() {
        let (l, lock, shared) = (l.clone(), lock.clone(), Arc::clone(&shared));
        tasks.push(tokio::spawn(async move {
            loop {
                let t0 = Instant::now();
                let lease = l
                    .acquire(&lock, AcquireOptions::forever())
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                let more = shared.granted(i, t0.elapsed());
                lease.release().await.unwrap_or_else(|e| panic!("{e}"));
                if !more {
                    return;
                }
            }
        }));
    }
    if let Some(d) = duration {
        tokio::time::sleep(d).await;
        shared.stop.store(true, Ordering::SeqCst);
    }
    for t in tasks {
        t.await.unwrap_or_else(|e| panic!("{e}"));
    }
    finish(&shared, began, duration)
}

fn finish(shared: &Shared, began: Instant, duration: Option<Duration>) -> Run {
    let last = shared.last.lock().unwrap_or_else(|p| p.into_inner());
    let reached = *shared.reached.lock().unwrap_or_else(|p| p.into_inner());
    Run {
        grants: shared.grants.load(Ordering::SeqCst).min(shared.target),
        switches: last.1,
        waits: last.2.clone(),
        per_worker: last.3.clone(),
        elapsed: duration
            .or_else(|| reached.map(|r| r - began))
            .unwrap_or_else(|| began.elapsed()),
    }
}

/// The same with rslock (its default retry: 3 tries, random 0–200 ms apart, looped).
async fn rslock_run(urls: &[String], duration: Duration) -> Run {
    let shared = Shared::new(u64::MAX);
    let began = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..WORKERS {
        let rs = rslock::LockManager::new(urls.to_vec());
        let shared = Arc::clone(&shared);
        tasks.push(tokio::spawn(async move {
            loop {
                let t0 = Instant::now();
                let lock = rs
                    .acquire_no_guard("bench/rslock-c", TTL)
                    .await
                    .unwrap_or_else(|e| panic!("{e:?}"));
                let more = shared.granted(i, t0.elapsed());
                rs.unlock(&lock).await;
                if !more {
                    return;
                }
            }
        }));
    }
    tokio::time::sleep(duration).await;
    shared.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap_or_else(|e| panic!("{e}"));
    }
    finish(&shared, began, Some(duration))
}

async fn lockers(url: &str, n: usize, ns: &str) -> Vec<RedisLocker> {
    (0..n)
        .map(|_| {
            RedisLocker::builder()
                .url(url)
                .ttl(TTL)
                .namespace(ns)
                .build()
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

/// Herd: N clients queue behind a holder; each holds 1 ms and releases. Server commands (all
/// of them, including those run inside scripts) and client wakeups per handoff.
async fn herd(url: &str, n: usize) {
    let mut conn = common::plain(url).await;
    let ns = format!("bench/herd{n}");
    let holder = lockers(url, 1, &ns).await.remove(0);
    let waiters = lockers(url, n, &ns).await;
    let lock = name("herd");
    let lease = holder
        .acquire(&lock, AcquireOptions::forever())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut tasks = Vec::new();
    for w in &waiters {
        let (w, lock) = (w.clone(), lock.clone());
        tasks.push(tokio::spawn(async move {
            let l = w
                .acquire(&lock, AcquireOptions::forever())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            tokio::time::sleep(Duration::from_millis(1)).await;
            l.release().await.unwrap_or_else(|e| panic!("{e}"));
        }));
    }
    let qkey = format!("{ns}/dlock:{{herd}}:q");
    loop {
        let len: usize = redis::cmd("LLEN")
            .arg(&qkey)
            .query_async(&mut conn)
            .await
            .unwrap_or(0);
        if len == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Let every waiter's notification channel come up (its first subscribe re-checks once).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before: (u64, u64) = waiters
        .iter()
        .map(|w| w.stats())
        .fold((0, 0), |a, s| (a.0 + s.wakeups, a.1 + s.requests));
    common::reset_stats(&mut conn).await;
    let released = Instant::now();
    lease.release().await.unwrap_or_else(|e| panic!("{e}"));
    for t in tasks {
        t.await.unwrap_or_else(|e| panic!("{e}"));
    }
    let took = released.elapsed();
    let stats = common::commandstats(&mut conn).await;
    let after: (u64, u64) = waiters
        .iter()
        .map(|w| w.stats())
        .fold((0, 0), |a, s| (a.0 + s.wakeups, a.1 + s.requests));
    let total: u64 = stats
        .iter()
        .filter(|(k, _)| {
            !k.ends_with(".usec") && !k.starts_with("info") && !k.starts_with("config")
        })
        .map(|(_, v)| *v)
        .sum();
    let evalsha = stats.get("evalsha").copied().unwrap_or(0);
    let publish = stats.get("publish").copied().unwrap_or(0);
    let nf = n as f64;
    eprintln!(
        "[herd] dlock fair N={n}: {:.2} server commands/handoff ({:.2} EVALSHA, {:.2} PUBLISH), {:.2} client requests/handoff, {:.2} wakeups/handoff, handoff {:?}",
        total as f64 / nf,
        evalsha as f64 / nf,
        publish as f64 / nf,
        (after.1 - before.1) as f64 / nf,
        (after.0 - before.0) as f64 / nf,
        took / n as u32
    );
}

/// The same herd measure for rslock (its waiters poll).
async fn rslock_herd(url: &str, n: usize) {
    let mut conn = common::plain(url).await;
    let key = format!("bench/rsherd{n}");
    let holder = rslock::LockManager::new(vec![url.to_string()]);
    let lock = holder
        .lock(key.as_str(), TTL)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let rs = rslock::LockManager::new(vec![url.to_string()]);
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let l = rs
                .acquire_no_guard(key.as_str(), TTL)
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
            tokio::time::sleep(Duration::from_millis(1)).await;
            rs.unlock(&l).await;
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    common::reset_stats(&mut conn).await;
    let released = Instant::now();
    holder.unlock(&lock).await;
    for t in tasks {
        t.await.unwrap_or_else(|e| panic!("{e}"));
    }
    let took = released.elapsed();
    let stats = common::commandstats(&mut conn).await;
    let total: u64 = stats
        .iter()
        .filter(|(k, _)| {
            !k.ends_with(".usec") && !k.starts_with("info") && !k.starts_with("config")
        })
        .map(|(_, v)| *v)
        .sum();
    eprintln!(
        "[herd] rslock N={n}: {:.2} server commands/handoff, handoff {:?}",
        total as f64 / n as f64,
        took / n as u32
    );
}

fn benches(c: &mut Criterion) {
    let one = common::cluster(1);
    let herd_node = common::cluster(1);
    let rt = common::runtime();
    let url = one.endpoints().remove(0);
    let herd_url = herd_node.endpoints().remove(0);
    let lock = name("contended");
    let ls = rt.block_on(lockers(&url, WORKERS, "bench/c"));

    // Fixed 3 s runs, side by side, for handoffs/s and wait percentiles.
    rt.block_on(async {
        dlock_run(&ls, &lock, u64::MAX, Some(Duration::from_secs(3)))
            .await
            .print("dlock fair, 8 clients");
        rslock_run(std::slice::from_ref(&url), Duration::from_secs(3))
            .await
            .print("rslock 0.10, 8 clients");
        for n in [1, 8, 32, 64] {
            herd(&herd_url, n).await;
        }
        for n in [1, 8, 32, 64] {
            rslock_herd(&herd_url, n).await;
        }
    });

    let mut g = c.benchmark_group("contention");
    g.bench_function("dlock_fair_8way_time_per_handoff", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let ls = &ls;
            let lock = &lock;
            async move { dlock_run(ls, lock, iters, None).await.elapsed }
        })
    });
    g.finish();
}

criterion_group!(name = group; config = common::criterion(); targets = benches);
criterion_main!(group);
