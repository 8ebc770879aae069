//! The one scenario list. Each scenario is an async function over a [`Ctx`] that returns
//! `Ok(())`, or a [`Verdict`] saying why it failed or does not apply; [`run`] turns that into a
//! report [`Row`].

mod basic;
mod close;
mod crash;
mod edges;
mod election;
mod enqueue;
mod exclusion;
mod family;
mod herd;
pub(crate) mod holder;
mod inspect;
mod lease;
mod list;
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

crate::__scenarios!(@define);

impl Scenario {
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
    /// The row's TTL multiplier (1 at the harness's fast settings; see [`run_scaled`]).
    pub(crate) ttl_scale: u32,
    /// The enrolment's committed table, when the run has one.
    declared: Option<Declared>,
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
            ttl_scale: 1,
            declared: None,
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

    /// The scenario's lease TTL: [`Scenario::ttl`] times the row's TTL scale.
    pub fn ttl(&self) -> Duration {
        self.scenario.ttl() * self.ttl_scale
    }

    /// How long after the scenario's TTL a crashed (or cut-off) holder's lock may still be
    /// held: the enrolment's declared slack ([`Declared::crash_release_slack`]), never the
    /// backend's own figure; without a declaration (negative controls), the one in `caps`
    /// (a client's [`Capabilities`]).
    pub(crate) fn crash_slack(&self, caps: &Capabilities) -> Duration {
        match &self.declared {
            Some(d) => d.crash_release_slack.at(self.ttl()),
            None => caps.crash_release_slack,
        }
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
    run_scaled(backend, module, scenario, fencing, declared, 1)
}

/// [`run_with`] at `ttl_scale` times every scenario's TTL (and its time limit): the rows that
/// prove the timing claims at the servers' default settings (a 2 s ZooKeeper tick, etcd's
/// 1 s election timeout) run with leases of production length. The scale is the enrolment's,
/// committed with the row; every bound a scenario judges by stays the scenario's own.
pub fn run_scaled(
    backend: Arc<dyn TestBackend>,
    module: &str,
    scenario: Scenario,
    fencing: Fencing,
    declared: Option<Declared>,
    ttl_scale: u32,
) -> Row {
    let name = backend.name().to_string();
    let mut ctx = Ctx::new(backend, module, scenario);
    ctx.fencing = fencing;
    ctx.ttl_scale = ttl_scale.max(1);
    ctx.declared = declared;
    let time_limit = SCENARIO_TIMEOUT * ctx.ttl_scale;
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
        match tokio::time::timeout(time_limit, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(Verdict::Fail(format!(
                "panicked: {}",
                panic_message(join.into_panic())
            ))),
            Err(_) => Err(Verdict::Fail(format!(
                "did not finish within {time_limit:?}"
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
    let wrong = declared.mismatches_at(&caps, ctx.ttl());
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
