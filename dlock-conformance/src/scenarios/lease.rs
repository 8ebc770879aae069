//! Lease life: renewal past many TTLs, loss announced before the lock can be stolen.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{AcquireOptions, FencingStrength, Lease, LockName, Locker, LossReason};
use tokio::time::Instant;

use super::util::{break_holder, name, spawn_timed, via_proxies, within};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;
use crate::faults::Mode;
use crate::history::{Event, History, Kind};

/// Scheduling allowance on top of a deadline when checking that `lost()` fired in time.
const SCHED: Duration = Duration::from_millis(250);

/// A lease stays held (same token, not lost) for more than 5 × TTL while a contender's
/// try_acquire keeps failing.
pub(crate) async fn renewal(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let lock = name("renewed")?;
    let ttl = ctx.ttl();
    let la = a.acquire(&lock, AcquireOptions::wait(ttl)).await?;
    let token = la.token();
    let renewals = a.stats().renewals;
    let began = Instant::now();
    let mut attempts = 0;
    while began.elapsed() < ttl * 5 + ttl / 2 {
        tokio::time::sleep(ttl / 4).await;
        attempts += 1;
        let stolen = b.try_acquire(&lock).await?;
        let at = began.elapsed();
        ensure!(
            stolen.is_none(),
            "a contender got the lock {at:?} into a renewed hold (TTL {ttl:?})"
        );
        if let Err(e) = la.check() {
            return Err(Verdict::Fail(format!(
                "the renewed lease was lost {at:?} into the hold: {e}"
            )));
        }
    }
    ctx.figure_ms("held_ms", began.elapsed());
    ctx.figure("contender_attempts", attempts);
    ctx.figure("renewal_rounds", a.stats().renewals - renewals);
    ensure!(la.token() == token, "the token changed during renewal");
    la.release().await?;
    let lb = b.try_acquire(&lock).await?;
    ensure!(
        lb.is_some(),
        "the lock was not free after the renewed lease was released"
    );
    if let Some(lb) = lb {
        lb.release().await?;
    }
    Ok(())
}

/// What one cut trial measured.
struct Trial {
    cut: &'static str,
    reason: String,
    detect: Duration,
    contender_after: Duration,
    /// Contender's grant minus the holder's `lost()`, as their tasks recorded them.
    margin_ms: f64,
    /// Contender's grant minus the holder's promised deadline; negative is a violation.
    promise_margin_ms: f64,
    /// The holder's `lost()` (as the task awaiting it saw it resolve) minus its promised
    /// deadline: negative is early, as it must be; positive means the lease was reported held
    /// past the instant the server could grant the lock to someone else.
    lost_vs_deadline_ms: f64,
    /// When the holder's `lost()` resolved.
    lost_t: Instant,
    /// When the core declared the lease lost (its loss timer fired): `lost()` resolvable.
    declared_t: Instant,
    /// The holder's latest promised deadline.
    deadline: Instant,
    /// The loss margin the contract asks of this lease: [`loss_margin`] of the TTL its
    /// deadlines are counted with (not the margin it aims with: that is what is judged).
    ///
    /// [`loss_margin`]: dlock_core::backend::loss_margin
    margin: Duration,
}

impl Trial {
    /// How late a [`Ticker`] in the same runtime woke, at most, in the [`STALL_WINDOW`] before
    /// `lost()` resolved: the process's own scheduling delay at that moment.
    fn runtime_lag(&self, ticker: &Ticker) -> Duration {
        ticker.max_lag(self.lost_t.checked_sub(STALL_WINDOW), self.lost_t)
    }
}

/// The period of [`Ticker`].
const TICK: Duration = Duration::from_millis(5);
/// How far back from `lost()` resolving the ticker's lag is looked at.
const STALL_WINDOW: Duration = Duration::from_millis(300);

/// A task in the scenario's runtime that wakes every [`TICK`] and records how late it woke:
/// when `lost()` resolves after the deadline, whether the whole process or runtime stalled.
struct Ticker {
    samples: Arc<Mutex<Vec<(Instant, Duration)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Ticker {
    fn start() -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&samples);
        let task = tokio::spawn(async move {
            loop {
                let due = Instant::now() + TICK;
                tokio::time::sleep_until(due).await;
                let now = Instant::now();
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((now, now.saturating_duration_since(due)));
            }
        });
        Ticker { samples, task }
    }

    /// The largest lag of a wake-up between `from` (or the start) and `to`.
    fn max_lag(&self, from: Option<Instant>, to: Instant) -> Duration {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples
            .iter()
            .filter(|(at, _)| from.is_none_or(|f| *at >= f) && *at <= to + TICK)
            .map(|(_, lag)| *lag)
            .max()
            .unwrap_or_default()
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `t` minus `reference` in milliseconds, negative when `t` came first.
fn ms_after(t: Instant, reference: Instant) -> f64 {
    (t.saturating_duration_since(reference).as_secs_f64()
        - reference.saturating_duration_since(t).as_secs_f64())
        * 1e3
}

/// Milliseconds rounded to the microsecond, for figures.
fn us_round(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}

/// How the holder of a cut trial came by its lease, and when the cut falls.
#[derive(Clone, Copy)]
enum Arrival {
    /// Acquired on a free name; cut after one renewal round, in the lease's steady state.
    Steady,
    /// Queued behind another holder and granted by its release (the handoff path: a direct
    /// grant, a grant on the wait's own earlier proof); cut as soon as the acquire returns,
    /// so the grant's own deadline is the one judged.
    Handoff,
}

/// Queues `holder` on `lock` behind a lease of `first`'s, releases that lease, and returns
/// the lease the release hands to `holder`.
async fn handed_over(
    ctx: &Ctx,
    first: &Arc<dyn Locker>,
    holder: &Arc<dyn Locker>,
    lock: &LockName,
) -> Result<Lease, Verdict> {
    let ttl = ctx.ttl();
    let before = first.acquire(lock, AcquireOptions::wait(ttl * 2)).await?;
    let (h, l) = (Arc::clone(holder), lock.clone());
    let mut queued =
        tokio::spawn(async move { h.acquire(&l, AcquireOptions::wait(ttl * 4)).await });
    // Release only once the wait is queued (where the backend keeps a queue; elsewhere after
    // TTL/20), so the grant comes from the release.
    let began = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        ensure!(
            !queued.is_finished(),
            "the waiter's acquire ended while the first holder still held the lock"
        );
        match first.inspect(lock).await?.waiting {
            Some(1) => break,
            None if began.elapsed() >= ttl / 20 => break,
            _ => ensure!(
                began.elapsed() < ttl,
                "the waiter did not show in the queue within {ttl:?}"
            ),
        }
    }
    before.release().await?;
    let got = within(ttl * 2, &mut queued).await.ok_or_else(|| {
        queued.abort();
        Verdict::Fail(format!(
            "the waiter was not granted within {:?} of the release",
            ttl * 2
        ))
    })?;
    Ok(got.map_err(|e| Verdict::Fail(format!("the waiter's task panicked: {e}")))??)
}

/// One trial: the holder's connection is cut (blackholed through a proxy per node; in-process
/// backends stop its renewal instead) while a contender waits.
async fn cut_trial(ctx: &Ctx, lock: LockName, arrival: Arrival) -> Result<Trial, Verdict> {
    let ttl = ctx.ttl();
    let (proxies, opts) = via_proxies(
        &ctx.backend().node_addrs(),
        ClientOptions::new(ctx.ns(), ttl),
    )?;
    let holder = ctx.client_with(opts).await?;
    let contender = ctx.client().await?;
    let slack = ctx.crash_slack(&contender.capabilities());
    let lease = match arrival {
        Arrival::Steady => holder.acquire(&lock, AcquireOptions::wait(ttl * 2)).await?,
        Arrival::Handoff => handed_over(ctx, &contender, &holder, &lock).await?,
    };
    let history = History::new();
    history.grant_until(0, lease.token(), lease.deadline().into_std());
    if let Arrival::Steady = arrival {
        // Let one renewal round pass so the cut hits a lease in its steady state.
        tokio::time::sleep(ttl / 2).await;
    }
    ensure!(lease.check().is_ok(), "the lease was lost before the cut");
    let lost = lease.lost();
    let cut = Instant::now();
    let how = if proxies.is_empty() {
        lease.stop_renewal_for_test();
        "renewal stopped in-process"
    } else {
        proxies.iter().for_each(|p| p.set(Mode::Blackhole));
        "blackholed proxy"
    };
    // The instant `lost()` resolved, as the task awaiting it saw it: its own scheduling delay
    // counts (a user's task sees the same).
    let lost_at = spawn_timed(lost);
    let l2 = lock.clone();
    let stolen_at =
        spawn_timed(async move { contender.acquire(&l2, AcquireOptions::wait(ttl * 4)).await });
    let lost = within(ttl * 5, lost_at).await;
    let declared = lease.lost_declared_at_for_test();
    let margin = dlock_core::backend::loss_margin(lease.renewal_ttl_for_test().unwrap_or(ttl));
    let stolen = within(ttl * 5, stolen_at).await;
    // Drop what the cut held back (as a real partition's timeouts would).
    proxies.iter().for_each(|p| p.set(Mode::Reset));
    // The latest promise: a lost lease keeps the last deadline it had.
    let promised = lease.deadline();
    history.promise(0, lease.token(), promised.into_std());
    let Some(Ok((lost_t, reason))) = lost else {
        return Err(Verdict::Fail(
            "lost() never fired after the holder was cut off".into(),
        ));
    };
    ensure!(
        reason != LossReason::Released,
        "lost() reported a release, not a loss"
    );
    let Some(declared_t) = declared else {
        return Err(Verdict::Fail(
            "lost() resolved, yet the core recorded no instant the lease was declared lost".into(),
        ));
    };
    let Some(Ok((stolen_t, got))) = stolen else {
        return Err(Verdict::Fail(
            "the contender's acquire never returned".into(),
        ));
    };
    let got = got.map_err(|e| {
        Verdict::Fail(format!(
            "the contender never got the lock after the holder was cut off: {e}"
        ))
    })?;
    // The contender's grant as it was when its reply arrived (recorded at `stolen_t`).
    history.push(Event {
        client: 1,
        kind: Kind::Grant,
        token: got.token(),
        at: stolen_t.into_std(),
        until: Some(got.deadline().into_std()),
    });
    got.release().await?;
    let promise = history.promise_violations();
    drop(lease);
    let trial = Trial {
        cut: how,
        reason: reason.to_string(),
        detect: lost_t.saturating_duration_since(cut),
        contender_after: stolen_t.saturating_duration_since(cut),
        margin_ms: ms_after(stolen_t, lost_t),
        promise_margin_ms: ms_after(stolen_t, promised),
        lost_vs_deadline_ms: ms_after(lost_t, promised),
        lost_t,
        declared_t,
        deadline: promised,
        margin,
    };
    // Judged against the promise: the contender's reply must not arrive before the holder's
    // latest promised deadline (at which its lost() fires on its own timer). Which of the two
    // TASKS ran first (`margin_ms`) is only reported: on a loaded machine both may wake in one
    // scheduling burst after the deadline, and that order says nothing about the backend.
    if let Err(v) = promise {
        return Err(Verdict::Fail(format!(
            "promise violation: the contender got the lock BEFORE the cut-off holder's lost() was due: {}",
            v.first
        )));
    }
    ensure!(
        trial.detect <= ttl + SCHED,
        "lost() fired {:?} after the cut, later than the TTL {ttl:?}",
        trial.detect
    );
    ensure!(
        trial.contender_after <= ttl * 2 + slack + SCHED,
        "the contender waited {:?} after the cut",
        trial.contender_after
    );
    Ok(trial)
}

/// The holder's connection is cut: no contender is granted before the holder's latest promised
/// deadline (when its `lost()` is due), and `lost()` fires no later than one TTL after the cut.
/// Reported, not judged: when `lost()` resolved against that deadline, as the task awaiting it
/// saw it (`lost_vs_deadline_ms`, negative is early), and how late the runtime itself was then
/// (`runtime_lag_ms`). `lost()` aims the loss margin early, which `dlock-core`'s
/// `lost_timing` test asserts; a process stalled longer than that is late whatever it aims at,
/// and then the fencing token protects the resource (see ARCHITECTURE.md).
pub(crate) async fn lost_before_stolen(ctx: &Ctx) -> Result<(), Verdict> {
    let ticker = Ticker::start();
    let t = cut_trial(ctx, name("cut")?, Arrival::Steady).await?;
    report_cut(ctx, &t, &ticker);
    Ok(())
}

/// [`lost_before_stolen`] for a lease a release handed over: the holder waits behind another,
/// that one releases, and the holder is cut as soon as its acquire returns, before any
/// renewal. Judged alike: nobody else is granted before the deadline the handed-over grant
/// promised, and `lost()` fires within a TTL of the cut. This is the path a queue's fast
/// handoff takes (a grant written by the release, a grant on the wait's own earlier proof).
pub(crate) async fn handoff_lost_before_stolen(ctx: &Ctx) -> Result<(), Verdict> {
    let ticker = Ticker::start();
    let t = cut_trial(ctx, name("handoff-cut")?, Arrival::Handoff).await?;
    report_cut(ctx, &t, &ticker);
    Ok(())
}

/// The figures of one cut trial.
fn report_cut(ctx: &Ctx, t: &Trial, ticker: &Ticker) {
    ctx.figure("cut", t.cut);
    ctx.figure("loss_reason", t.reason.clone());
    ctx.figure_ms("lost_after_cut_ms", t.detect);
    ctx.figure_ms("contender_after_cut_ms", t.contender_after);
    ctx.figure("margin_ms", us_round(t.margin_ms));
    ctx.figure("promise_margin_ms", us_round(t.promise_margin_ms));
    ctx.figure("lost_vs_deadline_ms", us_round(t.lost_vs_deadline_ms));
    ctx.figure_ms("runtime_lag_ms", t.runtime_lag(ticker));
}

/// How many cut trials [`loss_trials`] runs, on distinct names.
pub(crate) const TRIALS: usize = 20;
/// How many of them run at once.
const WAVE: usize = 5;

/// The longest runtime stall that may excuse a late `lost()`: a runtime stalled longer than
/// TTL/4 cannot keep leases (renewal runs every TTL/3); such a trial judged nothing and fails.
fn stall_bound(ttl: Duration) -> Duration {
    ttl / 4
}

/// Whether trial `t`'s `lost()` was in time. The core's own instant of declaring the loss (its
/// loss timer firing, before any waiting task runs) must not be after the promised deadline.
/// A late one is excused only when the runtime's own [`Ticker`] shows it was stalled at least
/// long enough to make a timer aimed the contract's loss margin early (`Trial::margin`) that
/// late (less one [`TICK`], the ticker's own resolution), and no longer than [`stall_bound`].
///
/// Returns `Ok(None)` when in time, `Ok(Some(stall))` when excused, the failure otherwise.
fn judge_loss(t: &Trial, ticker: &Ticker, ttl: Duration) -> Result<Option<Duration>, String> {
    let Some(late) = t.declared_t.checked_duration_since(t.deadline) else {
        return Ok(None);
    };
    if late.is_zero() {
        return Ok(None);
    }
    let margin = t.margin;
    let aim = t.deadline.checked_sub(margin).unwrap_or(t.deadline);
    let stall = ticker.max_lag(Some(aim), t.declared_t);
    if stall > stall_bound(ttl) {
        return Err(format!(
            "lost() was declared {late:?} after the promised deadline, and the runtime stalled \
             {stall:?}, more than the {:?} a trial can judge",
            stall_bound(ttl)
        ));
    }
    if stall + TICK < margin + late {
        return Err(format!(
            "lost() was declared {late:?} after the promised deadline while the runtime stalled \
             at most {stall:?} (a timer aimed {margin:?} early needs {:?}): it does not fire \
             early enough",
            margin + late
        ));
    }
    Ok(Some(stall))
}

/// [`lost_before_stolen`] in K = 20 trials (5 at a time): every one must hold, and in EVERY
/// trial `lost()` must be declared by the core no later than the promised deadline, unless
/// the runtime itself stalled that long (see [`judge_loss`]). Reported: the minimum margins,
/// `lost()` against the deadline as the core declared it (`declared_vs_deadline_max_ms`) and
/// as the awaiting task saw it (`lost_vs_deadline_p50_ms`, `_max_ms`; negative is early),
/// how many trials were late (`lost_after_deadline`), how many of them the runtime's stall
/// excused and the largest such stall (`excusing_stall_max_ms`).
pub(crate) async fn loss_trials(ctx: &Ctx) -> Result<(), Verdict> {
    let mut names = Vec::with_capacity(TRIALS);
    for i in 0..TRIALS {
        names.push(name(&format!("trial-{i}"))?);
    }
    // Waves of WAVE concurrent trials: enough overlap to be quick, not so much that the suite's
    // own load (a proxy and two clients per trial) decides the outcome.
    let ticker = Ticker::start();
    let mut results = Vec::with_capacity(TRIALS);
    let mut names = names.into_iter();
    loop {
        let wave: Vec<LockName> = names.by_ref().take(WAVE).collect();
        if wave.is_empty() {
            break;
        }
        results.extend(
            futures::future::join_all(wave.into_iter().map(|n| cut_trial(ctx, n, Arrival::Steady)))
                .await,
        );
    }
    let ttl = ctx.ttl();
    let mut failures = Vec::new();
    let mut margins = Vec::new();
    let mut promise_margins = Vec::new();
    let mut detects = Vec::new();
    let mut lost_vs_deadline = Vec::new();
    let mut declared_vs_deadline = Vec::new();
    let (mut late, mut excused, mut stall) = (0usize, 0usize, Duration::ZERO);
    let mut contract_margin: Option<Duration> = None;
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(t) => {
                if t.declared_t > t.deadline {
                    late += 1;
                }
                contract_margin = Some(contract_margin.map_or(t.margin, |m| m.min(t.margin)));
                match judge_loss(&t, &ticker, ttl) {
                    Ok(None) => {}
                    Ok(Some(s)) => {
                        excused += 1;
                        stall = stall.max(s);
                    }
                    Err(why) => failures.push(format!("trial {i}: {why}")),
                }
                margins.push(t.margin_ms);
                promise_margins.push(t.promise_margin_ms);
                detects.push(t.detect);
                lost_vs_deadline.push(t.lost_vs_deadline_ms);
                declared_vs_deadline.push(ms_after(t.declared_t, t.deadline));
            }
            Err(Verdict::Fail(why) | Verdict::Skip(why)) => {
                failures.push(format!("trial {i}: {why}"))
            }
        }
    }
    ctx.figure("trials", TRIALS);
    ctx.figure("violations", failures.len());
    if let Some(min) = margins.iter().copied().reduce(f64::min) {
        ctx.figure("min_margin_ms", us_round(min));
    }
    if let Some(min) = promise_margins.iter().copied().reduce(f64::min) {
        ctx.figure("min_promise_margin_ms", us_round(min));
    }
    lost_vs_deadline.sort_by(f64::total_cmp);
    let p50 = lost_vs_deadline
        .get(lost_vs_deadline.len().saturating_sub(1) / 2)
        .copied();
    if let (Some(p50), Some(max)) = (p50, lost_vs_deadline.last()) {
        ctx.figure("lost_vs_deadline_p50_ms", us_round(p50));
        ctx.figure("lost_vs_deadline_max_ms", us_round(*max));
    }
    if let Some(max) = declared_vs_deadline.iter().copied().reduce(f64::max) {
        ctx.figure("declared_vs_deadline_max_ms", us_round(max));
    }
    ctx.figure("lost_after_deadline", late);
    ctx.figure("late_excused_by_stall", excused);
    ctx.figure_ms("excusing_stall_max_ms", stall);
    ctx.figure_ms("stall_bound_ms", stall_bound(ttl));
    if let Some(m) = contract_margin {
        ctx.figure_ms("contract_loss_margin_ms", m);
    }
    ctx.figure_ms("runtime_lag_max_ms", ticker.max_lag(None, Instant::now()));
    if let Some(max) = detects.iter().max() {
        ctx.figure_ms("max_lost_after_cut_ms", *max);
    }
    ensure!(
        failures.is_empty(),
        "{} of {TRIALS} trials failed: {}",
        failures.len(),
        failures.join("; ")
    );
    Ok(())
}

/// A test hook breaks the held lease at the server (delete the key / revoke the lease / expire
/// the session): the holder's `lost()` fires within the TTL, and a contender then gets the lock.
pub(crate) async fn lost_after_break(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let lock = name("broken")?;
    let ttl = ctx.ttl();
    let slack = ctx.crash_slack(&b.capabilities());
    let lease = a.acquire(&lock, AcquireOptions::wait(ttl)).await?;
    tokio::time::sleep(ttl / 4).await;
    let lost = lease.lost();
    let broke = Instant::now();
    let hit = break_holder(ctx, &lock).await?;
    ensure!(
        hit.is_empty() || hit == [lease.token()],
        "the break reported tokens {hit:?}, the holder's is {}",
        lease.token()
    );
    let reason = within(ttl + SCHED, lost).await.ok_or_else(|| {
        Verdict::Fail(format!(
            "lost() did not fire within {:?} after the server-side break",
            ttl + SCHED
        ))
    })?;
    let detect = broke.elapsed();
    ctx.figure_ms("lost_after_break_ms", detect);
    ctx.figure("loss_reason", reason.to_string());
    ensure!(
        reason != LossReason::Released,
        "lost() reported a release, not a loss"
    );
    ensure!(lease.check().is_err(), "check() passes on a lost lease");
    let got = b
        .acquire(&lock, AcquireOptions::wait(ttl + slack + SCHED))
        .await
        .map_err(|e| Verdict::Fail(format!("after the break the lock did not become free: {e}")))?;
    let fenced = b.capabilities().fencing != FencingStrength::None;
    ensure!(
        !fenced || got.token() > lease.token(),
        "the new grant's token {} is not above the broken one's {}",
        got.token(),
        lease.token()
    );
    got.release().await?;
    drop(lease);
    Ok(())
}
