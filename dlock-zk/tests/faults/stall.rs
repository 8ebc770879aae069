//! A stall of the whole process (the client library's pings held back too) must not let a
//! renewal sent after it count as if the session had been heard all along: the leader may
//! have last heard of the session when the stall began.

use std::time::Duration;

use crate::support::{Zk, eventually};
use dlock_core::{AcquireOptions, Locker};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(4);
const STALL: Duration = Duration::from_millis(1500);

/// A holder stalls for 1.5 s right after a renewal (a current-thread runtime blocked by a
/// sleep: the driver, the client library's pings and everything else stand still). The
/// renewal after the stall proves the session alive, but the leader's last touch may date
/// from before the stall; so its deadline may reach no further past the stall's start than a
/// grant's deadline reaches past its request. Before the stall clock, it reached the whole
/// stall further (red: ~1.5 s past the bound).
#[tokio::test(flavor = "current_thread")]
async fn a_renewal_after_a_stall_counts_from_before_the_stall() {
    let Some(zk) = Zk::new("stall") else {
        return;
    };
    let (l, name, _, _) = zk.on_lock("stalled", TTL).await;
    let before = Instant::now();
    let lease = l.acquire(&name, AcquireOptions::forever()).await.unwrap();
    // How far a proof reaches past its send time, at most (the grant was sent after `before`).
    let span = lease.deadline() - before;

    let renewals = l.stats().renewals;
    assert!(
        eventually(TTL, || async { l.stats().renewals > renewals }).await,
        "no renewal within a TTL"
    );
    let stall_start = Instant::now();
    std::thread::sleep(STALL);
    let renewals = l.stats().renewals;
    assert!(
        eventually(TTL, || async { l.stats().renewals > renewals }).await,
        "no renewal after the stall"
    );
    assert!(
        !lease.is_lost(),
        "a stall shorter than the margin loses nothing"
    );
    // The stall clock beats every 20 ms; a stall is counted to within one beat.
    let bound = stall_start + span + Duration::from_millis(50);
    assert!(
        lease.deadline() <= bound,
        "the deadline after a {STALL:?} stall is {:?} past the bound (the stall's start + the proof's span)",
        lease.deadline() - bound
    );
    lease.release().await.unwrap();
}
