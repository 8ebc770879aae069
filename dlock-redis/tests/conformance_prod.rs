//! A handed-over lease judged against one Redis node with 10 s leases: `redis_10s`.
//!
//! Redis has no timing setting of its own that a lock depends on; what differs where users run
//! it is the lease. The lab rows' 2 s TTL is shorter than a queue entry's lifetime (3 s at
//! most, whatever the TTL), which caps a grant a release hands to the queue's head; from about
//! 9 s on that cap is below a renewal period, so a handed-over lease starts short and is
//! renewed a third of that validity later. This row judges that lease's promise at 10 s, the
//! bench's TTL. Its own binary, run beside the compile steps by `cargo xtask test`; one light
//! scenario, as the rows there already load the machine (the ZooKeeper ensembles at their
//! defaults).

mod support;

use std::sync::Arc;

use dlock_conformance::servers::{Cluster, ServerKind};
use support::{ClusterRef, FAIR, Kind, RedisBackend};

fn shared() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

// 5 × the lab TTLs: 10 s leases (5 s for `renewal`).
dlock_conformance::conformance_tests!(
    redis_10s,
    Arc::new(RedisBackend::new(
        "redis-10s",
        Kind::Single,
        ClusterRef::Shared(shared())
    )),
    declared = FAIR,
    ttl_scale = 5,
    only = [handoff_lost_before_stolen => HandoffLostBeforeStolen],
);
