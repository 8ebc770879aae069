//! Redis Sentinel: the locker finds the master through the sentinels and follows a failover.
//!
//! Each test starts its own deployment (`support/sentinel.rs`: 1 master and 1 replica from the
//! harness, 3 sentinels on free ephemeral ports), killed on drop. Without `redis-server` the
//! tests print why and pass, unless `CI` is set: then they fail.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, Lease, LockName, Locker};
use dlock_redis::RedisLocker;
use tokio::time::Instant;

mod support;

use support::sentinel::{Deployment, MASTER, Timing, data_options, free_port};

/// 1 master, 1 replica, 3 sentinels monitoring the master as `m` (quorum 2): the shared
/// [`Deployment`] with the failover timing (down after 1 s).
struct Setup {
    deployment: Deployment,
    /// Ports of the data servers: [first master, first replica].
    data: [u16; 2],
    sentinels: Vec<u16>,
    /// Held (dropped last) while the deployment lives: see [`ONE_AT_A_TIME`].
    _one: tokio::sync::MutexGuard<'static, ()>,
}

/// One test of this file at a time. Each starts a deployment of its own (2 servers, 3
/// sentinels) and most kill or fail over its master; run together, they starved the sentinels
/// of CPU: a CI rehearsal waited more than 60 s for the sentinels to reconfigure a restarted
/// old master as a replica (`down-after` checks kept resetting their 8 s wait), where alone it
/// takes about 15 s.
static ONE_AT_A_TIME: std::sync::LazyLock<tokio::sync::Mutex<()>> =
    std::sync::LazyLock::new(|| tokio::sync::Mutex::new(()));

async fn conn(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

async fn try_conn(port: u16) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()
}

/// Polls `check` every 50 ms until it is true, for at most `within`.
async fn until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let began = Instant::now();
    while !check().await {
        assert!(began.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `l`'s acquire of `name` within `wait_s` seconds; panics saying `what` was expected.
async fn granted(l: &RedisLocker, name: &LockName, wait_s: u64, what: &str) -> Lease {
    l.acquire(name, AcquireOptions::wait(Duration::from_secs(wait_s)))
        .await
        .expect(what)
}

/// `l`'s acquire of `name` within `wait_s` seconds, in a task of its own.
fn acquiring(
    l: &RedisLocker,
    name: &LockName,
    wait_s: u64,
) -> tokio::task::JoinHandle<Result<Lease, dlock_core::Error>> {
    let (l, name) = (l.clone(), name.clone());
    tokio::spawn(async move {
        l.acquire(&name, AcquireOptions::wait(Duration::from_secs(wait_s)))
            .await
    })
}

/// Asserts that `lease`, granted after a failover or a lost lease, has a token above `before`.
#[track_caller]
fn assert_above(lease: &Lease, before: u64) {
    assert!(
        lease.token().0 > before,
        "token {} is not above {before}, the token before",
        lease.token().0
    );
}

async fn info(port: u16, section: &str) -> String {
    let Some(mut c) = try_conn(port).await else {
        return String::new();
    };
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .unwrap_or_default()
}

/// The master's port the sentinel on `port` names.
async fn named_master(port: u16) -> Option<u16> {
    let mut c = try_conn(port).await?;
    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(MASTER)
        .query_async(&mut c)
        .await
        .ok()?;
    addr.map(|(_, p)| p)
}

impl Setup {
    /// The deployment (servers of this test's own), or `None` after printing why when
    /// redis-server is not installed and `CI` is unset.
    async fn start() -> Option<Setup> {
        let one = ONE_AT_A_TIME.lock().await;
        let started = tokio::task::spawn_blocking(|| {
            let master = dlock_conformance::servers::Cluster::start_with(
                dlock_conformance::servers::ServerKind::Redis,
                1,
                &data_options(),
            )?;
            Deployment::start(Arc::new(master), Timing::FAST)
        })
        .await
        .expect("the deployment start panicked");
        let deployment = match started {
            Ok(d) => d,
            Err(e) if e.may_skip() => {
                eprintln!("skipped: {e}");
                return None;
            }
            Err(e) => panic!("cannot start the sentinel deployment: {e}"),
        };
        let data = [
            deployment.master_addr().port(),
            deployment.replica_addr().expect("a replica").port(),
        ];
        let sentinels = deployment.sentinels.iter().map(|a| a.port()).collect();
        Some(Setup {
            deployment,
            data,
            sentinels,
            _one: one,
        })
    }

    fn locker(&self, ns: &str, ttl: Duration) -> dlock_redis::RedisLockerBuilder {
        self.deployment.locker(MASTER).ttl(ttl).namespace(ns)
    }

    /// A locker under `ns` finding the master through the sentinels.
    async fn build(&self, ns: &str, ttl: Duration) -> RedisLocker {
        self.locker(ns, ttl).build().await.expect("builds")
    }

    /// Kills the first master (`start_again == false`) or starts it again.
    async fn first_master(&self, start_again: bool) {
        let master = Arc::clone(&self.deployment.master);
        tokio::task::spawn_blocking(move || match start_again {
            false => master.node(0).kill(),
            true => master.node(0).start_again(),
        })
        .await
        .expect("join")
        .expect("the first master killed or started again");
    }

    /// Waits until every sentinel names the replica the master.
    async fn replica_named(&self) {
        let new = self.data[1];
        for &s in &self.sentinels {
            until(
                "the sentinels name the replica",
                Duration::from_secs(30),
                || async { named_master(s).await == Some(new) },
            )
            .await;
        }
    }

    /// Waits until the replica, now the master, counts a replica of its own (with
    /// `min-replicas-to-write`: until then it refuses writes).
    async fn new_master_counts_a_replica(&self) {
        until(
            "the new master counts its replica",
            Duration::from_secs(60),
            || async {
                info(self.data[1], "replication")
                    .await
                    .contains("min_slaves_good_slaves:1")
            },
        )
        .await;
    }

    /// `SENTINEL FAILOVER`, then waits until every sentinel names the replica and the old
    /// master has been turned into its replica (the sentinels do that a few seconds later).
    /// Returns when the sentinels named the new master.
    async fn failover(&self) -> Instant {
        let old = self.data[0];
        let mut c = conn(self.sentinels[0]).await;
        // NOGOODSLAVE until the sentinel's view of the replica is fresh (it reads the
        // replica's INFO every 10 s).
        let asked = Instant::now();
        loop {
            let r: redis::RedisResult<()> = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(MASTER)
                .query_async(&mut c)
                .await;
            match r {
                Ok(()) => break,
                Err(e)
                    if e.code() == Some("NOGOODSLAVE")
                        && asked.elapsed() < Duration::from_secs(30) =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("SENTINEL FAILOVER: {e}"),
            }
        }
        self.replica_named().await;
        let named = Instant::now();
        until(
            "the old master becomes a replica",
            Duration::from_secs(60),
            || async {
                let i = info(old, "replication").await;
                i.contains("role:slave") && i.contains("master_link_status:up")
            },
        )
        .await;
        // ... and the new master counts it (min-replicas-to-write: it accepts writes).
        self.new_master_counts_a_replica().await;
        named
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_name_the_master() {
    let Some(setup) = Setup::start().await else {
        return;
    };
    let began = std::time::Instant::now();
    let ns = "dlock-test/sentinel/find";
    let l = setup.build(ns, Duration::from_secs(2)).await;
    let name = LockName::new("found").expect("valid name");
    let lease = granted(&l, &name, 10, "granted on the master the sentinels name").await;
    let mut master = conn(setup.data[0]).await;
    let held: Option<String> = redis::cmd("GET")
        .arg(format!("{ns}/dlock:{{found}}"))
        .query_async(&mut master)
        .await
        .expect("GET");
    assert!(held.is_some(), "the lock key is not on the master");
    lease.release().await.expect("release");
    // A sentinel that is down is skipped: the first address refuses connections.
    let l = RedisLocker::builder()
        .sentinels(
            [format!("127.0.0.1:{}", free_port().expect("a free port"))]
                .into_iter()
                .chain(setup.deployment.sentinel_addrs()),
            MASTER,
        )
        .ttl(Duration::from_secs(2))
        .namespace(ns)
        .build()
        .await
        .expect("builds");
    l.try_acquire(&name)
        .await
        .expect("the next sentinel answers")
        .expect("free")
        .release()
        .await
        .expect("release");
    // An unknown master name: no grant, an Unavailable error naming why.
    let unknown = RedisLocker::builder()
        .sentinels(setup.deployment.sentinel_addrs(), "no-such-master")
        .ttl(Duration::from_secs(2))
        .build()
        .await
        .expect("builds");
    let e = unknown.try_acquire(&name).await.expect_err("no master");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("does not know"), "{e}");
    println!("sentinel discovery: {:?}", began.elapsed());
}

/// One hold of the contended workload.
#[derive(Debug, Clone)]
struct Hold {
    client: usize,
    token: u64,
    granted: Instant,
    /// When the holder stopped believing: release started, `lost()` fired, or the promised
    /// deadline, whichever came first.
    end: Instant,
    lost: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_contention_keeps_tokens_increasing_and_holds_apart() {
    let Some(setup) = Setup::start().await else {
        return;
    };
    let began = std::time::Instant::now();
    let ns = "dlock-test/sentinel/contended";
    let name = LockName::new("shared").expect("valid name");
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::default();
    let errors: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    // Whether client 0 holds the lock right now.
    let holding = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in 0..3 {
        let l = setup.build(ns, Duration::from_secs(2)).await;
        let (name, holds, errors, mut stop) =
            (name.clone(), holds.clone(), errors.clone(), stop.clone());
        // Client 0 holds long (past its TTL, across renewals); the others briefly.
        let holding = holding.clone();
        let hold_for = if client == 0 {
            Duration::from_secs(4)
        } else {
            Duration::from_millis(40)
        };
        tasks.push(tokio::spawn(async move {
            while !*stop.borrow() {
                let lease = match l
                    .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
                    .await
                {
                    Ok(lease) => lease,
                    Err(e) => {
                        *errors
                            .lock()
                            .expect("lock")
                            .entry(format!("{:?}", e.kind()))
                            .or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let granted = Instant::now();
                let token = lease.token().0;
                holding.store(client == 0, std::sync::atomic::Ordering::SeqCst);
                let lost = lease.lost();
                let (end, was_lost) = tokio::select! {
                    () = tokio::time::sleep(hold_for) => (Instant::now(), false),
                    _ = lost => (Instant::now(), true),
                    _ = stop.changed() => (Instant::now(), false),
                };
                holding.store(false, std::sync::atomic::Ordering::SeqCst);
                let end = end.min(lease.deadline());
                holds.lock().expect("lock").push(Hold {
                    client,
                    token,
                    granted,
                    end,
                    lost: was_lost,
                });
                let _ = lease.release().await;
            }
        }));
    }
    let count = |holds: &Arc<Mutex<Vec<Hold>>>| holds.lock().expect("lock").len();
    until(
        "grants before the failover, client 0 holding",
        Duration::from_secs(60),
        || async { count(&holds) >= 6 && holding.load(std::sync::atomic::Ordering::SeqCst) },
    )
    .await;
    let before = Instant::now();
    let failover_began = Instant::now();
    let named = setup.failover().await;
    let converted = Instant::now();
    let at_conversion = count(&holds);
    until(
        "grants after the failover",
        Duration::from_secs(60),
        || async { count(&holds) >= at_conversion + 6 },
    )
    .await;
    stop_tx.send_replace(true);
    for t in tasks {
        t.await.expect("client task");
    }
    let mut holds = holds.lock().expect("lock").clone();
    holds.sort_by_key(|h| h.granted);
    let max_before = holds
        .iter()
        .filter(|h| h.granted < before)
        .map(|h| h.token)
        .max()
        .expect("grants before");
    let after: Vec<&Hold> = holds.iter().filter(|h| h.granted > converted).collect();
    assert!(after.len() >= 3, "too few grants after the failover");
    for h in &after {
        assert!(
            h.token > max_before,
            "token {} after the failover is not above {max_before}",
            h.token
        );
    }
    // The new master holds the name's fence counter now (the old one is its replica).
    let mut new_master = conn(setup.data[1]).await;
    let role: redis::Role = redis::cmd("ROLE")
        .query_async(&mut new_master)
        .await
        .expect("ROLE");
    assert!(matches!(role, redis::Role::Primary { .. }), "{role:?}");
    let fence: u64 = redis::cmd("GET")
        .arg(format!("{ns}/dlock:{{shared}}:fence"))
        .query_async(&mut new_master)
        .await
        .expect("the fence counter on the new master");
    assert!(
        fence >= after.last().expect("after").token,
        "the last grants were not made on the new master"
    );
    let mut overlaps = Vec::new();
    let mut out_of_order = Vec::new();
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            if b.granted < a.end {
                overlaps.push(format!(
                    "client {} (token {}, lost {}) believed until {:?} after client {} (token {}) was granted",
                    a.client,
                    a.token,
                    a.lost,
                    a.end - b.granted,
                    b.client,
                    b.token
                ));
            }
        }
        if let Some(b) = holds.get(i + 1)
            && b.token <= a.token
        {
            out_of_order.push((a.token, b.token));
        }
    }
    let lost = holds.iter().filter(|h| h.lost).count();
    // Client 0's lease held across the failover could not be renewed (the old master refuses
    // writes once its replica is promoted): lost, before its deadline.
    let across = holds
        .iter()
        .find(|h| h.client == 0 && h.granted < failover_began && h.end > failover_began)
        .expect("client 0 held the lock when the failover began");
    assert!(
        across.lost,
        "the lease held across the failover was not lost: {across:?}"
    );
    println!(
        "holds {} (lost {lost}), errors {:?}, failover: sentinels named the new master after {:?}, the old master was demoted {:?} later; {:?} in all",
        holds.len(),
        errors.lock().expect("lock"),
        named - failover_began,
        converted - named,
        began.elapsed()
    );
    assert!(
        out_of_order.is_empty(),
        "tokens not increasing: {out_of_order:?}"
    );
    assert!(overlaps.is_empty(), "overlapping holds: {overlaps:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_grant_survives_a_failover() {
    let Some(setup) = Setup::start().await else {
        return;
    };
    let began = std::time::Instant::now();
    let ns = "dlock-test/sentinel/acked";
    // The TTL outlasts the time the sentinels take to demote the old master (see the README).
    // While the old master is still a master the new one has no replica: both refuse
    // writes (min-replicas-to-write) until the sentinels demote the old one (~10-15 s here).
    let ttl = Duration::from_secs(45);
    let l = setup
        .locker(ns, ttl)
        .wait_for_replicas(1, Duration::from_secs(2))
        .build()
        .await
        .expect("builds");
    let name = LockName::new("acked").expect("valid name");
    let lease = granted(&l, &name, 10, "granted and acknowledged").await;
    let token = lease.token().0;
    setup.failover().await;
    let demoted = Instant::now();
    // A renewal sent after the demotion succeeds (on the new master, the only one then).
    until("a renewal on the new master", ttl, || async {
        lease.deadline() > demoted + ttl / 2 || lease.is_lost()
    })
    .await;
    assert!(
        !lease.is_lost(),
        "the acknowledged lease was lost {:?} after the old master was demoted",
        demoted.elapsed()
    );
    assert!(lease.deadline() > demoted + ttl / 2, "not renewed");
    let mut new_master = conn(setup.data[1]).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(format!("{ns}/dlock:{{acked}}"))
        .query_async(&mut new_master)
        .await
        .expect("PTTL");
    assert!(pttl > 0, "the lock key is not held on the new master");
    let other = setup.build(ns, ttl).await;
    assert!(
        other
            .try_acquire(&name)
            .await
            .expect("new master")
            .is_none(),
        "another client was granted the held lock"
    );
    lease.release().await.expect("release on the new master");
    let next = granted(&other, &name, 10, "free after the release").await;
    assert_above(&next, token);
    next.release().await.expect("release");
    println!(
        "acknowledged lease across a failover: {:?}",
        began.elapsed()
    );
}

/// A node fault, not a requested failover: the master is killed. The lease held on it is lost
/// no later than its deadline; the sentinels promote the replica, which refuses locks while it
/// has no replica of its own (`min-replicas-to-write 1`: with one replica, losing either data
/// server stops grants); once the old master is back (empty: no persistence) the sentinels
/// make it the new master's replica, and grants resume with tokens above the lost lease's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_and_grants_resume_once_it_is_back_as_a_replica() {
    let Some(setup) = Setup::start().await else {
        return;
    };
    let began = std::time::Instant::now();
    let ns = "dlock-test/sentinel/killed";
    let name = LockName::new("killed").expect("valid name");
    let holder = setup.build(ns, Duration::from_secs(2)).await;
    let lease = granted(&holder, &name, 10, "granted on the first master").await;
    let token = lease.token().0;
    let lost = lease.lost();
    setup.first_master(false).await;
    let killed = Instant::now();
    // No renewal can succeed after the kill: this is the last promise.
    let deadline = lease.deadline();
    tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost() fired");
    let lost_at = Instant::now();
    assert!(
        lost_at <= deadline + Duration::from_millis(250),
        "lost() fired {:?} after the lease's deadline",
        lost_at - deadline
    );
    setup.replica_named().await;
    let promoted = Instant::now();
    let other = setup.build(ns, Duration::from_secs(2)).await;
    let refused = other.try_acquire(&name).await;
    assert!(
        matches!(&refused, Err(e) if e.kind() == ErrorKind::Unavailable),
        "the promoted replica without a replica of its own: {:?}",
        refused.map(|l| l.map(|l| l.token()))
    );
    setup.first_master(true).await;
    setup.new_master_counts_a_replica().await;
    let back = Instant::now();
    let next = granted(
        &other,
        &name,
        20,
        "granted on the new master once it has a replica",
    )
    .await;
    assert_above(&next, token);
    next.release().await.expect("release");
    println!(
        "master killed: lost after {:?}, replica promoted after {:?}, old master back as its replica {:?} later; {:?} in all",
        lost_at - killed,
        promoted - killed,
        back - promoted,
        began.elapsed()
    );
}

/// An acquire that waits retries within its wait across a requested failover (`SENTINEL
/// FAILOVER`: the sentinels also close the clients' connections to the servers they
/// reconfigure): it waits behind a holder whose lease the failover costs, and is granted on
/// the new master within its wait, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_is_granted_across_a_failover() {
    let Some(setup) = Setup::start().await else {
        return;
    };
    let ns = "dlock-test/sentinel/wait-failover";
    let name = LockName::new("waited").expect("valid name");
    let ttl = Duration::from_secs(2);
    let holder = setup.build(ns, ttl).await;
    let held = granted(&holder, &name, 10, "granted on the first master").await;
    let token = held.token().0;
    let waiter = setup.build(ns, ttl).await;
    let waiting = acquiring(&waiter, &name, 90);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter did not wait");
    setup.failover().await;
    let lease = waiting
        .await
        .expect("join")
        .expect("the waiting acquire is granted within its wait across the failover");
    assert_above(&lease, token);
    lease.release().await.expect("release");
    drop(held);
}

/// An acquire that starts while the master is dead (connections refused) retries within its
/// wait: the sentinels promote the replica, which takes writes once the old master is back
/// as its replica, and the acquire is granted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_waits_across_a_killed_master() {
    let Some(setup) = Setup::start().await else {
        return;
    };
    let ns = "dlock-test/sentinel/wait-killed";
    let name = LockName::new("waited").expect("valid name");
    let l = setup.build(ns, Duration::from_secs(2)).await;
    let first = granted(&l, &name, 10, "granted on the first master").await;
    let token = first.token().0;
    first.release().await.expect("release");
    setup.first_master(false).await;
    let waiting = acquiring(&l, &name, 90);
    setup.replica_named().await;
    assert!(
        !waiting.is_finished(),
        "the acquire ended while no master took writes: {:?}",
        waiting.await.expect("join").map(|l| l.token())
    );
    setup.first_master(true).await;
    let lease = waiting
        .await
        .expect("join")
        .expect("granted within its wait once the new master takes writes");
    assert_above(&lease, token);
    lease.release().await.expect("release");
}
