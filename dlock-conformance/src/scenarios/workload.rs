//! A contended workload for fault scenarios and the soak: workers loop acquire → fenced op →
//! hold → fenced op → release on one lock, recording every grant, loss, release and fenced
//! operation in a [`History`], while faults are injected around them.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::{
    AcquireOptions, Capabilities, Error, FenceGuard, FencingStrength, FencingToken, LockName,
    Locker, LossReason,
};
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use super::Verdict;
use crate::history::{BREAKS_PER_ERROR, FencedModel, History, Kind, Order, Violations};

/// How the fenced resource treats tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// Rejects an operation whose token is lower than one already accepted ([`FenceGuard`]).
    On,
    /// Accepts everything: a negative control, the fenced-safety checker must then fire
    /// whenever a stale holder writes.
    Off,
    /// A broken guard that also accepts a token ONE lower than the highest accepted (the
    /// off-by-one of a `fence - 1 <= $token` condition): a negative control, the fenced-safety
    /// checker must fire when the holder just superseded writes.
    Lax,
}

/// The shared resource the workers write to. Each operation is recorded as an attempt BEFORE
/// the guard sees it and with its outcome after, all under one lock (the resource's own order
/// of operations); the history's model of a fenced resource then judges the outcomes.
pub(crate) struct Resource {
    fencing: Fencing,
    guard: FenceGuard<u64>,
    /// The counter of [`Fencing::Off`] and [`Fencing::Lax`], with the highest token accepted.
    unguarded: Mutex<(Option<FencingToken>, u64)>,
    /// Serializes attempt record, guard and outcome record.
    order: Mutex<()>,
    history: Arc<History>,
}

impl Resource {
    pub(crate) fn new(fencing: Fencing, history: Arc<History>) -> Self {
        Resource {
            fencing,
            guard: FenceGuard::new(0),
            unguarded: Mutex::new((None, 0)),
            order: Mutex::new(()),
            history,
        }
    }

    /// One increment by `client` with `token`; whether it was accepted.
    pub(crate) fn op(&self, client: usize, token: FencingToken) -> bool {
        let _order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        self.history.write_attempt(client, token);
        let accepted = match self.fencing {
            Fencing::On => self.guard.apply(token, |v| *v += 1).is_ok(),
            Fencing::Off | Fencing::Lax => {
                let mut g = self.unguarded.lock().unwrap_or_else(|p| p.into_inner());
                let ok = self.fencing == Fencing::Off
                    || g.0.is_none_or(|h| token.get().saturating_add(1) >= h.get());
                if ok {
                    g.0 = g.0.max(Some(token));
                    g.1 += 1;
                }
                ok
            }
        };
        self.history.op(client, token, accepted);
        accepted
    }

    /// The counter's value.
    pub(crate) fn value(&self) -> u64 {
        match self.fencing {
            Fencing::On => self.guard.read(|v| *v),
            Fencing::Off | Fencing::Lax => {
                self.unguarded.lock().unwrap_or_else(|p| p.into_inner()).1
            }
        }
    }
}

/// Counters of a workload run.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub grants: AtomicU64,
    pub losses: AtomicU64,
    pub timeouts: AtomicU64,
    pub errors: AtomicU64,
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    pub stalls: AtomicU64,
}

impl Counts {
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::SeqCst)
    }
}

/// Workload parameters.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub lock: LockName,
    pub ttl: Duration,
    /// Each acquire's wait.
    pub wait: Duration,
    /// Longest hold between the two operations.
    pub hold_max: Duration,
    /// Chance (per grant) that the holder stalls: stops renewing and keeps writing with its
    /// token for 1.5 × TTL, as a paused process would on waking.
    pub stall_chance: f64,
    pub seed: u64,
}

/// A running workload.
pub(crate) struct Workload {
    pub history: Arc<History>,
    pub resource: Arc<Resource>,
    pub counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Workload {
    /// Starts one worker per client.
    pub(crate) fn start(clients: Vec<Arc<dyn Locker>>, plan: &Plan, fencing: Fencing) -> Self {
        // Tokens give the server's grant order; without fencing only the record does.
        let fencing_strength = clients.first().map(|c| c.capabilities().fencing);
        let unfenced = fencing_strength == Some(FencingStrength::None);
        let history = History::ordered_by(if unfenced {
            Order::Record
        } else {
            Order::Token
        });
        // Only Redlock's tokens are a majority's largest per-node count.
        let history = Arc::new(if fencing_strength == Some(FencingStrength::Assumed) {
            history.with_partial_counts()
        } else {
            history
        });
        let resource = Arc::new(Resource::new(fencing, Arc::clone(&history)));
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = clients
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let w = Worker {
                    id: i,
                    client: c,
                    plan: plan.clone(),
                    history: Arc::clone(&history),
                    resource: Arc::clone(&resource),
                    counts: Arc::clone(&counts),
                    stop: Arc::clone(&stop),
                };
                tokio::spawn(w.run())
            })
            .collect();
        Workload {
            history,
            resource,
            counts,
            stop,
            tasks,
        }
    }

    /// Grants so far.
    pub(crate) fn grants(&self) -> u64 {
        Counts::get(&self.counts.grants)
    }

    /// Stops the workers and waits for them (each finishes its current hold and releases).
    pub(crate) async fn stop(self, bound: Duration) -> Arc<History> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            let abort = t.abort_handle();
            if tokio::time::timeout(bound, t).await.is_err() {
                abort.abort();
            }
        }
        self.history
    }
}

struct Worker {
    id: usize,
    client: Arc<dyn Locker>,
    plan: Plan,
    history: Arc<History>,
    resource: Arc<Resource>,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
}

impl Worker {
    async fn run(self) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.plan.seed ^ (self.id as u64) << 32);
        let c = &self.counts;
        while !self.stop.load(Ordering::SeqCst) {
            let got = self
                .client
                .acquire(&self.plan.lock, AcquireOptions::wait(self.plan.wait))
                .await;
            let lease = match got {
                Ok(l) => l,
                Err(Error::Timeout { .. }) => {
                    c.timeouts.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                Err(_) => {
                    c.errors.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(rng.random_range(20..200))).await;
                    continue;
                }
            };
            let token = lease.token();
            let mut promised = lease.deadline();
            self.history
                .grant_until(self.id, token, promised.into_std());
            c.grants.fetch_add(1, Ordering::SeqCst);
            let lost = lease.lost();
            let (h, id) = (Arc::clone(&self.history), self.id);
            let watcher = tokio::spawn(async move {
                let reason = lost.await;
                if reason != LossReason::Released {
                    h.lost(id, token);
                }
                reason
            });
            self.write(token);
            self.observe(&lease, &mut promised);
            if rng.random_bool(self.plan.stall_chance.clamp(0.0, 1.0)) {
                c.stalls.fetch_add(1, Ordering::SeqCst);
                lease.stop_renewal_for_test();
                let until = tokio::time::Instant::now() + self.plan.ttl * 3 / 2;
                while tokio::time::Instant::now() < until {
                    tokio::time::sleep(self.plan.ttl / 4).await;
                    self.write(token);
                    self.observe(&lease, &mut promised);
                }
            } else {
                let hold_ms = self.plan.hold_max.as_millis().max(1) as u64;
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..hold_ms))).await;
                self.write(token);
            }
            // The latest promise (renewals moved it; a lost lease keeps its last one).
            self.observe(&lease, &mut promised);
            self.history.release(self.id, token);
            let _ = lease.release().await;
            if let Ok(reason) = watcher.await
                && reason != LossReason::Released
            {
                c.losses.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Records the lease's promised deadline when it moved since last recorded.
    fn observe(&self, lease: &dlock_core::Lease, promised: &mut tokio::time::Instant) {
        let now = lease.deadline();
        if now != *promised {
            *promised = now;
            self.history.promise(self.id, lease.token(), now.into_std());
        }
    }

    fn write(&self, token: FencingToken) {
        if self.resource.op(self.id, token) {
            self.counts.accepted.fetch_add(1, Ordering::SeqCst);
        } else {
            self.counts.rejected.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The checkers' findings over a history.
#[derive(Debug, Default, Clone)]
pub(crate) struct Findings {
    /// Grants before another unreleased, unbroken lease's promised deadline.
    pub promise: Option<Violations>,
    /// Grants inside another hold's belief interval.
    pub overlaps: Option<Violations>,
    /// Tokens not unique and increasing in grant order.
    pub tokens: Option<Violations>,
    /// Write outcomes that differ from the independent fenced-resource model's.
    pub fenced: Option<Violations>,
    /// The fenced-resource model's tallies.
    pub model: FencedModel,
    /// Holds in the history.
    pub holds: usize,
    /// Forced breaks recorded.
    pub breaks: usize,
    /// Of them, failed ones (victim unknown, attributed by timing).
    pub break_errors: usize,
    /// Diagnostics: what the old checker (beliefs ended by recorded events only) would count.
    pub recorded_overlaps: usize,
    /// Diagnostics: losses recorded after their promised deadline, and the worst delay.
    pub late_losses: (usize, Duration),
}

impl Findings {
    /// Runs every checker; token order on every backend that issues tokens
    /// ([`FencingStrength::Linearizable`], and Redlock's `Assumed` while its assumptions hold:
    /// no scenario that records a history restarts a node without its data).
    pub(crate) fn of(history: &History, caps: &Capabilities) -> Findings {
        Findings {
            promise: history.promise_violations().err(),
            overlaps: history.belief_overlap().err(),
            tokens: if caps.fencing == FencingStrength::None {
                None
            } else {
                history.token_order().err()
            },
            fenced: history.fenced_safety().err(),
            model: history.fenced_model(),
            holds: history.holds().len(),
            breaks: history
                .events()
                .iter()
                .filter(|e| e.kind == Kind::Break)
                .count(),
            break_errors: history.break_errors(),
            recorded_overlaps: history.recorded_overlaps(),
            late_losses: history.late_loss_records(),
        }
    }

    fn count(v: &Option<Violations>) -> usize {
        v.as_ref().map_or(0, |v| v.count)
    }

    /// How many violations, of every kind.
    pub(crate) fn violations(&self) -> usize {
        Self::count(&self.promise)
            + Self::count(&self.overlaps)
            + Self::count(&self.tokens)
            + Self::count(&self.fenced)
    }

    /// Every count as `key=value` pairs (violations and diagnostics).
    pub(crate) fn counts(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("holds", self.holds as u64),
            ("forced_breaks", self.breaks as u64),
            ("break_errors", self.break_errors as u64),
            ("promise_violations", Self::count(&self.promise) as u64),
            ("belief_overlaps", Self::count(&self.overlaps) as u64),
            ("token_violations", Self::count(&self.tokens) as u64),
            ("fenced_violations", Self::count(&self.fenced) as u64),
            ("write_attempts", self.model.attempts),
            ("writes_accepted", self.model.accepted),
            ("writes_the_model_accepts", self.model.expected),
            ("stale_writes_accepted", self.model.stale_accepted as u64),
            (
                "current_writes_rejected",
                self.model.current_rejected as u64,
            ),
            ("recorded_overlaps", self.recorded_overlaps as u64),
            ("late_loss_records", self.late_losses.0 as u64),
            ("late_loss_max_ms", self.late_losses.1.as_millis() as u64),
        ]
    }

    /// Records every count as a figure.
    pub(crate) fn figures(&self, ctx: &super::Ctx) {
        for (k, v) in self.counts() {
            ctx.figure(k, v);
        }
    }

    /// A failed verdict naming every violation, or `Ok`.
    pub(crate) fn verdict(&self, what: &str) -> Result<(), Verdict> {
        let mut why = Vec::new();
        let mut say = |label: &str, v: &Option<Violations>| {
            if let Some(v) = v {
                why.push(format!(
                    "{label}: {} ({:?} in all); first: {}",
                    v.count, v.total, v.first
                ));
            }
        };
        say(
            "promise violation (granted before a promised deadline)",
            &self.promise,
        );
        say("belief overlap", &self.overlaps);
        say("token violation", &self.tokens);
        say("fenced-safety violation", &self.fenced);
        if self.break_errors > self.breaks.div_ceil(BREAKS_PER_ERROR) {
            why.push(format!(
                "break errors: {} of {} forced breaks failed (at most one in {BREAKS_PER_ERROR}, \
                 rounded up): their victims are unknown and their timing excuses more than they hit",
                self.break_errors, self.breaks
            ));
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(Verdict::Fail(format!("{what}: {}", why.join("; "))))
        }
    }
}
