//! Renewal of 10,000 held leases on one locker: round trips per renewal period (target ≤ 1),
//! and the server time of one renewal round.

mod common;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use dlock_core::{LockName, Locker};
use dlock_redis::RedisLocker;
use futures::future::join_all;

const LEASES: usize = 10_000;

fn benches(c: &mut Criterion) {
    let node = common::cluster(1);
    let rt = common::runtime();
    let url = node.endpoints().remove(0);
    let ttl = Duration::from_secs(3);
    let names: Vec<LockName> = (0..LEASES)
        .map(|i| LockName::new(format!("r/{i}")).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let (locker, leases) = rt.block_on(async {
        let l = RedisLocker::builder()
            .url(&url)
            .ttl(ttl)
            .namespace("bench/renew")
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let began = Instant::now();
        let mut leases = Vec::with_capacity(LEASES);
        for chunk in names.chunks(1000) {
            for got in join_all(chunk.iter().map(|n| l.try_acquire(n))).await {
                leases.push(
                    got.unwrap_or_else(|e| panic!("{e}"))
                        .unwrap_or_else(|| panic!("held elsewhere")),
                );
            }
        }
        eprintln!(
            "[renewal] acquired {} leases in {:?}",
            leases.len(),
            began.elapsed()
        );
        (l, leases)
    });
    rt.block_on(async {
        let mut conn = common::plain(&url).await;
        common::reset_stats(&mut conn).await;
        let before = locker.stats();
        let periods = 3;
        tokio::time::sleep(ttl / 3 * periods).await;
        let after = locker.stats();
        let stats = common::commandstats(&mut conn).await;
        let evalsha = stats.get("evalsha").copied().unwrap_or(0);
        let usec = stats.get("evalsha.usec").copied().unwrap_or(0);
        let pexpire = stats.get("pexpire").copied().unwrap_or(0);
        eprintln!(
            "[renewal] {LEASES} leases over {periods} periods (TTL {ttl:?}): {} renewal rounds, {} client requests, {evalsha} EVALSHA at the server ({} PEXPIRE inside them), {:.1} ms server time per round (all its chunks), {} failures",
            after.renewals - before.renewals,
            after.requests - before.requests,
            pexpire,
            usec as f64 / (after.renewals - before.renewals).max(1) as f64 / 1000.0,
            after.renewal_failures - before.renewal_failures,
        );
        for l in &leases {
            l.check().unwrap_or_else(|e| panic!("a lease was lost: {e}"));
        }
    });
    // Criterion timing of what one renewal round costs the client and the server: the same
    // shape as the locker's round (one pipeline: SCRIPT LOAD + 10 compare-and-PEXPIRE calls of
    // 1,000 keys), by the same client library, with owners that do not match (no write).
    let keys: Vec<String> = (0..LEASES)
        .map(|i| format!("bench/renew/dlock:{{r/{i}}}"))
        .collect();
    let script = redis::Script::new(
        "local out = {} for i = 1, #KEYS do if redis.call('GET', KEYS[i]) == ARGV[i + 1] then out[i] = redis.call('PEXPIRE', KEYS[i], ARGV[1]) else out[i] = 0 end end return out",
    );
    let conn = rt.block_on(common::plain(&url));
    c.benchmark_group("renewal").sample_size(10).bench_function(
        "one_round_trip_10000_keys_shape",
        |b| {
            b.to_async(&rt).iter(|| {
                let mut conn = conn.clone();
                let mut pipe = redis::pipe();
                pipe.load_script(&script).ignore();
                for chunk in keys.chunks(1000) {
                    let mut inv = script.prepare_invoke();
                    inv.arg(3000);
                    for k in chunk {
                        inv.key(k);
                    }
                    for _ in chunk {
                        inv.arg("not-the-owner");
                    }
                    pipe.invoke_script(&inv);
                }
                async move {
                    let r: Vec<Vec<i64>> = pipe
                        .query_async(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(r.iter().map(Vec::len).sum::<usize>(), LEASES);
                }
            })
        },
    );
    rt.block_on(async {
        join_all(leases.into_iter().map(|l| l.release())).await;
    });
}

criterion_group!(name = group; config = common::criterion(); targets = benches);
criterion_main!(group);
