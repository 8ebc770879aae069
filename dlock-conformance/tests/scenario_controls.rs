//! The new scenarios' checks can fail: run against deliberately broken memory lockers.

use std::sync::Arc;

use dlock_conformance::memory::MemoryBackend;
use dlock_conformance::scenarios::{Fencing, run_control};
use dlock_conformance::{Scenario, Status, TestBackend};
use dlock_core::memory::Defect;

fn broken(defect: Defect) -> Arc<dyn TestBackend> {
    Arc::new(MemoryBackend::with_defect(defect))
}

/// A server that expires the holder before the client's deadline is caught by `slow_grant`:
/// the contender is granted before the lease's deadline.
#[test]
fn slow_grant_catches_early_expiry() {
    let row = run_control(
        broken(Defect::EarlyExpiry),
        "memory_earlyexpiry",
        Scenario::SlowGrant,
        Fencing::On,
    );
    assert_eq!(row.status, Status::Fail, "{}", row.summary());
    assert!(
        row.reason
            .contains("BEFORE the slow-granted lease's deadline"),
        "{}",
        row.summary()
    );
}

/// The correct memory backend passes the same run (so the control fails for the defect).
#[test]
fn slow_grant_passes_on_the_reference() {
    let row = run_control(
        Arc::new(MemoryBackend::new()),
        "memory",
        Scenario::SlowGrant,
        Fencing::On,
    );
    assert_eq!(row.status, Status::Pass, "{}", row.summary());
}
