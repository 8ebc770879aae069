//! Counters a locker keeps, so tests and users can see herd behaviour and renewal health.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a locker's counters. All counts are since the locker was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Locks granted.
    pub grants: u64,
    /// Acquires that had to wait (were not granted on the first attempt).
    pub waits: u64,
    /// Times a waiter was woken to re-check (watch events, notifications, timer fallbacks).
    pub wakeups: u64,
    /// Of [`Stats::wakeups`], those on the waiter's own timer (a fallback, a queue-entry
    /// refresh), not caused by a release or any other change at the server: they come with
    /// time spent waiting, not with releases. A backend that cannot tell counts none here.
    pub timer_wakeups: u64,
    /// Renewal rounds that succeeded (one round may renew many leases).
    pub renewals: u64,
    /// Renewal rounds that failed: the backend call erred, timed out or panicked, or left some
    /// lease undecided ([`Renewal::Retry`](crate::Renewal::Retry)).
    pub renewal_failures: u64,
    /// Leases lost (not counting releases), whatever noticed the loss: a renewal answer, the
    /// lease's own deadline timer, a check. A loss is counted before `lost()` resolves.
    pub losses: u64,
    /// Requests sent to the server(s).
    pub requests: u64,
    /// Times the renewal driver's task was found dead (panicked, or its runtime shut down) and
    /// restarted by a new registration.
    pub driver_restarts: u64,
}

/// The live counters behind [`Stats`]; backends increment them.
#[derive(Debug, Default)]
pub struct Counters {
    grants: AtomicU64,
    waits: AtomicU64,
    wakeups: AtomicU64,
    timer_wakeups: AtomicU64,
    renewals: AtomicU64,
    renewal_failures: AtomicU64,
    losses: AtomicU64,
    requests: AtomicU64,
    driver_restarts: AtomicU64,
}

macro_rules! counter {
    ($($field:ident => $add:ident),* $(,)?) => {
        impl Counters {
            $(
                #[doc = concat!("Adds `n` to the `", stringify!($field), "` counter.")]
                pub fn $add(&self, n: u64) {
                    self.$field.fetch_add(n, Ordering::Relaxed);
                }
            )*

            /// Reads every counter.
            pub fn snapshot(&self) -> Stats {
                Stats { $($field: self.$field.load(Ordering::Relaxed)),* }
            }
        }
    };
}

counter! {
    grants => add_grants,
    waits => add_waits,
    wakeups => add_wakeups,
    timer_wakeups => add_timer_wakeups,
    renewals => add_renewals,
    renewal_failures => add_renewal_failures,
    losses => add_losses,
    requests => add_requests,
    driver_restarts => add_driver_restarts,
}
