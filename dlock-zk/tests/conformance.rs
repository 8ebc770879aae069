//! The shared conformance suite against real ZooKeeper: `zk` (one server). The backend is in
//! `support/backend.rs`; the three-server ensemble is in `conformance_cluster.rs`, the TLS and
//! digest rows in `conformance_secure.rs`.

mod support;

use dlock_conformance::servers::ServerOptions;
use support::backend::{ZK, ZkBackend};

dlock_conformance::conformance_tests!(
    zk,
    ZkBackend::shared("zk", 1, ServerOptions::default(), false),
    declared = ZK
);
