//! The memory backend runs the whole scenario list.

use std::sync::{Arc, OnceLock};

use dlock_conformance::memory::MemoryBackend;
use dlock_conformance::{Declared, TestBackend};
use dlock_core::FencingStrength;

fn memory() -> Arc<dyn TestBackend> {
    static BACKEND: OnceLock<Arc<dyn TestBackend>> = OnceLock::new();
    Arc::clone(BACKEND.get_or_init(|| Arc::new(MemoryBackend::new())))
}

dlock_conformance::conformance_tests!(
    memory,
    memory(),
    declared = Declared {
        fair: true,
        herd_free: true,
        fencing: FencingStrength::Linearizable,
        crash_release_slack: dlock_conformance::Slack::fixed(std::time::Duration::from_millis(50)),
    }
);
