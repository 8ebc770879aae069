//! A hung member (SIGSTOP: its TCP connections stay open, nothing answers) must not cost a
//! lease while a quorum is healthy: each request attempt is capped and the next attempt goes to
//! another member.

mod support;

use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, LockName, Locker};

/// Resumes the paused member even if the test fails.
struct Resume<'a>(&'a Cluster, usize);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        let _ = self.0.node(self.1).resume();
    }
}

#[test]
fn hung_member_costs_no_lease() {
    // 5 rounds × 10 lockers = 50 trials, about 4 s per round.
    const ROUNDS: usize = 5;
    const LOCKERS: usize = 10;
    let cluster = Cluster::start(ServerKind::Etcd, 3).expect("a 3-member etcd cluster");
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
                let name = LockName::new(format!("l{i}")).expect("valid");
                let lease = locker
                    .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
                    .await
                    .expect("acquire");
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
