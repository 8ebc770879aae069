//! The server clamps the session timeout again on every reconnect: a member with a lower
//! `maxSessionTimeout` (e.g. during a rolling change of it) shortens the session when the
//! client reconnects there. The leases' deadlines must follow the shorter timeout.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{eventually, locker, namespace, partitionable};
use dlock_conformance::faults::{Mode, Proxy};
use dlock_core::{AcquireOptions, LockName, Locker};
use tokio::time::Instant;

/// What the locker asks for, and what the high member grants.
const TTL: Duration = Duration::from_secs(6);
/// The low member's `maxSessionTimeout`.
const LOW_MAX_MS: u64 = 1000;

/// A holds through the member that granted 6 s, then reconnects to a member whose maximum is
/// 1 s and is cut off right after. The leader expires the session about 1 s after A's last
/// touch and grants B: A's lease must be lost (or past its deadline) before B is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_to_a_member_with_a_lower_maximum_shortens_the_lease() {
    let low = 2;
    let Some(ens) = partitionable().await else {
        return;
    };
    // The harness gives every member the same settings: the low member gets its own maximum
    // as a later `zoo.cfg` line (which overrides the earlier one) and a restart.
    let cfg = ens.data_dir().unwrap().join(format!("zk{low}/zoo.cfg"));
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{text}maxSessionTimeout={LOW_MAX_MS}\n")).unwrap();
    tokio::task::block_in_place(|| ens.node(low).restart()).unwrap();
    let conf = ens.node(low).read_text(b"conf").unwrap_or_default();
    assert!(
        conf.contains(&format!("maxSessionTimeout={LOW_MAX_MS}")),
        "{conf}"
    );
    let high = 0;
    let p_high = Proxy::start(ens.addrs()[high]).unwrap();
    let p_low = Proxy::start(ens.addrs()[low]).unwrap();
    p_low.set(Mode::Reset);
    let ns = namespace("timeouts");
    let name = LockName::new("clamped").unwrap();
    let a = locker(&format!("{},{}", p_high.addr(), p_low.addr()), &ns, TTL).await;
    assert_eq!(
        a.negotiated_timeout(),
        TTL,
        "the high member grants what A asks"
    );
    let held = a.acquire(&name, AcquireOptions::forever()).await.unwrap();
    let lost_at = Arc::new(Mutex::new(None::<Instant>));
    let (lost, at) = (held.lost(), Arc::clone(&lost_at));
    tokio::spawn(async move {
        lost.await;
        *at.lock().unwrap() = Some(Instant::now());
    });

    // Move A to the low member, and let it renew there (or lose the lease), then cut it off.
    let renewals = a.stats().renewals;
    p_low.set(Mode::Pass);
    p_high.set(Mode::Reset);
    assert!(
        eventually(Duration::from_secs(10), || async {
            held.is_lost() || a.stats().renewals > renewals
        })
        .await,
        "A neither renewed through the low member nor lost its lease"
    );
    p_low.set(Mode::Blackhole);
    let cut_at = Instant::now();

    let b = locker(&ens.endpoints()[high], &ns, TTL).await;
    let granted = b
        .acquire(&name, AcquireOptions::wait(Duration::from_secs(20)))
        .await
        .expect("the leader expires A's session and grants B");
    let granted_at = Instant::now();
    let lost = *lost_at.lock().unwrap();
    let a_end = lost.map_or(held.deadline(), |l| l.min(held.deadline()));
    assert!(
        a_end <= granted_at,
        "A's lease runs until {:?} after the cut (lost: {:?}), but B was granted {:?} after it",
        a_end.saturating_duration_since(cut_at),
        lost.map(|l| l.saturating_duration_since(cut_at)),
        granted_at - cut_at
    );
    granted.release().await.unwrap();
}
