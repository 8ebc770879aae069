//! The shared conformance suite on a Redis Cluster: `redis_cluster` (3 masters, no replicas,
//! formed with `redis-cli --cluster create`; the lockers in fair mode, each lock on its slot's
//! master). Its own binary: the cluster connections of a third row's clients would crowd the
//! 2-core machine the other rows share.

mod support;

use std::sync::Arc;

use dlock_conformance::servers::{Cluster, ServerKind};
use support::cluster::{ClusterBackend, cluster_options, form};
use support::{ClusterRef, FAIR};

// The shared 3-master cluster (in the crash-test child: the parent's, through the external
// provider, already formed).
dlock_conformance::conformance_tests!(
    redis_cluster,
    {
        let cluster = Cluster::shared_with(ServerKind::Redis, 3, &cluster_options())
            .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
        form(&cluster).unwrap_or_else(|e| panic!("cannot form the Redis Cluster: {e}"));
        Arc::new(ClusterBackend::new(
            "redis-cluster",
            ClusterRef::Shared(cluster),
        ))
    },
    declared = FAIR
);
