//! The shared conformance suite against a real etcd server: the `etcd` row. The
//! `etcd_cluster`, `etcd_tls` and `etcd_auth` rows have test binaries of their own
//! (`conformance_cluster.rs`, `conformance_tls.rs`, `conformance_auth.rs`); the backends are in
//! `support/backend.rs`.

#[path = "support/backend.rs"]
mod backend;

use backend::{ETCD, backend};
use dlock_conformance::servers::ServerOptions;

dlock_conformance::conformance_tests!(
    etcd,
    backend(1, "etcd", ServerOptions::default()),
    declared = ETCD
);
