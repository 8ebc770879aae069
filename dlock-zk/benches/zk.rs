//! Benchmarks of the ZooKeeper locker against zookeeper-client's own lock recipe and the raw
//! create + getChildren + delete floor, on the same server in the same run.
//!
//! Run: `DLOCK_SERVER_FSYNC=1 cargo bench -p dlock-zk` (or point `DLOCK_ZK_CONNECT` at a
//! server). First a summary pass prints latency percentiles, 8-way handoffs/s and p99, and
//! herd figures (watch notifications and requests per handoff for N = 1, 8, 32, 64) with the
//! ratios, then the throughput of many independent locks on one locker and the renewal cost of
//! 1000 held leases; then criterion measures the uncontended cases and the 8-way handoff
//! (`DLOCK_BENCH_SUMMARY_ONLY=1` stops after the summary).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::Criterion;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_zk::ZkLocker;
use tokio::runtime::Runtime;
use tokio::time::Instant;
use zookeeper_client as zk;

const TTL: Duration = Duration::from_secs(10);
fn wait() -> AcquireOptions {
    AcquireOptions::forever()
}

struct Env {
    connect: String,
    rt: Runtime,
    ns: String,
}

impl Env {
    fn new() -> Env {
        let cluster = Cluster::shared(ServerKind::Zk, 1)
            .unwrap_or_else(|e| panic!("ZooKeeper for the benches: {e}"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        Env {
            connect: cluster.endpoints()[0].clone(),
            rt,
            ns: format!("bench/p{}", std::process::id()),
        }
    }

    async fn locker(&self, sub: &str) -> ZkLocker {
        ZkLocker::builder(&self.connect)
            .ttl(TTL)
            .namespace(format!("{}/{sub}", self.ns))
            .build()
            .await
            .unwrap()
    }

    async fn client(&self) -> zk::Client {
        zk::Client::connector()
            .with_session_timeout(TTL)
            .connect(&self.connect)
            .await
            .unwrap()
    }

    /// A parent dir for the peer recipe and the raw floor.
    async fn dir(&self, client: &zk::Client, sub: &str) -> String {
        let dir = format!("/dlock-bench/p{}/{sub}", std::process::id());
        client
            .mkdir(
                &dir,
                &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
            )
            .await
            .unwrap();
        dir
    }
}

/// dlock: acquire + release of an uncontended lock.
async fn dlock_pair(l: &ZkLocker, name: &LockName) {
    let lease = l.acquire(name, wait()).await.unwrap();
    lease.release().await.unwrap();
}

/// zookeeper-client's `Client::lock` (Curator prefix) + an explicit delete, so the release is a
/// measured round trip like ours (dropping the LockClient would delete in the background).
async fn peer_pair(c: &zk::Client, dir: &str) {
    let options = zk::LockOptions::new(zk::Acls::anyone_all())
        .with_ancestor_options(zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()))
        .unwrap();
    let lock = c
        .lock(
            zk::LockPrefix::new_curator(dir, "lock-").unwrap(),
            b"",
            options,
        )
        .await
        .unwrap();
    c.delete(lock.lock_path(), None).await.unwrap();
    std::mem::forget(lock);
}

/// The floor: the round trips the recipe needs (create, getChildren, delete).
async fn raw_floor(c: &zk::Client, dir: &str) {
    let prefix = format!("{dir}/n-");
    let (_, seq) = c
        .create(
            &prefix,
            b"",
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let _ = c.list_children(dir).await.unwrap();
    c.delete(&format!("{prefix}{seq}"), None).await.unwrap();
}

/// CPU time (user + system) this process used so far, from `/proc/self/stat` (Linux; zero
/// elsewhere). The servers are separate processes, so this is the client side only.
fn cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return Duration::ZERO;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Fields are numbered from 1 with pid and comm first: utime is field 14, index 11 here.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `op` back to back for `secs`; returns sorted latencies.
async fn sample<F, Fut>(secs: f64, mut op: F) -> Vec<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..10 {
        op().await;
    }
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut v = Vec::new();
    while Instant::now() < end {
        let t = Instant::now();
        op().await;
        v.push(t.elapsed());
    }
    v.sort();
    v
}

/// Sums runs: rates averaged, percentiles over all handoffs.
fn merge(runs: &[Handoffs]) -> Handoffs {
    let mut all: Vec<Duration> = runs
        .iter()
        .flat_map(|r| r.samples.iter().copied())
        .collect();
    all.sort();
    Handoffs {
        per_sec: runs.iter().map(|r| r.per_sec).sum::<f64>() / runs.len().max(1) as f64,
        p50: percentile(&all, 0.5),
        p99: percentile(&all, 0.99),
        acquisitions: runs.iter().map(|r| r.acquisitions).sum(),
        switches: runs.iter().map(|r| r.switches).sum(),
        violations: runs.iter().map(|r| r.violations).sum(),
        samples: all,
    }
}

/// The 8-way handoff result.
#[derive(Debug, Default, Clone)]
struct Handoffs {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    acquisitions: u64,
    switches: u64,
    violations: u64,
    samples: Vec<Duration>,
}

#[derive(Default)]
struct Track {
    last: Option<(usize, Instant)>,
    handoffs: Vec<Duration>,
    acquisitions: u64,
}

/// Workers loop acquire → release on one lock; a handoff is the time from the holder starting
/// its release to the next OTHER worker's grant. Runs until `target` switches happened or
/// `max` elapsed.
async fn handoffs<W, Fut>(
    workers: usize,
    target: u64,
    max: Duration,
    make: W,
) -> (Handoffs, Duration)
where
    W: Fn(
        usize,
        Arc<dyn Fn(usize) -> Box<dyn FnOnce() + Send> + Send + Sync>,
        Arc<AtomicBool>,
    ) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let track = Arc::new(Mutex::new(Track::default()));
    let inside = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let switches = Arc::new(AtomicU64::new(0));
    // `on_grant(worker)` records the grant and returns the "release starts" hook.
    let on_grant: Arc<dyn Fn(usize) -> Box<dyn FnOnce() + Send> + Send + Sync> = {
        let (track, inside, violations, switches) = (
            Arc::clone(&track),
            Arc::clone(&inside),
            Arc::clone(&violations),
            Arc::clone(&switches),
        );
        Arc::new(move |w: usize| {
            let now = Instant::now();
            if inside.swap(true, Ordering::SeqCst) {
                violations.fetch_add(1, Ordering::SeqCst);
            }
            {
                let mut t = track.lock().unwrap();
                t.acquisitions += 1;
                if let Some((prev, released)) = t.last {
                    if prev != w {
                        t.handoffs.push(now.saturating_duration_since(released));
                        switches.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            let (track, inside) = (Arc::clone(&track), Arc::clone(&inside));
            Box::new(move || {
                inside.store(false, Ordering::SeqCst);
                track.lock().unwrap().last = Some((w, Instant::now()));
            })
        })
    };
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        tasks.push(tokio::spawn(make(
            w,
            Arc::clone(&on_grant),
            Arc::clone(&stop),
        )));
    }
    while switches.load(Ordering::SeqCst) < target && start.elapsed() < max {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let t = track.lock().unwrap();
    let mut h = t.handoffs.clone();
    h.sort();
    let switches = switches.load(Ordering::SeqCst);
    (
        Handoffs {
            per_sec: switches as f64 / elapsed.as_secs_f64(),
            p50: percentile(&h, 0.5),
            p99: percentile(&h, 0.99),
            acquisitions: t.acquisitions,
            switches,
            violations: violations.load(Ordering::SeqCst),
            samples: h,
        },
        elapsed,
    )
}

async fn dlock_handoffs(env: &Env, target: u64, max: Duration) -> (Handoffs, Duration) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let sub = format!("handoff-{}", RUN.fetch_add(1, Ordering::Relaxed));
    let mut lockers = Vec::new();
    for _ in 0..8 {
        lockers.push(Arc::new(env.locker(&sub).await));
    }
    let name = LockName::new("h").unwrap();
    handoffs(8, target, max, |w, on_grant, stop| {
        let (l, name) = (Arc::clone(&lockers[w]), name.clone());
        async move {
            while !stop.load(Ordering::SeqCst) {
                let lease = match l.acquire(&name, AcquireOptions::forever()).await {
                    Ok(lease) => lease,
                    Err(e) => {
                        eprintln!("handoff worker {w}: acquire failed: {e}");
                        continue;
                    }
                };
                let releasing = on_grant(w);
                releasing();
                lease.release().await.unwrap();
            }
        }
    })
    .await
}

async fn peer_handoffs(env: &Env, target: u64, max: Duration) -> (Handoffs, Duration) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let sub = format!("peer-handoff-{}", RUN.fetch_add(1, Ordering::Relaxed));
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(env.client().await);
    }
    let dir = env.dir(&clients[0], &sub).await;
    handoffs(8, target, max, |w, on_grant, stop| {
        let (c, dir) = (clients[w].clone(), dir.clone());
        async move {
            let options = || {
                zk::LockOptions::new(zk::Acls::anyone_all())
                    .with_ancestor_options(
                        zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
                    )
                    .unwrap()
            };
            while !stop.load(Ordering::SeqCst) {
                let lock = c
                    .lock(
                        zk::LockPrefix::new_curator(&dir, "lock-").unwrap(),
                        b"",
                        options(),
                    )
                    .await
                    .unwrap();
                let releasing = on_grant(w);
                releasing();
                c.delete(lock.lock_path(), None).await.unwrap();
                std::mem::forget(lock);
            }
        }
    })
    .await
}

/// N waiters queue behind a holder; the holder releases and each waiter releases as soon as it
/// is granted. Returns (watch notifications, requests) per handoff.
async fn herd(env: &Env, n: usize) -> (f64, f64) {
    let sub = format!("herd-{n}");
    let name = LockName::new("herd").unwrap();
    let holder = env.locker(&sub).await;
    let mut waiters = Vec::new();
    for _ in 0..n {
        waiters.push(Arc::new(env.locker(&sub).await));
    }
    let lease = holder.acquire(&name, wait()).await.unwrap();
    let before: Vec<_> = waiters.iter().map(|w| w.stats()).collect();
    let mut tasks = Vec::new();
    for w in &waiters {
        let (w, name) = (Arc::clone(w), name.clone());
        tasks.push(tokio::spawn(async move {
            let lease = w.acquire(&name, wait()).await.unwrap();
            lease.release().await.unwrap();
        }));
        // Keep the queue order deterministic (not needed for the figures).
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let holder_before = holder.stats();
    lease.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let holder_after = holder.stats();
    let (mut wakeups, mut requests) = (0u64, 0u64);
    for (w, b) in waiters.iter().zip(before) {
        let a = w.stats();
        wakeups += a.wakeups - b.wakeups;
        requests += a.requests - b.requests;
    }
    requests += holder_after.requests - holder_before.requests;
    (wakeups as f64 / n as f64, requests as f64 / n as f64)
}

fn summary(env: &Env) {
    env.rt.block_on(async {
        let secs = 3.0;
        let l = env.locker("uncontended").await;
        let name = LockName::new("u").unwrap();
        let c = env.client().await;
        let peer_dir = env.dir(&c, "peer").await;
        let raw_dir = env.dir(&c, "raw").await;
        // Interleave the three in short slices so load changes on this shared machine hit
        // all of them alike.
        let (mut ours, mut peer, mut raw) = (Vec::new(), Vec::new(), Vec::new());
        let mut cpu = [Duration::ZERO; 3];
        let slices = 15;
        let (mut vs_peer, mut vs_raw) = (Vec::new(), Vec::new());
        for _ in 0..slices {
            let slice = secs / f64::from(slices);
            let t = cpu_time();
            let o = sample(slice, || dlock_pair(&l, &name)).await;
            let t2 = cpu_time();
            let pe = sample(slice, || peer_pair(&c, &peer_dir)).await;
            let t3 = cpu_time();
            let r = sample(slice, || raw_floor(&c, &raw_dir)).await;
            let t4 = cpu_time();
            let mid = |v: &[Duration]| percentile(v, 0.5).as_secs_f64().max(1e-9);
            vs_peer.push(mid(&o) / mid(&pe));
            vs_raw.push(mid(&o) / mid(&r));
            ours.extend(o);
            peer.extend(pe);
            raw.extend(r);
            cpu[0] += t2.saturating_sub(t);
            cpu[1] += t3.saturating_sub(t2);
            cpu[2] += t4.saturating_sub(t3);
        }
        for v in [&mut ours, &mut peer, &mut raw] {
            v.sort();
        }
        let held = l.acquire(&LockName::new("held").unwrap(), wait()).await.unwrap();
        let other = env.locker("uncontended").await;
        let held_name = LockName::new("held").unwrap();
        let try_held = sample(secs, || async {
            assert!(other.try_acquire(&held_name).await.unwrap().is_none());
        })
        .await;
        held.release().await.unwrap();
        let line = |what: &str, v: &[Duration]| {
            let mean = v.iter().sum::<Duration>() / u32::try_from(v.len().max(1)).unwrap_or(u32::MAX);
            println!(
                "{what:<44} n={:>6}  p50={:>8.1?}  mean={:>8.1?}  p99={:>8.1?}  ops/s={:>7.0}",
                v.len(),
                percentile(v, 0.5),
                mean,
                percentile(v, 0.99),
                v.len() as f64 / secs
            );
        };
        println!("== uncontended acquire+release ({secs} s each) ==");
        line("dlock-zk acquire+release", &ours);
        line("zookeeper-client Client::lock + delete", &peer);
        line("raw create+getChildren+delete (floor)", &raw);
        line("dlock-zk try_acquire on a held lock", &try_held);
        let per_op = |i: usize, v: &[Duration]| cpu[i].as_secs_f64() * 1e6 / v.len().max(1) as f64;
        println!(
            "client CPU per op: dlock {:.0} µs, zookeeper-client lock {:.0} µs, raw floor {:.0} µs",
            per_op(0, &ours),
            per_op(1, &peer),
            per_op(2, &raw)
        );
        let p50 = |v: &[Duration]| percentile(v, 0.5).as_secs_f64();
        vs_peer.sort_by(f64::total_cmp);
        vs_raw.sort_by(f64::total_cmp);
        println!(
            "ratio p50: dlock / zookeeper-client lock = {:.2} overall, per-slice median {:.2} (target <= 1.0); dlock / raw floor = {:.2} overall, per-slice median {:.2} (target <= 1.35)",
            p50(&ours) / p50(&peer),
            vs_peer[vs_peer.len() / 2],
            p50(&ours) / p50(&raw),
            vs_raw[vs_raw.len() / 2]
        );

        // Alternate short runs and take the median of the per-pair ratios: the machine is
        // shared, and its load moves on a scale of seconds.
        let pairs = 8;
        println!("== 8-way contention, {pairs} × 0.5 s each, alternating ==");
        let (mut d, mut p) = (Vec::new(), Vec::new());
        let mut cpu8 = [Duration::ZERO; 2];
        let mut ratios = Vec::new();
        for i in 0..pairs {
            // Alternate which goes first, so neither always runs after the other.
            let run_d = || dlock_handoffs(env, u64::MAX, Duration::from_millis(500));
            let run_p = || peer_handoffs(env, u64::MAX, Duration::from_millis(500));
            let t = cpu_time();
            let (hd, hp);
            if i % 2 == 0 {
                hd = run_d().await.0;
                let t2 = cpu_time();
                cpu8[0] += t2.saturating_sub(t);
                hp = run_p().await.0;
                cpu8[1] += cpu_time().saturating_sub(t2);
            } else {
                hp = run_p().await.0;
                let t2 = cpu_time();
                cpu8[1] += t2.saturating_sub(t);
                hd = run_d().await.0;
                cpu8[0] += cpu_time().saturating_sub(t2);
            }
            ratios.push(hd.per_sec / hp.per_sec.max(1e-9));
            d.push(hd);
            p.push(hp);
        }
        ratios.sort_by(f64::total_cmp);
        let (d, p) = (merge(&d), merge(&p));
        println!(
            "client CPU per acquisition: dlock {:.0} µs, zookeeper-client lock {:.0} µs",
            cpu8[0].as_secs_f64() * 1e6 / d.acquisitions.max(1) as f64,
            cpu8[1].as_secs_f64() * 1e6 / p.acquisitions.max(1) as f64
        );
        for (what, h) in [("dlock-zk", &d), ("zookeeper-client lock", &p)] {
            println!(
                "{what:<24} handoffs/s={:>7.0}  handoff p50={:>8.1?} p99={:>8.1?}  acquisitions={} switches={} violations={}",
                h.per_sec, h.p50, h.p99, h.acquisitions, h.switches, h.violations
            );
        }
        println!(
            "ratio handoffs/s: dlock / zookeeper-client = {:.2} overall, per-pair median {:.2} (range {:.2}–{:.2}) (target >= 1.0); dlock p99 handoff = {:?} (target <= 2 ms)",
            d.per_sec / p.per_sec,
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
            d.p99
        );

        println!("== herd: per handoff, N waiters queued ==");
        for n in [1, 8, 32, 64] {
            let (wakeups, requests) = herd(env, n).await;
            println!("N={n:>3}  watch notifications/handoff={wakeups:.2}  requests/handoff={requests:.2}");
        }

        println!("== many independent locks on one locker (64 tasks, one lock each, {secs} s) ==");
        let many = Arc::new(env.locker("many").await);
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (l, stop, ops) = (Arc::clone(&many), Arc::clone(&stop), Arc::clone(&ops));
            tasks.push(tokio::spawn(async move {
                let name = LockName::new(format!("k{i}")).unwrap();
                while !stop.load(Ordering::SeqCst) {
                    dlock_pair(&l, &name).await;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::SeqCst);
        for t in tasks {
            t.await.unwrap();
        }
        println!("acquire+release/s over 64 names, one session: {:.0}", ops.load(Ordering::Relaxed) as f64 / secs);

        println!("== renewal cost of many held leases (one locker) ==");
        let short = ZkLocker::builder(&env.connect)
            .ttl(Duration::from_millis(900))
            .namespace(format!("{}/renew", env.ns))
            .build()
            .await
            .unwrap();
        let mut held = Vec::new();
        for i in 0..1000 {
            held.push(short.acquire(&LockName::new(format!("r{i}")).unwrap(), wait()).await.unwrap());
        }
        let before = short.stats();
        let ttl = short.negotiated_timeout();
        tokio::time::sleep(ttl * 3).await;
        let after = short.stats();
        let rounds = after.renewals - before.renewals;
        println!(
            "1000 leases, TTL {ttl:?}: {rounds} renewal rounds in {:?}, {} requests ({:.2} per round), {} losses",
            ttl * 3,
            after.requests - before.requests,
            (after.requests - before.requests) as f64 / rounds.max(1) as f64,
            after.losses - before.losses
        );
        for l in held {
            l.release().await.unwrap();
        }
    });
}

fn criterion_benches(env: &Env, c: &mut Criterion) {
    let (l, other, client, peer_dir, raw_dir) = env.rt.block_on(async {
        let client = env.client().await;
        let peer_dir = env.dir(&client, "c-peer").await;
        let raw_dir = env.dir(&client, "c-raw").await;
        (
            env.locker("c-unc").await,
            env.locker("c-unc").await,
            client,
            peer_dir,
            raw_dir,
        )
    });
    let name = LockName::new("u").unwrap();
    let mut g = c.benchmark_group("uncontended");
    g.bench_function("dlock_zk_acquire_release", |b| {
        b.to_async(&env.rt).iter(|| dlock_pair(&l, &name))
    });
    g.bench_function("zookeeper_client_lock_release", |b| {
        b.to_async(&env.rt).iter(|| peer_pair(&client, &peer_dir))
    });
    g.bench_function("raw_create_children_delete", |b| {
        b.to_async(&env.rt).iter(|| raw_floor(&client, &raw_dir))
    });
    let held_name = LockName::new("held").unwrap();
    let held = env.rt.block_on(l.acquire(&held_name, wait())).unwrap();
    g.bench_function("dlock_zk_try_acquire_held", |b| {
        b.to_async(&env.rt)
            .iter(|| async { assert!(other.try_acquire(&held_name).await.unwrap().is_none()) })
    });
    env.rt.block_on(held.release()).unwrap();
    g.finish();

    let mut g = c.benchmark_group("handoff_8way");
    g.sample_size(10);
    g.bench_function("dlock_zk", |b| {
        b.iter_custom(|iters| {
            let (_, elapsed) = env
                .rt
                .block_on(dlock_handoffs(env, iters, Duration::from_secs(60)));
            elapsed
        })
    });
    g.bench_function("zookeeper_client_lock", |b| {
        b.iter_custom(|iters| {
            let (_, elapsed) = env
                .rt
                .block_on(peer_handoffs(env, iters, Duration::from_secs(60)));
            elapsed
        })
    });
    g.finish();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` runs bench targets without `--bench`: keep that quick.
    if !args.iter().any(|a| a == "--bench") {
        println!("benches are skipped outside `cargo bench`");
        return;
    }
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let env = Env::new();
    summary(&env);
    if std::env::var_os("DLOCK_BENCH_SUMMARY_ONLY").is_some() {
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    criterion_benches(&env, &mut c);
    c.final_summary();
}
