//! Counters a locker keeps, so tests and users can see herd behaviour and renewal health.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::CommonOptions;
use crate::metrics::{self, Labels};

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

/// The live counters behind [`Stats`]; backends increment them. They also carry the labels of
/// the locker's metrics (`metrics` feature): build them with [`Counters::labelled`] so that
/// the metrics name the backend and the tier; `Counters::default()` labels them
/// `backend="unknown"`.
#[derive(Debug, Default)]
pub struct Counters {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    labels: Labels,
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

impl Counters {
    /// Counters whose metrics are labelled `backend` (the backend's short name, e.g. `"redis"`)
    /// and with the `metrics_tier` and `metrics_lock_names` options of `common`.
    pub fn labelled(backend: &'static str, common: &CommonOptions) -> Self {
        Counters {
            labels: Labels::new(backend, common),
            ..Counters::default()
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn labels(&self) -> &Labels {
        &self.labels
    }

    /// Adds `n` to the `renewal_failures` counter (and to `dlock_renewal_failed_rounds_total`).
    pub fn add_renewal_failures(&self, n: u64) {
        self.renewal_failures.fetch_add(n, Ordering::Relaxed);
        metrics::round_failed(self, n);
    }
}

macro_rules! counter {
    ($($field:ident => $add:ident),* ; $($other:ident),* $(,)?) => {
        impl Counters {
            $(
                #[doc = concat!("Adds `n` to the `", stringify!($field), "` counter.")]
                pub fn $add(&self, n: u64) {
                    self.$field.fetch_add(n, Ordering::Relaxed);
                }
            )*

            /// Reads every counter.
            pub fn snapshot(&self) -> Stats {
                Stats {
                    $($field: self.$field.load(Ordering::Relaxed),)*
                    $($other: self.$other.load(Ordering::Relaxed),)*
                }
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
    losses => add_losses,
    requests => add_requests,
    driver_restarts => add_driver_restarts;
    // Added by hand above: it also emits a metric.
    renewal_failures,
}
