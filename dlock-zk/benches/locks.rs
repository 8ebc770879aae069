//! Criterion micro-benchmarks of the ZooKeeper locker against a server the conformance
//! harness starts: acquire + release, a `try_acquire` on a held lock, one handoff.
//! `cargo xtask bench` compares it with the raw server floor and zookeeper-client's recipe.

use std::sync::Arc;

use dlock_conformance::micro;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::Locker;
use dlock_zk::ZkLocker;

fn main() {
    let cluster = Cluster::shared(ServerKind::Zk, 1)
        .unwrap_or_else(|e| panic!("ZooKeeper for the benches: {e}"));
    let ns = format!("bench/p{}", std::process::id());
    let rt = micro::runtime();
    let locker = || -> Arc<dyn Locker> {
        Arc::new(
            rt.block_on(
                ZkLocker::builder()
                    .connect_string(&cluster.endpoints()[0])
                    .namespace(&ns)
                    .build(),
            )
            .expect("ZkLocker"),
        )
    };
    let (a, b) = (locker(), locker());
    let mut c = micro::criterion();
    micro::bench(&mut c, &rt, "zk", a, b);
    c.final_summary();
}
