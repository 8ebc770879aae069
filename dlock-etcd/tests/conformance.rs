//! The shared conformance suite against real etcd: `etcd` (one server) and `etcd_cluster`
//! (a three-member cluster). The `etcd_tls` row has its own test binary
//! (`conformance_tls.rs`); the backends are in `support/backend.rs`.

#[path = "support/backend.rs"]
mod backend;

use std::sync::{Arc, OnceLock};

use backend::{ETCD, backend};
use dlock_conformance::TestBackend;
use dlock_conformance::servers::ServerOptions;

fn etcd() -> Arc<dyn TestBackend> {
    static B: OnceLock<Arc<dyn TestBackend>> = OnceLock::new();
    Arc::clone(B.get_or_init(|| backend(1, "etcd", ServerOptions::default())))
}

fn etcd_cluster() -> Arc<dyn TestBackend> {
    static B: OnceLock<Arc<dyn TestBackend>> = OnceLock::new();
    Arc::clone(B.get_or_init(|| backend(3, "etcd-cluster", ServerOptions::default())))
}

dlock_conformance::conformance_tests!(etcd, etcd(), declared = ETCD);
dlock_conformance::conformance_tests!(etcd_cluster, etcd_cluster(), declared = ETCD);
