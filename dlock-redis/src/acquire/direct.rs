//! A grant the release made to us directly (the queue head; see `pass_on` in `scripts.rs`):
//! its token came over the notification channel, with no request of ours. When it counts,
//! and from when its deadline runs.
//!
//! The release set the key to our owner value at some instant `r` for `min(TTL, dl − r)`,
//! where `dl` is our queue entry's deadline, set by our last queued attempt when it ran: its
//! run time + the entry lifetime. That attempt was sent at `s` and answered "not granted", so
//! it ran before the release (after it, it would have found our owner value and granted). So
//! the key's expiry is at least `min(s + TTL, s + entry lifetime)`, and the lease's deadline
//! is counted as for a grant whose request was sent at `s` with the TTL capped at the entry
//! lifetime (1 ms less, for the server clock's millisecond rounding): [`start_of`] gives the
//! equivalent send time for the renewal driver, which counts a deadline as send time + TTL −
//! drift.

use std::time::Duration;

use tokio::time::Instant;

use super::queue::entry_lifetime;
use crate::locker::Inner;

/// The send time to register a direct grant with, so that the driver's deadline is
/// `queued_at + min(TTL, entry lifetime − 1 ms) − drift`; `None` when that leaves less than a
/// renewal period (TTL/3) from now: the waiter then asks for its grant with an attempt, which
/// re-arms the key from that attempt's send (one round trip more, as before direct grants).
pub(super) fn start_of(inner: &Inner, queued_at: Instant) -> Option<Instant> {
    let ttl = inner.ttl;
    let capped = ttl.min(entry_lifetime(ttl).saturating_sub(Duration::from_millis(1)));
    let start = queued_at.checked_sub(ttl - capped)?;
    let left = inner
        .driver
        .deadline_from(start)
        .checked_duration_since(Instant::now())?;
    (left >= ttl / 3).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ttl_is_capped_at_the_entry_lifetime() {
        // TTL 10 s: the entry lives 3 s, so the key lives at most that long after our refresh.
        let ttl = Duration::from_secs(10);
        let capped = ttl.min(entry_lifetime(ttl).saturating_sub(Duration::from_millis(1)));
        assert_eq!(capped, Duration::from_millis(2999));
        // TTL 200 ms: the entry outlives the TTL; the TTL stands.
        let ttl = Duration::from_millis(200);
        let capped = ttl.min(entry_lifetime(ttl).saturating_sub(Duration::from_millis(1)));
        assert_eq!(capped, ttl);
    }
}
