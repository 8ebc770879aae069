//! Criterion micro-benchmarks of the etcd locker against a server the conformance harness
//! starts: acquire + release, a `try_acquire` on a held lock, one handoff. `cargo xtask bench`
//! compares it with the raw server floor and etcd's own lock API.

use std::sync::Arc;

use dlock_conformance::micro;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::Locker;
use dlock_etcd::EtcdLocker;

fn main() {
    let cluster = Cluster::shared(ServerKind::Etcd, 1)
        .unwrap_or_else(|e| panic!("etcd for the benches: {e}"));
    let ns = format!("bench/p{}", std::process::id());
    let rt = micro::runtime();
    let locker = || -> Arc<dyn Locker> {
        Arc::new(
            rt.block_on(
                EtcdLocker::builder()
                    .endpoints(cluster.endpoints())
                    .prefix(&ns)
                    .build(),
            )
            .expect("EtcdLocker"),
        )
    };
    let (a, b) = (locker(), locker());
    let mut c = micro::criterion();
    micro::bench(&mut c, &rt, "etcd", a, b);
    c.final_summary();
}
