//! The driver's one task: plans rounds, runs them (several may be in flight), settles replies.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::{RenewBackend, Renewal, Shared, lock};
use crate::LossReason;
use crate::lease::LeaseCell;
use crate::options::drift;

type Batch<E> = Vec<(u64, Arc<LeaseCell>, Arc<E>)>;

/// Marks the task dead when dropped: on return, on a panic, or when its runtime shuts down
/// and drops it. The next registration then starts a new task.
pub(super) struct Alive<B: RenewBackend> {
    shared: Weak<Shared<B>>,
    generation: u64,
}

impl<B: RenewBackend> Alive<B> {
    pub(super) fn new(shared: Weak<Shared<B>>, generation: u64) -> Self {
        Alive { shared, generation }
    }
}

impl<B: RenewBackend> Drop for Alive<B> {
    fn drop(&mut self) {
        let Some(shared) = self.shared.upgrade() else {
            return; // The locker and every lease are gone: nothing to renew.
        };
        let mut slot = lock(&shared.task);
        if slot.generation == self.generation {
            slot.running = false;
        }
        drop(slot);
        let held = shared.leases().len();
        if std::thread::panicking() {
            tracing::error!(
                leases = held,
                "renewal driver panicked; it restarts at the next registration"
            );
        } else if held > 0 {
            tracing::warn!(
                leases = held,
                "renewal driver stopped with leases held (its runtime shut down?); it restarts at the next registration"
            );
        }
    }
}

/// One renewal request and what came of it.
struct Round<E> {
    batch: Batch<E>,
    start: Instant,
    outcome: Outcome,
}

enum Outcome {
    /// One [`Renewal`] per lease of the batch.
    Replied(Vec<Renewal>),
    /// The round failed as a whole (error, panic, timeout, malformed reply).
    Failed(String),
}

/// What the task should do next, from the registered leases.
struct Plan {
    /// When the first lease counts as lost (to declare it lost on time).
    earliest_deadline: Instant,
    /// Whether some lease can go into a round now (renewing, not in flight).
    renewable: bool,
    /// The earliest urgent time of those.
    urgent: Option<Instant>,
}

fn plan<B: RenewBackend>(shared: &Shared<B>) -> Option<Plan> {
    let leases = shared.leases();
    let earliest_deadline = leases.values().map(|r| r.cell.lost_at()).min()?;
    let mut renewable = false;
    let mut urgent: Option<Instant> = None;
    for r in leases.values().filter(|r| r.renewing && !r.in_flight) {
        renewable = true;
        if let Some(u) = r.urgent {
            urgent = Some(urgent.map_or(u, |x| x.min(u)));
        }
    }
    Some(Plan {
        earliest_deadline,
        renewable,
        urgent,
    })
}

/// The task. Holds only a weak reference: it ends when the locker and every lease are gone.
///
/// A regular round renews every lease TTL/3 after the previous regular round started. A lease
/// with an urgent time (little validity left, undecided, failed) is renewed at that time in a
/// round of its own unless a regular round comes first; a round does not wait for another
/// round's reply.
pub(super) async fn run<B: RenewBackend>(weak: Weak<Shared<B>>, alive: Alive<B>) {
    let _alive = alive;
    let mut failures: u32 = 0;
    // When the next regular round is due; `None` while idle.
    let mut tick: Option<Instant> = None;
    // When the last urgent (not regular) round was sent.
    let mut last_urgent: Option<Instant> = None;
    let mut inflight: FuturesUnordered<BoxFuture<'static, Round<B::Entry>>> =
        FuturesUnordered::new();
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let period = shared.ttl / 3;
        let wake = Arc::clone(&shared.wake);
        let notified = wake.notified();
        let plan = plan(&shared);
        drop(shared);
        let target = match plan {
            None if inflight.is_empty() => {
                // Idle: forget the past (an outage is over once nothing is held), and wait for
                // a lease, re-checking now and then so a dropped locker ends us.
                tick = None;
                failures = 0;
                let _ = tokio::time::timeout(period, notified).await;
                continue;
            }
            None => Instant::now() + period,
            Some(plan) => {
                let regular = *tick.get_or_insert_with(|| Instant::now() + period);
                // While a round is in flight, urgent rounds start at most every quarter period:
                // leases falling due one after another (a burst of grants) then share a round
                // instead of sending one each behind the one in flight.
                let gate = if inflight.is_empty() {
                    None
                } else {
                    last_urgent.map(|t| t + period / 4)
                };
                let round_at = plan.renewable.then(|| {
                    plan.urgent
                        .map_or(regular, |u| gate.map_or(u, |g| u.max(g)).min(regular))
                });
                round_at.map_or(plan.earliest_deadline, |r| r.min(plan.earliest_deadline))
            }
        };
        set_planned(&weak, Some(target));
        tokio::select! {
            () = tokio::time::sleep_until(target) => {}
            () = notified => {
                set_planned(&weak, None);
                continue;
            }
            Some(round) = inflight.next(), if !inflight.is_empty() => {
                set_planned(&weak, None);
                if let Some(shared) = weak.upgrade() {
                    settle(&shared, round, &mut failures, tick);
                }
                continue;
            }
        }
        set_planned(&weak, None);
        let Some(shared) = weak.upgrade() else { return };
        let now = Instant::now();
        let regular = tick.is_some_and(|t| now >= t);
        let batch = expire_and_collect(&shared, regular, now);
        if batch.is_empty() {
            // Woken only to expire leases (or nothing renewable): no round now.
            continue;
        }
        if regular {
            tick = Some(now + period);
        } else {
            last_urgent = Some(now);
        }
        inflight.push(round(&shared, batch, now));
    }
}

/// Sends one renewal request for `batch`, bounded by the batch's validity.
fn round<B: RenewBackend>(
    shared: &Shared<B>,
    batch: Batch<B::Entry>,
    start: Instant,
) -> BoxFuture<'static, Round<B::Entry>> {
    let period = shared.ttl / 3;
    let earliest = batch
        .iter()
        .map(|(_, c, _)| c.lost_at())
        .min()
        .unwrap_or(start);
    // A round may run for TTL/3, or for three quarters of the remaining validity if that is
    // longer: a reply delayed by a short network blip still counts, and a quarter of the
    // validity is left for a retry when the request is truly lost. Never past the moment the
    // lease counts as lost. A backend whose retry would only queue behind this call runs it
    // to that moment.
    let remaining = earliest.saturating_duration_since(start);
    let budget = if shared.backend.abandon_slow_rounds() {
        period.max(remaining * 3 / 4).min(remaining)
    } else {
        remaining
    }
    .max(Duration::from_millis(1));
    let backend = Arc::clone(&shared.backend);
    let entries: Vec<Arc<B::Entry>> = batch.iter().map(|(_, _, e)| Arc::clone(e)).collect();
    async move {
        let n = entries.len();
        // The call itself runs inside the guarded future, so a panic anywhere in it is caught.
        let call = AssertUnwindSafe(async { backend.renew(&entries).await }).catch_unwind();
        let outcome = match tokio::time::timeout(budget, call).await {
            Ok(Ok(Ok(results))) if results.len() == n => Outcome::Replied(results),
            Ok(Ok(Ok(results))) => Outcome::Failed(format!(
                "backend returned {} results for {n} leases",
                results.len()
            )),
            Ok(Ok(Err(e))) => Outcome::Failed(e.to_string()),
            Ok(Err(panic)) => Outcome::Failed(format!(
                "the backend's renew panicked: {}",
                panic_message(panic.as_ref())
            )),
            Err(_) => Outcome::Failed(format!("renewal timed out after {budget:?}")),
        };
        Round {
            batch,
            start,
            outcome,
        }
    }
    .boxed()
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Applies a round's outcome to its leases.
fn settle<B: RenewBackend>(
    shared: &Shared<B>,
    round: Round<B::Entry>,
    failures: &mut u32,
    tick: Option<Instant>,
) {
    let Round {
        batch,
        start,
        outcome,
    } = round;
    let period = shared.ttl / 3;
    let now = Instant::now();
    crate::metrics::round_settled(&shared.counters, now.saturating_duration_since(start));
    let mut lost: Vec<(Arc<LeaseCell>, LossReason)> = Vec::new();
    let mut leases = shared.leases();
    for (id, _, _) in &batch {
        if let Some(r) = leases.get_mut(id) {
            r.in_flight = false;
        }
    }
    match outcome {
        Outcome::Replied(results) => {
            *failures = 0;
            shared.counters.add_renewals(1);
            let new_deadline = start + shared.ttl.saturating_sub(drift(shared.ttl));
            let mut undecided = 0usize;
            for ((id, cell, _), result) in batch.iter().zip(results) {
                let reason = match result {
                    Renewal::Retry => {
                        undecided += 1;
                        if let Some(r) = leases.get_mut(id) {
                            r.urgent = Some(retry_at(now, cell.lost_at(), period));
                        }
                        continue;
                    }
                    Renewal::Extended | Renewal::ExtendedUntil(_)
                        if cell.extend(capped(new_deadline, &result, shared.ttl)) =>
                    {
                        // Next due TTL/3 after this round started, or at the regular round
                        // within a quarter period of that (see `next_due`); halfway to the
                        // loss when a capped extension left less than that.
                        let due = next_due(start, period, tick)
                            .min(now + cell.lost_at().saturating_duration_since(now) / 2);
                        if let Some(r) = leases.get_mut(id) {
                            r.urgent = Some(due);
                        }
                        tracing::trace!(lock = %cell.name, token = %cell.token, "lease renewed");
                        continue;
                    }
                    // Released meanwhile, or the reply came after the deadline: a late reply
                    // never resurrects a lease.
                    Renewal::Extended | Renewal::ExtendedUntil(_) => LossReason::Expired,
                    Renewal::Lost(reason) => reason,
                };
                leases.remove(id);
                lost.push((Arc::clone(cell), reason));
            }
            if undecided > 0 {
                // Not a failed request, but leases went without extension: count it as a
                // failed round so it shows.
                tracing::debug!(
                    undecided,
                    leases = batch.len(),
                    "renewal left leases undecided; retrying those"
                );
                shared.counters.add_renewal_failures(1);
            }
        }
        Outcome::Failed(why) => {
            *failures += 1;
            shared.counters.add_renewal_failures(1);
            tracing::warn!(leases = batch.len(), failures = *failures, error = %why, "renewal failed; retrying");
            // Back off (20 ms doubling, capped at TTL/12) inside the remaining validity.
            let backoff = Duration::from_millis(10)
                .saturating_mul(1 << (*failures).min(10))
                .min(period / 4)
                .max(Duration::from_millis(1));
            for (id, _, _) in &batch {
                if let Some(r) = leases.get_mut(id) {
                    r.urgent = Some(now + backoff);
                }
            }
        }
    }
    drop(leases);
    for (cell, reason) in lost {
        // Counted by the cell, if this call ends it.
        cell.mark_lost(reason);
    }
}

/// When a lease renewed by a round that started at `start` is due again: TTL/3 later, or at
/// the regular round (`tick`, repeating every period) if one comes within a quarter period
/// of that, before or after. Renewing up to a quarter period later than TTL/3 still leaves
/// more than half the validity; without the snap, a lease whose own round was in flight when
/// a regular round started would be renewed just before every later regular round too, in a
/// second round per period, for as long as its round stays in flight at the tick.
fn next_due(start: Instant, period: Duration, tick: Option<Instant>) -> Instant {
    let due = start + period;
    let (Some(mut t), false) = (tick, period.is_zero()) else {
        return due;
    };
    let window = period / 4;
    let earliest = due.checked_sub(window).unwrap_or(due);
    if t < earliest {
        // Whole periods forward to the first regular round at or after `earliest`.
        let behind = earliest - t;
        let steps = behind.as_nanos().div_ceil(period.as_nanos());
        t += period.saturating_mul(u32::try_from(steps).unwrap_or(u32::MAX));
    }
    if t <= due + window { t } else { due }
}

/// The deadline a renewal answer sets: the round's (`full`: start + TTL − drift), or for
/// [`Renewal::ExtendedUntil`] the earlier of that and the backend's bound less the drift.
fn capped(full: Instant, result: &Renewal, ttl: Duration) -> Instant {
    match result {
        Renewal::ExtendedUntil(bound) => full.min(bound.checked_sub(drift(ttl)).unwrap_or(*bound)),
        _ => full,
    }
}

/// When to retry a lease left undecided: soon (TTL/12), and well inside its validity (a third
/// of what is left, but not more often than every 5 ms).
fn retry_at(now: Instant, deadline: Instant, period: Duration) -> Instant {
    let remaining = deadline.saturating_duration_since(now);
    now + (period / 4)
        .min(remaining / 3)
        .max(Duration::from_millis(5))
}

fn set_planned<B: RenewBackend>(weak: &Weak<Shared<B>>, at: Option<Instant>) {
    if let Some(shared) = weak.upgrade() {
        *lock(&shared.planned) = at;
    }
}

/// Declares expired leases lost and returns the ones to renew now: every renewable lease in a
/// regular round, only those whose urgent time came otherwise. Marks them in flight.
fn expire_and_collect<B: RenewBackend>(
    shared: &Shared<B>,
    regular: bool,
    now: Instant,
) -> Batch<B::Entry> {
    let mut expired = Vec::new();
    let mut batch = Vec::new();
    {
        let mut leases = shared.leases();
        leases.retain(|id, r| {
            if r.cell.lost_at() <= now || !r.cell.is_live() {
                expired.push(Arc::clone(&r.cell));
                return false;
            }
            let due = regular || r.urgent.is_some_and(|u| u <= now);
            if r.renewing && !r.in_flight && due {
                r.in_flight = true;
                batch.push((*id, Arc::clone(&r.cell), Arc::clone(&r.entry)));
            }
            true
        });
    }
    for cell in expired {
        cell.mark_lost(LossReason::Expired);
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_due_near_the_regular_round_joins_it() {
        let p = Duration::from_secs(1);
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // No regular round planned: TTL/3 after the start.
        assert_eq!(next_due(t0, p, None), t0 + p);
        // A regular round 10 ms after the due time, or 10 ms before it: that round.
        assert_eq!(next_due(t0, p, Some(t0 + p + ms(10))), t0 + p + ms(10));
        assert_eq!(next_due(t0, p, Some(t0 + p - ms(10))), t0 + p - ms(10));
        // The tick still points at the round this one missed: whole periods on.
        assert_eq!(next_due(t0, p, Some(t0 + ms(10))), t0 + p + ms(10));
        assert_eq!(next_due(t0, p, Some(t0 - p * 3 + ms(5))), t0 + p + ms(5));
        // Half a period away: no snap.
        assert_eq!(next_due(t0, p, Some(t0 + p + p / 2)), t0 + p);
        assert_eq!(next_due(t0, p, Some(t0 + p / 2)), t0 + p);
    }
}
