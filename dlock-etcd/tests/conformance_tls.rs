//! The shared conformance suite against etcd serving its clients over TLS only and accepting
//! only client certificates of its CA: `etcd_tls` (one member; the crate's tests build with the
//! `tls` feature). The backend is in `support/backend.rs`.
//!
//! Its own test binary, run after `conformance`'s: `cargo xtask test` runs each binary with 24
//! test threads on 2 cores, and the `etcd` and `etcd-cluster` rows already keep both busy. In
//! one binary with them, this row's scenarios (last in name order) overlapped their heaviest
//! tail and its `many_leases_break` starved (up to hundreds of its 1,000 leases lost before the
//! break, in each of 4 runs); alone it passed, and named to sort first it passed while
//! `etcd-cluster::many_leases_break` starved instead.

#[path = "support/backend.rs"]
mod backend;

use backend::{ETCD, backend};
use dlock_conformance::servers::ServerOptions;

// One member serving clients over TLS only (`https://`, `--cert-file`/`--key-file`) and
// accepting only clients with a certificate of its CA (`--client-cert-auth
// --trusted-ca-file`); certificates made at start-up. Lockers trust the CA and present the
// client identity (`EtcdLockerBuilder::tls_root_certificates`, `tls_client_identity`).
dlock_conformance::conformance_tests!(
    etcd_tls,
    backend(1, "etcd-tls", ServerOptions::default().with_tls(true)),
    declared = ETCD
);
