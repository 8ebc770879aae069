//! The memory backend runs the whole scenario list.

use std::sync::Arc;

use dlock_conformance::Declared;
use dlock_conformance::memory::MemoryBackend;
use dlock_core::FencingStrength;

dlock_conformance::conformance_tests!(
    memory,
    Arc::new(MemoryBackend::new()),
    declared = Declared {
        fair: true,
        herd_free: true,
        fencing: FencingStrength::Linearizable,
        crash_release_slack: dlock_conformance::Slack::fixed(std::time::Duration::from_millis(50)),
    }
);
