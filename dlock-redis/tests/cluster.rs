//! Redis Cluster mode against a real 3-master cluster (each test its own, formed with
//! `redis-cli --cluster create`): renewal cost (one request per
//! master per period, counted by the client and by the servers), a waiter subscribed on
//! another master than the lock's woken by the release, a slot moved under a held lease
//! (`MOVED` followed), a master killed under held leases.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_conformance::servers::Cluster;
use dlock_core::{AcquireOptions, Lease, LockName, Locker};
use dlock_redis::RedisLocker;
use support::cluster::start;
use support::commandstat_calls;
use tokio::time::Instant;

/// A private formed cluster; `None` (after printing why) when the servers are not installed
/// and `CI` is unset.
fn cluster() -> Option<Cluster> {
    match start() {
        Ok(c) => Some(c),
        Err(e) if e.may_skip() && std::env::var_os("CI").is_none() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("cannot start the Redis Cluster: {e}"),
    }
}

async fn locker(urls: Vec<String>, ns: &str, ttl: Duration) -> RedisLocker {
    RedisLocker::builder()
        .cluster(urls)
        .ttl(ttl)
        .namespace(ns)
        .build()
        .await
        .expect("a cluster locker")
}

/// `l`'s acquire of `name` within 5 s; panics saying `what` was expected.
async fn hold(l: &RedisLocker, name: &LockName, what: &str) -> Lease {
    l.acquire(name, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect(what)
}

/// `l`'s acquire of `name` within 10 s, in a task of its own that also returns when it ended.
fn timed_acquire(
    l: &RedisLocker,
    name: &LockName,
) -> tokio::task::JoinHandle<(Result<Lease, dlock_core::Error>, Instant)> {
    let (l, name) = (l.clone(), name.clone());
    tokio::spawn(async move {
        let r = l
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(10)))
            .await;
        (r, Instant::now())
    })
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/dlock:{{{name}}}")
}

/// The index of the node serving `key`'s slot: the first running node that answers, or the
/// node its `MOVED` names.
async fn owner_of(cluster: &Cluster, key: &str) -> usize {
    for (i, url) in cluster.endpoints().iter().enumerate() {
        if !cluster.node(i).is_running() {
            continue;
        }
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let r: Result<Option<String>, _> = redis::cmd("GET").arg(key).query_async(&mut conn).await;
        match r {
            Ok(_) => return i,
            Err(e) if e.code() == Some("MOVED") => {
                // (`host:port`, slot)
                let (to, _slot) = e.redirect_node().expect("MOVED names a node");
                return cluster
                    .addrs()
                    .iter()
                    .position(|a| a.to_string() == to)
                    .unwrap_or_else(|| panic!("MOVED to an unknown node {to}"));
            }
            Err(e) => panic!("GET {key} on node {i}: {e}"),
        }
    }
    panic!("no node serves {key}");
}

async fn node_cmd<T: redis::FromRedisValue>(cluster: &Cluster, i: usize, cmd: &redis::Cmd) -> T {
    let client = redis::Client::open(cluster.node(i).endpoint()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    cmd.query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{cmd:?} on node {i}: {e}"))
}

fn info(cluster: &Cluster, i: usize) -> String {
    cluster
        .node(i)
        .read_text(b"INFO commandstats\r\nQUIT\r\n")
        .expect("INFO")
}

/// 90 leases over the 3 masters: each renewal round is ONE request per master (client-side
/// `requests`), and each master sees one pipeline per round: one `SCRIPT LOAD` and one
/// `EVALSHA` per slot it holds leases in (server-side `INFO commandstats`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_is_one_request_per_master_per_period() {
    let Some(cluster) = cluster() else { return };
    renewal_cost(&cluster, 90, Duration::from_millis(1500), true).await;
}

/// As [`renewal_is_one_request_per_master_per_period`] with 10,000 leases (TTL 6 s): still one
/// request per master per period. Ignored by default (a minute of work on a small machine):
/// `cargo test -p dlock-redis --test cluster -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: 10,000 leases"]
async fn renewal_of_10000_leases_is_one_request_per_master_per_period() {
    let Some(cluster) = cluster() else { return };
    renewal_cost(&cluster, 10_000, Duration::from_secs(6), false).await;
}

/// Holds `count` leases over the 3 masters and checks one renewal request per master per
/// round over a window of 6 periods; with `per_slot`, also one `EVALSHA` per held slot per
/// round on each master (one `CLUSTER KEYSLOT` per lease to know them).
async fn renewal_cost(cluster: &Cluster, count: usize, ttl: Duration, per_slot: bool) {
    use futures::StreamExt;
    let ns = "renew-cost";
    let l = locker(cluster.endpoints(), ns, ttl).await;
    let names: Vec<LockName> = (0..count)
        .map(|i| LockName::new(format!("n{i}")).expect("a valid name"))
        .collect();
    let t0 = Instant::now();
    let leases: Vec<_> = futures::stream::iter(names.iter())
        .map(|n| l.try_acquire(n))
        .buffer_unordered(128)
        .collect()
        .await;
    let leases: Vec<_> = leases
        .into_iter()
        .map(|r| r.expect("acquire").expect("free"))
        .collect();
    eprintln!("{count} leases acquired in {:?}", t0.elapsed());
    // Slots held per node (with `per_slot`); every master must hold some leases.
    let mut slots: BTreeMap<usize, std::collections::BTreeSet<i64>> = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        if !per_slot && i >= 300 {
            break;
        }
        let k = key(ns, name.as_str());
        let slot: i64 = node_cmd(cluster, 0, redis::cmd("CLUSTER").arg("KEYSLOT").arg(&k)).await;
        slots
            .entry(owner_of(cluster, &k).await)
            .or_default()
            .insert(slot);
    }
    assert_eq!(
        slots.len(),
        3,
        "the leases must cover every master: {slots:?}"
    );
    // Let the rounds settle into the regular period.
    tokio::time::sleep(ttl).await;
    let s0 = l.stats();
    let before: Vec<String> = (0..3).map(|i| info(cluster, i)).collect();
    let period = ttl / 3;
    let window = period * 6;
    let w0 = Instant::now();
    tokio::time::sleep(window).await;
    let s1 = l.stats();
    let after: Vec<String> = (0..3).map(|i| info(cluster, i)).collect();
    let elapsed = w0.elapsed();
    let rounds = s1.renewals - s0.renewals;
    let requests = s1.requests - s0.requests;
    eprintln!(
        "{count} leases: {rounds} rounds, {requests} client requests in {elapsed:?} (period {period:?})"
    );
    assert_eq!(
        s1.renewal_failures - s0.renewal_failures,
        0,
        "no round may fail"
    );
    let periods = (elapsed.as_millis() / period.as_millis()) as u64;
    assert!(
        rounds + 2 >= periods && rounds <= periods + 1,
        "{rounds} rounds in {elapsed:?} (period {period:?})"
    );
    // A round in flight at either snapshot is counted by one side only: one round of slack.
    assert!(
        requests + 3 >= 3 * rounds && requests <= 3 * (rounds + 1),
        "{requests} requests for {rounds} rounds over 3 masters (one per master per round expected)"
    );
    for i in 0..3 {
        let calls = |text: &str, cmd: &str| commandstat_calls(text, cmd).unwrap_or(0);
        let loads = calls(&after[i], "script|load") - calls(&before[i], "script|load");
        let evals = calls(&after[i], "evalsha") - calls(&before[i], "evalsha");
        eprintln!("node {i}: {loads} pipelines (SCRIPT LOAD), {evals} script calls");
        assert!(
            loads + 1 >= rounds && loads <= rounds + 1,
            "node {i}: {loads} pipelines (SCRIPT LOAD) for {rounds} rounds"
        );
        if per_slot {
            let held = slots[&i].len() as u64;
            assert!(
                evals + held >= rounds * held && evals <= (rounds + 1) * held,
                "node {i}: {evals} script calls for {rounds} rounds × {held} slots"
            );
        }
    }
    assert_eq!(leases.iter().filter(|l| l.is_lost()).count(), 0);
    let released: Vec<_> = futures::stream::iter(leases)
        .map(|l| l.release())
        .buffer_unordered(128)
        .collect()
        .await;
    assert!(released.iter().all(Result::is_ok), "every release succeeds");
}

/// A waiter whose subscription sits on another master than the lock's slot owner is woken by
/// the release (a cluster forwards `PUBLISH` to every node), not by its fallback timer (a
/// queue entry refresh, up to 1 s later): over 7 handoffs the median wake-up latency stays far
/// below what the timer gives (uniform over 0–1 s: a median under 150 ms by chance about 1 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_subscribed_on_another_master_is_woken() {
    let Some(cluster) = cluster() else { return };
    let ns = "wake";
    let ttl = Duration::from_secs(20);
    let name = LockName::new("across").expect("a valid name");
    let k = key(ns, "across");
    let owner = owner_of(&cluster, &k).await;
    let other = (owner + 1) % 3;
    let all = cluster.endpoints();
    let holder = locker(all.clone(), ns, ttl).await;
    // The waiter's first seed (where its subscription goes) is not the owner.
    let mut seeds = vec![all[other].clone()];
    seeds.extend((0..3).filter(|&i| i != other).map(|i| all[i].clone()));
    let waiter = locker(seeds, ns, ttl).await;
    let pattern = format!("{ns}/dlock:notify:*");
    let mut latencies = Vec::new();
    for round in 0..7 {
        let lease = hold(&holder, &name, "holder").await;
        let w = timed_acquire(&waiter, &name);
        // Queued, and subscribed on `other` only.
        let began = Instant::now();
        loop {
            let queued: i64 =
                node_cmd(&cluster, owner, redis::cmd("LLEN").arg(format!("{k}:q"))).await;
            let on_other: Vec<String> = node_cmd(
                &cluster,
                other,
                redis::cmd("PUBSUB").arg("CHANNELS").arg(&pattern),
            )
            .await;
            if queued == 1 && !on_other.is_empty() {
                break;
            }
            assert!(
                began.elapsed() < Duration::from_secs(5),
                "round {round}: the waiter never queued ({queued}) and subscribed on node {other}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let on_owner: Vec<String> = node_cmd(
            &cluster,
            owner,
            redis::cmd("PUBSUB").arg("CHANNELS").arg(&pattern),
        )
        .await;
        assert!(on_owner.is_empty(), "subscribed on the owner: {on_owner:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released = Instant::now();
        lease.release().await.expect("release");
        let (got, at) = w.await.expect("waiter task");
        let got = got.expect("the waiter must be granted");
        latencies.push(at - released);
        got.release().await.expect("release");
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    assert!(
        median < Duration::from_millis(150),
        "median wake-up {median:?} after the release ({latencies:?}): timers, not notifications"
    );
}

/// Moves the slot of `key` from node `from` to node `to` with its keys (the resharding steps
/// `redis-cli --cluster reshard` takes).
async fn move_slot(cluster: &Cluster, key: &str, from: usize, to: usize) {
    let slot: i64 = node_cmd(cluster, from, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await;
    let from_id: String = node_cmd(cluster, from, &redis::cmd("CLUSTER").arg("MYID").clone()).await;
    let to_id: String = node_cmd(cluster, to, &redis::cmd("CLUSTER").arg("MYID").clone()).await;
    let setslot = |state: &str, id: &str| {
        let mut c = redis::cmd("CLUSTER");
        c.arg("SETSLOT").arg(slot).arg(state).arg(id);
        c
    };
    let _: () = node_cmd(cluster, to, &setslot("IMPORTING", &from_id)).await;
    let _: () = node_cmd(cluster, from, &setslot("MIGRATING", &to_id)).await;
    let keys: Vec<String> = node_cmd(
        cluster,
        from,
        redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(1000),
    )
    .await;
    if !keys.is_empty() {
        let dest = cluster.node(to).addr();
        let mut m = redis::cmd("MIGRATE");
        m.arg(dest.ip().to_string())
            .arg(dest.port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys);
        let _: String = node_cmd(cluster, from, &m).await;
    }
    for i in 0..3 {
        let _: () = node_cmd(cluster, i, &setslot("NODE", &to_id)).await;
    }
}

/// A held lease's slot moves to another master: renewal follows it (the lease stays held past
/// several TTLs), another locker finds it held there, a waiter queues there and is handed the
/// lock by the release, and the next grants' tokens are larger (the fence counter moved with
/// the slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_slot_is_followed() {
    let Some(cluster) = cluster() else { return };
    let ns = "moving";
    let ttl = Duration::from_millis(1500);
    let name = LockName::new("resharded").expect("a valid name");
    let k = key(ns, "resharded");
    let a = locker(cluster.endpoints(), ns, ttl).await;
    let b = locker(cluster.endpoints(), ns, ttl).await;
    let lease = hold(&a, &name, "acquire").await;
    let first = lease.token();
    let from = owner_of(&cluster, &k).await;
    let to = (from + 1) % 3;
    move_slot(&cluster, &k, from, to).await;
    assert_eq!(owner_of(&cluster, &k).await, to, "the slot moved");
    tokio::time::sleep(ttl * 3).await;
    assert!(!lease.is_lost(), "the lease was lost after its slot moved");
    let pttl: i64 = node_cmd(&cluster, to, redis::cmd("PTTL").arg(&k)).await;
    assert!(
        pttl > 0,
        "the lock key lives on the new master with a TTL ({pttl})"
    );
    assert!(
        b.try_acquire(&name).await.expect("try").is_none(),
        "another locker must find it held on the new master"
    );
    // A waiter queued on the new master is handed the lock by the release there.
    let c = locker(cluster.endpoints(), ns, Duration::from_secs(20)).await;
    let waiter = timed_acquire(&c, &name);
    let began = Instant::now();
    loop {
        let queued: i64 = node_cmd(&cluster, to, redis::cmd("LLEN").arg(format!("{k}:q"))).await;
        if queued == 1 {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the waiter never queued on the new master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let released = Instant::now();
    lease.release().await.expect("release on the new master");
    let (got, at) = waiter.await.expect("waiter task");
    let next = got.expect("the queued waiter is granted after the move");
    assert!(
        at - released < Duration::from_secs(2),
        "granted {:?} after the release",
        at - released
    );
    assert!(next.token() > first, "{} after {}", next.token(), first);
    let second = next.token();
    next.release().await.expect("release");
    let again = hold(&b, &name, "acquire after the move").await;
    assert!(again.token() > second, "{} after {second}", again.token());
    again.release().await.expect("release");
}

/// Acquires one lease on each of the 3 masters (names `<prefix><i>`, the first found for each
/// master), keyed by the master's node index.
async fn one_lease_per_master(
    cluster: &Cluster,
    l: &RedisLocker,
    ns: &str,
    prefix: &str,
) -> BTreeMap<usize, (String, Lease)> {
    let mut by_node = BTreeMap::new();
    for i in 0..100 {
        let name = format!("{prefix}{i}");
        let owner = owner_of(cluster, &key(ns, &name)).await;
        if by_node.contains_key(&owner) {
            continue;
        }
        let lease = hold(l, &LockName::new(&name).expect("a valid name"), "acquire").await;
        by_node.insert(owner, (name, lease));
        if by_node.len() == 3 {
            break;
        }
    }
    assert_eq!(by_node.len(), 3, "no name found for every master");
    by_node
}

/// A master is killed under held leases: its leases are lost no later than their deadlines;
/// leases on the other masters stay held and their names keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_loses_only_its_leases_by_their_deadlines() {
    let Some(cluster) = cluster() else { return };
    let ns = "killed";
    let ttl = Duration::from_millis(2000);
    let l = locker(cluster.endpoints(), ns, ttl).await;
    let mut by_node = one_lease_per_master(&cluster, &l, ns, "k").await;
    let victim = 1;
    cluster.node(victim).kill().expect("kill");
    let (_, lost_lease) = by_node.remove(&victim).expect("a lease on the victim");
    let deadline = lost_lease.deadline();
    let reason = tokio::time::timeout(ttl * 2, lost_lease.lost())
        .await
        .expect("the lease on the killed master must be lost");
    let at = Instant::now();
    assert!(
        at <= deadline + Duration::from_millis(100),
        "lost {:?} after its deadline ({reason:?})",
        at - deadline
    );
    tokio::time::sleep(ttl * 2).await;
    for (node, (name, lease)) in &by_node {
        assert!(
            !lease.is_lost(),
            "the lease {name} on live master {node} was lost"
        );
    }
    // Names on the live masters keep working for a new locker.
    let again = locker(cluster.endpoints(), ns, ttl).await;
    let mut granted = 0;
    for i in 0..100 {
        let name = format!("fresh{i}");
        if owner_of(&cluster, &key(ns, &name)).await == victim {
            continue;
        }
        let lease = hold(
            &again,
            &LockName::new(&name).expect("a valid name"),
            "a name on a live master",
        )
        .await;
        lease.release().await.expect("release");
        granted += 1;
        if granted == 3 {
            break;
        }
    }
    for (_, (_, lease)) in by_node {
        lease.release().await.expect("release");
    }
}

/// A master is frozen (SIGSTOP) under held leases: the leases on the other masters stay held
/// (the frozen master's renewal request must not hold back theirs past their deadlines), and
/// the frozen master's leases are lost no later than their deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_does_not_cost_the_other_masters_leases() {
    let Some(cluster) = cluster() else { return };
    let ns = "frozen";
    let ttl = Duration::from_millis(1500);
    let l = locker(cluster.endpoints(), ns, ttl).await;
    let mut by_node = one_lease_per_master(&cluster, &l, ns, "f").await;
    let victim = 2;
    cluster.node(victim).pause().expect("pause");
    let (_, frozen) = by_node.remove(&victim).expect("a lease on the victim");
    let deadline = frozen.deadline();
    let lost = tokio::time::timeout(ttl * 2, frozen.lost()).await;
    let at = Instant::now();
    tokio::time::sleep(ttl * 2).await;
    let survivors: Vec<(usize, bool)> = by_node
        .iter()
        .map(|(node, (_, lease))| (*node, lease.is_lost()))
        .collect();
    cluster.node(victim).resume().expect("resume");
    let reason = lost.expect("the lease on the frozen master must be lost");
    assert!(
        at <= deadline + Duration::from_millis(100),
        "lost {:?} after its deadline ({reason:?})",
        at - deadline
    );
    for (node, was_lost) in survivors {
        assert!(
            !was_lost,
            "the lease on live master {node} was lost while node {victim} was frozen"
        );
    }
    for (_, (_, lease)) in by_node {
        let _ = lease.release().await;
    }
}

/// A spin-mode locker that reaches every master through its own proxy (30 s TTL), connected
/// to every master.
async fn proxied_locker(
    cluster: &Cluster,
    ns: &str,
) -> (Vec<dlock_conformance::faults::Proxy>, RedisLocker) {
    use dlock_conformance::faults::Proxy;
    let proxies: Vec<Proxy> = cluster
        .addrs()
        .into_iter()
        .map(|a| Proxy::start(a).expect("proxy"))
        .collect();
    let mut b = RedisLocker::builder()
        .cluster(proxies.iter().map(|p| format!("redis://{}", p.addr())))
        .ttl(Duration::from_secs(30))
        .request_timeout(Duration::from_secs(5))
        .namespace(ns)
        .fair(false);
    for (node, proxy) in cluster.addrs().iter().zip(&proxies) {
        b = b.cluster_address_map(node.to_string(), proxy.addr().to_string());
    }
    let l = b.build().await.expect("a cluster locker");
    for i in 0..10 {
        let warm = l
            .try_acquire(&LockName::new(format!("warm{i}")).expect("valid name"))
            .await
            .expect("cluster up")
            .expect("free");
        warm.release().await.expect("release");
    }
    (proxies, l)
}

/// Loses the reply of the request in flight through `proxy` once `arrived` says it ran: the
/// reply is held, then the connection reset, and the client connects again.
async fn lose_reply<F, Fut>(proxy: &dlock_conformance::faults::Proxy, mut arrived: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    use dlock_conformance::faults::{Direction, Mode};
    let began = Instant::now();
    while !arrived().await {
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the request never arrived"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.set_direction(Direction::Downstream, Mode::Reset);
    tokio::time::sleep(Duration::from_millis(5)).await;
    proxy.set_direction(Direction::Downstream, Mode::Pass);
}

/// The cluster connection sends a request again after its connection dropped
/// (`RetryMethod::Reconnect`), also a script that had already run. Here the acquire's reply is
/// lost (held by the proxy, then the connection reset): the re-sent acquire meets the key the
/// first one set with the same owner value. That is our grant: either the acquire returns it,
/// or nothing of it is left; a key carrying our owner value that nobody holds would keep the
/// lock for a whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_acquire_that_already_ran_is_our_grant() {
    use dlock_conformance::faults::{Direction, Mode};
    let Some(cluster) = cluster() else { return };
    let ns = "dlock-test/cluster/resent";
    let (proxies, l) = proxied_locker(&cluster, ns).await;
    let name = LockName::new("job").expect("valid name");
    let k = key(ns, "job");
    let owner = owner_of(&cluster, &k).await;
    proxies[owner].set_direction(Direction::Downstream, Mode::Blackhole);
    let (l2, n2) = (l.clone(), name.clone());
    let attempt = tokio::spawn(async move { l2.try_acquire(&n2).await });
    // Once the first send ran (the key is set), its reply is lost; the client sends again.
    lose_reply(&proxies[owner], || async {
        node_cmd::<Option<String>>(&cluster, owner, redis::cmd("GET").arg(&k))
            .await
            .is_some()
    })
    .await;
    let got = attempt.await.expect("join");
    println!("the acquire whose reply was lost returned {got:?}");
    match got {
        Ok(Some(lease)) => lease.release().await.expect("release"),
        other => {
            // A failed attempt gives its key back in the background; a refused one ("held")
            // has nothing to give back.
            let returned = Instant::now();
            loop {
                let left: Option<String> =
                    node_cmd(&cluster, owner, redis::cmd("GET").arg(&k)).await;
                if left.is_none() {
                    break;
                }
                assert!(
                    returned.elapsed() < Duration::from_secs(5),
                    "the acquire returned {other:?} and left the lock held by its own owner value {left:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// As [`a_resent_acquire_that_already_ran_is_our_grant`] for a proclamation: the re-sent
/// announcement that already ran is one announcement, not two (observers would see the
/// value twice, as two changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_proclamation_is_announced_once() {
    use dlock_conformance::faults::{Direction, Mode};
    use dlock_core::Election;
    let Some(cluster) = cluster() else { return };
    let ns = "dlock-test/cluster/resent-proclaim";
    let (proxies, l) = proxied_locker(&cluster, ns).await;
    let name = LockName::new("lead").expect("valid name");
    let leading = l
        .campaign(&name, b"v1", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .expect("campaign");
    let k = key(ns, "lead");
    let owner = owner_of(&cluster, &k).await;
    let leader = format!("{k}:leader");
    let changes = format!("{k}:changes");
    let count = || async {
        let n: Option<u64> =
            node_cmd(&cluster, owner, redis::cmd("HGET").arg(&leader).arg("n")).await;
        let len: u64 = node_cmd(&cluster, owner, redis::cmd("XLEN").arg(&changes)).await;
        (n.unwrap_or(0), len)
    };
    let (n0, len0) = count().await;
    proxies[owner].set_direction(Direction::Downstream, Mode::Blackhole);
    let (proclaimed, ()) = tokio::join!(
        leading.proclaim(b"v2"),
        lose_reply(&proxies[owner], || async { count().await.0 > n0 })
    );
    proclaimed.expect("the proclamation (sent again after its reply was lost) succeeds");
    let (n1, len1) = count().await;
    assert_eq!(
        (n1 - n0, len1 - len0),
        (1, 1),
        "one proclamation became {} announcements and {} stream entries",
        n1 - n0,
        len1 - len0
    );
    leading.resign().await.expect("resign");
}
