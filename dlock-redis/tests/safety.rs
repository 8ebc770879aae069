//! Safety of the single-node lock under slow replies and data loss, on real servers: the
//! server never expires a key before the lease's deadline, and fencing tokens never repeat or
//! go back after a restart without persistence, a failover to a lagging replica, or an
//! evicted fence key.

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::faults::{Direction, Mode, Proxy};
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker};
use dlock_redis::RedisLocker;
use tokio::time::Instant;

fn shared() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn private(nodes: usize) -> Cluster {
    Cluster::start(ServerKind::Redis, nodes)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

async fn locker(url: &str, ns: &str) -> RedisLocker {
    RedisLocker::builder()
        .url(url)
        .ttl(Duration::from_secs(2))
        .namespace(ns)
        .build()
        .await
        .expect("builds")
}

/// The earliest instant (our clock) at which the server may drop `key`: the `PTTL` read
/// counted from when the request was sent (the server read it later, so it expires later).
async fn server_expiry(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Instant {
    let sent = Instant::now();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL");
    assert!(pttl > 0, "the lock key {key} has no TTL left ({pttl})");
    sent + Duration::from_millis(u64::try_from(pttl).unwrap_or(0))
}

/// A fair acquire whose first `SET NX PX` reply comes back after the request timeout is
/// granted later by the queue script as "our own earlier grant". The lease's deadline is
/// counted from that later attempt, so the script must re-arm the key's TTL: the server must
/// never drop the key before the lease's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_grant_re_armed_never_outlives_its_key() {
    let cluster = shared();
    let url = cluster.endpoints().remove(0);
    let proxy = Proxy::start(cluster.addrs()[0]).expect("proxy");
    let ns = "dlock-test/safety/slow-grant";
    let l = RedisLocker::builder()
        .url(format!("redis://{}", proxy.addr()))
        .ttl(Duration::from_secs(2))
        .request_timeout(Duration::from_millis(300))
        .namespace(ns)
        .build()
        .await
        .expect("builds");
    drop(l.try_acquire(&name("warm")).await.expect("server up"));
    let mut conn = connect(&url).await;
    let lock = name("slow");
    let key = format!("{ns}/dlock:{{slow}}");
    // Replies held: the first SET NX PX is applied, its reply comes after the timeout.
    proxy.set_direction(Direction::Downstream, Mode::Blackhole);
    let (l2, n2) = (l.clone(), lock.clone());
    let acquiring = tokio::spawn(async move {
        l2.acquire(&n2, AcquireOptions::wait(Duration::from_secs(5)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(450)).await;
    proxy.set_direction(Direction::Downstream, Mode::Pass);
    let lease = acquiring.await.expect("join").expect("granted");
    lease.stop_renewal_for_test();
    let expiry = server_expiry(&mut conn, &key).await;
    let deadline = lease.deadline();
    assert!(
        expiry + Duration::from_millis(2) >= deadline,
        "the server drops the key {:?} before the lease's deadline",
        deadline - expiry
    );
    drop(lease);
}

/// The token of a fresh grant on `url` (released at once).
async fn token_on(url: &str, ns: &str, lock: &LockName) -> u64 {
    let l = locker(url, ns).await;
    let lease = l
        .acquire(lock, AcquireOptions::wait(Duration::from_secs(10)))
        .await
        .expect("acquire");
    let t = lease.token().get();
    lease.release().await.expect("release");
    t
}

/// A restart without persistence loses the fence counter: tokens granted after it must still
/// be greater than every token granted before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_restart_without_persistence() {
    let cluster = private(1);
    let url = cluster.endpoints().remove(0);
    let ns = "dlock-test/safety/restart";
    let lock = name("r");
    let mut before = 0;
    for _ in 0..3 {
        before = before.max(token_on(&url, ns, &lock).await);
    }
    tokio::task::block_in_place(|| cluster.node(0).restart()).expect("restart");
    let after = token_on(&url, ns, &lock).await;
    assert!(
        after > before,
        "token {after} after the restart, {before} before"
    );
}

/// An evicted (or deleted) fence key: the next token is still greater than every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_the_fence_key_is_evicted() {
    let url = shared().endpoints().remove(0);
    let ns = "dlock-test/safety/evicted";
    let lock = name("e");
    let before = token_on(&url, ns, &lock).await;
    let mut conn = connect(&url).await;
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{ns}/dlock:{{e}}:fence"))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let after = token_on(&url, ns, &lock).await;
    assert!(
        after > before,
        "token {after} after the eviction, {before} before"
    );
}

/// A failover to a replica that missed the latest grants: tokens the promoted replica grants
/// are still greater than every token the old master granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_a_failover_to_a_lagging_replica() {
    let cluster = private(2);
    let urls = cluster.endpoints();
    let (master, replica) = (cluster.addrs()[0], &urls[1]);
    let ns = "dlock-test/safety/failover";
    let lock = name("f");
    let mut conn = connect(replica).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg(master.ip().to_string())
        .arg(master.port())
        .query_async(&mut conn)
        .await
        .expect("REPLICAOF");
    for _ in 0..3 {
        token_on(&urls[0], ns, &lock).await;
    }
    // Wait until the replica has the counter, then cut it off (it lags from here on).
    let fence = format!("{ns}/dlock:{{f}}:fence");
    let mut master_conn = connect(&urls[0]).await;
    let want: Option<String> = redis::cmd("GET")
        .arg(&fence)
        .query_async(&mut master_conn)
        .await
        .expect("GET");
    let began = Instant::now();
    loop {
        let got: Option<String> = redis::cmd("GET")
            .arg(&fence)
            .query_async(&mut conn)
            .await
            .expect("GET on the replica");
        if got == want {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the replica never caught up ({got:?} vs {want:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut conn)
        .await
        .expect("promote");
    let mut before = 0;
    for _ in 0..3 {
        before = before.max(token_on(&urls[0], ns, &lock).await);
    }
    tokio::task::block_in_place(|| cluster.node(0).kill()).expect("kill the old master");
    let after = token_on(replica, ns, &lock).await;
    assert!(
        after > before,
        "token {after} on the promoted replica, {before} on the old master"
    );
}

/// A restart without persistence loses every held lock at the server: every lease the locker
/// holds is declared lost in the same renewal round, before its deadline (each key is checked
/// by owner value, which is also right when persistence kept the key: then it is still ours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_loses_every_held_lease_before_its_deadline() {
    let cluster = private(1);
    let url = cluster.endpoints().remove(0);
    let l = locker(&url, "dlock-test/safety/restart-held").await;
    let mut leases = Vec::new();
    for i in 0..3 {
        leases.push(
            l.acquire(
                &name(&format!("h{i}")),
                AcquireOptions::wait(Duration::from_secs(2)),
            )
            .await
            .expect("acquire"),
        );
    }
    tokio::task::block_in_place(|| cluster.node(0).restart()).expect("restart");
    for lease in &leases {
        let deadline = lease.deadline();
        let _ = lease.lost().await;
        let at = Instant::now();
        assert!(
            at <= deadline,
            "{} was lost {:?} after its deadline",
            lease.name(),
            at - deadline
        );
    }
}
