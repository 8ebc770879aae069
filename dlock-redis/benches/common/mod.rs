//! Servers, runtime and measurement helpers shared by the benches.

#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use criterion::Criterion;
use dlock_conformance::servers::{Cluster, ServerKind};

/// A private cluster for one bench binary (killed when dropped).
pub fn cluster(nodes: usize) -> Cluster {
    Cluster::start(ServerKind::Redis, nodes)
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"))
}

/// The runtime every contender runs on (the same for dlock, rslock and the floors).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a runtime: {e}"))
}

/// Short measurements: the machine is shared, ratios matter, not absolute times.
pub fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args()
}

/// `INFO commandstats` as command → calls.
pub async fn commandstats(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("INFO commandstats: {e}"));
    let mut out = HashMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((cmd, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.insert(cmd.to_string(), calls);
        if let Some(us) = fields
            .split(',')
            .find_map(|f| f.strip_prefix("usec="))
            .and_then(|v| v.parse::<u64>().ok())
        {
            out.insert(format!("{cmd}.usec"), us);
        }
    }
    out
}

/// Resets the server's command statistics.
pub async fn reset_stats(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("CONFIG RESETSTAT: {e}"));
}

/// A plain connection for measurements.
pub async fn plain(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap_or_else(|e| panic!("bad url {url}: {e}"))
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// The p-th percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// One contender of a side-by-side run: an operation to repeat.
pub type Op<'a> = Box<dyn Fn() -> futures::future::BoxFuture<'a, ()> + 'a>;

/// Runs every contender in turn, `batch` operations at a time, round-robin for `duration`, so
/// that they all see the same machine load; returns the median time per operation of each.
pub fn side_by_side(
    rt: &tokio::runtime::Runtime,
    ops: &[(&str, Op<'_>)],
    duration: Duration,
    batch: usize,
) -> Vec<(String, Duration)> {
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); ops.len()];
    rt.block_on(async {
        let began = std::time::Instant::now();
        while began.elapsed() < duration {
            for (i, (_, op)) in ops.iter().enumerate() {
                let t = std::time::Instant::now();
                for _ in 0..batch {
                    op().await;
                }
                samples[i].push(t.elapsed() / u32::try_from(batch).unwrap_or(1));
            }
        }
    });
    ops.iter()
        .zip(samples)
        .map(|((name, _), mut s)| {
            s.sort();
            (name.to_string(), percentile(&s, 0.5))
        })
        .collect()
}
