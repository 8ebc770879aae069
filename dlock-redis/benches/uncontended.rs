//! Uncontended acquire+release against the raw floor (SET + EVALSHA by the same client) and
//! rslock 0.10, on one node and on five (Redlock); try_acquire on a held lock; 1,000 distinct
//! locks on one locker.

mod common;

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_redis::{RedisLocker, RedlockLocker};
use futures::future::join_all;
use redis::aio::ConnectionManager;

const TTL: Duration = Duration::from_secs(10);
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

fn benches(c: &mut Criterion) {
    let one = common::cluster(1);
    let five = common::cluster(5);
    let rt = common::runtime();
    let url = one.endpoints().remove(0);
    let urls = five.endpoints();
    let name = LockName::new("bench").unwrap_or_else(|e| panic!("{e}"));

    let (single, single_nonfair, redlock, floor_conns, floor5_conns, rs1, rs5) =
        rt.block_on(async {
            let single = RedisLocker::builder()
                .url(&url)
                .ttl(TTL)
                .namespace("bench/u")
                .build()
                .unwrap_or_else(|e| panic!("{e}"));
            let single_nonfair = RedisLocker::builder()
                .url(&url)
                .ttl(TTL)
                .fair(false)
                .namespace("bench/n")
                .build()
                .unwrap_or_else(|e| panic!("{e}"));
            let redlock = RedlockLocker::builder()
                .nodes(urls.clone())
                .ttl(TTL)
                .namespace("bench/r")
                .build()
                .unwrap_or_else(|e| panic!("{e}"));
            let manager = |u: String| async move {
                ConnectionManager::new(redis::Client::open(u).unwrap_or_else(|e| panic!("{e}")))
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            };
            let floor_conns = manager(url.clone()).await;
            let mut floor5 = Vec::new();
            for u in &urls {
                floor5.push(manager(u.clone()).await);
            }
            let rs1 = rslock::LockManager::new(vec![url.clone()]);
            let rs5 = rslock::LockManager::new(urls.clone());
            (
                single,
                single_nonfair,
                redlock,
                floor_conns,
                floor5,
                rs1,
                rs5,
            )
        });
    let script = redis::Script::new(RELEASE);

    // Side by side, interleaved in small batches: the ratios the targets are about.
    {
        let floor1 = || {
            let mut conn = floor_conns.clone();
            let script = &script;
            Box::pin(async move {
                let _: Option<String> = redis::cmd("SET")
                    .arg("bench/floor")
                    .arg("owner-value-0123456789abcdef0123")
                    .arg("NX")
                    .arg("PX")
                    .arg(10_000)
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                let _: i64 = script
                    .key("bench/floor")
                    .arg("owner-value-0123456789abcdef0123")
                    .invoke_async(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }) as futures::future::BoxFuture<'_, ()>
        };
        let floor5 = || {
            let conns = floor5_conns.clone();
            let script = &script;
            Box::pin(async move {
                join_all(conns.clone().into_iter().map(|mut conn| async move {
                    let _: Option<String> = redis::cmd("SET")
                        .arg("bench/floor5")
                        .arg("owner-value-0123456789abcdef0123")
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                }))
                .await;
                join_all(conns.into_iter().map(|mut conn| async move {
                    let _: i64 = script
                        .key("bench/floor5")
                        .arg("owner-value-0123456789abcdef0123")
                        .invoke_async(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                }))
                .await;
            }) as futures::future::BoxFuture<'_, ()>
        };
        let ops: Vec<(&str, common::Op<'_>)> = vec![
            ("floor_set_evalsha_1", Box::new(floor1)),
            ("dlock_single_fair", Box::new(|| pair(&single, &name))),
            (
                "dlock_single_nonfair",
                Box::new(|| pair(&single_nonfair, &name)),
            ),
            (
                "rslock_single",
                Box::new(|| {
                    Box::pin(async {
                        let l = rs1
                            .lock("bench/rslock", TTL)
                            .await
                            .unwrap_or_else(|e| panic!("{e:?}"));
                        rs1.unlock(&l).await;
                    })
                }),
            ),
            ("floor_set_evalsha_5", Box::new(floor5)),
            ("dlock_redlock_5", Box::new(|| pair(&redlock, &name))),
            (
                "rslock_redlock_5",
                Box::new(|| {
                    Box::pin(async {
                        let l = rs5
                            .lock("bench/rslock5", TTL)
                            .await
                            .unwrap_or_else(|e| panic!("{e:?}"));
                        rs5.unlock(&l).await;
                    })
                }),
            ),
        ];
        let medians = common::side_by_side(&rt, &ops, Duration::from_secs(8), 50);
        let get = |n: &str| {
            medians
                .iter()
                .find(|(k, _)| k == n)
                .map_or(Duration::ZERO, |(_, d)| *d)
        };
        for (n, d) in &medians {
            eprintln!(
                "[side-by-side] {n}: {d:?} per acquire+release (median of interleaved batches)"
            );
        }
        let ratio = |a: &str, b: &str| get(a).as_secs_f64() / get(b).as_secs_f64().max(1e-9);
        eprintln!(
            "[ratio] dlock_single_fair / floor_set_evalsha_1 = {:.2}",
            ratio("dlock_single_fair", "floor_set_evalsha_1")
        );
        eprintln!(
            "[ratio] dlock_single_fair / rslock_single = {:.2}",
            ratio("dlock_single_fair", "rslock_single")
        );
        eprintln!(
            "[ratio] dlock_single_nonfair / floor_set_evalsha_1 = {:.2}",
            ratio("dlock_single_nonfair", "floor_set_evalsha_1")
        );
        eprintln!(
            "[ratio] dlock_redlock_5 / rslock_redlock_5 = {:.2}",
            ratio("dlock_redlock_5", "rslock_redlock_5")
        );
        eprintln!(
            "[ratio] dlock_redlock_5 / floor_set_evalsha_5 = {:.2}",
            ratio("dlock_redlock_5", "floor_set_evalsha_5")
        );
    }

    let mut g = c.benchmark_group("uncontended");
    g.bench_function("floor_set_evalsha_1", |b| {
        b.to_async(&rt).iter(|| {
            let mut conn = floor_conns.clone();
            let script = &script;
            async move {
                let _: Option<String> = redis::cmd("SET")
                    .arg("bench/floor")
                    .arg("owner-value-0123456789abcdef0123")
                    .arg("NX")
                    .arg("PX")
                    .arg(10_000)
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                let _: i64 = script
                    .key("bench/floor")
                    .arg("owner-value-0123456789abcdef0123")
                    .invoke_async(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        })
    });
    g.bench_function("dlock_single_fair", |b| {
        b.to_async(&rt).iter(|| async {
            let l = single
                .acquire(&name, AcquireOptions::forever())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            l.release().await.unwrap_or_else(|e| panic!("{e}"));
        })
    });
    g.bench_function("dlock_single_nonfair", |b| {
        b.to_async(&rt).iter(|| async {
            let l = single_nonfair
                .acquire(&name, AcquireOptions::forever())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            l.release().await.unwrap_or_else(|e| panic!("{e}"));
        })
    });
    g.bench_function("rslock_single", |b| {
        b.to_async(&rt).iter(|| async {
            let l = rs1
                .lock("bench/rslock", TTL)
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
            rs1.unlock(&l).await;
        })
    });
    g.bench_function("floor_set_evalsha_5", |b| {
        b.to_async(&rt).iter(|| {
            let conns = floor5_conns.clone();
            let conns2 = floor5_conns.clone();
            let script = &script;
            async move {
                join_all(conns.into_iter().map(|mut conn| async move {
                    let _: Option<String> = redis::cmd("SET")
                        .arg("bench/floor5")
                        .arg("owner-value-0123456789abcdef0123")
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    conn
                }))
                .await;
                join_all(conns2.into_iter().map(|mut conn| async move {
                    let _: i64 = script
                        .key("bench/floor5")
                        .arg("owner-value-0123456789abcdef0123")
                        .invoke_async(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                }))
                .await;
            }
        })
    });
    g.bench_function("dlock_redlock_5", |b| {
        b.to_async(&rt).iter(|| async {
            let l = redlock
                .acquire(&name, AcquireOptions::forever())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            l.release().await.unwrap_or_else(|e| panic!("{e}"));
        })
    });
    g.bench_function("rslock_redlock_5", |b| {
        b.to_async(&rt).iter(|| async {
            let l = rs5
                .lock("bench/rslock5", TTL)
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
            rs5.unlock(&l).await;
        })
    });
    g.finish();

    // try_acquire on a lock another client holds.
    let (other1, other5, h1, h5) = rt.block_on(async {
        let o1 = RedisLocker::builder()
            .url(&url)
            .ttl(TTL)
            .namespace("bench/u")
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let o5 = RedlockLocker::builder()
            .nodes(urls.clone())
            .ttl(TTL)
            .namespace("bench/r")
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let held = LockName::new("held").unwrap_or_else(|e| panic!("{e}"));
        let h1 = o1
            .acquire(&held, AcquireOptions::forever())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let h5 = o5
            .acquire(&held, AcquireOptions::forever())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        (o1, o5, h1, h5)
    });
    let held = LockName::new("held").unwrap_or_else(|e| panic!("{e}"));
    let mut g = c.benchmark_group("try_acquire_held");
    g.bench_function("dlock_single", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(
                single
                    .try_acquire(&held)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .is_none()
            );
        })
    });
    g.bench_function("dlock_redlock_5", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(
                redlock
                    .try_acquire(&held)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .is_none()
            );
        })
    });
    g.finish();
    rt.block_on(async {
        let _ = h1.release().await;
        let _ = h5.release().await;
    });

    // 1,000 distinct locks on one locker, taken concurrently then released.
    let names: Vec<LockName> = (0..1000)
        .map(|i| LockName::new(format!("many/{i}")).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let mut g = c.benchmark_group("many_locks");
    g.sample_size(10);
    g.bench_function("dlock_single_1000_acquire_release", |b| {
        b.to_async(&rt).iter(|| async {
            let leases = join_all(
                names
                    .iter()
                    .map(|n| single.acquire(n, AcquireOptions::forever())),
            )
            .await;
            let leases: Vec<_> = leases
                .into_iter()
                .map(|l| l.unwrap_or_else(|e| panic!("{e}")))
                .collect();
            assert_eq!(single.held(), 1000);
            join_all(leases.into_iter().map(|l| l.release())).await;
        })
    });
    g.finish();
    drop((other1, other5));
}

/// One uncontended acquire + release.
fn pair<'a>(l: &'a dyn Locker, name: &'a LockName) -> futures::future::BoxFuture<'a, ()> {
    Box::pin(async move {
        let lease = l
            .acquire(name, AcquireOptions::forever())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        lease.release().await.unwrap_or_else(|e| panic!("{e}"));
    })
}

criterion_group!(name = group; config = common::criterion(); targets = benches);
criterion_main!(group);
