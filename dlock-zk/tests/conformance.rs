//! The shared conformance suite against real ZooKeeper: `zk` (one server). The backend is in
//! `support/backend.rs`; the three-server ensemble is in `conformance_cluster.rs`, the TLS and
//! digest rows in `conformance_secure.rs`.

mod support;

use std::sync::{Arc, OnceLock};

use dlock_conformance::TestBackend;
use dlock_conformance::servers::ServerOptions;
use support::backend::{ZK, ZkBackend};

fn zk() -> Arc<dyn TestBackend> {
    static B: OnceLock<Arc<dyn TestBackend>> = OnceLock::new();
    Arc::clone(B.get_or_init(|| ZkBackend::shared("zk", 1, ServerOptions::default(), false)))
}

dlock_conformance::conformance_tests!(zk, zk(), declared = ZK);
