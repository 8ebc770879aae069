//! Options for acquiring and for building lockers, validated before any I/O.

use std::time::Duration;

use crate::error::Error;

/// The shortest lease TTL a locker accepts.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// The longest lease TTL a locker accepts.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest wait `acquire` accepts (longer waits are almost surely a unit mistake).
pub const MAX_WAIT: Duration = Duration::from_secs(30 * 24 * 3600);

/// Options of one [`Locker::acquire`](crate::Locker::acquire) call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireOptions {
    /// How long to wait for the lock; `None` waits until granted or cancelled.
    pub wait: Option<Duration>,
}

/// A bounded wait: `AcquireOptions::from(d)` is [`AcquireOptions::wait`]`(d)`.
impl From<Duration> for AcquireOptions {
    fn from(wait: Duration) -> Self {
        AcquireOptions::wait(wait)
    }
}

impl AcquireOptions {
    /// Wait until granted or cancelled.
    pub fn forever() -> Self {
        AcquireOptions { wait: None }
    }

    /// Wait at most `wait`, then fail with [`Error::Timeout`].
    pub fn wait(wait: Duration) -> Self {
        AcquireOptions { wait: Some(wait) }
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when the wait is longer than [`MAX_WAIT`].
    pub fn validate(&self) -> Result<(), Error> {
        match self.wait {
            Some(w) if w > MAX_WAIT => Err(Error::invalid_option(
                "wait",
                format!("{w:?} is longer than the maximum {MAX_WAIT:?}"),
            )),
            _ => Ok(()),
        }
    }
}

/// Checks a lease TTL given to a locker builder.
///
/// # Errors
/// [`Error::InvalidOption`] when the TTL is below [`MIN_TTL`] (zero included) or above
/// [`MAX_TTL`].
pub fn validate_ttl(ttl: Duration) -> Result<Duration, Error> {
    if ttl < MIN_TTL {
        return Err(Error::invalid_option(
            "ttl",
            format!("{ttl:?} is shorter than the minimum {MIN_TTL:?}"),
        ));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid_option(
            "ttl",
            format!("{ttl:?} is longer than the maximum {MAX_TTL:?}"),
        ));
    }
    Ok(ttl)
}

/// The clock-drift allowance subtracted from a TTL: `ttl / 100 + 2 ms`, as in Redlock.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The most a lease's loss margin adds for scheduling delay (see [`loss_margin`]).
const MAX_SCHEDULING_ALLOWANCE: Duration = Duration::from_millis(200);

/// How long before its deadline a lease that was not extended counts as lost (in
/// `Lease::lost`, `is_lost` and `check`): the drift allowance again, plus a scheduling
/// allowance of `ttl / 10`, at most 200 ms.
///
/// The timer behind `lost()` rounds up to the next millisecond and the woken task then waits
/// for a CPU; on a loaded machine (the project's CI) the whole runtime was measured up to 85 ms
/// late. For a 2 s TTL the margin is 222 ms, for 1 s 112 ms, for 30 s 502 ms, and 13 ms at the
/// 100 ms minimum.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(dlock_core::backend::loss_margin(Duration::from_secs(2)), Duration::from_millis(222));
/// ```
pub fn loss_margin(ttl: Duration) -> Duration {
    drift(ttl) + (ttl / 10).min(MAX_SCHEDULING_ALLOWANCE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert!(validate_ttl(Duration::ZERO).is_err());
        assert!(validate_ttl(Duration::from_millis(99)).is_err());
        assert!(validate_ttl(Duration::from_millis(100)).is_ok());
        assert!(validate_ttl(MAX_TTL).is_ok());
        assert!(validate_ttl(MAX_TTL + Duration::from_secs(1)).is_err());
        assert!(AcquireOptions::wait(MAX_WAIT * 2).validate().is_err());
        assert!(AcquireOptions::forever().validate().is_ok());
    }

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(1)), Duration::from_millis(12));
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
    }

    #[test]
    fn the_loss_margin_adds_a_tenth_of_the_ttl_at_most_200_ms() {
        assert_eq!(loss_margin(MIN_TTL), Duration::from_millis(13));
        assert_eq!(
            loss_margin(Duration::from_secs(1)),
            Duration::from_millis(112)
        );
        assert_eq!(
            loss_margin(Duration::from_secs(30)),
            Duration::from_millis(502)
        );
    }
}
