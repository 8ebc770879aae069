//! Every checker is proven able to fail: deliberately broken memory backends fail the matching
//! scenario (and the honest memory backend passes it, in tests/memory.rs).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::memory::MemoryBackend;
use dlock_conformance::scenarios::Fencing;
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_conformance::{ClientOptions, Row, Scenario, Status, TestBackend, scenarios};
use dlock_core::memory::Defect;
use dlock_core::{
    AcquireOptions, Capabilities, Error, FencingToken, Lease, LockName, LockState, Locker,
    MemoryLocker, MemoryServer, Stats,
};
use support::{assert_caught, in_process, reason, run_printed};

mod support;

fn run(backend: impl TestBackend, scenario: Scenario) -> Row {
    run_printed(Arc::new(backend), "checkers", scenario)
}

#[test]
fn claiming_primitives_it_lacks_fails_family_cancel() {
    let row = run(
        Wrapped::new(MemoryBackend::new(), Twist::ClaimFamily),
        Scenario::FamilyCancel,
    );
    assert_caught(
        &row,
        &["Capabilities::primitives says true, but the backend lacks it"],
    );
}

#[test]
fn late_loss_fails_lost_before_stolen() {
    // The server lets go 50 ms before the lease's promised deadline: the contender is
    // granted before it.
    let row = run(
        MemoryBackend::with_defect(Defect::LateLoss),
        Scenario::LostBeforeStolen,
    );
    assert_caught(&row, &["BEFORE the cut-off holder's lost() was due"]);
}

#[test]
fn a_handoff_deadline_counted_from_the_wake_fails_handoff_lost_before_stolen() {
    // Only a waiter's grant over-promises: the scenario that cuts a lease taken on a free name
    // passes, the one that cuts a handed-over lease at once does not.
    let backend = || MemoryBackend::with_defect(Defect::HandoffFromWake);
    let free = run(backend(), Scenario::LostBeforeStolen);
    assert_eq!(free.status, Status::Pass, "{}", free.summary());
    let row = run(backend(), Scenario::HandoffLostBeforeStolen);
    assert_caught(&row, &["BEFORE the cut-off holder's lost() was due"]);
}

#[test]
fn early_expiry_fails_loss_trials() {
    let row = run(
        MemoryBackend::with_defect(Defect::EarlyExpiry),
        Scenario::LossTrials,
    );
    assert_caught(&row, &["trials failed"]);
    assert_eq!(
        row.figures.get("violations").and_then(|v| v.as_u64()),
        Some(20),
        "{}",
        row.summary()
    );
}

#[test]
fn lifo_fails_fifo() {
    // The LIFO memory variant grants newest-first; it may also stall (it wakes the head, which
    // may not go): either way the FIFO checker must fail it.
    let row = run(MemoryBackend::with_defect(Defect::Lifo), Scenario::Fifo);
    assert_eq!(
        row.status,
        Status::Fail,
        "the broken backend passed: {}",
        row.summary()
    );
    assert!(
        row.reason.contains("out of enqueue order") || row.reason.contains("waiter 0"),
        "{}",
        row.reason
    );
}

#[test]
fn wake_all_is_not_claimed_herd_free_and_skips() {
    // Honest capabilities: a wake-all backend does not claim herd-freedom, so herd is skipped
    // with a reason.
    let row = run(MemoryBackend::with_defect(Defect::WakeAll), Scenario::Herd);
    assert_eq!(row.status, Status::Skip, "{}", row.summary());
    assert!(row.reason.contains("herd-free"), "{}", row.reason);
}

#[test]
fn wake_all_claiming_herd_free_fails_herd() {
    let row = run(
        Wrapped::new(
            MemoryBackend::with_defect(Defect::WakeAll),
            Twist::ClaimHerdFree,
        ),
        Scenario::Herd,
    );
    assert_caught(&row, &["wakes more than one waiter"]);
    assert!(
        row.figures.contains_key("wakeups_per_release_n8"),
        "{}",
        row.summary()
    );
}

/// A waiter that reads the queue an entry at a time after each wake-up: one wake-up per
/// release, but up to five more requests per handoff. Under the old bound (2 × r1 + 6) it
/// passed at every N; herd at one (r1 + 1) catches it.
#[test]
fn reading_the_queue_per_wakeup_fails_the_herd_request_bound() {
    let row = run(
        MemoryBackend::with_defect(Defect::PagedQueueRead),
        Scenario::Herd,
    );
    assert_caught(&row, &["requests per handoff"]);
    assert!(row.reason.contains("not flat"), "{}", row.reason);
    let fig = |k: &str| row.figures.get(k).and_then(|v| v.as_f64());
    let r1 = fig("requests_per_handoff_n1").expect("the single-waiter figure");
    let r8 = fig("requests_per_handoff_n8").expect("the 8-waiter figure");
    assert!(
        r8 > r1 + 1.0 && r8 <= 2.0 * r1 + 6.0,
        "the defect sits between the new and the old bound: {}",
        row.summary()
    );
    assert_eq!(
        fig("wakeups_per_release_n8"),
        Some(1.0),
        "{}",
        row.summary()
    );
}

#[test]
fn leaking_waiters_fail_the_leak_audits() {
    for s in [
        Scenario::WaitTimeout,
        Scenario::TryAcquireHeld,
        Scenario::Cancel,
    ] {
        let row = run(Wrapped::new(MemoryBackend::new(), Twist::LeakOnFailure), s);
        assert_caught(&row, &["left entries behind"]);
    }
}

/// One test per checker that a broken backend must fail with the quoted reason.
macro_rules! caught {
    ($($(#[$doc:meta])* $test:ident: $backend:expr, $scenario:ident, $why:literal;)*) => {
        $(
            $(#[$doc])*
            #[test]
            fn $test() {
                assert_caught(&run($backend, Scenario::$scenario), &[$why]);
            }
        )*
    };
}

caught! {
    no_fencing_fails_token_monotonicity:
        MemoryBackend::with_defect(Defect::NoFencing), FencingMonotonic, "was granted after token";
    no_fencing_fails_the_fenced_resource:
        MemoryBackend::with_defect(Defect::NoFencing), FencedResource, "stale holder's write";
    unguarded_release_fails_release_retry:
        MemoryBackend::with_defect(Defect::UnguardedRelease), ReleaseIdempotent,
        "deleted the newer holder's lock";
    early_expiry_fails_lost_before_stolen:
        MemoryBackend::with_defect(Defect::EarlyExpiry), LostBeforeStolen,
        "BEFORE the cut-off holder's lost() was due";
    /// Two wake-ups per release (the head and the waiter behind it) passed the old bound of two;
    /// herd at one catches it.
    waking_two_per_release_fails_herd:
        MemoryBackend::with_defect(Defect::WakeTwo), Herd, "wakes more than one waiter";
    split_brain_fails_mutual_exclusion: SplitBrain, MutualExclusion, "overlapping holds";
    colliding_names_fail_name_isolation:
        Wrapped::new(MemoryBackend::new(), Twist::FirstCharOnly), NameIsolation, "blocks";
    accepting_a_zero_ttl_fails_bad_input:
        Wrapped::new(MemoryBackend::new(), Twist::ClampTtl), BadInput, "TTL";
    a_lease_that_is_never_lost_fails_lost_after_break:
        Wrapped::new(MemoryBackend::new(), Twist::NeverBreak), LostAfterBreak, "did not fire";
    one_lost_lease_failing_its_whole_renewal_round_fails_many_leases_break:
        MemoryBackend::with_defect(Defect::BatchLoss), ManyLeasesBreak,
        "other leases were lost after one of 1000 was broken";
}

// ---- broken backends built from the memory backend ----

/// Every client locks against a server of its own: no exclusion at all.
struct SplitBrain;

in_process!(holds_nothing SplitBrain {
    fn name(&self) -> &str {
        "memory-split-brain"
    }
    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Ok(Arc::new(
            MemoryLocker::builder()
                .ttl(opts.ttl)
                .server(MemoryServer::new())
                .build()?,
        ))
    }
});

#[derive(Clone, Copy, PartialEq, Eq)]
enum Twist {
    /// Claims herd-freedom it does not have.
    ClaimHerdFree,
    /// Locks only the first character of each name (`a`, `a/b`, `ab` collide).
    FirstCharOnly,
    /// Clamps bad TTLs to a valid one instead of rejecting them.
    ClampTtl,
    /// The leak hook reports a phantom entry after any failed or cancelled attempt.
    LeakOnFailure,
    /// break_holder does nothing.
    NeverBreak,
    /// break_holder deletes, then reports an error (the victim is unknown to the caller).
    BreakErrs,
    /// break_holder takes 50 ms (opening a session) before the memory backend's delete.
    SlowBreak,
    /// Claims the memory locker's primitives (election, read-write lock, semaphore), but
    /// offers none of them (`Wrapped` never overrides `TestBackend::election` and the rest).
    ClaimFamily,
}

struct Wrapped {
    inner: MemoryBackend,
    twist: Twist,
    leaked: Arc<std::sync::atomic::AtomicBool>,
}

impl Wrapped {
    fn new(inner: MemoryBackend, twist: Twist) -> Self {
        Wrapped {
            inner,
            twist,
            leaked: Arc::default(),
        }
    }
}

in_process!(Wrapped {
    fn name(&self) -> &str {
        "memory-wrapped"
    }
    async fn client(&self, mut opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        if self.twist == Twist::ClampTtl {
            opts.ttl = opts
                .ttl
                .clamp(Duration::from_millis(100), Duration::from_secs(3600));
        }
        let inner = self.inner.client(opts).await?;
        Ok(Arc::new(Twisted {
            inner,
            twist: self.twist,
            leaked: Arc::clone(&self.leaked),
        }))
    }
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let mut left = self.inner.leftovers(namespace).await?;
        if self.leaked.load(std::sync::atomic::Ordering::SeqCst) {
            left.push("phantom:leaked-waiter".into());
        }
        Ok(left)
    }
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error> {
        if self.twist == Twist::NeverBreak {
            return Ok(Some(Vec::new()));
        }
        if self.twist == Twist::SlowBreak {
            tokio::time::sleep(SESSION_OPENING).await;
        }
        let broke = self.inner.break_holder(namespace, name).await;
        if self.twist == Twist::BreakErrs {
            return Err(Error::Backend {
                message: format!("the break's reply was lost ({:?})", broke.is_ok()),
                source: None,
            });
        }
        broke
    }
});

struct Twisted {
    inner: Arc<dyn Locker>,
    twist: Twist,
    leaked: Arc<std::sync::atomic::AtomicBool>,
}

impl Twisted {
    fn map(&self, name: &LockName) -> Result<LockName, Error> {
        if self.twist == Twist::FirstCharOnly {
            return LockName::new(&name.as_str()[..1]);
        }
        Ok(name.clone())
    }

    fn leak(&self) {
        if self.twist == Twist::LeakOnFailure {
            self.leaked.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// Marks a leak when an acquire future is dropped before it finished.
struct LeakOnDrop<'a>(&'a Twisted, bool);

impl Drop for LeakOnDrop<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.leak();
        }
    }
}

#[async_trait]
impl Locker for Twisted {
    async fn acquire(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        let mut guard = LeakOnDrop(self, false);
        let got = self.inner.acquire(&self.map(name)?, opts).await;
        guard.1 = got.is_ok();
        got
    }

    async fn try_acquire(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        let got = self.inner.try_acquire(&self.map(name)?).await?;
        if got.is_none() {
            self.leak();
        }
        Ok(got)
    }

    fn ttl(&self) -> Duration {
        self.inner.ttl()
    }

    async fn close(&self) -> Result<(), Error> {
        self.inner.close().await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState, Error> {
        self.inner.inspect(&self.map(name)?).await
    }

    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.capabilities();
        if self.twist == Twist::ClaimHerdFree {
            caps.with_fair_queue(true, true)
        } else {
            caps
        }
    }

    fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

// ---- negative controls of the server-node fault scenarios ----

/// Claims a 5-node Redis topology and, over any private cluster, hands out a memory backend
/// (optionally broken): the node-fault scenarios then really kill and pause Redis nodes while
/// the workload runs on the memory backend, so the scenario's checkers meet a known defect.
struct Pretend {
    defect: Option<Defect>,
}

in_process!(holds_nothing Pretend {
    fn name(&self) -> &str {
        "memory-pretend-cluster"
    }
    async fn client(&self, _opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Err(Error::unavailable(
            "only the private-cluster backend serves clients",
            None,
        ))
    }
    fn topology(&self) -> Option<(ServerKind, usize)> {
        Some((ServerKind::Redis, 5))
    }
    fn on_cluster(&self, _cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        Some(Arc::new(match self.defect {
            Some(d) => MemoryBackend::with_defect(d),
            None => MemoryBackend::new(),
        }))
    }
});

fn redis_installed() -> bool {
    match Cluster::shared(ServerKind::Redis, 1) {
        Ok(_) => true,
        Err(e) if e.may_skip() => {
            println!("skipped: {e}");
            false
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn node_faults_pass_on_the_honest_memory_backend() {
    if !redis_installed() {
        return;
    }
    let row = run(Pretend { defect: None }, Scenario::MinorityNodesDown);
    assert_eq!(row.status, Status::Pass, "{}", row.summary());
    assert!(
        row.figures.get("grants").and_then(|v| v.as_u64()) > Some(0),
        "{}",
        row.summary()
    );
}

#[test]
fn node_faults_with_an_unfenced_resource_fail_fenced_safety() {
    if !redis_installed() {
        return;
    }
    let row = scenarios::run_control(
        Arc::new(Pretend { defect: None }),
        "checkers",
        Scenario::MinorityNodesDown,
        Fencing::Off,
    );
    println!("{}", row.summary());
    assert_caught(&row, &["fenced-safety violation"]);
}

#[test]
fn node_faults_with_early_expiry_fail_belief_overlap() {
    if !redis_installed() {
        return;
    }
    let row = run(
        Pretend {
            defect: Some(Defect::EarlyExpiry),
        },
        Scenario::MinorityNodesDown,
    );
    assert_caught(&row, &["belief overlap"]);
}

#[test]
fn node_faults_skip_with_a_reason_without_a_topology() {
    for s in [Scenario::MinorityNodesDown, Scenario::MajorityNodesDown] {
        let row = run(MemoryBackend::new(), s);
        assert_eq!(row.status, Status::Skip, "{}", row.summary());
        assert!(row.reason.contains("topology"), "{}", row.reason);
    }
}

#[test]
fn majority_down_fails_a_backend_that_ignores_the_dead_nodes() {
    // The memory backend keeps granting with 3 of 5 Redis nodes dead: the scenario must fail.
    if !redis_installed() {
        return;
    }
    let row = run(Pretend { defect: None }, Scenario::MajorityNodesDown);
    assert_caught(&row, &["SUCCEEDED"]);
}

// ---- the soak's checkers ----

/// The soak of `secs` seconds (seed 11) on `backend`; a failure as its reason.
fn soak(backend: impl TestBackend, secs: u64, fencing: Fencing) -> Result<String, String> {
    dlock_conformance::soak::run(
        Arc::new(backend),
        "checkers",
        Duration::from_secs(secs),
        11,
        fencing,
    )
    .map_err(reason)
}

#[test]
fn the_soak_passes_the_honest_memory_backend() {
    let out = soak(MemoryBackend::new(), 8, Fencing::On)
        .expect("the honest memory backend passes the soak");
    for zero in [
        "break_errors=0",
        "promise_violations=0",
        "belief_overlaps=0",
        "token_violations=0",
        "fenced_violations=0",
    ] {
        assert!(out.contains(zero), "{out}");
    }
    assert!(
        !out.contains("forced_breaks=0 "),
        "the breaks are recorded: {out}"
    );
}

#[test]
fn the_soak_with_an_unfenced_resource_reports_the_violation() {
    let why = soak(MemoryBackend::new(), 8, Fencing::Off)
        .expect_err("stale writes reach an unfenced resource");
    assert!(why.contains("fenced-safety violation"), "{why}");
}

// ---- negative controls of the promise, token and fenced-safety checkers ----

/// A soak without nemeses in which EVERY holder stalls (renewal stopped right after its grant,
/// writes go on for 1.5 × TTL): each hold ends in a takeover at the server's expiry, which only
/// the lease's promised deadline can judge.
fn stalling_soak(backend: MemoryBackend) -> Result<String, String> {
    stalling_soak_with(backend, Fencing::On)
}

fn stalling_soak_with(backend: MemoryBackend, fencing: Fencing) -> Result<String, String> {
    let mut plan = dlock_conformance::soak::SoakPlan::new(Duration::from_secs(6), 5);
    plan.fencing = fencing;
    plan.stall_chance = 1.0;
    plan.nemeses = false;
    let out = dlock_conformance::soak::run_plan(Arc::new(backend), "checkers", &plan);
    println!("{out:?}");
    out.map_err(reason)
}

fn caught_by(defect: Defect, needles: &[&str]) {
    let why = stalling_soak(MemoryBackend::with_defect(defect))
        .expect_err("the broken backend passed the stalling soak");
    for needle in needles {
        assert!(
            why.contains(needle),
            "{defect:?} not caught by {needle:?}: {why}"
        );
    }
}

#[test]
fn stalling_holders_pass_every_checker_on_the_honest_memory_backend() {
    let out = stalling_soak(MemoryBackend::new()).expect("the honest backend keeps its promise");
    assert!(out.contains("promise_violations=0"), "{out}");
    assert!(!out.contains(" stalls=0 "), "no holder stalled: {out}");
}

#[test]
fn deadline_counted_from_the_reply_is_caught_by_the_promise_check() {
    caught_by(Defect::DeadlineFromReply, &["promise violation"]);
}

#[test]
fn an_expiry_50ms_before_the_deadline_is_caught_by_the_promise_check() {
    caught_by(Defect::LateLoss, &["promise violation"]);
}

#[test]
fn a_regrant_that_does_not_rearm_the_ttl_is_caught_by_the_promise_check() {
    caught_by(Defect::StaleRegrant, &["promise violation"]);
}

#[test]
fn a_reused_token_is_caught_by_the_token_and_fenced_safety_checks() {
    // The fenced resource (FenceGuard) accepts the equal token of the superseded holder; the
    // fenced-safety checker judges writes by grant order, not by the guard's rule, so it fires.
    caught_by(
        Defect::ReusedToken,
        &["token violation", "fenced-safety violation"],
    );
}

#[test]
fn many_leases_break_passes_on_the_honest_memory_backend() {
    let row = run(MemoryBackend::new(), Scenario::ManyLeasesBreak);
    assert_eq!(row.status, Status::Pass, "{}", row.summary());
}

// ---- negative controls of the independent fenced-resource model ----

#[test]
fn the_fenced_model_agrees_with_the_guard_on_the_honest_memory_backend() {
    let out = stalling_soak(MemoryBackend::new()).expect("the honest backend passes");
    for zero in [
        "fenced_violations=0",
        "stale_writes_accepted=0",
        "current_writes_rejected=0",
    ] {
        assert!(out.contains(zero), "{out}");
    }
    // The stalled holders' writes were offered and refused: the model had something to judge.
    assert!(!out.contains(" ops_rejected=0 "), "{out}");
}

#[test]
fn a_guard_that_accepts_a_lower_token_fails_the_fenced_model() {
    let why = stalling_soak_with(MemoryBackend::new(), Fencing::Lax)
        .expect_err("an off-by-one guard passed the stalling soak");
    assert!(why.contains("fenced-safety violation"), "{why}");
    assert!(why.contains("stale_writes_accepted="), "{why}");
    assert!(!why.contains("stale_writes_accepted=0 "), "{why}");
}

#[test]
fn a_lower_token_for_a_later_grant_fails_the_fenced_model() {
    // Ordered by token, the later holder looks like the earlier one and the guard's verdicts
    // look right; the model orders holds by real-time grant and sees both wrong outcomes.
    let why = stalling_soak(MemoryBackend::with_defect(Defect::LowerTokenAfterLapse))
        .expect_err("a backend handing a lower token to a later grant passed");
    assert!(why.contains("fenced-safety violation"), "{why}");
    assert!(!why.contains("current_writes_rejected=0 "), "{why}");
}

// ---- exact breaks ----

/// Breaks whose outcome is unknown (the call failed after deleting) are attributed by timing,
/// which can excuse more than they hit: counted, and the soak fails above one in
/// `BREAKS_PER_ERROR`.
#[test]
fn failing_breaks_fail_the_soak_above_the_bound() {
    let why = soak(
        Wrapped::new(MemoryBackend::new(), Twist::BreakErrs),
        6,
        Fencing::On,
    )
    .expect_err("every break failed");
    assert!(why.contains("break errors:"), "{why}");
    assert!(why.contains("at most one in 20, rounded up"), "{why}");
}

/// How long [`Twist::SlowBreak`] takes before deleting.
const SESSION_OPENING: Duration = Duration::from_millis(50);

/// A break is dated from the backend's mark right before its delete, not from the call: the
/// 50 ms the break spent opening its session cannot excuse a grant made meanwhile.
#[test]
fn a_recorded_break_is_dated_from_the_delete_not_the_call() {
    use dlock_conformance::history::{History, Kind, break_recorded};
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(async {
        let backend = Wrapped::new(MemoryBackend::new(), Twist::SlowBreak);
        let lock = LockName::new("dated").expect("a valid name");
        let client = backend
            .client(ClientOptions::new("dated", Duration::from_secs(2)))
            .await
            .expect("a client");
        let lease = client
            .acquire(&lock, AcquireOptions::wait(Duration::from_secs(1)))
            .await
            .expect("granted");
        let history = History::new();
        let called = std::time::Instant::now();
        let hit = break_recorded(&history, &backend, "dated", &lock)
            .await
            .expect("the break");
        assert_eq!(hit, Some(vec![lease.token()]));
        let breaks: Vec<_> = history
            .events()
            .into_iter()
            .filter(|e| e.kind == Kind::Break)
            .collect();
        assert_eq!(breaks.len(), 1, "{breaks:?}");
        assert_eq!(breaks[0].token, lease.token());
        assert!(
            breaks[0].at >= called + SESSION_OPENING,
            "dated {:?} after the call",
            breaks[0].at - called
        );
        assert_eq!(history.break_errors(), 0);
        drop(lease);
    });
}
