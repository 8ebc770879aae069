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
use crate::history::History;

/// How the fenced resource treats tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// Rejects an operation whose token is lower than one already accepted.
    On,
    /// Accepts everything: a negative control, the fenced-safety checker must then fire
    /// whenever a stale holder writes.
    Off,
}

/// The shared resource the workers write to, recording each outcome in the history in the
/// same step as the check.
pub(crate) struct Resource {
    fencing: Fencing,
    guard: FenceGuard<u64>,
    unfenced: Mutex<u64>,
    history: Arc<History>,
}

impl Resource {
    pub(crate) fn new(fencing: Fencing, history: Arc<History>) -> Self {
        Resource {
            fencing,
            guard: FenceGuard::new(0),
            unfenced: Mutex::new(0),
            history,
        }
    }

    /// One increment by `client` with `token`; whether it was accepted.
    pub(crate) fn op(&self, client: usize, token: FencingToken) -> bool {
        match self.fencing {
            Fencing::On => {
                let done = self.guard.apply(token, |v| {
                    *v += 1;
                    self.history.op(client, token, true);
                });
                if done.is_err() {
                    self.history.op(client, token, false);
                }
                done.is_ok()
            }
            Fencing::Off => {
                let mut v = self.unfenced.lock().unwrap_or_else(|p| p.into_inner());
                *v += 1;
                self.history.op(client, token, true);
                true
            }
        }
    }

    /// The counter's value.
    pub(crate) fn value(&self) -> u64 {
        match self.fencing {
            Fencing::On => self.guard.read(|v| *v),
            Fencing::Off => *self.unfenced.lock().unwrap_or_else(|p| p.into_inner()),
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
        let history = Arc::new(History::new());
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
            self.history.grant(self.id, token);
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
            if rng.random_bool(self.plan.stall_chance.clamp(0.0, 1.0)) {
                c.stalls.fetch_add(1, Ordering::SeqCst);
                lease.stop_renewal_for_test();
                let until = tokio::time::Instant::now() + self.plan.ttl * 3 / 2;
                while tokio::time::Instant::now() < until {
                    tokio::time::sleep(self.plan.ttl / 4).await;
                    self.write(token);
                }
            } else {
                let hold_ms = self.plan.hold_max.as_millis().max(1) as u64;
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..hold_ms))).await;
                self.write(token);
            }
            self.history.release(self.id, token);
            let _ = lease.release().await;
            if let Ok(reason) = watcher.await {
                if reason != LossReason::Released {
                    c.losses.fetch_add(1, Ordering::SeqCst);
                }
            }
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
    pub fenced: Option<String>,
    pub tokens: Option<String>,
    pub overlaps: Option<(usize, Duration, String)>,
}

impl Findings {
    /// Runs the checkers that apply to `caps`: fenced safety always; token monotonicity only
    /// with linearizable fencing; belief overlap always.
    pub(crate) fn of(history: &History, caps: &Capabilities) -> Findings {
        Findings {
            fenced: history.fenced_safety().err(),
            tokens: if caps.fencing == FencingStrength::Linearizable {
                history.token_monotonicity().err()
            } else {
                None
            },
            overlaps: history
                .belief_overlap()
                .err()
                .map(|o| (o.count, o.total, o.first)),
        }
    }

    /// How many checkers fired.
    pub(crate) fn violations(&self) -> usize {
        usize::from(self.fenced.is_some())
            + usize::from(self.tokens.is_some())
            + self.overlaps.as_ref().map_or(0, |o| o.0)
    }

    /// A failed verdict naming every violation, or `Ok`.
    pub(crate) fn verdict(&self, what: &str) -> Result<(), Verdict> {
        let mut why = Vec::new();
        if let Some(f) = &self.fenced {
            why.push(format!("fenced-safety violation: {f}"));
        }
        if let Some(t) = &self.tokens {
            why.push(format!("token-monotonicity violation: {t}"));
        }
        if let Some((n, total, first)) = &self.overlaps {
            why.push(format!(
                "belief overlap: {n} overlapping holds ({total:?} in all); first: {first}"
            ));
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(Verdict::Fail(format!("{what}: {}", why.join("; "))))
        }
    }
}
