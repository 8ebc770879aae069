//! The contenders against real servers. A floor whose create-if-absent silently fails measures
//! nothing, so a refused `SET NX` (or a failed etcd txn compare) and a release that deleted
//! nothing must be errors; the etcd peer's lease is kept alive past its TTL. The read floors
//! let readers share, fail where a writer's key is present, and fail a release that removed
//! nothing.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock_conformance::servers::{Cluster, ServerKind};

use crate::impls::{Held, Impl, Kind, Server, etcd_client};

const TTL: Duration = Duration::from_secs(10);

/// The shared single-node cluster, or `None` (printed) where the servers are not installed and
/// the harness allows skipping (never under `CI`).
fn server(kind: ServerKind) -> Option<Arc<Cluster>> {
    match Cluster::shared(kind, 1) {
        Ok(c) => Some(c),
        Err(e) if e.may_skip() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn unique(who: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("dlock-bench-test/{who}-{}-{nanos}/", std::process::id())
}

/// A second client cannot take a held key; the holder's release frees it; a second release of
/// the same key (nothing left to delete) is an error.
async fn floor_is_a_floor(floor: &Impl, key: String) {
    let a = floor.client(TTL).await.unwrap_or_else(|e| panic!("{e}"));
    let b = floor.client(TTL).await.unwrap_or_else(|e| panic!("{e}"));
    let held = a.acquire("k").await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        b.acquire("k").await.is_err(),
        "{}: a second client took a held key",
        floor.name
    );
    a.release(held).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        a.release(Box::new(key)).await.is_err(),
        "{}: a release that deleted nothing succeeded",
        floor.name
    );
    let again = b.acquire("k").await.unwrap_or_else(|e| panic!("{e}"));
    b.release(again).await.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn redis_floor_checks_set_nx() {
    let Some(c) = server(ServerKind::Redis) else {
        return;
    };
    let prefix = unique("redis-floor");
    let floor = Impl::new(Server::Redis, Kind::Floor, c.endpoints(), prefix.clone());
    floor_is_a_floor(&floor, format!("{prefix}k")).await;
}

#[tokio::test]
async fn etcd_floor_checks_its_txn() {
    let Some(c) = server(ServerKind::Etcd) else {
        return;
    };
    let prefix = unique("etcd-floor");
    let floor = Impl::new(Server::Etcd, Kind::Floor, c.endpoints(), prefix.clone());
    floor_is_a_floor(&floor, format!("{prefix}k")).await;
}

#[tokio::test]
async fn etcd_peer_lease_outlives_its_ttl() {
    let Some(c) = server(ServerKind::Etcd) else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let (mut client, lease) = etcd_client(&c.endpoints(), ttl)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Twice the TTL: without keep-alives the lease would be gone.
    tokio::time::sleep(ttl * 2).await;
    let left = client
        .lease_time_to_live(lease.id, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .ttl();
    assert!(left > 0, "lease {} expired (ttl {left})", lease.id);
}

/// Two clients read the same name at once; releasing a read twice is an error the second
/// time (`again` rebuilds what the first acquire returned).
async fn read_floor_shares(floor: &Impl, again: impl Fn(&Held) -> Held) {
    let a = floor.client(TTL).await.unwrap_or_else(|e| panic!("{e}"));
    let b = floor.client(TTL).await.unwrap_or_else(|e| panic!("{e}"));
    let ha = a.acquire("k").await.unwrap_or_else(|e| panic!("{e}"));
    let hb = b.acquire("k").await.unwrap_or_else(|e| panic!("{e}"));
    let copy = again(&ha);
    a.release(ha).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        a.release(copy).await.is_err(),
        "{}: a read release that removed nothing succeeded",
        floor.name
    );
    b.release(hb).await.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn redis_read_floor_shares_and_checks_its_release() {
    let Some(c) = server(ServerKind::Redis) else {
        return;
    };
    let prefix = unique("redis-read-floor");
    let floor = Impl::new(Server::Redis, Kind::ReadFloor, c.endpoints(), prefix);
    read_floor_shares(&floor, |h| {
        Box::new(
            h.downcast_ref::<(String, String)>()
                .cloned()
                .unwrap_or_default(),
        )
    })
    .await;
}

#[tokio::test]
async fn etcd_read_floor_shares_and_sees_a_writer() {
    let Some(c) = server(ServerKind::Etcd) else {
        return;
    };
    let prefix = unique("etcd-read-floor");
    let floor = Impl::new(Server::Etcd, Kind::ReadFloor, c.endpoints(), prefix.clone());
    read_floor_shares(&floor, |h| {
        Box::new(h.downcast_ref::<String>().cloned().unwrap_or_default())
    })
    .await;
    let mut raw = etcd_client::Client::connect(c.endpoints(), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    raw.put(format!("{prefix}k/write/w"), "", None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let a = floor.client(TTL).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        a.acquire("k").await.is_err(),
        "a read beside a writer's key"
    );
    raw.delete(
        prefix.as_str(),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn zk_read_floor_shares_and_sees_a_writer() {
    let Some(c) = server(ServerKind::Zk) else {
        return;
    };
    let base = format!("/{}", unique("zk-read-floor").trim_end_matches('/'));
    let floor = Impl::new(Server::Zk, Kind::ReadFloor, c.endpoints(), base.clone());
    read_floor_shares(&floor, |h| {
        Box::new(h.downcast_ref::<String>().cloned().unwrap_or_default())
    })
    .await;
    let raw = zookeeper_client::Client::connect(&c.endpoints().join(","))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ephemeral =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    raw.create(&format!("{base}/k/write-0"), b"", &ephemeral)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let a = floor.client(TTL).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        a.acquire("k").await.is_err(),
        "a read beside a writer's node"
    );
}
