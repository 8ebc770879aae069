//! What the negative-control test binaries share: judging a control's row, the reference run
//! on the correct memory backend, and the parts of an in-process broken [`TestBackend`] that
//! every one of them writes the same way.

// Each test binary uses its own share of this module.
#![allow(dead_code, unused_macros, unused_imports)]

use std::sync::Arc;

use dlock_conformance::memory::MemoryBackend;
use dlock_conformance::scenarios::{Fencing, Verdict, run_control};
use dlock_conformance::{Row, Scenario, Status, TestBackend};

/// The row of a broken backend must fail, and its reason name every one of `needles`.
pub fn assert_caught(row: &Row, needles: &[&str]) {
    assert_eq!(
        row.status,
        Status::Fail,
        "the broken backend passed: {}",
        row.summary()
    );
    for needle in needles {
        assert!(
            row.reason.contains(needle),
            "failed for another reason than expected ({needle:?}): {}",
            row.summary()
        );
    }
}

/// Runs `scenario` on `backend` (with the fenced resource on), prints the row and returns it.
pub fn run_printed(backend: Arc<dyn TestBackend>, label: &str, scenario: Scenario) -> Row {
    let row = run_control(backend, label, scenario, Fencing::On);
    println!("{}", row.summary());
    row
}

/// The reason a soak or scenario gave for failing (or skipping).
pub fn reason(v: Verdict) -> String {
    match v {
        Verdict::Fail(why) | Verdict::Skip(why) => why,
    }
}

/// Runs `scenario` on the correct memory backend: the row must pass.
pub fn passes(scenario: Scenario) -> Row {
    let row = run_control(
        Arc::new(MemoryBackend::new()),
        "memory",
        scenario,
        Fencing::On,
    );
    assert_eq!(row.status, Status::Pass, "{}", row.summary());
    row
}

/// `impl TestBackend for $backend` of an in-process broken backend: it has no server nodes and
/// nothing for a child process. `forward($field)` adds `leftovers` and `break_holder` of the
/// memory backend in that field; `holds_nothing` adds a `leftovers` that finds nothing and a
/// `break_holder` that breaks an unknown holder. The items given write the rest.
macro_rules! in_process {
    (forward($field:tt) $backend:ident { $($item:tt)* }) => {
        $crate::support::in_process!($backend {
            async fn leftovers(
                &self,
                namespace: &str,
            ) -> Result<Vec<String>, ::dlock_core::Error> {
                self.$field.leftovers(namespace).await
            }

            async fn break_holder(
                &self,
                namespace: &str,
                name: &::dlock_core::LockName,
            ) -> Result<Option<Vec<::dlock_core::FencingToken>>, ::dlock_core::Error> {
                self.$field.break_holder(namespace, name).await
            }

            $($item)*
        });
    };
    (holds_nothing $backend:ident { $($item:tt)* }) => {
        $crate::support::in_process!($backend {
            async fn leftovers(
                &self,
                _namespace: &str,
            ) -> Result<Vec<String>, ::dlock_core::Error> {
                Ok(Vec::new())
            }

            async fn break_holder(
                &self,
                _namespace: &str,
                _name: &::dlock_core::LockName,
            ) -> Result<Option<Vec<::dlock_core::FencingToken>>, ::dlock_core::Error> {
                Ok(Some(Vec::new()))
            }

            $($item)*
        });
    };
    ($backend:ident { $($item:tt)* }) => {
        #[::async_trait::async_trait]
        impl ::dlock_conformance::TestBackend for $backend {
            fn node_addrs(&self) -> Vec<::std::net::SocketAddr> {
                Vec::new()
            }

            fn child_env(&self) -> Vec<(String, String)> {
                Vec::new()
            }

            $($item)*
        }
    };
}

pub(crate) use in_process;
