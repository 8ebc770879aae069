//! The shared conformance suite against a real three-server ZooKeeper ensemble: `zk_cluster`.
//!
//! Its own test binary: in one binary with the `zk` row, 24 test threads ran both rows' private
//! ensembles (three JVMs each) at once on 2 cores, and the CPU starvation that caused delayed
//! renewals and server replies by hundreds of milliseconds (CI rehearsal r36: `short_blip` lost
//! its lease when a reconnect after the blip took longer than the 383 ms left of it).

mod support;

use dlock_conformance::servers::ServerOptions;
use support::backend::{ZK, ZkBackend};

dlock_conformance::conformance_tests!(
    zk_cluster,
    ZkBackend::shared("zk-cluster", 3, ServerOptions::default(), false),
    declared = ZK
);
