//! The one scenario list. Each scenario is an async function over a [`Ctx`] that returns
//! `Ok(())`, or a [`Verdict`] saying why it failed or does not apply; [`run`] turns that into a
//! report [`Row`].

mod basic;
mod crash;
mod election;
mod enqueue;
mod exclusion;
mod family;
mod herd;
pub(crate) mod holder;
mod lease;
mod many;
mod network;
mod nodes;
mod partition;
mod private;
mod queue;
mod restart;
mod slow;
mod takeover;
pub(crate) mod util;
pub(crate) mod workload;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{Capabilities, Locker};
use serde_json::{Map, Value};

use crate::report::{Row, Status};
use crate::{ClientOptions, Declared, TestBackend};

pub use holder::{CRASH_HOLDER_VAR, crash_holder_main};
pub use workload::Fencing;

/// Every scenario, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scenario {
    /// 8 clients × 50 read-sleep-write sections: exact count, no overlapping holds.
    MutualExclusion,
    /// Tokens strictly increase across grants, also after a forced expiry.
    FencingMonotonic,
    /// A fenced resource rejects the stale holder's write after a takeover.
    FencedResource,
    /// `try_acquire` on a held name returns `None` at once and leaves nothing behind.
    TryAcquireHeld,
    /// A bounded wait returns `Timeout` and leaves nothing behind.
    WaitTimeout,
    /// A dropped pending acquire leaves nothing behind; the next waiter gets the lock promptly.
    Cancel,
    /// 16 queued waiters are granted in enqueue order.
    Fifo,
    /// Wakeups per release and requests per handoff stay flat for N = 1, 8, 32 waiters.
    Herd,
    /// A lease stays held for ≥ 5 × TTL while a contender keeps failing.
    Renewal,
    /// A holder cut off from the servers learns of the loss before a contender gets the lock.
    LostBeforeStolen,
    /// [`Scenario::LostBeforeStolen`] in 20 trials, 5 at a time; the minimum margin is reported.
    LossTrials,
    /// A holder broken from the server side learns of it within the TTL.
    LostAfterBreak,
    /// Release is idempotent; a retried release never deletes a newer holder's lock.
    ReleaseIdempotent,
    /// `close()` ends every lease at once (`lost()` says `Closed`, not counted as a loss),
    /// frees the locks at the server before it returns, and the closed locker grants nothing.
    Close,
    /// The holder's link goes silent for 0.3 × TTL: the lease survives, same token.
    ShortBlip,
    /// A release whose reply is lost returns within a bound; its retry never deletes the next
    /// holder's lock.
    ReleaseReplyLost,
    /// A SIGKILLed holder process's lock is free within [TTL − drift, TTL + slack].
    CrashRelease,
    /// A holder process frozen (SIGSTOP) past its TTL: taken over with a higher token, its late
    /// write rejected by the fenced resource, its lease known lost after SIGCONT.
    PausedHolder,
    /// A waiter process in the middle of the queue is SIGKILLed: the next waiter re-targets,
    /// does not jump the holder, and gets the lock right after the holder releases.
    WaiterCrash,
    /// On a private cluster under a contended workload: Redlock 1 and 2 of 5 nodes killed or
    /// paused keep working; etcd / ZooKeeper follower killed, leader killed, leader paused
    /// break no checker (fenced safety, tokens, belief overlap).
    MinorityNodesDown,
    /// On a private cluster: a majority of nodes killed makes an acquire fail within its wait,
    /// with no partial entries; the lock works again once they are back.
    MajorityNodesDown,
    /// `a`, `a/b` and `ab` never block each other.
    NameIsolation,
    /// Bad names, TTLs and waits give typed errors before any I/O.
    BadInput,
    /// The core re-entrancy wrapper over the backend.
    Reentrancy,
    /// Replies (server→client only) delayed past the request timeout during acquire, then
    /// renewal stopped: nobody else is granted before the lease's deadline, and the server's
    /// expiry of the holder is never earlier than that deadline.
    SlowGrant,
    /// Renewal replies delayed (requests not): over many renewals the server's expiry is never
    /// earlier than the lease's deadline, and nobody else is granted.
    OneWayDelay,
    /// Every server node restarted (Redis without persistence: a forced break; etcd and
    /// ZooKeeper keep their data): no grant while a lease is still believed held (Redis
    /// excepted), and every token after the restart is above every token before.
    ServerRestart,
    /// Acquires dropped while their enqueue request is at the server and its reply is held:
    /// nothing of theirs stays on the server, and the next contender is granted promptly.
    CancelMidEnqueue,
    /// On a cluster, the holder's server cut from the leader: the holder's `lost()` fires
    /// before anyone else is granted.
    LeaderPartition,
    /// 1,000 leases on one locker, one broken at the server: it is lost within TTL + slack,
    /// the others stay held.
    ManyLeasesBreak,
    /// 4 campaigners × 5 terms: no two leaders' beliefs overlap, terms strictly increase, the
    /// server records each leader's term and value while it leads.
    ElectionSingleLeader,
    /// The leader's link dies: a follower leads within TTL + slack, after the old leader's
    /// `lost()` fired, with a higher term.
    ElectionFailover,
    /// An observer sees every leader change and proclamation, in order, none extra.
    ElectionObserve,
    /// Two readers hold together while a writer waits; then 6 clients mixing reads and writes:
    /// a writer overlaps nobody, its token orders it against the leases before and after it.
    RwExclusion,
    /// Readers keep the name read-held without a gap: a writer is still granted (FIFO across
    /// modes), within TTL + 1 s.
    RwWriterNotStarved,
    /// A semaphore of 3: 3 held at once and a fourth kept waiting; then 8 clients churning:
    /// never more than 3 held; the count agreed.
    SemaphoreBound,
    /// The only permit's holder is cut off: the waiter gets it within TTL + slack, after the
    /// holder's `lost()` fired, with a higher token.
    SemaphoreCrashRelease,
    /// For each family primitive the backend has: a request dropped while queued leaves
    /// nothing behind, and the next one is granted promptly.
    FamilyCancel,
    /// A writer cut off while a reader waits, then a reader cut off while a writer waits: each
    /// waiter granted within TTL + slack, after the holder's `lost()` fired, with a higher token.
    RwLostBeforeStolen,
    /// [`Scenario::CrashRelease`] for each family primitive the backend has: a SIGKILLed
    /// process's leadership, write lease or only permit is free within [TTL − drift,
    /// TTL + slack].
    FamilyCrashRelease,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: [Scenario; 40] = [
        Scenario::MutualExclusion,
        Scenario::FencingMonotonic,
        Scenario::FencedResource,
        Scenario::TryAcquireHeld,
        Scenario::WaitTimeout,
        Scenario::Cancel,
        Scenario::Fifo,
        Scenario::Herd,
        Scenario::Renewal,
        Scenario::LostBeforeStolen,
        Scenario::LossTrials,
        Scenario::LostAfterBreak,
        Scenario::ReleaseIdempotent,
        Scenario::Close,
        Scenario::ShortBlip,
        Scenario::ReleaseReplyLost,
        Scenario::CrashRelease,
        Scenario::PausedHolder,
        Scenario::WaiterCrash,
        Scenario::MinorityNodesDown,
        Scenario::MajorityNodesDown,
        Scenario::NameIsolation,
        Scenario::BadInput,
        Scenario::Reentrancy,
        Scenario::SlowGrant,
        Scenario::OneWayDelay,
        Scenario::ServerRestart,
        Scenario::CancelMidEnqueue,
        Scenario::LeaderPartition,
        Scenario::ManyLeasesBreak,
        Scenario::ElectionSingleLeader,
        Scenario::ElectionFailover,
        Scenario::ElectionObserve,
        Scenario::RwExclusion,
        Scenario::RwWriterNotStarved,
        Scenario::SemaphoreBound,
        Scenario::SemaphoreCrashRelease,
        Scenario::FamilyCancel,
        Scenario::RwLostBeforeStolen,
        Scenario::FamilyCrashRelease,
    ];

    /// The scenario's name (also its test function's name).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::MutualExclusion => "mutual_exclusion",
            Scenario::FencingMonotonic => "fencing_monotonic",
            Scenario::FencedResource => "fenced_resource",
            Scenario::TryAcquireHeld => "try_acquire_held",
            Scenario::WaitTimeout => "wait_timeout",
            Scenario::Cancel => "cancel",
            Scenario::Fifo => "fifo",
            Scenario::Herd => "herd",
            Scenario::Renewal => "renewal",
            Scenario::LostBeforeStolen => "lost_before_stolen",
            Scenario::LossTrials => "loss_trials",
            Scenario::LostAfterBreak => "lost_after_break",
            Scenario::ReleaseIdempotent => "release_idempotent",
            Scenario::Close => "close",
            Scenario::ShortBlip => "short_blip",
            Scenario::ReleaseReplyLost => "release_reply_lost",
            Scenario::CrashRelease => "crash_release",
            Scenario::PausedHolder => "paused_holder",
            Scenario::WaiterCrash => "waiter_crash",
            Scenario::MinorityNodesDown => "minority_nodes_down",
            Scenario::MajorityNodesDown => "majority_nodes_down",
            Scenario::NameIsolation => "name_isolation",
            Scenario::BadInput => "bad_input",
            Scenario::Reentrancy => "reentrancy",
            Scenario::SlowGrant => "slow_grant",
            Scenario::OneWayDelay => "one_way_delay",
            Scenario::ServerRestart => "server_restart",
            Scenario::CancelMidEnqueue => "cancel_mid_enqueue",
            Scenario::LeaderPartition => "leader_partition",
            Scenario::ManyLeasesBreak => "many_leases_break",
            Scenario::ElectionSingleLeader => "election_single_leader",
            Scenario::ElectionFailover => "election_failover",
            Scenario::ElectionObserve => "election_observe",
            Scenario::RwExclusion => "rw_exclusion",
            Scenario::RwWriterNotStarved => "rw_writer_not_starved",
            Scenario::SemaphoreBound => "semaphore_bound",
            Scenario::SemaphoreCrashRelease => "semaphore_crash_release",
            Scenario::FamilyCancel => "family_cancel",
            Scenario::RwLostBeforeStolen => "rw_lost_before_stolen",
            Scenario::FamilyCrashRelease => "family_crash_release",
        }
    }

    /// The lease TTL the scenario's clients use.
    pub fn ttl(self) -> Duration {
        match self {
            Scenario::Renewal => Duration::from_secs(1),
            _ => Duration::from_secs(2),
        }
    }
}

/// Why a scenario did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A check failed.
    Fail(String),
    /// The scenario does not apply (capability gate); the reason is printed.
    Skip(String),
}

impl From<dlock_core::Error> for Verdict {
    fn from(e: dlock_core::Error) -> Self {
        Verdict::Fail(format!("unexpected error: {e}"))
    }
}

/// Fails the scenario with a formatted reason unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {{
        let holds: bool = $cond;
        if !holds {
            return Err($crate::scenarios::Verdict::Fail(format!($($fmt)+)));
        }
    }};
}
pub(crate) use ensure;

/// What a scenario works with: the backend, its namespace, its TTL, and the figures it reports.
pub struct Ctx {
    backend: Arc<dyn TestBackend>,
    module: String,
    scenario: Scenario,
    pub(crate) namespace: String,
    fencing: Fencing,
    figures: Mutex<Map<String, Value>>,
}

/// One id per test process, so runs never collide in a shared server.
fn run_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("p{}-{:x}", std::process::id(), nanos % (1 << 40))
    })
}

impl Ctx {
    /// A context for `scenario` against `backend`; `module` is the enrolment's module name
    /// (used to re-execute the test binary for the crash-release holder).
    pub fn new(backend: Arc<dyn TestBackend>, module: &str, scenario: Scenario) -> Ctx {
        let namespace = format!("dlock-test/{}/{}/{}", run_id(), module, scenario.name());
        Ctx {
            backend,
            module: module.to_string(),
            scenario,
            namespace,
            fencing: Fencing::On,
            figures: Mutex::new(Map::new()),
        }
    }

    /// The backend under test.
    pub fn backend(&self) -> &Arc<dyn TestBackend> {
        &self.backend
    }

    /// The scenario's namespace.
    pub fn ns(&self) -> &str {
        &self.namespace
    }

    /// How the scenarios' fenced resources treat tokens ([`Fencing::Off`] only in negative
    /// controls).
    pub fn fencing(&self) -> Fencing {
        self.fencing
    }

    /// The scenario's lease TTL.
    pub fn ttl(&self) -> Duration {
        self.scenario.ttl()
    }

    /// Records a measured figure.
    pub fn figure(&self, key: &str, value: impl Into<Value>) {
        self.figures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), value.into());
    }

    /// Records a duration figure in milliseconds (with µs precision).
    pub fn figure_ms(&self, key: &str, d: Duration) {
        let ms = (d.as_secs_f64() * 1e6).round() / 1e3;
        self.figure(key, ms);
    }

    /// A new client in the scenario's namespace with the scenario's TTL.
    ///
    /// # Errors
    /// [`Verdict::Fail`] when the backend cannot build it.
    pub async fn client(&self) -> Result<Arc<dyn Locker>, Verdict> {
        self.client_with(ClientOptions::new(self.namespace.clone(), self.ttl()))
            .await
    }

    /// A new client with explicit options.
    ///
    /// # Errors
    /// [`Verdict::Fail`] when the backend cannot build it.
    pub async fn client_with(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Verdict> {
        self.backend
            .client(opts)
            .await
            .map_err(|e| Verdict::Fail(format!("cannot build a client: {e}")))
    }

    /// `n` new clients.
    ///
    /// # Errors
    /// As [`Ctx::client`].
    pub async fn clients(&self, n: usize) -> Result<Vec<Arc<dyn Locker>>, Verdict> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.client().await?);
        }
        Ok(out)
    }

    /// What the backend keeps under the namespace right now.
    ///
    /// # Errors
    /// [`Verdict::Fail`] when the server cannot be read.
    pub async fn leftovers(&self) -> Result<Vec<String>, Verdict> {
        self.backend
            .leftovers(&self.namespace)
            .await
            .map_err(|e| Verdict::Fail(format!("leak audit cannot read the server: {e}")))
    }

    /// The capabilities of a fresh client.
    ///
    /// # Errors
    /// As [`Ctx::client`].
    pub async fn capabilities(&self) -> Result<Capabilities, Verdict> {
        Ok(self.client().await?.capabilities())
    }

    /// Records that a part of the scenario could not run, with the reason (listed under the
    /// `skipped_parts` figure; the committed allowlist must name it as `part: <reason>`).
    pub fn skip_part(&self, reason: impl Into<String>) {
        let mut figures = self.figures.lock().unwrap_or_else(|p| p.into_inner());
        let parts = figures
            .entry(crate::report::SKIPPED_PARTS)
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(a) = parts {
            let reason = Value::String(reason.into());
            if !a.contains(&reason) {
                a.push(reason);
            }
        }
    }

    fn take_figures(&self) -> Map<String, Value> {
        std::mem::take(&mut *self.figures.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

async fn dispatch(ctx: &Ctx) -> Result<(), Verdict> {
    match ctx.scenario {
        Scenario::MutualExclusion => exclusion::mutual_exclusion(ctx).await,
        Scenario::FencingMonotonic => exclusion::fencing_monotonic(ctx).await,
        Scenario::FencedResource => exclusion::fenced_resource(ctx).await,
        Scenario::TryAcquireHeld => basic::try_acquire_held(ctx).await,
        Scenario::WaitTimeout => basic::wait_timeout(ctx).await,
        Scenario::Cancel => queue::cancel(ctx).await,
        Scenario::Fifo => queue::fifo(ctx).await,
        Scenario::Herd => herd::herd(ctx).await,
        Scenario::Renewal => lease::renewal(ctx).await,
        Scenario::LostBeforeStolen => lease::lost_before_stolen(ctx).await,
        Scenario::LossTrials => lease::loss_trials(ctx).await,
        Scenario::LostAfterBreak => lease::lost_after_break(ctx).await,
        Scenario::ReleaseIdempotent => basic::release_idempotent(ctx).await,
        Scenario::Close => basic::close(ctx).await,
        Scenario::ShortBlip => network::short_blip(ctx).await,
        Scenario::ReleaseReplyLost => network::release_reply_lost(ctx).await,
        Scenario::CrashRelease => crash::crash_release(ctx).await,
        Scenario::PausedHolder => crash::paused_holder(ctx).await,
        Scenario::WaiterCrash => crash::waiter_crash(ctx).await,
        Scenario::MinorityNodesDown => nodes::minority_nodes_down(ctx).await,
        Scenario::MajorityNodesDown => nodes::majority_nodes_down(ctx).await,
        Scenario::NameIsolation => basic::name_isolation(ctx).await,
        Scenario::BadInput => basic::bad_input(ctx).await,
        Scenario::Reentrancy => basic::reentrancy(ctx).await,
        Scenario::SlowGrant => slow::slow_grant(ctx).await,
        Scenario::OneWayDelay => slow::one_way_delay(ctx).await,
        Scenario::ServerRestart => restart::server_restart(ctx).await,
        Scenario::CancelMidEnqueue => enqueue::cancel_mid_enqueue(ctx).await,
        Scenario::LeaderPartition => partition::leader_partition(ctx).await,
        Scenario::ManyLeasesBreak => many::many_leases_break(ctx).await,
        Scenario::ElectionSingleLeader => election::election_single_leader(ctx).await,
        Scenario::ElectionFailover => election::election_failover(ctx).await,
        Scenario::ElectionObserve => election::election_observe(ctx).await,
        Scenario::RwExclusion => family::rw_exclusion(ctx).await,
        Scenario::RwWriterNotStarved => family::rw_writer_not_starved(ctx).await,
        Scenario::SemaphoreBound => family::semaphore_bound(ctx).await,
        Scenario::SemaphoreCrashRelease => family::semaphore_crash_release(ctx).await,
        Scenario::FamilyCancel => family::family_cancel(ctx).await,
        Scenario::RwLostBeforeStolen => family::rw_lost_before_stolen(ctx).await,
        Scenario::FamilyCrashRelease => crash::family_crash_release(ctx).await,
    }
}

/// The longest a scenario may run before it fails as hung.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(150);

/// Runs one scenario against `backend` on a runtime of its own, then audits the namespace for
/// leftovers (waiting up to 2 × TTL + 1 s for expiries), and returns its row. Never panics on a
/// scenario failure: panics inside the scenario become a failed row.
pub fn run(backend: Arc<dyn TestBackend>, module: &str, scenario: Scenario) -> Row {
    run_control(backend, module, scenario, Fencing::On)
}

/// [`run`] with the workload scenarios' fenced resource in mode `fencing`: with
/// [`Fencing::Off`] (a negative control) the fenced-safety checker must fire whenever a stale
/// holder writes.
pub fn run_control(
    backend: Arc<dyn TestBackend>,
    module: &str,
    scenario: Scenario,
    fencing: Fencing,
) -> Row {
    run_with(backend, module, scenario, fencing, None)
}

/// [`run_control`] that first checks a fresh client's capabilities against the enrolment's
/// `declared` table (a mismatch fails the row before the scenario runs).
pub fn run_with(
    backend: Arc<dyn TestBackend>,
    module: &str,
    scenario: Scenario,
    fencing: Fencing,
    declared: Option<Declared>,
) -> Row {
    let name = backend.name().to_string();
    let mut ctx = Ctx::new(backend, module, scenario);
    ctx.fencing = fencing;
    let ctx = Arc::new(ctx);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return row(
                &name,
                scenario,
                Status::Fail,
                format!("cannot build a runtime: {e}"),
                Map::new(),
            );
        }
    };
    let c = Arc::clone(&ctx);
    let outcome = runtime.block_on(async move {
        let task = tokio::spawn(async move {
            if let Some(declared) = declared {
                check_declared(&c, &declared).await?;
            }
            let result = dispatch(&c).await;
            if result.is_ok() {
                audit(&c).await
            } else {
                result
            }
        });
        match tokio::time::timeout(SCENARIO_TIMEOUT, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(Verdict::Fail(format!(
                "panicked: {}",
                panic_message(join.into_panic())
            ))),
            Err(_) => Err(Verdict::Fail(format!(
                "did not finish within {SCENARIO_TIMEOUT:?}"
            ))),
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    let figures = ctx.take_figures();
    match outcome {
        Ok(()) => row(&name, scenario, Status::Pass, String::new(), figures),
        Err(Verdict::Fail(reason)) => row(&name, scenario, Status::Fail, reason, figures),
        Err(Verdict::Skip(reason)) => row(&name, scenario, Status::Skip, reason, figures),
    }
}

/// A fresh client reports exactly the capabilities the enrolment declared.
async fn check_declared(ctx: &Ctx, declared: &Declared) -> Result<(), Verdict> {
    let caps = ctx.capabilities().await?;
    let wrong = declared.mismatches(&caps);
    ensure!(
        wrong.is_empty(),
        "the backend's capabilities differ from the table its enrolment declares: {}",
        wrong.join(", ")
    );
    Ok(())
}

/// Every scenario leaves nothing behind once its leases are released or expired.
async fn audit(ctx: &Ctx) -> Result<(), Verdict> {
    let bound = ctx.ttl() * 2 + Duration::from_secs(1);
    let began = tokio::time::Instant::now();
    loop {
        let left = ctx.leftovers().await?;
        if left.is_empty() {
            return Ok(());
        }
        if began.elapsed() >= bound {
            return Err(Verdict::Fail(format!(
                "leak audit: {} entries still under {} {bound:?} after the scenario: {left:?}",
                left.len(),
                ctx.ns()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn row(
    backend: &str,
    scenario: Scenario,
    status: Status,
    reason: String,
    figures: Map<String, Value>,
) -> Row {
    Row {
        backend: backend.to_string(),
        scenario: scenario.name().to_string(),
        status,
        reason,
        figures,
    }
}

pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<crate::SkipBackend>() {
        s.0.clone()
    } else {
        "a non-string panic".to_string()
    }
}
