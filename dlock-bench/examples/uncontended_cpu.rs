//! Where an uncontended acquire + release spends its time on Redis and Redlock, for issue 32's
//! uncontended and distinct-lock bounds: one client loops acquire → release on one name,
//! dlock beside the floor (`SET NX PX`, then the compare-and-delete script, on every node in
//! parallel) and rslock. Prints per pair: the p50, the CPU time of the client and of the
//! servers, the client's context switches (all from `/proc`), and the commands the servers
//! ran (`INFO commandstats`, summed over the nodes: calls per pair × µs per call; a script's
//! own time includes the commands it calls, which are also counted on their own rows).
//!
//! ```sh
//! cargo run --release -p dlock-bench --example uncontended_cpu -- redis redlock
//! ```
//!
//! Starts its own servers (the conformance harness's `local` provider): 1 node for `redis`,
//! 5 for `redlock`.

use std::time::{Duration, Instant};

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_redis::{RedisLocker, RedlockLocker};
use futures::future::join_all;
#[path = "support/proc_stats.rs"]
mod proc_stats;
use proc_stats::{cpu_secs, switches};

const PAIRS: usize = 20_000;
const WARM: usize = 1_000;
const TTL: Duration = Duration::from_secs(10);
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// One connection per node, for the floor and for the server's statistics.
async fn conns(urls: &[String]) -> Vec<redis::aio::MultiplexedConnection> {
    let mut out = Vec::new();
    for u in urls {
        let client = redis::Client::open(u.as_str()).expect("redis url");
        out.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
        );
    }
    out
}

/// `INFO commandstats` of every node, summed: (command, calls, usec).
async fn commandstats(conns: &mut [redis::aio::MultiplexedConnection]) -> Vec<(String, f64, f64)> {
    let mut out: Vec<(String, f64, f64)> = Vec::new();
    for c in conns {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(c)
            .await
            .unwrap_or_default();
        for line in info.lines() {
            let Some((cmd, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            match out.iter_mut().find(|(c, _, _)| c == cmd) {
                Some(row) => {
                    row.1 += field("calls");
                    row.2 += field("usec");
                }
                None => out.push((cmd.to_owned(), field("calls"), field("usec"))),
            }
        }
    }
    out
}

async fn reset(conns: &mut [redis::aio::MultiplexedConnection]) {
    for c in conns {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(c)
            .await
            .expect("resetstat");
    }
}

/// One contender's loop of `PAIRS` pairs after `WARM` unmeasured ones.
async fn measure<F, Fut>(
    what: &str,
    stats: &mut [redis::aio::MultiplexedConnection],
    servers: &[String],
    mut pair: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..WARM {
        pair().await;
    }
    reset(stats).await;
    let server_cpu = || servers.iter().map(|p| cpu_secs(p)).sum::<f64>();
    let (cpu, srv, sw) = (cpu_secs("self"), server_cpu(), switches("self"));
    let mut t = Vec::with_capacity(PAIRS);
    for _ in 0..PAIRS {
        let s = Instant::now();
        pair().await;
        t.push(s.elapsed());
    }
    let (cpu, srv, sw) = (
        cpu_secs("self") - cpu,
        server_cpu() - srv,
        switches("self") - sw,
    );
    let server = commandstats(stats).await;
    t.sort();
    let n = PAIRS as f64;
    let p50 = t.get(t.len() / 2).copied().unwrap_or_default();
    let detail: Vec<String> = server
        .iter()
        .filter(|(c, calls, _)| c != "info" && c != "config|resetstat" && *calls > 0.0)
        .map(|(c, calls, u)| format!("{c} {:.2}×{:.2} µs", calls / n, u / calls))
        .collect();
    println!(
        "{what:14} p50 {:6.1} µs; per pair: CPU client {:5.1} µs, servers {:5.1} µs; client switches {:4.1}; commands: {}",
        p50.as_secs_f64() * 1e6,
        cpu / n * 1e6,
        srv / n * 1e6,
        sw / n,
        detail.join(", ")
    );
}

async fn run(kind: &str, urls: &[String], servers: &[String]) {
    let mut stats = conns(urls).await;
    let floor_conns = conns(urls).await;
    let release = redis::Script::new(RELEASE);
    let ttl_ms = u64::try_from(TTL.as_millis()).unwrap_or(u64::MAX);
    let name = LockName::new("uncontended").expect("valid");
    // Two rounds, so a cold first contender shows as a difference between the rounds.
    for round in 0..2 {
        let key = format!("floor-{round}");
        measure(&format!("{kind} floor"), &mut stats, servers, || {
            let (conns, release, key) = (floor_conns.clone(), &release, key.clone());
            async move {
                join_all(conns.into_iter().map(|mut c| {
                    let key = key.clone();
                    async move {
                        let set: Option<String> = redis::cmd("SET")
                            .arg(&key)
                            .arg("v")
                            .arg("NX")
                            .arg("PX")
                            .arg(ttl_ms)
                            .query_async(&mut c)
                            .await
                            .expect("SET");
                        assert!(set.is_some(), "the floor's SET NX was refused");
                        let _: i64 = release
                            .key(&key)
                            .arg("v")
                            .invoke_async(&mut c)
                            .await
                            .expect("release");
                    }
                }))
                .await;
            }
        })
        .await;
        let mgr = rslock::LockManager::new(urls.to_vec());
        let resource = format!("rslock-{round}");
        measure(&format!("{kind} rslock"), &mut stats, servers, || {
            let (mgr, resource) = (&mgr, resource.as_bytes());
            async move {
                let lock = mgr.acquire_no_guard(resource, TTL).await.expect("rslock");
                mgr.unlock(&lock).await;
            }
        })
        .await;
        let ns = format!("uncontended-cpu-{round}");
        let locker: Box<dyn Locker> = if kind == "redlock" {
            Box::new(
                RedlockLocker::builder()
                    .nodes(urls.to_vec())
                    .ttl(TTL)
                    .namespace(&ns)
                    .build()
                    .await
                    .expect("redlock"),
            )
        } else {
            Box::new(
                RedisLocker::builder()
                    .url(urls[0].as_str())
                    .ttl(TTL)
                    .namespace(&ns)
                    .build()
                    .await
                    .expect("redis"),
            )
        };
        measure(&format!("{kind} dlock"), &mut stats, servers, || {
            let (locker, name) = (&locker, &name);
            async move {
                let lease = locker
                    .acquire(name, AcquireOptions::forever())
                    .await
                    .expect("acquire");
                lease.release().await.expect("release");
            }
        })
        .await;
    }
}

fn main() {
    let kinds: Vec<String> = std::env::args().skip(1).collect();
    let kinds = if kinds.is_empty() {
        vec!["redis".to_string(), "redlock".into()]
    } else {
        kinds
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for kind in kinds {
        let nodes = if kind == "redlock" { 5 } else { 1 };
        let c = Cluster::start(ServerKind::Redis, nodes).expect("servers");
        let pids: Vec<String> = (0..nodes)
            .filter_map(|i| c.node(i).pid().map(|p| p.to_string()))
            .collect();
        rt.block_on(run(&kind, &c.endpoints(), &pids));
    }
}
