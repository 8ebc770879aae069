//! The one scenario list every dlock backend must pass, its checkers, the fault tools and the
//! real-server harness.
//!
//! A backend enrols with one file, `tests/conformance.rs`:
//! ```ignore
//! use std::sync::{Arc, OnceLock};
//! use dlock_conformance::TestBackend;
//! fn memory() -> Arc<dyn TestBackend> {
//!     static B: OnceLock<Arc<dyn TestBackend>> = OnceLock::new();
//!     Arc::clone(B.get_or_init(|| Arc::new(dlock_conformance::memory::MemoryBackend::new())))
//! }
//! dlock_conformance::conformance_tests!(memory, memory());
//! ```
//! Each scenario becomes the test `memory::<scenario>`; see [`Scenario`] for the list.

mod backend;
pub mod faults;
mod gate;
pub mod history;
pub mod kit;
mod macros;
pub mod memory;
#[cfg(feature = "criterion")]
pub mod micro;
pub mod report;
pub mod scenarios;
pub mod servers;
pub mod soak;

use std::sync::Arc;

pub use backend::{
    ClientOptions, Declared, ServerExpiry, Slack, TestBackend, read_text, redis_command,
    sum_samples,
};
pub use report::{Row, Status};
pub use scenarios::Scenario;

/// The panic payload of [`skip_backend`]: the suite reports the test as skipped.
#[derive(Debug, Clone)]
pub struct SkipBackend(pub String);

/// For backend factories: when the servers cannot be provided, skip (binaries missing and `CI`
/// unset, see [`HarnessError::may_skip`](servers::HarnessError::may_skip)) or fail (anything
/// else, and always under `CI`). Never returns.
///
/// ```no_run
/// use dlock_conformance::servers::{Cluster, ServerKind};
/// let cluster = Cluster::shared(ServerKind::Redis, 1).unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
/// ```
pub fn harness_unavailable(err: servers::HarnessError) -> ! {
    if err.may_skip() {
        skip_backend(err.to_string())
    }
    panic!("the test servers are unavailable: {err}")
}

/// Ends the current test as skipped with `reason` (a panic the suite's runner recognises).
pub fn skip_backend(reason: String) -> ! {
    std::panic::panic_any(SkipBackend(reason))
}

/// Runs one scenario as a test: builds the backend (a factory panic with [`SkipBackend`] is a
/// skip, any other panic a failure), checks the declared capabilities, runs the scenario,
/// turns any skip the committed allowlist does not name into a failure, prints the row, writes
/// it to `$DLOCK_REPORT_DIR`, and panics when it failed. Used by [`conformance_tests!`].
///
/// A whole backend skipped because its servers are unavailable (binaries missing, `CI` unset)
/// stays a skip here so a machine without servers can still run `cargo test`; `cargo xtask
/// test` and `cargo xtask conform` fail on it all the same.
/// With `DLOCK_LOG` set (an `EnvFilter`, e.g. `dlock_core=debug,dlock_zk=debug`), the library's
/// `tracing` output goes to the test's captured output: a failing scenario prints it.
fn init_log() {
    if std::env::var_os("DLOCK_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("DLOCK_LOG"))
            .with_test_writer()
            .try_init();
    }
}

#[doc(hidden)]
pub fn __run(
    module: &str,
    scenario: Scenario,
    factory: fn() -> Arc<dyn TestBackend>,
    declared: Declared,
) {
    __run_scaled(module, scenario, factory, declared, 1);
}

/// [`__run`] at `ttl_scale` times every scenario's TTL ([`scenarios::run_scaled`]).
#[doc(hidden)]
pub fn __run_scaled(
    module: &str,
    scenario: Scenario,
    factory: fn() -> Arc<dyn TestBackend>,
    declared: Declared,
    ttl_scale: u32,
) {
    init_log();
    let report_name = module.replace('_', "-");
    let backend = match std::panic::catch_unwind(factory) {
        Ok(b) => b,
        Err(payload) => {
            let row = match payload.downcast::<SkipBackend>() {
                Ok(skip) => Row {
                    backend: report_name,
                    scenario: scenario.name().into(),
                    status: Status::Skip,
                    reason: skip.0,
                    figures: Default::default(),
                },
                Err(other) => Row {
                    backend: report_name,
                    scenario: scenario.name().into(),
                    status: Status::Fail,
                    reason: format!(
                        "the backend could not be built: {}",
                        scenarios::panic_message(other)
                    ),
                    figures: Default::default(),
                },
            };
            finish(&row, None);
            return;
        }
    };
    // A row on several server processes runs a few scenarios at a time (see `gate`).
    let _slot = backend
        .topology()
        .filter(|&(_, nodes)| nodes > 1)
        .map(|_| gate::enter(module, gate::CLUSTER_PARALLEL));
    let mut row = scenarios::run_scaled(
        Arc::clone(&backend),
        module,
        scenario,
        scenarios::Fencing::On,
        Some(declared),
        ttl_scale,
    );
    row.enforce_allowlist();
    finish(&row, Some(&*backend));
}

fn finish(row: &Row, backend: Option<&dyn TestBackend>) {
    row.write_if_requested();
    println!("{}", row.summary());
    if row.failed() {
        let logs = backend
            .map(TestBackend::logs)
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| servers::shared_logs(4096));
        if !logs.is_empty() {
            println!("---- server output ----\n{logs}");
        }
        panic!("{}::{} failed: {}", row.backend, row.scenario, row.reason);
    }
}
