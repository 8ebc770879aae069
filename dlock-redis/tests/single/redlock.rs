//! Redlock under node failures, on real servers: the quorum error names every cause, nodes
//! restarted empty or paused, per-lease renewal verdicts, the steady-state request count, and
//! tokens when a lagging node and an emptied one form the quorum.

use std::time::{Duration, Instant};

use dlock_conformance::servers::Cluster;
use dlock_core::{AcquireOptions, Error, LockName, Locker};
use dlock_redis::RedlockLocker;

use super::{conn, granted, name, private, runtime};

async fn locker(cluster: &Cluster, ns: &str) -> RedlockLocker {
    RedlockLocker::builder()
        .nodes(cluster.endpoints())
        .ttl(Duration::from_secs(1))
        .namespace(ns)
        .build()
        .await
        .expect("a valid locker")
}

/// With 3 of 5 nodes down, acquire fails within its wait with `QuorumNotReached` naming every
/// down node's cause (that nothing is left on the live nodes is `majority_nodes_down`'s).
#[test]
fn majority_down_fails_within_the_wait_naming_every_cause() {
    let cluster = private(5);
    for i in 0..3 {
        cluster.node(i).kill().expect("kill a node");
    }
    runtime().block_on(async {
        let ns = "dlock-test/redlock-faults/majority-down";
        let l = locker(&cluster, ns).await;
        let name = name("job");
        let wait = Duration::from_secs(1);
        let began = Instant::now();
        let got = l.acquire(&name, AcquireOptions::wait(wait)).await;
        let took = began.elapsed();
        match got {
            Err(Error::QuorumNotReached {
                needed,
                granted,
                causes,
            }) => {
                assert_eq!(needed, 3);
                assert!(granted <= 2, "granted {granted}");
                let down: Vec<_> = cluster.endpoints()[..3]
                    .iter()
                    .map(|e| e.trim_start_matches("redis://").to_string())
                    .collect();
                for node in &down {
                    assert!(
                        causes.iter().any(|c| &c.node == node),
                        "no cause for {node}: {causes:?}"
                    );
                }
            }
            other => panic!("expected QuorumNotReached, got {other:?}"),
        }
        assert!(
            took <= wait + Duration::from_millis(500),
            "took {took:?} for a wait of {wait:?}"
        );
        assert!(matches!(
            l.try_acquire(&name).await,
            Err(Error::QuorumNotReached { .. })
        ));
    });
}

/// A node restarted empty (no persistence) while a majority still holds the key cannot let a
/// second holder in, and the fencing token still increases although two nodes forgot their
/// counters.
#[test]
fn restarted_empty_nodes_do_not_let_two_holders_in() {
    let cluster = private(5);
    runtime().block_on(async {
        let ns = "dlock-test/redlock-faults/restart";
        let a = locker(&cluster, ns).await;
        let b = locker(&cluster, ns).await;
        let name = name("job");
        // Raise the counters on every node first, so a forgotten counter is visibly lower.
        let mut last = 0;
        for _ in 0..3 {
            let l = granted(&a, &name, Duration::from_secs(2), "acquire").await;
            assert!(l.token().get() > last);
            last = l.token().get();
            l.release().await.expect("release");
        }
        let held = granted(&a, &name, Duration::from_secs(2), "acquire").await;
        let held_token = held.token().get();
        for i in [0, 1] {
            tokio::task::block_in_place(|| cluster.node(i).restart()).expect("restart a node");
        }
        // Two empty nodes grant B, three still refuse: no quorum, however often B tries.
        for _ in 0..5 {
            assert!(
                b.try_acquire(&name).await.expect("try_acquire").is_none(),
                "B got the lock while A holds a majority"
            );
        }
        let timed = b
            .acquire(&name, AcquireOptions::wait(Duration::from_millis(300)))
            .await;
        assert!(matches!(timed, Err(Error::Timeout { .. })), "{timed:?}");
        // A's lease survives renewals (a majority still confirms it) for several TTLs.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        held.check().expect("A still holds the lock");
        held.release().await.expect("release");
        let next = granted(
            &b,
            &name,
            Duration::from_secs(2),
            "B acquires after A released",
        )
        .await;
        assert!(
            next.token().get() > held_token,
            "token {} after {held_token}",
            next.token()
        );
        next.release().await.expect("release");
    });
}

/// A node that hangs (SIGSTOP) costs at most the per-node timeout and no correctness.
#[test]
fn a_paused_minority_node_does_not_block_acquire() {
    let cluster = private(5);
    cluster.node(4).pause().expect("pause a node");
    runtime().block_on(async {
        let l = locker(&cluster, "dlock-test/redlock-faults/paused").await;
        let name = name("job");
        let began = Instant::now();
        let lease = granted(&l, &name, Duration::from_secs(2), "acquire with 4 of 5").await;
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "took {:?}",
            began.elapsed()
        );
        lease.release().await.expect("release");
    });
    cluster.node(4).resume().expect("resume");
}

/// Each lease gets its own renewal verdict: one lease that no round can decide (its key is
/// left on one node, another node is down) must not keep the other leases of the same locker
/// from being extended by the majority that still holds them.
#[test]
fn an_undecided_lease_does_not_fail_the_others() {
    let cluster = private(3);
    runtime().block_on(async {
        let ns = "dlock-test/redlock-faults/per-lease";
        let l = locker(&cluster, ns).await;
        let wait = AcquireOptions::wait(Duration::from_secs(2));
        let kept = l.acquire(&name("kept"), wait).await.expect("acquire");
        let open = l.acquire(&name("open"), wait).await.expect("acquire");
        // `open` stays held on node 0 only, refused by node 1, node 2 is down: never decided.
        on_node(
            &cluster.endpoints()[1],
            redis::cmd("DEL").arg(format!("{ns}/dlock:{{open}}")),
        )
        .await;
        tokio::task::block_in_place(|| cluster.node(2).kill()).expect("kill a node");
        // Several TTLs: `kept` is extended by nodes 0 and 1 every round.
        tokio::time::sleep(Duration::from_secs(3)).await;
        kept.check().expect("a majority kept extending this lease");
        assert!(open.is_lost(), "a lease no majority extended is lost");
        kept.release().await.expect("release");
    });
}

/// While every node is up, the nodes' counters agree, so a grant costs one request per node
/// (no fence write-back round) and a release one per node.
#[test]
fn steady_state_grants_need_no_fence_write_back() {
    let cluster = private(3);
    runtime().block_on(async {
        let l = locker(&cluster, "dlock-test/redlock-faults/steady").await;
        let name = name("job");
        let before = l.stats().requests;
        let rounds = 20;
        let mut last = 0;
        for _ in 0..rounds {
            let lease = granted(&l, &name, Duration::from_secs(2), "acquire").await;
            assert!(lease.token().get() > last);
            last = lease.token().get();
            lease.release().await.expect("release");
        }
        let requests = l.stats().requests - before;
        assert_eq!(
            requests,
            rounds * 6,
            "{requests} requests for {rounds} grants and releases on 3 nodes"
        );
    });
}

/// A poll that every node refuses (another owner holds the key) wrote nothing, so it costs one
/// request per node and no unlock round; an attempt that some nodes granted without a quorum
/// still unlocks those nodes before it returns.
#[test]
fn a_refused_poll_costs_one_request_per_node_and_a_partial_grant_is_undone() {
    let cluster = private(3);
    runtime().block_on(async {
        let ns = "dlock-test/redlock-faults/refused";
        let holder = locker(&cluster, ns).await;
        let poller = locker(&cluster, ns).await;
        let name = name("job");
        let lease = granted(&holder, &name, Duration::from_secs(2), "acquire").await;
        let before = poller.stats().requests;
        let rounds = 10;
        for _ in 0..rounds {
            let r = poller
                .try_acquire(&name)
                .await
                .expect("a refusal, not an error");
            assert!(r.is_none(), "granted while another owner holds the lock");
        }
        let requests = poller.stats().requests - before;
        assert_eq!(
            requests,
            rounds * 3,
            "{requests} requests for {rounds} refused polls on 3 nodes"
        );
        lease.release().await.expect("release");
        // Nodes 1 and 2 hold another owner's key: node 0 grants alone, and must be undone.
        let key = format!("{ns}/dlock:{{job}}");
        let urls = cluster.endpoints();
        for url in &urls[1..] {
            on_node(url, redis::cmd("SET").arg(&key).arg("someone-else")).await;
        }
        let r = poller
            .try_acquire(&name)
            .await
            .expect("a refusal, not an error");
        assert!(r.is_none(), "granted by one node of three");
        let left: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn(&urls[0]).await)
            .await
            .expect("GET");
        assert_eq!(left, None, "the lone grant on node 0 was not undone");
    });
}

/// Runs one command on one node (the default user).
async fn on_node(url: &str, cmd: &redis::Cmd) {
    let _: redis::Value = cmd
        .query_async(&mut conn(url).await)
        .await
        .expect("command");
}

/// One grant and its release; the grant's token.
async fn grant_token(l: &RedlockLocker, name: &LockName) -> u64 {
    let lease = granted(l, name, Duration::from_secs(2), "acquire").await;
    let token = lease.token().get();
    lease.release().await.expect("release");
    token
}

/// A node that refused grants (another owner's key) lags behind the counters the granting
/// majority holds. When a node restarts empty (down for longer than the TTL, the documented
/// assumption) and the next quorum is that empty node and the lagging one, the token must
/// still be above every earlier token: every node below a grant's token is raised to it.
#[test]
fn tokens_keep_increasing_when_a_lagging_node_and_an_emptied_node_form_the_quorum() {
    let cluster = private(3);
    runtime().block_on(async {
        let ns = "dlock-test/redlock-faults/lagging";
        let l = locker(&cluster, ns).await;
        let name = name("job");
        let key = format!("{ns}/dlock:{{job}}");
        let urls = cluster.endpoints();
        let mut last = grant_token(&l, &name).await;
        // Node 2 refuses the next grants: another owner holds the key there (no TTL).
        on_node(&urls[2], redis::cmd("SET").arg(&key).arg("someone-else")).await;
        for _ in 0..3 {
            let token = grant_token(&l, &name).await;
            assert!(token > last, "token {token} after {last}");
            last = token;
        }
        on_node(&urls[2], redis::cmd("DEL").arg(&key)).await;
        // Node 0 loses everything and stays down for longer than the TTL.
        tokio::task::block_in_place(|| cluster.node(0).kill()).expect("kill node 0");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        tokio::task::block_in_place(|| cluster.node(0).restart()).expect("restart node 0");
        // Node 1 (which holds the latest counter) refuses now: the quorum is nodes 0 and 2.
        on_node(&urls[1], redis::cmd("SET").arg(&key).arg("someone-else")).await;
        let lease = granted(&l, &name, Duration::from_secs(5), "nodes 0 and 2 grant").await;
        let token = lease.token().get();
        lease.release().await.expect("release");
        assert!(
            token > last,
            "token {token} repeats or goes back after {last} (granted by the emptied node and the lagging one)"
        );
    });
}
