//! What the mutex's fair queue and the read-write lock's and semaphore's queue share on the
//! client: how long an entry lives and when it is refreshed, joining the queue, and sleeping
//! until notified or until the fallback timer.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Notify;

use super::pending::Pending;
use crate::locker::Inner;
use crate::wait::Wait;

/// The longest a waiter sleeps without refreshing its queue entry (its fallback timer): the
/// TTL, at most [`MAX_REFRESH`].
pub(super) fn refresh_period(ttl: Duration) -> Duration {
    ttl.min(MAX_REFRESH)
}

/// The refresh period bound: a few seconds whatever the TTL, so a crashed waiter (whose entry
/// lives three refresh periods) or a crashed head (whose reservation lasts no longer than its
/// entry) stalls the queue for at most [`entry_lifetime`] + one refresh period, about 4 s,
/// not one or more TTLs.
const MAX_REFRESH: Duration = Duration::from_secs(1);

/// How long a waiter's queue entry lives without a refresh: three refresh periods, so it only
/// expires when the waiter is gone (or its link to the server is).
pub(super) fn entry_lifetime(ttl: Duration) -> Duration {
    refresh_period(ttl).saturating_mul(3)
}

/// Gives the request its queue entry (`<locker id>.<sequence>`, then `.<mode>` for a family
/// request) and registers it for notifications, BEFORE the first attempt that can enqueue it:
/// no notification can be missed.
pub(super) fn join_queue(inner: &Inner, p: &mut Pending, mode: Option<&str>) -> Arc<Notify> {
    let seq = inner.seq.fetch_add(1, Ordering::Relaxed);
    let entry = match mode {
        None => format!("{}.{seq}", inner.locker_id),
        Some(mode) => format!("{}.{seq}.{mode}", inner.locker_id),
    };
    let notify = inner.notifier.register(&entry);
    p.entry = Some(entry);
    notify
}

async fn notified(n: Option<&Arc<Notify>>) {
    match n {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `notify` fires (a queued request) or for `sleep`, at most until the wait's
/// end, and counts the wake-up. `false`: the wait is over.
pub(super) async fn doze(
    inner: &Inner,
    wait: &Wait,
    notify: Option<&Arc<Notify>>,
    sleep: Duration,
) -> bool {
    let wake_at = wait.wake_at(sleep);
    tokio::select! {
        () = notified(notify) => {}
        () = tokio::time::sleep_until(wake_at) => {
            if wait.is_over() {
                return false;
            }
            // The waiter's own timer (the queue-entry refresh, the fallback for a lost
            // notification or an expired holder), not a release.
            inner.counters.add_timer_wakeups(1);
        }
    }
    inner.counters.add_wakeups(1);
    true
}
