//! The drift guard on real servers: two routers whose configurations send `orders/42` to
//! different tiers (etcd in one, Redis in the other) over the same Redis and etcd cannot both
//! run, so they cannot both hold the name.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_any::TieredConfig;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, Error, LockName, Locker};

fn shared(kind: ServerKind) -> Arc<Cluster> {
    Cluster::shared(kind, 1).unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn namespace() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "dlock-any-drift-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A configuration over the shared Redis (`fast`) and etcd (`strict`) in `ns`, with `routes`
/// (TOML `[[routes]]` tables) appended.
fn config(ns: &str, routes: &str) -> TieredConfig {
    let (redis, etcd) = (shared(ServerKind::Redis), shared(ServerKind::Etcd));
    format!(
        "[tiers.fast]\nurl = \"redis://{}?ttl=2s&namespace={ns}\"\n\
         [tiers.strict]\nurl = \"etcd://{}?ttl=2s&namespace={ns}\"\n{routes}",
        redis.addrs()[0],
        etcd.addrs()[0],
    )
    .parse()
    .unwrap_or_else(|e| panic!("the test's configuration: {e}"))
}

const STRICT_ORDERS: &str = "[[routes]]\npattern = \"orders/*\"\ntier = \"strict\"\n\
                             [[routes]]\npattern = \"*\"\ntier = \"fast\"\n";
/// The drifted configuration: orders go to Redis, cache names to etcd (both tiers used).
const FAST_ORDERS: &str = "[[routes]]\npattern = \"cache/*\"\ntier = \"strict\"\n\
                           [[routes]]\npattern = \"*\"\ntier = \"fast\"\n";

fn is_drift(e: &Error) -> bool {
    matches!(
        e,
        Error::InvalidOption {
            option: "config.fingerprint",
            ..
        }
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_differently_configured_routers_cannot_both_hold_one_name() {
    let ns = namespace();
    let (a_config, b_config) = (config(&ns, STRICT_ORDERS), config(&ns, FAST_ORDERS));
    assert_ne!(a_config.fingerprint(), b_config.fingerprint());
    let name = LockName::new("orders/42").expect("name");

    let a = a_config.connect().await.expect("the first router connects");
    let lease = a
        .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("granted on etcd");
    // Without the guard, `b` would connect and get `orders/42` from Redis at once.
    let e = b_config
        .connect()
        .await
        .expect_err("the drifted router is refused");
    assert!(is_drift(&e), "{e}");
    assert!(e.to_string().contains("different configuration"), "{e}");

    // A router with the same configuration runs beside it and is excluded as usual.
    let a2 = config(&ns, STRICT_ORDERS)
        .connect()
        .await
        .expect("same configuration");
    assert!(a2.try_acquire(&name).await.expect("asks").is_none());
    drop(lease);
    a2.close().await.expect("closed");
    a.close().await.expect("closed");

    // Once no router of the old configuration runs, the new one may: a stop-then-start deploy.
    let b = b_config
        .connect()
        .await
        .expect("the new configuration alone");
    let lease = b
        .try_acquire(&name)
        .await
        .expect("asks")
        .expect("free on Redis");
    drop(lease);
    b.close().await.expect("closed");
}
