//! Replies from every member slower than the per-member attempt cap, but well inside a renewal
//! round: the keep-alive must still renew. A try that is merely slow is kept in flight while
//! the next member is tried, never abandoned for a fresh stream that is just as slow.

use crate::support;

use std::time::Duration;

use dlock_conformance::faults::{Direction, Mode, Proxy};
use dlock_core::{AcquireOptions, Locker};
use tokio::time::Instant;

/// The locker's TTL; its attempt cap is min(request timeout / 3, TTL / 6) = 333 ms.
const TTL: Duration = Duration::from_secs(2);
/// Above the attempt cap, below a third of the TTL.
const REPLY_DELAY: Duration = Duration::from_millis(450);

#[test]
fn replies_slower_than_the_attempt_cap_still_renew() {
    let etcd = support::single();
    support::runtime().block_on(async {
        // Three "members": three proxies in front of the one server, all delayed alike.
        let upstream = etcd.endpoints()[0]
            .trim_start_matches("http://")
            .parse()
            .expect("endpoint address");
        let proxies: Vec<Proxy> = (0..3)
            .map(|_| Proxy::start(upstream).expect("proxy"))
            .collect();
        let endpoints = proxies
            .iter()
            .map(|p| format!("http://{}", p.addr()))
            .collect();
        let ns = support::namespace("slow-replies");
        let locker = support::builder(endpoints, &ns)
            .ttl(TTL)
            .build()
            .await
            .expect("build the locker");
        let lease = locker
            .acquire(
                &support::name("slow"),
                AcquireOptions::wait(Duration::from_secs(5)),
            )
            .await
            .expect("acquire");
        let before = locker.stats().renewals;
        for p in &proxies {
            p.set_direction(Direction::Downstream, Mode::Delay(REPLY_DELAY));
        }
        let began = Instant::now();
        let mut lost = None;
        while began.elapsed() < TTL * 4 {
            if let Err(e) = lease.check() {
                lost = Some(format!("{:?} into the delay: {e}", began.elapsed()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let rounds = locker.stats().renewals - before;
        for p in &proxies {
            p.set(Mode::Pass);
        }
        assert!(
            lost.is_none(),
            "lease lost under a {REPLY_DELAY:?} reply delay after {rounds} renewal rounds: {}; {:?}",
            lost.unwrap_or_default(),
            locker.stats()
        );
        // A round every TTL / 3: 12 in 4 × TTL; 6 leaves room for a loaded machine.
        assert!(rounds >= 6, "only {rounds} renewal rounds in 4 × TTL");
        lease.release().await.expect("release");
    });
}
