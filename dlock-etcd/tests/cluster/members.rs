//! A member hung (SIGSTOP: its TCP connections stay open, nothing answers) or killed must not
//! cost a lease while a quorum is healthy: each request attempt is capped and the next attempt
//! goes to another member. (What a killed leader may cost, and that nobody is granted a lock
//! its holder still believes held, is `minority_nodes_down` on the `etcd-cluster` row.)

use std::time::Duration;

use dlock_core::Locker;

use crate::support::{self, Resume};

#[test]
fn hung_member_costs_no_lease() {
    // 5 rounds × 10 lockers = 50 trials, about 4 s per round.
    const ROUNDS: usize = 5;
    const LOCKERS: usize = 10;
    let cluster = support::three_members();
    support::runtime().block_on(async {
        let mut trials = 0;
        let mut lost = Vec::new();
        for round in 0..ROUNDS {
            let leader = cluster
                .wait_leader(Duration::from_secs(10))
                .expect("leader");
            let victim = (leader + 1 + round % 2) % 3;
            let ns = support::namespace("hung-member");
            let mut leases = Vec::new();
            for i in 0..LOCKERS {
                // A fresh locker per trial: its connections and streams land anywhere.
                let locker = support::locker(&cluster, &ns).await;
                let lease = support::hold(&locker, &support::name(&format!("l{i}"))).await;
                leases.push((locker, lease));
            }
            cluster.node(victim).pause().expect("SIGSTOP a follower");
            let resume = Resume(&cluster, victim);
            // One and a half TTLs: every lease needs at least one renewal while it hangs.
            tokio::time::sleep(Duration::from_secs(3)).await;
            for (locker, lease) in &leases {
                trials += 1;
                if let Err(e) = lease.check() {
                    lost.push(format!(
                        "round {round}, member {victim} hung: {e}; {:?}",
                        locker.stats()
                    ));
                }
            }
            drop(resume);
            for (_, lease) in leases {
                let _ = lease.release().await;
            }
        }
        assert_eq!(trials, ROUNDS * LOCKERS);
        assert!(
            lost.is_empty(),
            "{} of {trials} leases lost:\n{}",
            lost.len(),
            lost.join("\n")
        );
    });
}

/// A follower killed while a lock is held: renewal goes on through the two live members, for
/// three TTLs, without a loss.
#[test]
fn follower_killed_while_held_keeps_the_lock() {
    let cluster = support::three_members();
    support::runtime().block_on(async {
        let holder = support::locker(&cluster, &support::namespace("follower-killed")).await;
        let lease = support::hold(&holder, &support::name("held")).await;
        let leader = cluster
            .wait_leader(Duration::from_secs(10))
            .expect("leader");
        cluster
            .node((leader + 1) % 3)
            .kill()
            .expect("kill a follower");
        tokio::time::sleep(holder.ttl() * 3).await;
        lease
            .check()
            .expect("the lease is held after a follower died");
        assert!(holder.stats().renewals >= 3, "{:?}", holder.stats());
        lease.release().await.expect("release");
    });
}
