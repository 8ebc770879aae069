//! A locker built from the application's own etcd client: it excludes a locker built from
//! endpoints, renews through that client, and refuses a second way to reach etcd before any
//! I/O.

use crate::support;

use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, Locker};
use dlock_etcd::EtcdLocker;

const TTL: Duration = Duration::from_secs(2);

#[test]
fn a_locker_from_an_existing_client() {
    support::on_single("from-client", |cluster, ns| async move {
        let client = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .expect("the application's client");
        let mine = EtcdLocker::builder()
            .client(client.clone())
            .prefix(&ns)
            .ttl(TTL)
            .build()
            .await
            .expect("a locker from the client");
        let theirs = support::locker(&cluster, &ns).await;
        let lock = support::name("shared");
        let held = mine
            .acquire(&lock, AcquireOptions::wait(TTL * 3))
            .await
            .expect("granted");
        // Held through renewals over the client: two TTLs, and still excluding the other.
        tokio::time::sleep(TTL * 2).await;
        held.check()
            .expect("renewed through the application's client");
        assert!(
            theirs
                .try_acquire(&lock)
                .await
                .expect("reachable")
                .is_none(),
            "the endpoints' locker sees the client's locker's hold"
        );
        let state = theirs.inspect(&lock).await.expect("inspect");
        assert_eq!(state.holder.and_then(|h| h.token), Some(held.token()));
        held.release().await.expect("release");
        let next = theirs.try_acquire(&lock).await.expect("reachable");
        assert!(next.is_some(), "free after the release");
        mine.close().await.expect("close");
        // Closing the locker leaves the application's client working.
        client
            .clone()
            .get("dlock-from-client-probe", None)
            .await
            .expect("the application's client still answers");
    });
}

#[test]
fn a_second_way_to_reach_etcd_is_refused_before_any_io() {
    support::runtime().block_on(async {
        // A client that never connects: nothing may be sent through it.
        let client = etcd_client::Client::connect(["http://127.0.0.1:9"], None)
            .await
            .expect("lazy client");
        let with = || EtcdLocker::builder().client(client.clone());
        for (option, builder) in [
            ("endpoints", with().endpoints(["http://127.0.0.1:2379"])),
            ("user", with().user("u", "p")),
            (
                "tls_root_certificates",
                with().tls_root_certificates(b"-----BEGIN CERTIFICATE-----".to_vec()),
            ),
        ] {
            let err = builder.validate().expect_err("two ways to reach etcd");
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
            assert!(err.to_string().contains(option), "{option}: {err}");
        }
        with().validate().expect("the client alone is enough");
    });
}
