//! The metrics calls with the `metrics` feature: each emits through the `metrics` facade to
//! whatever recorder the application installed (none: nothing is recorded).
//!
//! Handles are looked up at every call rather than kept: a recorder installed after the locker
//! was built still gets everything from then on.

use std::time::Duration;

use metrics::{Label, Unit, counter, describe_counter, describe_gauge, describe_histogram};
use metrics::{gauge, histogram};
use tokio::time::Instant;

use super::{End, Labels};
use crate::{Counters, Error, LockName, LossReason};

const GRANTS: &str = "dlock_grants_total";
const RELEASES: &str = "dlock_releases_total";
const TIMEOUTS: &str = "dlock_acquire_timeouts_total";
const LOSSES: &str = "dlock_losses_total";
const ROUNDS: &str = "dlock_renewal_rounds_total";
const FAILED_ROUNDS: &str = "dlock_renewal_failed_rounds_total";
const ACQUIRE_WAIT: &str = "dlock_acquire_wait_seconds";
const HOLD: &str = "dlock_hold_seconds";
const ROUND_LATENCY: &str = "dlock_renewal_round_seconds";
const HELD: &str = "dlock_held_leases";
const WAITERS: &str = "dlock_waiters";

/// Registers the description and unit of every dlock metric with the installed recorder (the
/// `# HELP` lines of a Prometheus exporter). Call it once after installing the recorder;
/// the metrics are recorded whether or not it was called. Only with the `metrics` feature.
pub fn describe_metrics() {
    describe_counter!(
        GRANTS,
        Unit::Count,
        "Leases granted (a backend's internal leases not counted)."
    );
    describe_counter!(
        RELEASES,
        Unit::Count,
        "Leases released by their holder (release, a Releaser, or drop)."
    );
    describe_counter!(
        TIMEOUTS,
        Unit::Count,
        "Acquires that ended because their wait elapsed."
    );
    describe_counter!(
        LOSSES,
        Unit::Count,
        "Leases lost, by reason: expired, gone, session_ended."
    );
    describe_counter!(
        ROUNDS,
        Unit::Count,
        "Renewal rounds settled (one round renews many leases)."
    );
    describe_counter!(
        FAILED_ROUNDS,
        Unit::Count,
        "Renewal rounds that failed, timed out or left a lease undecided."
    );
    describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "Time an acquire took, by outcome: granted, timeout, error."
    );
    describe_histogram!(
        HOLD,
        Unit::Seconds,
        "Time from grant to release, loss or close."
    );
    describe_histogram!(
        ROUND_LATENCY,
        Unit::Seconds,
        "Time from a renewal round's request to its settling."
    );
    describe_gauge!(HELD, Unit::Count, "Leases held now.");
    describe_gauge!(WAITERS, Unit::Count, "Acquire calls in progress.");
}

/// `backend` and `tier`.
fn base(l: &Labels) -> Vec<Label> {
    vec![
        Label::new("backend", l.backend),
        Label::new("tier", l.tier.to_string()),
    ]
}

/// `backend`, `tier`, and `lock` when the locker was built with `metrics_lock_names(true)`.
fn per_lock(l: &Labels, name: &LockName) -> Vec<Label> {
    let mut labels = base(l);
    if l.lock_names {
        labels.push(Label::new("lock", name.as_str().to_owned()));
    }
    labels
}

/// An acquire in progress: counted in `dlock_waiters` until it is done or dropped.
pub(crate) struct Wait {
    labels: Labels,
    name: LockName,
    began: Instant,
    done: bool,
}

impl Wait {
    /// Starts counting an acquire of `name` on the locker with `counters` (`None`: a backend
    /// that does not hand its counters to the contract, labelled `backend="unknown"`).
    pub(crate) fn start(counters: Option<&Counters>, name: &LockName) -> Wait {
        let labels = counters.map(|c| c.labels().clone()).unwrap_or_default();
        gauge!(WAITERS, base(&labels)).increment(1.0);
        Wait {
            labels,
            name: name.clone(),
            began: Instant::now(),
            done: false,
        }
    }

    /// Records how the acquire ended: its wait by outcome, and a timeout.
    pub(crate) fn done<T>(mut self, result: &Result<T, Error>) {
        self.done = true;
        gauge!(WAITERS, base(&self.labels)).decrement(1.0);
        let outcome = match result {
            Ok(_) => "granted",
            Err(Error::Timeout { .. }) => "timeout",
            Err(_) => "error",
        };
        let mut labels = per_lock(&self.labels, &self.name);
        if outcome == "timeout" {
            counter!(TIMEOUTS, labels.clone()).increment(1);
        }
        labels.push(Label::new("outcome", outcome));
        histogram!(ACQUIRE_WAIT, labels).record(self.began.elapsed().as_secs_f64());
    }
}

impl Drop for Wait {
    /// A cancelled acquire leaves the waiters too.
    fn drop(&mut self) {
        if !self.done {
            gauge!(WAITERS, base(&self.labels)).decrement(1.0);
        }
    }
}

/// A lease of `name` was granted.
pub(crate) fn granted(counters: &Counters, name: &LockName) {
    let l = counters.labels();
    counter!(GRANTS, per_lock(l, name)).increment(1);
    gauge!(HELD, base(l)).increment(1.0);
}

/// A lease of `name` ended after being held for `held`.
pub(crate) fn ended(counters: &Counters, name: &LockName, held: Duration, how: End<'_>) {
    let l = counters.labels();
    gauge!(HELD, base(l)).decrement(1.0);
    histogram!(HOLD, per_lock(l, name)).record(held.as_secs_f64());
    match how {
        End::Released => counter!(RELEASES, per_lock(l, name)).increment(1),
        End::Lost(reason) => {
            let mut labels = per_lock(l, name);
            labels.push(Label::new("reason", reason_label(reason)));
            counter!(LOSSES, labels).increment(1);
        }
        End::Closed => {}
    }
}

/// A lease's state was dropped without ending (nothing else to count): it is held no more.
pub(crate) fn released_unended(counters: &Counters) {
    gauge!(HELD, base(counters.labels())).decrement(1.0);
}

/// A renewal round settled `latency` after its request was sent.
pub(crate) fn round_settled(counters: &Counters, latency: Duration) {
    let l = base(counters.labels());
    counter!(ROUNDS, l.clone()).increment(1);
    histogram!(ROUND_LATENCY, l).record(latency.as_secs_f64());
}

/// `n` renewal rounds failed.
pub(crate) fn round_failed(counters: &Counters, n: u64) {
    counter!(FAILED_ROUNDS, base(counters.labels())).increment(n);
}

/// The `reason` label of a loss: one word per [`LossReason`] variant, never its message.
fn reason_label(reason: &LossReason) -> &'static str {
    match reason {
        LossReason::Expired => "expired",
        LossReason::Gone(_) => "gone",
        LossReason::SessionEnded(_) => "session_ended",
        LossReason::Closed => "closed",
        LossReason::Released => "released",
    }
}
