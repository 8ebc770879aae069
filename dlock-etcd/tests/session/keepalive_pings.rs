//! HTTP/2 keep-alive pings that etcd accepts with its default flags.
//!
//! etcd's gRPC server (`--grpc-keepalive-min-time`, 5 s by default) counts a ping that comes
//! less than 5 s after the previous one as a strike while it has sent nothing in between, and
//! closes the connection (GOAWAY `too_many_pings`) at the third. A client pinging every 2 s
//! trips that whenever etcd is silent for about 8 s: with a TTL ≥ 24 s, between every two
//! keep-alive rounds. So the check needs a TTL of at least 24 s and a few silent gaps.
//!
//! SLOW (about 45 s): a 30 s TTL and a lock held for 40 s (four silent gaps of 10 s). Run it alone
//! with `cargo test -p dlock-etcd --test session keepalive_pings`.

use crate::support;

use std::time::Duration;

use dlock_conformance::faults::Proxy;
use dlock_conformance::servers::ServerOptions;
use dlock_core::Locker;
use dlock_etcd::EtcdLocker;

#[test]
fn slow_idle_connection_survives_default_etcd_ping_policy() {
    // etcd's default timing (and its default ping policy), as deployed.
    let server = support::private(&ServerOptions::etcd_production());
    let proxy = Proxy::start(server.addrs()[0]).expect("counting proxy");
    support::runtime().block_on(async {
        let locker = EtcdLocker::builder()
            .endpoints([format!("http://{}", proxy.addr())])
            .prefix(support::namespace("pings"))
            .ttl(Duration::from_secs(30))
            .build()
            .await
            .expect("locker");
        let name = support::name("long");
        let lease = support::hold(&locker, &name).await;
        let connections = proxy.connections();
        tokio::time::sleep(Duration::from_secs(40)).await;
        lease.check().expect("held through four silent gaps");
        let stats = locker.stats();
        assert_eq!(
            proxy.connections(),
            connections,
            "etcd closed the connection (reconnects): {stats:?}\n{}",
            server.logs()
        );
        assert_eq!(stats.losses, 0, "{stats:?}");
        assert_eq!(stats.renewal_failures, 0, "{stats:?}");
        assert!(stats.renewals >= 3, "{stats:?}");
        lease.release().await.expect("release");
    });
}
