//! The flash-sale workload (issue 32): many client PROCESSES on a few hot names, each critical
//! section reading and writing a fenced resource, with and without a nemesis that pauses a
//! holder (SIGSTOP) past its TTL. It measures what the design documents' table quotes (P99
//! lock latency and "concurrent conflict rate") and what Kleppmann's argument predicts: any
//! lease lock lets sections overlap when a holder pauses past its TTL, and only fencing makes
//! the late write harmless.
//!
//! The parent process is the observer (`observer.rs`, independent of every lock) and hosts the
//! resource and the nemesis (`resource.rs`); each client is this binary re-run as
//! `__flash-client` (`child.rs`); the contenders are in `contenders.rs`, the table and the
//! verdicts in `table.rs`.

mod child;
mod contenders;
mod observer;
mod resource;
pub mod table;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_conformance::servers::Cluster;

use crate::stats::{Row, Sink};
use child::{ChildArgs, now_ns};
use contenders::Spec;
use resource::{Nemesis, Resource};

pub use child::main as child_main;

/// The workload names of the two runs of a contender.
pub const CALM: &str = "flash-sale";
pub const PAUSES: &str = "flash-sale-pauses";

/// The sizes of the flash sale.
#[derive(Clone, Debug)]
pub struct FlashPlan {
    /// Client processes, and the hot names they share.
    pub clients: usize,
    pub names: usize,
    /// Each run's length.
    pub duration: Duration,
    /// Every contender's TTL (lease, key expiry or session timeout); a pause lasts 1.5 × it.
    pub ttl: Duration,
    /// The nemesis arms this long after the previous pause ended.
    pub every: Duration,
    /// Whether the run without pauses is made too (`--quick` makes only the paused one).
    pub calm: bool,
    /// The contenders, in the table's order.
    pub specs: Vec<Spec>,
}

impl FlashPlan {
    /// The plan for the selected backends: in `--quick`, dlock and the seed's lock on one
    /// Redis, 16 clients on 4 names, one 5 s run with pauses each; else every contender, 32
    /// clients on 8 names, `duration` (default 60 s) with and without pauses.
    pub fn new(quick: bool, duration: Option<Duration>, backends: &[String]) -> FlashPlan {
        let picked = contenders::ALL
            .into_iter()
            .filter(|s| backends.iter().any(|b| b == s.backend))
            .filter(|s| !quick || s.backend == "redis");
        FlashPlan {
            clients: if quick { 16 } else { 32 },
            names: if quick { 4 } else { 8 },
            duration: duration.unwrap_or(Duration::from_secs(if quick { 5 } else { 60 })),
            ttl: Duration::from_millis(if quick { 1000 } else { 2000 }),
            every: Duration::from_millis(if quick { 500 } else { 4000 }),
            calm: !quick,
            specs: picked.collect(),
        }
    }

    fn pause(&self) -> Duration {
        self.ttl * 3 / 2
    }
}

/// Runs every contender of `plan` (each with and without pauses), adding its rows; a
/// contender that cannot run is a failure, and the other contenders still run.
pub async fn run(plan: &FlashPlan, run_ns: &str, rows: &mut Vec<Row>) -> Vec<String> {
    let mut failures = Vec::new();
    for spec in &plan.specs {
        let cluster = match Cluster::shared(spec.kind, spec.nodes) {
            Ok(c) => c,
            Err(e) => {
                let why = format!("cannot start {} × {}: {e}", spec.kind.as_str(), spec.nodes);
                eprintln!("[flash-sale] {} FAILED: {why}", spec.id());
                failures.push(format!("flash-sale {}: {why}", spec.id()));
                continue;
            }
        };
        let runs: &[bool] = if plan.calm { &[false, true] } else { &[true] };
        for &pauses in runs {
            let workload = if pauses { PAUSES } else { CALM };
            let t = Instant::now();
            let mut sink = Sink {
                backend: spec.backend,
                rows,
            };
            match one(spec, &cluster, plan, pauses, run_ns).await {
                Ok(out) => {
                    eprintln!(
                        "[flash-sale] {} {workload} done in {:.1?}: {} sections, {} conflicts, stale writes {} unfenced / {} fenced (+{} before any later token reached the resource), {} pause(s)",
                        spec.id(),
                        t.elapsed(),
                        out.verdict.sections,
                        out.verdict.conflicts,
                        out.verdict.stale_unfenced,
                        out.verdict.stale_fenced,
                        out.verdict.stale_unseen,
                        out.pauses
                    );
                    out.rows(&mut sink, workload, spec, plan);
                }
                Err(e) => {
                    eprintln!("[flash-sale] {} {workload} FAILED: {e}", spec.id());
                    failures.push(format!("{}/{workload}/{}: {e}", spec.backend, spec.imp));
                }
            }
        }
    }
    failures
}

/// What one run measured.
struct Outcome {
    verdict: observer::Verdict,
    acquire: Vec<Duration>,
    pauses: u64,
    acquire_errors: u64,
    release_errors: u64,
    seconds: f64,
}

impl Outcome {
    fn rows(mut self, sink: &mut Sink<'_>, workload: &str, spec: &Spec, plan: &FlashPlan) {
        let v = &self.verdict;
        let mut out = sink.to(workload, spec.imp);
        out.percentiles("acquire", &mut self.acquire);
        let count = |out: &mut crate::stats::Rows<'_>, m: &str, n: usize| {
            out.add(m, n as f64, "count");
        };
        count(&mut out, "sections", v.sections);
        count(&mut out, "conflicts", v.conflicts);
        if v.sections > 0 {
            out.add(
                "conflict_rate",
                100.0 * v.conflicts as f64 / v.sections as f64,
                "%",
            );
        }
        count(&mut out, "stale_writes_unfenced", v.stale_unfenced);
        if spec.fenced {
            count(&mut out, "stale_writes_fenced", v.stale_fenced);
            count(&mut out, "stale_writes_unseen", v.stale_unseen);
        }
        count(
            &mut out,
            "pauses",
            usize::try_from(self.pauses).unwrap_or(usize::MAX),
        );
        count(&mut out, "paused_overtaken", v.paused_overtaken);
        out.add("acquire_errors", self.acquire_errors as f64, "count");
        out.add("release_errors", self.release_errors as f64, "count");
        count(&mut out, "clients", plan.clients);
        count(&mut out, "names", plan.names);
        out.add("seconds", self.seconds, "s");
        out.add("ttl", plan.ttl.as_secs_f64() * 1e6, "us");
        if workload == PAUSES {
            out.add("pause", plan.pause().as_secs_f64() * 1e6, "us");
            out.add("pause_every", plan.every.as_secs_f64() * 1e6, "us");
        }
    }
}

/// Kills the children still running when dropped (a failed run leaves none behind).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn unix_ms() -> u64 {
    now_ns() / 1_000_000
}

/// One run of one contender: the clients start together, run `plan.duration`, and the
/// observer judges their sections.
async fn one(
    spec: &Spec,
    cluster: &Arc<Cluster>,
    plan: &FlashPlan,
    pauses: bool,
    run_ns: &str,
) -> Result<Outcome, String> {
    let nemesis = Nemesis::new(plan.pause());
    let (res, addr) = Resource::start(Arc::clone(&nemesis)).await?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let ns = format!("{run_ns}/{}", if pauses { PAUSES } else { CALM });
    let mut children = Children(Vec::new());
    for client in 0..plan.clients {
        let args = ChildArgs {
            spec: *spec,
            client,
            names: plan.names,
            ttl: plan.ttl,
            resource: addr.to_string(),
            at: cluster.endpoints(),
            prefix: spec.prefix(&ns),
        };
        let child = Command::new(&exe)
            .args(args.to_args())
            .envs(cluster.external_env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start a client process: {e}"))?;
        res.allow(child.id());
        children.0.push(child);
    }
    // Every client connected (servers and resource) before the clock starts.
    let ready_by = Instant::now() + Duration::from_secs(60);
    while res.record_hellos() < plan.clients {
        if let Some(why) = exited(&mut children)? {
            return Err(format!("a client process ended before the start: {why}"));
        }
        if Instant::now() > ready_by {
            return Err(format!(
                "only {} of {} clients connected within 60 s",
                res.record_hellos(),
                plan.clients
            ));
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), res.hello.notified()).await;
    }
    let started = Instant::now();
    let until = unix_ms() + u64::try_from(plan.duration.as_millis()).unwrap_or(u64::MAX);
    res.go(until);
    if pauses {
        nemesis_loop(&nemesis, plan, started).await;
    }
    // The clients finish their section in progress after the end: a TTL or two, a pause.
    let deadline = started + plan.duration + plan.pause() + plan.ttl * 4 + Duration::from_secs(30);
    let mut ended = Vec::new();
    while ended.len() < plan.clients {
        for (i, c) in children.0.iter_mut().enumerate() {
            if ended.contains(&i) {
                continue;
            }
            if let Some(status) = c.try_wait().map_err(|e| format!("client {i}: {e}"))? {
                if !status.success() {
                    return Err(format!("client process {i} failed ({status})"));
                }
                ended.push(i);
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} client process(es) still running {:.0?} after the end",
                plan.clients - ended.len(),
                deadline - started - plan.duration
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Their connections close as they exit; the last lines may still be in flight.
    let drained_by = Instant::now() + Duration::from_secs(5);
    while res.finished() < plan.clients && Instant::now() < drained_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let record = res.take();
    if record.finals.len() < plan.clients {
        return Err(format!(
            "{} of {} clients reported their end",
            record.finals.len(),
            plan.clients
        ));
    }
    if let Some(f) = record.faults.first() {
        return Err(format!("{} fault(s), the first: {f}", record.faults.len()));
    }
    let verdict = observer::judge(&record.sections);
    if verdict.sections == 0 {
        return Err("no critical section completed: the contender did not run".to_string());
    }
    Ok(Outcome {
        acquire: record
            .sections
            .iter()
            .map(|s| Duration::from_micros(s.acquire_us))
            .collect(),
        verdict,
        pauses: nemesis.pauses.load(std::sync::atomic::Ordering::SeqCst),
        acquire_errors: record.finals.iter().map(|f| f.0).sum(),
        release_errors: record.finals.iter().map(|f| f.1).sum(),
        seconds,
    })
}

/// Pauses one holder at a time: arms `plan.every` after the previous pause ended, while a
/// whole pause still fits before the end.
async fn nemesis_loop(nemesis: &Nemesis, plan: &FlashPlan, started: Instant) {
    let end = started + plan.duration;
    loop {
        tokio::time::sleep(plan.every).await;
        if Instant::now() + plan.pause() + plan.every / 2 > end {
            break;
        }
        nemesis.arm();
        // A section begins within milliseconds on hot names; give up at the end regardless.
        let left = end.saturating_duration_since(Instant::now()) + plan.pause();
        if tokio::time::timeout(left, nemesis.ended.notified())
            .await
            .is_err()
        {
            break;
        }
    }
    nemesis.disarm();
}

/// The first child that has exited, if any, and how.
fn exited(children: &mut Children) -> Result<Option<String>, String> {
    for (i, c) in children.0.iter_mut().enumerate() {
        if let Some(status) = c.try_wait().map_err(|e| format!("client {i}: {e}"))? {
            return Ok(Some(format!("client {i}: {status}")));
        }
    }
    Ok(None)
}
