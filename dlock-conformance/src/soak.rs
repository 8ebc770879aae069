//! The soak: randomized combined nemeses against one backend for a set duration, judged by the
//! history checkers. The hidden `__soak` test of [`conformance_tests!`](crate::conformance_tests)
//! runs it when [`SOAK_VAR`] is set (`cargo xtask conform --soak 10m [--seed N]`).
//!
//! Nemeses, chosen at random every 0.3–1.5 s (several may overlap): a worker's links
//! blackholed for 0.2–3 × TTL, delayed by 20–300 ms, reset, or their replies lost; the holder
//! broken from the server side (recorded in the history, so the checkers attribute it to the
//! hold it hit); a holder stall (renewal stopped, writes continue for 1.5 × TTL); a holder
//! PROCESS frozen (SIGSTOP) past its TTL, then writing with its old token (its grant, promised
//! deadline, writes and loss are recorded in the history too).
//!
//! It prints one line `DLOCK_SOAK result backend=… seed=… key=value…` with every count, and
//! fails on ANY violation of the history checkers (grant before a promised deadline, belief
//! overlap, token order, fenced safety) or a fenced counter that disagrees with the accepted
//! writes. It cannot pass empty: a run whose counts fall below its [`Minimums`] (grants,
//! accepted writes, breaks that hit a holder, frozen-holder writes rejected) fails, a
//! frozen-holder step that fails is counted and named, and only a deliberate skip
//! ([`SkipBackend`](crate::SkipBackend)) with `CI` unset is a skip: under `CI` a skip or a
//! backend that cannot be built fails.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{FencingToken, Locker};
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::faults::{Direction, Mode, Proxy};
use crate::history::{Event, History, Kind};
use crate::scenarios::holder::{HolderProcess, field};
use crate::scenarios::util::{instant_of_mono, via_proxies};
use crate::scenarios::workload::{Counts, Findings, Plan, Workload};
use crate::scenarios::{Ctx, Fencing, Scenario, Verdict};
use crate::{ClientOptions, TestBackend};

/// `<seconds>,<seed>`: turns the hidden `__soak` test on.
pub const SOAK_VAR: &str = "DLOCK_SOAK";

/// Workers in the soak.
const WORKERS: usize = 4;
/// The soak's lease TTL at the harness's fast settings (times [`SoakPlan::ttl_scale`]).
const TTL: Duration = Duration::from_secs(2);
/// The history id of the first frozen holder process (the n-th is `PROCESS_CLIENT + n`).
const PROCESS_CLIENT: usize = 1000;

/// The least a soak must have exercised to pass. Below any of them the run tested too little
/// to vouch for anything (a backend whose every acquire fails shows `grants=0`), so it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Minimums {
    /// Grants recorded by the workers.
    pub grants: u64,
    /// Writes the fenced resource accepted.
    pub accepted_writes: u64,
    /// Forced breaks that hit a holder (only counted when the nemeses run).
    pub breaks_hit: u64,
    /// Writes of a frozen holder process the fenced resource rejected (only where holder
    /// processes run: the nemeses on, a backend with server nodes).
    pub frozen_rejected: u64,
}

impl Minimums {
    /// Per minute of soak: well under what a healthy 1-minute soak shows. Measured one
    /// backend at a time on the shared 2-core machine (grants / accepted writes / breaks that
    /// hit / frozen writes rejected): memory 271 / 482 / 74 / – (no holder processes in
    /// process), redis 81 / 180 / 16 / 4, redlock-degraded 141 / 289 / 14 / 7, etcd
    /// 94 / 229 / 11 / 7, etcd-cluster 125 / 273 / 12 / 8, zk 97 / 208 / 15 / 4, zk-cluster
    /// 108 / 248 / 18 / 6.
    pub const PER_MINUTE: Minimums = Minimums {
        grants: 20,
        accepted_writes: 20,
        breaks_hit: 2,
        frozen_rejected: 1,
    };

    /// The minimums of a soak of `duration`: [`Minimums::PER_MINUTE`] times its whole minutes,
    /// and at least one grant and one accepted write however short it is.
    pub fn for_duration(duration: Duration) -> Minimums {
        Minimums::for_duration_scaled(duration, 1)
    }

    /// [`Minimums::for_duration`] for a soak whose leases are `ttl_scale` times longer: each
    /// count divided by the scale (holds, stalls and frozen pauses all last that much longer),
    /// and still at least one grant and one accepted write.
    pub fn for_duration_scaled(duration: Duration, ttl_scale: u32) -> Minimums {
        let minutes = duration.as_secs() / 60;
        let scale = u64::from(ttl_scale.max(1));
        let per = Minimums::PER_MINUTE;
        Minimums {
            grants: (per.grants * minutes / scale).max(1),
            accepted_writes: (per.accepted_writes * minutes / scale).max(1),
            breaks_hit: per.breaks_hit * minutes / scale,
            frozen_rejected: per.frozen_rejected * minutes / scale,
        }
    }
}

/// What one soak does: its length, seed and fenced resource, the workers' stall chance, and
/// whether the nemeses run (negative controls turn them off so that every stall ends in a
/// takeover that only the backend's promise can judge), and the counts it must reach.
#[derive(Debug, Clone)]
pub struct SoakPlan {
    /// How long the nemeses run.
    pub duration: Duration,
    /// The seed of every random choice.
    pub seed: u64,
    /// The fenced resource's mode ([`Fencing::Off`] is a negative control).
    pub fencing: Fencing,
    /// Chance per grant that the holder stalls (renewal stopped, writes go on for 1.5 × TTL).
    pub stall_chance: f64,
    /// Whether link faults, breaks and frozen processes run.
    pub nemeses: bool,
    /// The counts the run must reach ([`Minimums::for_duration`] by default).
    pub minimums: Minimums,
    /// The lease TTL's multiplier: 1 at the harness's fast settings, the enrolment's
    /// `ttl_scale` on the production-settings rows (see [`SoakPlan::scaled`]).
    pub ttl_scale: u32,
}

impl SoakPlan {
    /// The soak `cargo xtask conform --soak` runs: all nemeses, a 5 % stall chance, fenced.
    pub fn new(duration: Duration, seed: u64) -> SoakPlan {
        SoakPlan {
            duration,
            seed,
            fencing: Fencing::On,
            stall_chance: 0.05,
            nemeses: true,
            minimums: Minimums::for_duration(duration),
            ttl_scale: 1,
        }
    }

    /// The plan with leases `ttl_scale` times the soak's TTL (its link faults, stalls and
    /// frozen pauses, which last TTLs, as well) and minimums to match
    /// ([`Minimums::for_duration_scaled`]).
    #[must_use]
    pub fn scaled(mut self, ttl_scale: u32) -> SoakPlan {
        self.ttl_scale = ttl_scale.max(1);
        self.minimums = Minimums::for_duration_scaled(self.duration, self.ttl_scale);
        self
    }

    /// The soak's lease TTL.
    pub fn ttl(&self) -> Duration {
        TTL * self.ttl_scale
    }
}

/// What one soak measured.
#[derive(Debug, Default)]
struct Nemeses {
    blackholes: AtomicU64,
    delays: AtomicU64,
    resets: AtomicU64,
    lost_replies: AtomicU64,
    breaks: AtomicU64,
    breaks_hit: AtomicU64,
    frozen: AtomicU64,
    frozen_rejected: AtomicU64,
    /// Frozen-holder steps that failed, each with the step and why.
    frozen_failures: Mutex<Vec<String>>,
}

/// The body of the hidden `__soak` test: does nothing unless [`SOAK_VAR`] is set; otherwise
/// runs [`soak_outcome`] with `CI` read from the environment and prints its line.
///
/// # Panics
/// On a malformed variable, and when the soak fails (the test fails).
pub fn soak_main(module: &str, factory: fn() -> Arc<dyn TestBackend>) {
    soak_main_scaled(module, factory, 1);
}

/// [`soak_main`] with leases `ttl_scale` times the soak's TTL ([`SoakPlan::scaled`]): the
/// `__soak` of a row enrolled with `ttl_scale`.
///
/// # Panics
/// As [`soak_main`].
pub fn soak_main_scaled(module: &str, factory: fn() -> Arc<dyn TestBackend>, ttl_scale: u32) {
    let Ok(spec) = std::env::var(SOAK_VAR) else {
        return;
    };
    let (secs, seed) = spec
        .split_once(',')
        .and_then(|(d, s)| Some((d.trim().parse::<u64>().ok()?, s.trim().parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("malformed {SOAK_VAR}={spec:?}: want <seconds>,<seed>"));
    let plan = SoakPlan::new(Duration::from_secs(secs), seed).scaled(ttl_scale);
    let ci = std::env::var_os("CI").is_some();
    match soak_outcome(module, factory, &plan, ci) {
        Ok(line) => println!("{line}"),
        Err(line) => {
            println!("{line}");
            panic!("{line}");
        }
    }
}

/// Builds the backend with `factory` and runs `plan` on it; returns the `DLOCK_SOAK` line to
/// print: `Ok` with `DLOCK_SOAK result …` or `DLOCK_SOAK skipped …`, `Err` with
/// `DLOCK_SOAK failed …`. Only a deliberate skip (a factory panic with
/// [`SkipBackend`](crate::SkipBackend)) with `ci` false is a skip; under `ci` it fails, and
/// so does any other factory panic or a skip of the run itself, always.
///
/// # Errors
/// The `DLOCK_SOAK failed …` line.
pub fn soak_outcome(
    module: &str,
    factory: fn() -> Arc<dyn TestBackend>,
    plan: &SoakPlan,
    ci: bool,
) -> Result<String, String> {
    let (seed, secs) = (plan.seed, plan.duration.as_secs());
    let backend = match std::panic::catch_unwind(factory) {
        Ok(b) => b,
        Err(p) => {
            let deliberate = p.downcast_ref::<crate::SkipBackend>().is_some();
            let why = crate::scenarios::panic_message(p);
            return if deliberate && !ci {
                Ok(format!(
                    "DLOCK_SOAK skipped backend={module} reason={why:?}"
                ))
            } else if deliberate {
                Err(format!(
                    "DLOCK_SOAK failed backend={module} seed={seed} secs={secs} reason={:?}",
                    format!("skipped under CI (a skip there is a failure): {why}")
                ))
            } else {
                Err(format!(
                    "DLOCK_SOAK failed backend={module} seed={seed} secs={secs} reason={:?}",
                    format!("the backend could not be built: {why}")
                ))
            };
        }
    };
    let name = backend.name().to_string();
    match run_plan(backend, module, plan) {
        Ok(line) => Ok(format!(
            "DLOCK_SOAK result backend={name} seed={seed} secs={secs} {line}"
        )),
        Err(Verdict::Skip(why)) => Err(format!(
            "DLOCK_SOAK failed backend={name} seed={seed} secs={secs} reason={:?}",
            format!("the soak could not run (not a deliberate skip): {why}")
        )),
        Err(Verdict::Fail(why)) => Err(format!(
            "DLOCK_SOAK failed backend={name} seed={seed} secs={secs} reason={why:?}"
        )),
    }
}

/// Runs one soak of `duration` against `backend` on a runtime of its own and returns its
/// figures (`key=value …`). `module` is the enrolment's module (the frozen holder processes
/// re-execute its `__crash_holder` test). [`Fencing::Off`] is the negative control: the
/// fenced-safety checker must then fire.
///
/// # Errors
/// [`Verdict::Fail`] with the violation (or what broke), [`Verdict::Skip`] when it cannot run.
pub fn run(
    backend: Arc<dyn TestBackend>,
    module: &str,
    duration: Duration,
    seed: u64,
    fencing: Fencing,
) -> Result<String, Verdict> {
    let mut plan = SoakPlan::new(duration, seed);
    plan.fencing = fencing;
    run_plan(backend, module, &plan)
}

/// [`run`] with every knob of a [`SoakPlan`].
///
/// # Errors
/// As [`run`].
pub fn run_plan(
    backend: Arc<dyn TestBackend>,
    module: &str,
    plan: &SoakPlan,
) -> Result<String, Verdict> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Verdict::Fail(format!("cannot build a runtime: {e}")))?;
    let outcome = runtime.block_on(soak(backend, module, plan.clone()));
    runtime.shutdown_timeout(Duration::from_secs(2));
    outcome
}

async fn soak(
    backend: Arc<dyn TestBackend>,
    module: &str,
    soak_plan: SoakPlan,
) -> Result<String, Verdict> {
    let mut ctx = Ctx::new(Arc::clone(&backend), module, Scenario::PausedHolder);
    // The frozen holder processes hold with the context's TTL: the soak's.
    ctx.ttl_scale = soak_plan.ttl_scale;
    let ttl = soak_plan.ttl();
    debug_assert_eq!(ctx.ttl(), ttl, "the paused-holder TTL is the soak's");
    ctx.namespace = ctx.namespace.replace("/paused_holder", "/soak");
    let ctx = Arc::new(ctx);
    let addrs = backend.node_addrs();
    let mut clients: Vec<Arc<dyn Locker>> = Vec::new();
    let mut links: Vec<Arc<Vec<Proxy>>> = Vec::new();
    for _ in 0..WORKERS {
        let (proxies, opts) = via_proxies(&addrs, ClientOptions::new(ctx.ns(), ttl))?;
        if !proxies.is_empty() {
            links.push(Arc::new(proxies));
        }
        clients.push(
            backend
                .client(opts)
                .await
                .map_err(|e| Verdict::Fail(format!("cannot build a client: {e}")))?,
        );
    }
    let caps = clients[0].capabilities();
    let plan = Plan {
        lock: crate::scenarios::util::name("soak")?,
        ttl,
        wait: ttl * 2,
        hold_max: ttl / 4,
        stall_chance: soak_plan.stall_chance,
        seed: soak_plan.seed,
    };
    let load = Workload::start(clients, &plan, soak_plan.fencing);
    let nemeses = Arc::new(Nemeses::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(soak_plan.seed);
    let end = Instant::now() + soak_plan.duration;
    let mut frozen: Option<tokio::task::JoinHandle<()>> = None;
    let in_process = addrs.is_empty();
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
        if !soak_plan.nemeses {
            continue;
        }
        let pick = rng.random_range(0..6u32);
        let link =
            (!links.is_empty()).then(|| Arc::clone(&links[rng.random_range(0..links.len())]));
        match (pick, link) {
            (0, Some(l)) => {
                nemeses.blackholes.fetch_add(1, Ordering::SeqCst);
                let d = ttl.mul_f64(rng.random_range(0.2..3.0));
                tokio::spawn(async move {
                    l.iter().for_each(|p| p.set(Mode::Blackhole));
                    tokio::time::sleep(d).await;
                    l.iter().for_each(|p| p.set(Mode::Pass));
                });
            }
            (1, Some(l)) => {
                nemeses.delays.fetch_add(1, Ordering::SeqCst);
                let lag = Duration::from_millis(rng.random_range(20..300));
                let d = Duration::from_millis(rng.random_range(1000..4000));
                tokio::spawn(async move {
                    l.iter().for_each(|p| p.set(Mode::Delay(lag)));
                    tokio::time::sleep(d).await;
                    l.iter().for_each(|p| p.set(Mode::Pass));
                });
            }
            (2, Some(l)) => {
                nemeses.resets.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    l.iter().for_each(|p| p.set(Mode::Reset));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    l.iter().for_each(|p| p.set(Mode::Pass));
                });
            }
            (3, Some(l)) => {
                nemeses.lost_replies.fetch_add(1, Ordering::SeqCst);
                let d = ttl.mul_f64(rng.random_range(0.2..2.0));
                tokio::spawn(async move {
                    l.iter()
                        .for_each(|p| p.set_direction(Direction::Downstream, Mode::Blackhole));
                    tokio::time::sleep(d).await;
                    l.iter().for_each(|p| p.set(Mode::Reset));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    l.iter().for_each(|p| p.set(Mode::Pass));
                });
            }
            (5, _) if !in_process && frozen.as_ref().is_none_or(|f| f.is_finished()) => {
                let n = nemeses.frozen.fetch_add(1, Ordering::SeqCst) as usize;
                let (c, ns, r, h) = (
                    Arc::clone(&ctx),
                    Arc::clone(&nemeses),
                    Arc::clone(&load.resource),
                    Arc::clone(&load.history),
                );
                let lock = plan.lock.clone();
                frozen = Some(tokio::spawn(async move {
                    if let Err(step) =
                        freeze_a_holder(&c, &lock, PROCESS_CLIENT + n, &ns, &r, &h).await
                    {
                        println!("DLOCK_SOAK frozen_step_failed process={n} {step}");
                        ns.frozen_failures
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!("process {n}: {step}"));
                    }
                }));
            }
            _ => {
                nemeses.breaks.fetch_add(1, Ordering::SeqCst);
                // Recorded from the instant the backend marked its delete (not from the call:
                // a grant before the delete is not excused by it); a failed break is recorded
                // with an unknown victim and counted by the findings.
                match crate::history::break_recorded(&load.history, &*backend, ctx.ns(), &plan.lock)
                    .await
                {
                    Ok(Some(_)) => {
                        nemeses.breaks_hit.fetch_add(1, Ordering::SeqCst);
                    }
                    // Nobody held the lock: nothing was broken.
                    Ok(None) => {}
                    Err(e) => tracing::debug!(error = %e, "soak: the break failed"),
                }
            }
        }
    }
    links
        .iter()
        .flat_map(|l| l.iter())
        .for_each(|p| p.set(Mode::Pass));
    if let Some(f) = frozen
        && tokio::time::timeout(ttl * 10, f).await.is_err()
    {
        nemeses
            .frozen_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push("the last frozen holder did not finish in 10 × TTL".into());
    }
    let counts = Arc::clone(&load.counts);
    let resource = Arc::clone(&load.resource);
    let history = load.stop(ttl * 5).await;
    let f = Findings::of(&history, &caps);
    let g = |c: &AtomicU64| c.load(Ordering::SeqCst);
    let frozen_failures = std::mem::take(
        &mut *nemeses
            .frozen_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    let accepted_writes = history
        .events()
        .iter()
        .filter(|e| e.kind == crate::history::Kind::OpAccepted)
        .count() as u64;
    let mut line = format!(
        "ops_accepted={} ops_rejected={} grants={} losses={} timeouts={} errors={} stalls={} \
         blackholes={} delays={} resets={} lost_replies={} breaks={} breaks_hit={} \
         frozen_processes={} frozen_writes_rejected={} frozen_failures={} fenced_counter={} \
         accepted_writes_recorded={accepted_writes}",
        Counts::get(&counts.accepted),
        Counts::get(&counts.rejected),
        Counts::get(&counts.grants),
        Counts::get(&counts.losses),
        Counts::get(&counts.timeouts),
        Counts::get(&counts.errors),
        Counts::get(&counts.stalls),
        g(&nemeses.blackholes),
        g(&nemeses.delays),
        g(&nemeses.resets),
        g(&nemeses.lost_replies),
        g(&nemeses.breaks),
        g(&nemeses.breaks_hit),
        g(&nemeses.frozen),
        g(&nemeses.frozen_rejected),
        frozen_failures.len(),
        resource.value(),
    );
    for (k, v) in f.counts() {
        line.push_str(&format!(" {k}={v}"));
    }
    if let Err(Verdict::Fail(why)) = f.verdict("the soak's history") {
        let dump = dump_history(&history, soak_plan.seed);
        return Err(Verdict::Fail(format!("{why} ({line}); history: {dump}")));
    }
    // The resource's own count of accepted writes against the independent model's: a guard
    // that let a stale write in (or refused a current one) shows here too.
    if resource.value() != f.model.expected {
        return Err(Verdict::Fail(format!(
            "the fenced counter is {} where the resource model accepts {} writes ({line})",
            resource.value(),
            f.model.expected
        )));
    }
    let min = soak_plan.minimums;
    let mut short = Vec::new();
    let mut floor = |what: &str, got: u64, least: u64| {
        if got < least {
            short.push(format!("{what}={got} (at least {least})"));
        }
    };
    floor("grants", Counts::get(&counts.grants), min.grants);
    floor("accepted writes", accepted_writes, min.accepted_writes);
    if soak_plan.nemeses {
        floor(
            "breaks that hit a holder",
            g(&nemeses.breaks_hit),
            min.breaks_hit,
        );
        if !in_process {
            floor(
                "frozen-holder writes rejected",
                g(&nemeses.frozen_rejected),
                min.frozen_rejected,
            );
        }
    }
    if !short.is_empty() {
        return Err(Verdict::Fail(format!(
            "the soak tested too little: {} ({line}){}",
            short.join(", "),
            if frozen_failures.is_empty() {
                String::new()
            } else {
                format!(
                    "; frozen-holder steps failed: {}",
                    frozen_failures.join("; ")
                )
            }
        )));
    }
    if !frozen_failures.is_empty() {
        line.push_str(&format!(
            " frozen_failure_steps={:?}",
            frozen_failures.join("; ")
        ));
    }
    Ok(line)
}

/// A holder PROCESS joins the queue; once granted it writes, is frozen (SIGSTOP) for
/// 1.5 × TTL, resumed, and writes again with its old token: the fenced resource must reject
/// that write whenever a newer holder wrote meanwhile. Its grant (at the instant its reply
/// arrived, with its promised deadline), its writes, its latest promise and its loss go into
/// the history as client `client`, judged like every worker's.
///
/// # Errors
/// The step that failed (`step=<name> reason=…`): the caller counts and reports it.
async fn freeze_a_holder(
    ctx: &Ctx,
    lock: &dlock_core::LockName,
    client: usize,
    nemeses: &Nemeses,
    resource: &crate::scenarios::workload::Resource,
    history: &History,
) -> Result<(), String> {
    let failed = |step: &str, v: Verdict| {
        let why = match v {
            Verdict::Fail(w) | Verdict::Skip(w) => w,
        };
        format!("step={step} reason={why:?}")
    };
    let mut holder = HolderProcess::spawn(ctx, lock).map_err(|v| failed("spawn", v))?;
    holder.granted().await.map_err(|v| failed("granted", v))?;
    let token = FencingToken(holder.token);
    let granted = instant_of_mono(holder.granted_ns);
    let Some(deadline) = promised(&mut holder).await else {
        // Unknown promise: record the grant without one (belief and token checks still see it).
        history.push(Event {
            client,
            kind: Kind::Grant,
            token,
            at: granted,
            until: None,
        });
        return Err(failed(
            "promise",
            Verdict::Fail("the holder process did not report its deadline".into()),
        ));
    };
    history.push(Event {
        client,
        kind: Kind::Grant,
        token,
        at: granted,
        until: Some(deadline),
    });
    resource.op(client, token);
    holder.pause().map_err(|v| failed("pause", v))?;
    tokio::time::sleep(ctx.ttl() * 3 / 2).await;
    holder.resume().map_err(|v| failed("resume", v))?;
    if !resource.op(client, token) {
        nemeses.frozen_rejected.fetch_add(1, Ordering::SeqCst);
    }
    if let Some(rest) = holder.expect("lost", Duration::from_secs(5)).await
        && let Some(at) = field(&rest, "at_ns")
    {
        history.push(Event {
            client,
            kind: Kind::Lost,
            token,
            at: instant_of_mono(at),
            until: None,
        });
    }
    if let Some(latest) = promised(&mut holder).await {
        history.promise(client, token, latest);
    }
    history.release(client, token);
    let _ = holder.send("release");
    let _ = holder.expect("released", Duration::from_secs(5)).await;
    holder.kill();
    Ok(())
}

/// The holder process's promised deadline, asked now.
async fn promised(holder: &mut HolderProcess) -> Option<std::time::Instant> {
    holder.send("check").ok()?;
    let state = holder.expect("state", Duration::from_secs(10)).await?;
    field(&state, "deadline_ns").map(instant_of_mono)
}

/// Writes every event of a failed soak, one per line with times in ms from the first event, to
/// a file in the temp dir; returns its path (or why it could not be written).
fn dump_history(history: &History, seed: u64) -> String {
    let events = history.events();
    let Some(t0) = events.first().map(|e| e.at) else {
        return "empty".into();
    };
    let ms = |t: std::time::Instant| t.saturating_duration_since(t0).as_secs_f64() * 1e3;
    let mut text = String::new();
    for e in &events {
        let who = if e.client == crate::history::BREAKER {
            "breaker".to_string()
        } else {
            format!("client {}", e.client)
        };
        let until = e
            .until
            .map_or(String::new(), |u| format!(" until={:.1}", ms(u)));
        text.push_str(&format!(
            "{:10.1} {who} {:?} token={}{until}\n",
            ms(e.at),
            e.kind,
            e.token.0
        ));
    }
    let path =
        std::env::temp_dir().join(format!("dlock-soak-{}-{seed}.history", std::process::id()));
    match std::fs::write(&path, text) {
        Ok(()) => path.display().to_string(),
        Err(e) => format!("not written ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longer_leases_lower_the_minimums_but_never_to_nothing() {
        let ten = Duration::from_secs(600);
        let lab = Minimums::for_duration(ten);
        assert_eq!(
            (lab.grants, lab.breaks_hit, lab.frozen_rejected),
            (200, 20, 10)
        );
        let prod = SoakPlan::new(ten, 1).scaled(5);
        assert_eq!(prod.ttl(), Duration::from_secs(10));
        assert_eq!(
            prod.minimums,
            Minimums {
                grants: 40,
                accepted_writes: 40,
                breaks_hit: 4,
                frozen_rejected: 2,
            }
        );
        let short = Minimums::for_duration_scaled(Duration::from_secs(60), 15);
        assert_eq!((short.grants, short.accepted_writes), (1, 1));
    }
}
