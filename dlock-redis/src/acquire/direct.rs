//! A grant the release made to us directly (the queue head; see `pass_on` in `scripts.rs`):
//! its token came over the notification channel, with no request of ours. When it counts,
//! and from when its deadline runs.
//!
//! The release set the key to our owner value at some instant `r` for `min(TTL, dl − r)`,
//! where `dl` is our queue entry's deadline, set by the last of our queued attempts that ran
//! before the release: its run time + the entry lifetime. The announcement names that attempt
//! (its number, from the grant details it left). The waiter takes the grant only when that is
//! the last attempt it saw answered "not granted", sent at `s`: it ran before the release and
//! after `s`, so the key's expiry is at least `min(s + TTL, s + entry lifetime)`, and the
//! lease's deadline is counted as for a grant whose request was sent at `s` with the TTL capped
//! at the entry lifetime (1 ms less, for the server clock's millisecond rounding): [`start_of`]
//! gives the equivalent send time for the renewal driver, which counts a deadline as send
//! time + TTL − drift.
//!
//! An announcement may arrive late (it travels on another connection than the attempts). A
//! later attempt answered meanwhile may have found that grant expired and the lock taken:
//! counted from that attempt's send, the deadline would fall after the key's expiry. So an
//! announcement after any other attempt than the last answered one is not taken.

use std::time::Duration;

use tokio::time::Instant;

use super::queue::{entry_lifetime, refresh_period};
use crate::locker::Inner;

/// The send time to register a direct grant with, so that the driver's deadline is
/// `queued_at + min(TTL, entry lifetime − 1 ms) − drift` (`queued_at`: the send of the attempt
/// the announcement names); `None` when that leaves less than
/// [`least_left`] from now: the waiter then asks for its grant with an attempt, which re-arms
/// the key from that attempt's send (one round trip more, as before direct grants).
///
/// Its first renewal is due a third of the validity left after the grant
/// ([`handed_over`](super::grant::handed_over)): the lease reaches a full TTL one renewal
/// later, and a shorter hold sends none.
pub(super) fn start_of(inner: &Inner, queued_at: Instant) -> Option<Instant> {
    let ttl = inner.ttl;
    let start = queued_at.checked_sub(ttl - capped(ttl))?;
    let left = inner
        .driver
        .deadline_from(start)
        .checked_duration_since(Instant::now())?;
    (left >= least_left(ttl)).then_some(start)
}

/// The TTL a direct grant is counted with: the TTL, but at most the queue entry's lifetime
/// less 1 ms (the server clock's millisecond rounding), which is as long as `pass_on` lets
/// the key live past the entry's last refresh.
fn capped(ttl: Duration) -> Duration {
    ttl.min(entry_lifetime(ttl).saturating_sub(Duration::from_millis(1)))
}

/// The least validity a direct grant must leave to be taken: a renewal period (TTL/3), but
/// never more than a queue refresh period (1 s at most). The grant is capped at the entry's
/// lifetime (three refresh periods, at most 3 s) and the entry was refreshed at most a refresh
/// period before, so a grant leaves about two refresh periods less the drift allowance: under
/// TTL/3 from a TTL of 9 s, which left every grant at the default TTLs (10 s, Redis's 30 s) to
/// the round trip it saves.
fn least_left(ttl: Duration) -> Duration {
    (ttl / 3).min(refresh_period(ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_taken_at_every_ttl_from_2_s_to_a_minute() {
        // What a grant leaves when the entry was refreshed a whole refresh period before. (Past
        // about 100 s the drift allowance, 1 % of the TTL, eats the 3 s a grant can have.)
        for secs in [2, 3, 9, 10, 30, 60] {
            let ttl = Duration::from_secs(secs);
            let left = capped(ttl)
                .saturating_sub(refresh_period(ttl))
                .saturating_sub(dlock_core::backend::drift(ttl));
            assert!(
                left >= least_left(ttl),
                "TTL {ttl:?}: a grant leaves {left:?}, less than {:?}",
                least_left(ttl)
            );
            assert!(least_left(ttl) <= ttl / 3, "TTL {ttl:?}");
        }
    }

    #[test]
    fn the_ttl_is_capped_at_the_entry_lifetime() {
        // TTL 10 s: the entry lives 3 s, so the key lives at most that long after our refresh.
        let ttl = Duration::from_secs(10);
        assert_eq!(capped(ttl), Duration::from_millis(2999));
        // TTL 200 ms: the entry outlives the TTL; the TTL stands.
        let ttl = Duration::from_millis(200);
        assert_eq!(capped(ttl), ttl);
    }
}
