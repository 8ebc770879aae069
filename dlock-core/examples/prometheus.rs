//! Serves a locker's metrics to Prometheus at `http://ADDR/metrics`, with the exporter's own
//! HTTP listener, while a small workload runs: grants, releases, contended acquires that wait
//! and some that time out.
//!
//! ```text
//! cargo run -p dlock-core --features metrics --example prometheus -- [ADDR] [SECONDS]
//! curl -s http://127.0.0.1:9464/metrics | grep dlock_
//! ```
//!
//! ADDR defaults to `127.0.0.1:9464`; the example serves for SECONDS (default 60), then exits.
//! The memory backend stands in for a real one: any backend's builder takes the same
//! `metrics_tier` option, and its metrics carry `backend="redis"` (or etcd, zk, …) instead.

use std::net::SocketAddr;
use std::time::Duration;

use dlock_core::{AcquireOptions, LockName, Locker, MemoryLocker};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Histogram buckets (seconds) for waits, hold times and renewal rounds: 1 ms to 30 s.
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args.next().as_deref().unwrap_or("127.0.0.1:9464").parse()?;
    let seconds: u64 = args.next().as_deref().unwrap_or("60").parse()?;

    // Histograms with buckets (the exporter renders summaries otherwise), served at /metrics.
    PrometheusBuilder::new()
        .set_buckets(BUCKETS)?
        .with_http_listener(addr)
        .install()?;
    dlock_core::describe_metrics();
    println!("serving http://{addr}/metrics for {seconds} s");

    let locker = MemoryLocker::builder()
        .ttl(Duration::from_secs(2))
        .metrics_tier("example")
        .build()?;
    let name = LockName::new("example/job")?;
    let until = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while tokio::time::Instant::now() < until {
        let lease = locker
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(1)))
            .await?;
        // A contender that gives up while the lock is held: a timeout.
        let contender = locker.acquire(&name, AcquireOptions::wait(Duration::from_millis(50)));
        if let Err(e) = contender.await {
            println!("contender: {e}");
        }
        // Held across a renewal round (every TTL/3).
        tokio::time::sleep(Duration::from_millis(800)).await;
        lease.release().await?;
    }
    Ok(())
}
