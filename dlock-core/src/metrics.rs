//! The locker's metrics through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`): the labels every locker's [`Counters`](crate::Counters) carry, and the calls
//! the contract, the lease and the renewal driver make. Without the feature those calls are
//! empty inline functions (`off.rs`), so they cost nothing. The names and labels are listed in
//! the crate's README.

use std::sync::Arc;

use crate::CommonOptions;

#[cfg(feature = "metrics")]
mod emit;
#[cfg(feature = "metrics")]
pub use emit::describe_metrics;
#[cfg(feature = "metrics")]
pub(crate) use emit::{Wait, ended, granted, released_unended, round_failed, round_settled};
#[cfg(not(feature = "metrics"))]
mod off;
#[cfg(not(feature = "metrics"))]
pub(crate) use off::{Wait, ended, granted, released_unended, round_failed, round_settled};

/// The labels of one locker's metrics: the backend's own name, the `metrics_tier` option (empty
/// when unset) and whether per-lock metrics carry the lock's name.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Labels {
    pub(crate) backend: &'static str,
    pub(crate) tier: Arc<str>,
    pub(crate) lock_names: bool,
}

impl Default for Labels {
    /// A locker whose backend did not name itself: `backend="unknown"`, no tier.
    fn default() -> Self {
        Labels {
            backend: "unknown",
            tier: Arc::from(""),
            lock_names: false,
        }
    }
}

impl Labels {
    pub(crate) fn new(backend: &'static str, common: &CommonOptions) -> Self {
        Labels {
            backend,
            tier: Arc::from(common.metrics_tier().unwrap_or_default()),
            lock_names: common.metrics_lock_names(),
        }
    }
}

/// How a lease ended, for [`ended`].
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum End<'a> {
    /// Its holder released it (or dropped it).
    Released,
    /// Lost, for this reason (never `Closed` or `Released`).
    Lost(&'a crate::LossReason),
    /// Its locker was closed: neither a release nor a loss.
    Closed,
}
