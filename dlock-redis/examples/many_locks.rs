//! Profiling aid: the bench's `locks-1000` and `uncontended` shapes, dlock against the floor
//! (`SET NX PX` + `EVALSHA` compare-and-delete on one multiplexed connection), alternating,
//! with the server's `INFO commandstats` delta per pair.
//!
//! `DLOCK_REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p dlock-redis --example
//! many_locks -- [rounds] [uncontended-iterations]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_redis::RedisLocker;

const COUNT: usize = 1000;
const TTL: Duration = Duration::from_secs(10);
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

async fn commandstats(c: &mut redis::aio::MultiplexedConnection) -> String {
    redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap_or_default()
}

fn stats_map(s: &str) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut m = std::collections::BTreeMap::new();
    for line in s.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let mut calls = 0;
        let mut usec = 0;
        for kv in rest.split(',') {
            match kv.split_once('=') {
                Some(("calls", v)) => calls = v.parse().unwrap_or(0),
                Some(("usec", v)) => usec = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        m.insert(name.to_string(), (calls, usec));
    }
    m
}

fn delta(a: &str, b: &str, pairs: usize) {
    let (a, b) = (stats_map(a), stats_map(b));
    for (k, (c1, u1)) in &b {
        let (c0, u0) = a.get(k).copied().unwrap_or((0, 0));
        if c1 > &c0 {
            println!(
                "    {k}: {:.2} calls/pair, {:.2} us/call, {:.2} us/pair",
                (c1 - c0) as f64 / pairs as f64,
                (u1 - u0) as f64 / (c1 - c0) as f64,
                (u1 - u0) as f64 / pairs as f64
            );
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let url = std::env::var("DLOCK_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let single: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let only = std::env::var("ONLY").unwrap_or_default();
    let locker = Arc::new(
        RedisLocker::builder()
            .url(&url)
            .ttl(TTL)
            .namespace("prof")
            .request_timeout(Duration::from_secs(10))
            .build()
            .await
            .expect("locker"),
    );
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut floor = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let mut info = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let script = redis::Script::new(RELEASE);
    let names: Vec<LockName> = (0..COUNT)
        .map(|k| LockName::new(format!("many-{k}")).expect("name"))
        .collect();
    let keys: Vec<String> = (0..COUNT).map(|k| format!("prof-floor-{k}")).collect();
    let (mut td, mut tf) = (Duration::ZERO, Duration::ZERO);
    for r in 0..=rounds {
        if only != "floor" {
            let s0 = commandstats(&mut info).await;
            let t0 = Instant::now();
            let held = futures::future::join_all(
                names
                    .iter()
                    .map(|n| locker.acquire(n, AcquireOptions::forever())),
            )
            .await;
            let held: Vec<_> = held.into_iter().map(|h| h.expect("acquire")).collect();
            futures::future::join_all(held.into_iter().map(|l| l.release()))
                .await
                .into_iter()
                .for_each(|r| r.expect("release"));
            let el = t0.elapsed();
            if r > 0 {
                td += el;
            }
            if r == 1 {
                let s1 = commandstats(&mut info).await;
                println!("dlock round commandstats:");
                delta(&s0, &s1, COUNT);
            }
        }
        if only != "dlock" {
            let s0 = commandstats(&mut info).await;
            let t0 = Instant::now();
            futures::future::join_all(keys.iter().map(|k| {
                let mut c = floor.clone();
                async move {
                    let v: Option<String> = redis::cmd("SET")
                        .arg(k)
                        .arg("v")
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async(&mut c)
                        .await
                        .expect("set");
                    assert!(v.is_some());
                }
            }))
            .await;
            futures::future::join_all(keys.iter().map(|k| {
                let mut c = floor.clone();
                let mut inv = script.key(k.as_str());
                inv.arg("v");
                async move {
                    let n: i64 = inv.invoke_async(&mut c).await.expect("del");
                    assert_eq!(n, 1);
                }
            }))
            .await;
            let el = t0.elapsed();
            if r > 0 {
                tf += el;
            }
            if r == 1 {
                let s1 = commandstats(&mut info).await;
                println!("floor round commandstats:");
                delta(&s0, &s1, COUNT);
            }
        }
    }
    let _ = &mut floor;
    let total = (COUNT * rounds) as f64;
    if !td.is_zero() {
        println!("dlock pairs/s {:.0}", total / td.as_secs_f64());
    }
    if !tf.is_zero() {
        println!("floor pairs/s {:.0}", total / tf.as_secs_f64());
    }
    if single > 0 {
        let name = LockName::new("single").expect("name");
        let mut lat = Vec::new();
        for _ in 0..single {
            let t = Instant::now();
            let l = locker
                .acquire(&name, AcquireOptions::forever())
                .await
                .expect("acquire");
            l.release().await.expect("release");
            lat.push(t.elapsed());
        }
        lat.sort();
        println!("dlock uncontended p50 {:?}", lat[lat.len() / 2]);
        let mut lat = Vec::new();
        for _ in 0..single {
            let t = Instant::now();
            let mut c = floor.clone();
            let _: Option<String> = redis::cmd("SET")
                .arg("prof-single")
                .arg("v")
                .arg("NX")
                .arg("PX")
                .arg(10_000)
                .query_async(&mut c)
                .await
                .expect("set");
            let mut inv = script.key("prof-single");
            inv.arg("v");
            let _: i64 = inv.invoke_async(&mut c).await.expect("del");
            lat.push(t.elapsed());
        }
        lat.sort();
        println!("floor uncontended p50 {:?}", lat[lat.len() / 2]);
    }
    let _ = locker.close().await;
}
