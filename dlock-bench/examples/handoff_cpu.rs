//! Where a contended handoff's time goes, for issue 15's handoff targets: `workers` lockers
//! (each its own connection or session) loop acquire → release on one lock for a few seconds,
//! as the bench's `contention-N` workload does, while the CPU time of this process and of the
//! server is read from `/proc`. Prints, per backend and worker count: handoffs/s, the mean
//! handoff cycle, the CPU time per handoff in the client process and in the server, and how
//! busy the machine's CPUs were. A cycle close to (client + server CPU per handoff) ÷ CPUs is
//! bound by CPU; a cycle far above it waits on something else (wake-ups, the network, raft).
//!
//! `zk-peer` runs the same loop on zookeeper-client's lock (the bench's ZooKeeper peer:
//! Curator's node names, an explicit delete as the release), for the client-side cost of a
//! ZooKeeper handoff beside dlock's.
//!
//! ```sh
//! cargo run --release -p dlock-bench --example handoff_cpu -- redis etcd zk zk-peer
//! ```
//!
//! Starts its own servers (the conformance harness's `local` provider).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_etcd::EtcdLocker;
use dlock_redis::RedisLocker;
use dlock_zk::ZkLocker;
#[path = "support/proc_stats.rs"]
mod proc_stats;
use proc_stats::{cpu_secs, switches};

const RUN: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(10);

/// CPU seconds and context switches of this process and of the server, now.
fn sample(server: &str) -> [f64; 4] {
    [
        cpu_secs("self"),
        cpu_secs(server),
        switches("self"),
        switches(server),
    ]
}

async fn locker(kind: &str, c: &Cluster, ns: &str) -> Arc<dyn Locker> {
    macro_rules! build {
        ($builder:expr) => {
            Arc::new($builder.ttl(TTL).namespace(ns).build().await.expect(kind))
        };
    }
    match kind {
        "redis" => build!(RedisLocker::builder().url(c.endpoints()[0].as_str())),
        "etcd" => build!(EtcdLocker::builder().endpoints(c.endpoints())),
        _ => build!(ZkLocker::builder().connect_string(c.endpoints().join(","))),
    }
}

/// Redis `INFO commandstats`: (command, calls, usec).
async fn commandstats(c: &Cluster) -> Vec<(String, f64, f64)> {
    let Ok(client) = redis::Client::open(c.endpoints()[0].as_str()) else {
        return Vec::new();
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return Vec::new();
    };
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (cmd, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            Some((cmd.to_string(), field("calls"), field("usec")))
        })
        .collect()
}

async fn run(kind: &str, c: &Cluster, workers: usize) {
    let ns = format!("handoff-cpu-{}-{workers}", std::process::id());
    let name = LockName::new("contended").expect("valid");
    let mut lockers = Vec::new();
    for _ in 0..workers {
        let l = locker(kind, c, &ns).await;
        // Connections and sessions open outside the measurement.
        let warm = LockName::new("warm-up").expect("valid");
        let h = l
            .acquire(&warm, AcquireOptions::forever())
            .await
            .expect("warm");
        h.release().await.expect("warm release");
        lockers.push(l);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let server_pid = c.node(0).pid().map(|p| p.to_string()).unwrap_or_default();
    let stats0 = if kind == "redis" {
        commandstats(c).await
    } else {
        Vec::new()
    };
    let (s0, t0) = (sample(&server_pid), Instant::now());
    let tasks: Vec<_> = lockers
        .iter()
        .map(|l| {
            let (l, stop, grants, name) = (
                Arc::clone(l),
                Arc::clone(&stop),
                Arc::clone(&grants),
                name.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let h = l
                        .acquire(&name, AcquireOptions::forever())
                        .await
                        .expect("acquire");
                    grants.fetch_add(1, Ordering::Relaxed);
                    h.release().await.expect("release");
                }
            })
        })
        .collect();
    tokio::time::sleep(RUN).await;
    let n = grants.load(Ordering::Relaxed) as f64;
    let secs = t0.elapsed().as_secs_f64();
    let s1 = sample(&server_pid);
    let d: Vec<f64> = s1.iter().zip(s0).map(|(a, b)| a - b).collect();
    if kind == "redis" {
        for (cmd, calls, usec) in commandstats(c).await {
            let (c0, u0) = stats0
                .iter()
                .find(|(k, ..)| *k == cmd)
                .map_or((0.0, 0.0), |(_, c, u)| (*c, *u));
            if calls - c0 >= n / 10.0 {
                println!(
                    "  {cmd:12} {:5.2} calls per handoff, {:6.1} µs per call",
                    (calls - c0) / n,
                    (usec - u0) / (calls - c0)
                );
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    report(kind, workers, n, secs, &d);
}

/// The same loop on the smallest FIFO handoff over one Redis: an acquire script takes the key
/// with `SET NX` or queues the caller; a release script deletes the key and publishes to the
/// queue's head, which then runs the acquire script again. Two requests and one notification
/// per handoff, as dlock's fair locker, without fencing, deadlines, renewal or cleanup.
async fn floor_chain(c: &Cluster, workers: usize) {
    use futures::StreamExt;
    const ACQUIRE: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 10000) then return 1 end redis.call('RPUSH', KEYS[2], ARGV[1]) return 0";
    const RELEASE: &str = "redis.call('DEL', KEYS[1]) local h = redis.call('LPOP', KEYS[2]) if h then redis.call('PUBLISH', h, '1') end return 1";
    let url = c.endpoints()[0].clone();
    let base = format!("floor-chain-{}-{workers}", std::process::id());
    let (key, queue) = (format!("{base}/lock"), format!("{base}/queue"));
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let ready = Arc::new(tokio::sync::Barrier::new(workers + 1));
    for w in 0..workers {
        let client = redis::Client::open(url.as_str()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        let mut sub = client.get_async_pubsub().await.expect("pubsub");
        let me = format!("{base}/w{w}");
        sub.subscribe(&me).await.expect("subscribe");
        let (stop, grants, ready, key, queue) = (
            Arc::clone(&stop),
            Arc::clone(&grants),
            Arc::clone(&ready),
            key.clone(),
            queue.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let acquire = redis::Script::new(ACQUIRE);
            let release = redis::Script::new(RELEASE);
            let mut messages = sub.on_message();
            ready.wait().await;
            while !stop.load(Ordering::Relaxed) {
                loop {
                    let got: i64 = acquire
                        .key(&key)
                        .key(&queue)
                        .arg(&me)
                        .invoke_async(&mut conn)
                        .await
                        .expect("acquire");
                    if got == 1 {
                        break;
                    }
                    messages.next().await;
                }
                grants.fetch_add(1, Ordering::Relaxed);
                let _: i64 = release
                    .key(&key)
                    .key(&queue)
                    .invoke_async(&mut conn)
                    .await
                    .expect("release");
            }
        }));
    }
    ready.wait().await;
    measure(c, "floor", workers, &grants, &stop, tasks).await;
}

/// The same loop on zookeeper-client's lock, each worker on its own session.
async fn zk_peer(c: &Cluster, workers: usize) {
    use zookeeper_client as zk;
    let dir = format!("/handoff-cpu-peer-{}-{workers}", std::process::id());
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(tokio::sync::Barrier::new(workers + 1));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let client = zk::Client::connector()
            .with_session_timeout(TTL)
            .connect(&c.endpoints().join(","))
            .await
            .expect("zk connect");
        let (stop, grants, ready, dir) = (
            Arc::clone(&stop),
            Arc::clone(&grants),
            Arc::clone(&ready),
            dir.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let lock = || async {
                let prefix = zk::LockPrefix::new_curator(&dir, "lock-").expect("prefix");
                let options = zk::LockOptions::new(zk::Acls::anyone_all())
                    .with_ancestor_options(
                        zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
                    )
                    .expect("options");
                let lock = client.lock(prefix, b"", options).await.expect("lock");
                let path = lock.lock_path().to_string();
                // Released by an explicit delete, as the bench's peer does.
                std::mem::forget(lock);
                path
            };
            // The parent exists and the session is warm before the measurement.
            let path = lock().await;
            client.delete(&path, None).await.expect("delete");
            ready.wait().await;
            while !stop.load(Ordering::Relaxed) {
                let path = lock().await;
                grants.fetch_add(1, Ordering::Relaxed);
                client.delete(&path, None).await.expect("delete");
            }
        }));
    }
    ready.wait().await;
    measure(c, "zk-peer", workers, &grants, &stop, tasks).await;
}

/// Counts the grants and samples the CPU of the workers `tasks` (already past their warm-up)
/// for `RUN`, then stops them and reports.
async fn measure(
    c: &Cluster,
    what: &str,
    workers: usize,
    grants: &AtomicU64,
    stop: &AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) {
    let server_pid = c.node(0).pid().map(|p| p.to_string()).unwrap_or_default();
    let (s0, t0) = (sample(&server_pid), Instant::now());
    let g0 = grants.load(Ordering::Relaxed);
    tokio::time::sleep(RUN).await;
    let n = (grants.load(Ordering::Relaxed) - g0) as f64;
    let secs = t0.elapsed().as_secs_f64();
    let s1 = sample(&server_pid);
    let d: Vec<f64> = s1.iter().zip(s0).map(|(a, b)| a - b).collect();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    report(what, workers, n, secs, &d);
}

/// `d`: CPU seconds and context switches of the client and the server over the run.
fn report(what: &str, workers: usize, n: f64, secs: f64, d: &[f64]) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let (cpu, srv) = (d[0], d[1]);
    println!(
        "{what:7} workers={workers}: {:5.0} handoffs/s, cycle {:4.0} µs; per handoff: CPU client {:3.0} µs, server {:3.0} µs, context switches client {:4.1}, server {:4.1}; CPUs busy {:2.0} %",
        n / secs,
        secs / n * 1e6,
        cpu / n * 1e6,
        srv / n * 1e6,
        d[2] / n,
        d[3] / n,
        (cpu + srv) / secs / cpus * 100.0,
    );
}

fn main() {
    let kinds: Vec<String> = std::env::args().skip(1).collect();
    let kinds = if kinds.is_empty() {
        vec!["redis".to_string(), "etcd".into(), "zk".into()]
    } else {
        kinds
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for kind in kinds {
        let server = match kind.as_str() {
            "redis" => ServerKind::Redis,
            "etcd" => ServerKind::Etcd,
            _ => ServerKind::Zk,
        };
        let c = Cluster::start(server, 1).expect("server");
        rt.block_on(async {
            for workers in [2, 8] {
                match kind.as_str() {
                    "redis" => floor_chain(&c, workers).await,
                    "zk-peer" => {
                        zk_peer(&c, workers).await;
                        continue;
                    }
                    _ => {}
                }
                run(&kind, &c, workers).await;
            }
        });
    }
}
