//! Criterion micro-benchmarks of the Redis lockers — fair single node, spin mode, Redlock on
//! five nodes — against servers the conformance harness starts: acquire + release, a
//! `try_acquire` on a held lock, one handoff. `cargo xtask bench` compares them with the raw
//! server floor and rslock.

use std::sync::Arc;

use dlock_conformance::micro;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::Locker;
use dlock_redis::{RedisLocker, RedlockLocker};

fn main() {
    let one = Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| panic!("Redis for the benches: {e}"));
    let five = Cluster::shared(ServerKind::Redis, 5)
        .unwrap_or_else(|e| panic!("5 Redis nodes for the benches: {e}"));
    let ns = format!("bench/p{}", std::process::id());
    let rt = micro::runtime();
    // The lockers are built inside the runtime they run on.
    let _entered = rt.enter();
    let single = |fair: bool| -> Arc<dyn Locker> {
        Arc::new(
            rt.block_on(
                RedisLocker::builder()
                    .url(one.endpoints()[0].clone())
                    .namespace(format!("{ns}/fair-{fair}"))
                    .fair(fair)
                    .build(),
            )
            .expect("RedisLocker"),
        )
    };
    let redlock = || -> Arc<dyn Locker> {
        Arc::new(
            rt.block_on(
                RedlockLocker::builder()
                    .nodes(five.endpoints())
                    .namespace(format!("{ns}/redlock"))
                    .build(),
            )
            .expect("RedlockLocker"),
        )
    };
    let mut c = micro::criterion();
    micro::bench(&mut c, &rt, "redis_fair", single(true), single(true));
    micro::bench(&mut c, &rt, "redis_spin", single(false), single(false));
    micro::bench(&mut c, &rt, "redlock", redlock(), redlock());
    c.final_summary();
}
