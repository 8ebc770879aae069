//! The shared conformance suite against real Redis servers: `redis` (one node, fair mode),
//! `redis_spin` (one node, spin mode), `redlock` (five nodes), `redlock_degraded` (five
//! nodes, two of them killed), `redis_acl` (one node, fair mode, the lockers connecting as an
//! ACL user with exactly the README's rules) and `redis_tls` (one TLS-only node, fair mode).
//! Each declares the capabilities it must report.

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
use dlock_conformance::{Declared, Slack};
use dlock_core::FencingStrength;
use support::acl::{
    CONFORMANCE_PASSWORD, CONFORMANCE_USER, ELECTION_RULES, FAMILY_RULES, RULES, WAIT_RULES,
};
use support::{ClusterRef, FAIR, Kind, RedisBackend};

fn shared(nodes: usize) -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, nodes)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn redis() -> RedisBackend {
    RedisBackend::new("redis", Kind::Single, ClusterRef::Shared(shared(1)))
}

/// The single node in spin mode (`fair(false)`): no queue, waiters retry.
fn redis_spin() -> RedisBackend {
    RedisBackend::new("redis-spin", Kind::Spin, ClusterRef::Shared(shared(1)))
}

fn redlock() -> RedisBackend {
    RedisBackend::new("redlock", Kind::Redlock, ClusterRef::Shared(shared(5)))
}

/// Five nodes of which the last two are killed: a majority is still up.
fn redlock_degraded() -> RedisBackend {
    let cluster = Cluster::start(ServerKind::Redis, 5)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    // In the crash-test child the endpoints come from the parent (external): already killed.
    if !cluster.is_external() {
        for i in [3, 4] {
            cluster
                .node(i)
                .kill()
                .unwrap_or_else(|e| panic!("cannot kill redis node {i}: {e}"));
        }
    }
    RedisBackend::new(
        "redlock-degraded",
        Kind::Redlock,
        ClusterRef::Owned(cluster),
    )
}

/// One node whose config has the ACL user `CONFORMANCE_USER` with exactly the README's rules
/// (mutex, family, election) for the keys and channels of this row's namespaces
/// (`dlock-test/<run>/redis_acl/<scenario>/`). Set at start-up (`user` directive), so a
/// restarted node still has it; the default user stays for the scenarios' own helpers.
fn redis_acl_options() -> ServerOptions {
    let mut args = vec!["--user".to_string(), CONFORMANCE_USER.to_string()];
    args.extend(support::acl::acl_rules(
        CONFORMANCE_PASSWORD,
        "dlock-test/*/redis_acl/*/",
        &[RULES, FAMILY_RULES, ELECTION_RULES, WAIT_RULES],
    ));
    ServerOptions::default().with_args(args)
}

/// The single node in fair mode, the lockers connecting as the ACL user.
fn redis_acl() -> RedisBackend {
    let options = redis_acl_options();
    let cluster = Cluster::shared_with(ServerKind::Redis, 1, &options)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    RedisBackend::new("redis-acl", Kind::Single, ClusterRef::Shared(cluster))
        .with_user(CONFORMANCE_USER, CONFORMANCE_PASSWORD)
        .with_options(options)
}

/// The single node in fair mode serving TLS only (`--port 0 --tls-port P`, certificates made
/// at start-up); the lockers connect with `rediss://` trusting the cluster's CA.
fn redis_tls() -> RedisBackend {
    let options = ServerOptions::default().with_tls(false);
    let cluster = Cluster::shared_with(ServerKind::Redis, 1, &options)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    RedisBackend::new("redis-tls", Kind::Single, ClusterRef::Shared(cluster)).with_options(options)
}

/// Spin mode: no queue; the same counter.
const SPIN: Declared = Declared {
    fair: false,
    herd_free: false,
    fencing: FencingStrength::Linearizable,
    crash_release_slack: Slack::fixed(Duration::from_millis(250)),
};
/// Redlock: no queue; tokens monotonic under the algorithm's assumptions only.
const REDLOCK: Declared = Declared {
    fair: false,
    herd_free: false,
    fencing: FencingStrength::Assumed,
    crash_release_slack: Slack::fixed(Duration::from_millis(250)),
};

dlock_conformance::conformance_tests!(redis, Arc::new(redis()), declared = FAIR);
dlock_conformance::conformance_tests!(redis_spin, Arc::new(redis_spin()), declared = SPIN);
dlock_conformance::conformance_tests!(redlock, Arc::new(redlock()), declared = REDLOCK);
dlock_conformance::conformance_tests!(
    redlock_degraded,
    Arc::new(redlock_degraded()),
    declared = REDLOCK
);
dlock_conformance::conformance_tests!(redis_acl, Arc::new(redis_acl()), declared = FAIR);
dlock_conformance::conformance_tests!(redis_tls, Arc::new(redis_tls()), declared = FAIR);
