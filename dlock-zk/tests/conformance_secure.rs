//! The shared conformance suite against secured ZooKeeper (the backend is in
//! `support/backend.rs`):
//! - `zk_tls` (row `zk-tls`): one server serving clients over TLS only (`secureClientPort`,
//!   Netty connection factory, no plain client port) and accepting only client certificates of
//!   its CA (`ssl.clientAuth=need`); certificates made at start-up. Lockers trust the CA and
//!   present the client identity (`tls_root_certificates`, `tls_client_identity`).
//! - `zk_digest` (row `zk-digest`): one server; the lockers authenticate with the `digest`
//!   scheme and put `ZkAcl::CreatorAll` on every node they create, so audits authenticate too.
//!   [`zk_digest_nodes_are_the_creators_alone`] checks those ACLs hold against an
//!   unauthenticated client.
//!
//! Its own test binary, beside `conformance.rs`'s `zk` and `zk-cluster` rows: each row here
//! has its own server.

mod support;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_zk::DEFAULT_PREFIX;
use support::backend::{DIGEST_USER, ZK, ZkBackend};
use zookeeper_client as zkc;

/// The digest row's backend, concretely (for the ACL check).
fn digest_backend() -> Arc<ZkBackend> {
    static B: OnceLock<Arc<ZkBackend>> = OnceLock::new();
    Arc::clone(B.get_or_init(|| {
        // Its own server (told apart from a plain row's by a harmless extra `zoo.cfg` line),
        // so that the root the lockers create carries their ACL.
        let options = ServerOptions::default().with_args(["# dlock zk-digest row"]);
        let cluster = Cluster::shared_with(ServerKind::Zk, 1, &options)
            .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
        Arc::new(ZkBackend::new("zk-digest", cluster, options, true))
    }))
}

dlock_conformance::conformance_tests!(
    zk_tls,
    ZkBackend::shared("zk-tls", 1, ServerOptions::default().with_tls(true), false),
    declared = ZK
);
dlock_conformance::conformance_tests!(zk_digest, digest_backend(), declared = ZK);

/// The nodes a digest locker creates (here: the lock parent and the contender node) carry
/// only the locker's digest identity with every permission, and a client that did not
/// authenticate can neither read the lock's queue nor delete the holder's node. Red when the
/// ACL option is dropped (the nodes are then `world:anyone`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_digest_nodes_are_the_creators_alone() {
    let backend = digest_backend();
    let ns = support::namespace("digest-acl");
    let locker = backend
        .builder(&backend.cluster().endpoints().join(","))
        .ttl(Duration::from_secs(4))
        .namespace(ns.clone())
        .build()
        .await
        .expect("build");
    let name = LockName::new("acl").expect("name");
    let lease = locker
        .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("acquire");

    let audit = backend.raw().await.expect("authenticated audit session");
    let parent = format!("{DEFAULT_PREFIX}/{ns}/{}", name.encoded());
    let nodes = support::contenders(&audit, &parent).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let holder = format!("{parent}/{}", nodes[0]);
    // The root may predate the row (an external server); the lock's nodes are the locker's.
    for path in [parent.clone(), holder.clone()] {
        let (acls, _) = audit.get_acl(&path).await.expect("get_acl");
        assert_eq!(acls.len(), 1, "{path}: {acls:?}");
        let acl = &acls[0];
        assert_eq!(acl.scheme(), "digest", "{path}: {acls:?}");
        assert!(
            acl.id().starts_with(&format!("{DIGEST_USER}:")),
            "{path}: {acls:?}"
        );
        assert_eq!(acl.permission(), zkc::Permission::ALL, "{path}: {acls:?}");
    }

    // A session without credentials (the server's plain port: this row has no TLS).
    let anonymous = support::raw(&backend.cluster().endpoints()[0]).await;
    match anonymous.delete(&holder, None).await {
        Err(zkc::Error::NoAuth) => {}
        other => panic!("an unauthenticated delete of {holder}: {other:?}"),
    }
    match anonymous.list_children(&parent).await {
        Err(zkc::Error::NoAuth) => {}
        other => panic!("an unauthenticated list of {parent}: {other:?}"),
    }
    assert!(
        audit.check_stat(&holder).await.expect("stat").is_some(),
        "the holder's node is gone"
    );
    lease.release().await.expect("release");
}
