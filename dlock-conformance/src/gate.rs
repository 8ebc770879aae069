//! How many scenarios of one multi-server row run at once in one test process.
//!
//! `cargo xtask test` runs 24 tests at once: scenarios mostly sleep on TTLs. A row on a cluster
//! is different. 24 of its scenarios at once, each with its own clients and some with a private
//! cluster, kept the three members of an etcd cluster so busy on 2 cores that their heartbeats
//! stalled past the election timeout: elections with no fault set, renewals timing out, and 8
//! `etcd-cluster` rows failed at once in one CI run. With one busy loop beside the binary, the
//! `etcd-cluster` binary failed 3 runs of 3 at 24 scenarios at once (`leader_partition`) and
//! passed 3 of 3 at 8, in the same wall time (its longest scenarios set it).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// Scenarios of one multi-server row that may run at once in one test process.
pub(crate) const CLUSTER_PARALLEL: usize = 8;

/// Running scenarios per row (the `conformance_tests!` module name).
struct Gates {
    running: Mutex<HashMap<String, usize>>,
    freed: Condvar,
}

fn gates() -> &'static Gates {
    static G: OnceLock<Gates> = OnceLock::new();
    G.get_or_init(|| Gates {
        running: Mutex::new(HashMap::new()),
        freed: Condvar::new(),
    })
}

fn lock(g: &Gates) -> MutexGuard<'_, HashMap<String, usize>> {
    g.running.lock().unwrap_or_else(|p| p.into_inner())
}

/// A place among the row's running scenarios; dropping it (also when the scenario panics)
/// lets the next one in.
#[derive(Debug)]
pub(crate) struct Slot {
    row: String,
}

/// Waits until fewer than `limit` scenarios of `row` run, then takes a place.
pub(crate) fn enter(row: &str, limit: usize) -> Slot {
    let g = gates();
    let mut running = lock(g);
    while running.get(row).copied().unwrap_or(0) >= limit.max(1) {
        running = g.freed.wait(running).unwrap_or_else(|p| p.into_inner());
    }
    *running.entry(row.to_string()).or_insert(0) += 1;
    Slot {
        row: row.to_string(),
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let g = gates();
        let mut running = lock(g);
        if let Some(n) = running.get_mut(&self.row) {
            *n = n.saturating_sub(1);
        }
        drop(running);
        g.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::enter;

    #[test]
    fn no_more_than_the_limit_run_at_once() {
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..12)
            .map(|_| {
                let (now, most) = (Arc::clone(&now), Arc::clone(&most));
                std::thread::spawn(move || {
                    let _slot = enter("gate-test-row", 3);
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a gated thread panicked");
        }
        let most = most.load(Ordering::SeqCst);
        assert!(
            (1..=3).contains(&most),
            "{most} ran at once under a limit of 3"
        );
    }

    #[test]
    fn a_panicking_scenario_frees_its_place() {
        let r = std::thread::spawn(|| {
            let _slot = enter("gate-test-panic", 1);
            panic!("the scenario failed");
        })
        .join();
        assert!(r.is_err());
        // Would wait for ever if the panicking holder had kept its place.
        let _slot = enter("gate-test-panic", 1);
    }

    #[test]
    fn rows_do_not_share_places() {
        let _a = enter("gate-test-a", 1);
        // A second row is let in while the first is full.
        let _b = enter("gate-test-b", 1);
    }
}
