//! The arithmetic of Redlock: quorum size, validity, the majority-max fencing token.

use std::time::Duration;

use dlock_core::backend::drift;

/// The quorum of `n` nodes: a strict majority.
pub(crate) fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// What is left of a TTL after `elapsed` and the clock-drift allowance; `None` when nothing is
/// (saturating: an attempt that took longer than its TTL can never report success).
pub(crate) fn validity(ttl: Duration, elapsed: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)
        .and_then(|v| v.checked_sub(drift(ttl)))
        .filter(|v| !v.is_zero())
}

/// The fencing token of a grant from the per-node counters of the granting nodes, and the
/// nodes (indexes into `granted`) whose counter is below it and must be raised.
pub(crate) fn token_plan(granted: &[(usize, u64)]) -> Option<(u64, Vec<usize>)> {
    let max = granted.iter().map(|(_, c)| *c).max()?;
    let laggards = granted
        .iter()
        .filter(|(_, c)| *c < max)
        .map(|(i, _)| *i)
        .collect();
    Some((max, laggards))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
    }

    #[test]
    fn validity_saturates() {
        let ttl = Duration::from_secs(1);
        assert_eq!(
            validity(ttl, Duration::from_millis(100)),
            Some(Duration::from_millis(888))
        );
        assert_eq!(validity(ttl, Duration::from_millis(988)), None);
        assert_eq!(validity(ttl, Duration::from_millis(1000)), None);
        assert_eq!(validity(ttl, Duration::from_secs(3600)), None);
    }

    #[test]
    fn token_is_the_max_and_laggards_are_raised() {
        assert_eq!(token_plan(&[(0, 5), (2, 7), (4, 7)]), Some((7, vec![0])));
        assert_eq!(token_plan(&[(1, 3), (2, 3), (3, 3)]), Some((3, vec![])));
        assert_eq!(token_plan(&[]), None);
    }
}
