//! A keep-alive reply that comes later than three quarters of the validity left, but before
//! the lease counts as lost, still renews: the round is not given up for a retry, which would
//! open a fresh stream and wait just as long with only a quarter of the validity left.

use crate::support;

use std::time::Duration;

use dlock_conformance::faults::{Direction, Mode, Proxy};
use dlock_core::{AcquireOptions, Locker};
use tokio::time::Instant;

/// The locker's TTL. A regular round starts with R = TTL − 2 × drift − 200 ms − TTL/3 =
/// 4.97 s of validity left; three quarters of it are 3.73 s.
const TTL: Duration = Duration::from_secs(8);
/// Between those three quarters and R, 0.57 s before R.
const REPLY_DELAY: Duration = Duration::from_millis(4400);
/// When replies pass again, counted from the round's request: after a retry of a round given
/// up at three quarters of R (3.75 s), 0.45 s before the next round can start (it starts once
/// the delayed reply is in).
const DELAY_ENDS: Duration = Duration::from_millis(3950);

#[test]
fn a_reply_later_than_three_quarters_of_the_validity_still_renews() {
    let etcd = support::single();
    support::runtime().block_on(async {
        let upstream = etcd.endpoints()[0]
            .trim_start_matches("http://")
            .parse()
            .expect("endpoint address");
        let proxy = Proxy::start(upstream).expect("proxy");
        let ns = support::namespace("late-round");
        let locker = support::builder(vec![format!("http://{}", proxy.addr())], &ns)
            .ttl(TTL)
            .request_timeout(Duration::from_secs(6))
            .build()
            .await
            .expect("build the locker");
        let lease = locker
            .acquire(
                &support::name("late"),
                AcquireOptions::wait(Duration::from_secs(5)),
            )
            .await
            .expect("acquire");
        // After one round that renewed the lease, the next regular round renews it with the
        // session: delay the replies to that round only.
        let granted = lease.deadline();
        while lease.deadline() == granted {
            lease.check().expect("held before any delay");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let renewed = lease.deadline();
        proxy.set_direction(Direction::Downstream, Mode::Delay(REPLY_DELAY));
        let delayed_at = Instant::now();
        let sent = loop {
            if let Some(&t) = proxy.upstream_log().last()
                && t > delayed_at
            {
                break t;
            }
            assert!(
                delayed_at.elapsed() < TTL,
                "no renewal round was sent within a TTL"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        tokio::time::sleep_until(sent + DELAY_ENDS).await;
        proxy.set_direction(Direction::Downstream, Mode::Pass);
        // Held past the deadline the last undelayed round gave: the delayed round renewed it.
        let past = renewed + Duration::from_millis(100);
        while Instant::now() < past {
            if let Err(e) = lease.check() {
                panic!(
                    "lease lost {:?} after a round whose replies were delayed {REPLY_DELAY:?}: {e}; {:?}",
                    sent.elapsed(),
                    locker.stats()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            lease.deadline() > renewed,
            "the lease outlived its deadline without a renewal"
        );
        lease.release().await.expect("release");
    });
}
