//! Which names this locker recently had to queue for: their next acquire skips the script-free
//! first attempt (it would fail) and queues at once, saving a round trip under contention.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// At most this many names are remembered; beyond it the memory is cleared.
const CAPACITY: usize = 4096;

/// Recently contended lock keys.
#[derive(Debug, Default)]
pub(crate) struct Contended {
    seen: Mutex<HashMap<String, Instant>>,
}

impl Contended {
    fn seen(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `key` had to queue within the last `window`.
    pub(crate) fn recently(&self, key: &str, window: Duration) -> bool {
        self.seen().get(key).is_some_and(|at| at.elapsed() < window)
    }

    /// Notes that `key` had to queue now.
    pub(crate) fn note(&self, key: &str) {
        let mut seen = self.seen();
        if seen.len() >= CAPACITY && !seen.contains_key(key) {
            seen.clear();
        }
        seen.insert(key.to_owned(), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_within_the_window_and_stays_bounded() {
        let c = Contended::default();
        assert!(!c.recently("a", Duration::from_secs(1)));
        c.note("a");
        assert!(c.recently("a", Duration::from_secs(1)));
        assert!(!c.recently("a", Duration::ZERO));
        for i in 0..CAPACITY + 10 {
            c.note(&format!("k{i}"));
        }
        assert!(c.seen().len() <= CAPACITY);
    }
}
