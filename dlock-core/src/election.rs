//! Leader election: one leader per name at a time, each with a term (a fencing token above
//! every earlier leader's) and a value it proclaims; everyone else can read or follow who leads.
//!
//! An election is a fair lock whose holder carries a value: a campaign waits in the lock's
//! queue (FIFO, only the next in line is woken) and leads once granted. A [`Leadership`] is a
//! [`Lease`] underneath: renewed by the locker's one renewal driver, lost (see
//! [`Leadership::lost`]) before anyone else can be granted the name, and its term is the
//! lease's fencing token.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{AcquireOptions, Error, FencingToken, Lease, LockName, Locker, LossReason};

/// The largest value a campaign or a proclamation may carry.
pub const MAX_VALUE_LEN: usize = 64 * 1024;

/// Checks a campaign's or a proclamation's value.
///
/// # Errors
/// [`Error::InvalidOption`] when the value is longer than [`MAX_VALUE_LEN`].
pub fn validate_value(value: &[u8]) -> Result<(), Error> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::InvalidOption {
            option: "value",
            reason: format!(
                "{} bytes, more than the {MAX_VALUE_LEN} bytes a leader's value may hold",
                value.len()
            ),
        });
    }
    Ok(())
}

/// A leader as the server records it.
#[derive(Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leadership's fencing token: above every earlier leader's term of the same name.
    pub term: FencingToken,
    /// The value the leader campaigned with, or last proclaimed.
    pub value: Vec<u8>,
}

impl fmt::Debug for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leader")
            .field("term", &self.term)
            .field("value", &String::from_utf8_lossy(&self.value))
            .finish()
    }
}

/// The leader changes of one election, in the order the server made them.
///
/// Every new leader is reported, and so is every value a leader proclaims; nothing is
/// skipped silently: when the backend can no longer tell that it saw every change (a lost
/// connection, history the server compacted), [`LeaderChanges::next`] fails and the
/// observer should call [`Election::observe`] again.
#[async_trait]
pub trait LeaderChanges: Send {
    /// The next change. The first call returns the leader at the time the observation began,
    /// or waits for the first one when nobody leads.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when changes may have been missed (see the trait's
    /// documentation); [`Error::Backend`] when the server answers something unexpected.
    ///
    /// # Cancel safety
    /// Cancel-safe: a change is consumed only when `next` returns it.
    async fn next(&mut self) -> Result<Leader, Error>;
}

/// A backend's part of a [`Leadership`]: writing a new value for the held name. For backend
/// authors.
#[async_trait]
pub trait Proclaim: Send + Sync + 'static {
    /// Sets the value recorded for `lease`'s leadership, only while `lease` still holds the
    /// name at the server (a guarded write).
    ///
    /// # Errors
    /// [`Error::Lost`] when the server no longer records `lease` as the holder; what a request
    /// fails with otherwise.
    async fn proclaim(&self, lease: &Lease, value: &[u8]) -> Result<(), Error>;
}

/// Leader election on one backend. Object-safe, like [`Locker`](crate::Locker), and
/// reached from one with `Locker::as_*`; its `ttl` and `close` are the locker's.
#[async_trait]
pub trait Election: Locker {
    /// Campaigns for `name` with `value`: waits in line (FIFO) until this campaign leads,
    /// until `opts.wait` elapses, or until the future is dropped.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a value longer than [`MAX_VALUE_LEN`] or bad options
    /// (before any I/O); [`Error::Timeout`] when the wait elapses; what the backend's
    /// `acquire` fails with otherwise.
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the campaign; nothing is left behind.
    async fn campaign(
        &self,
        name: &LockName,
        value: &[u8],
        opts: AcquireOptions,
    ) -> Result<Leadership, Error>;

    /// The current leader of `name`, as the server records it (`None`: nobody leads).
    ///
    /// # Errors
    /// [`Error::Unavailable`] or [`Error::Backend`] when the server cannot be read;
    /// [`Error::Closed`] once the locker is closed.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>, Error>;

    /// Follows the leader changes of `name` (see [`LeaderChanges`]).
    ///
    /// # Errors
    /// [`Error::Unavailable`] or [`Error::Backend`] when the observation cannot start;
    /// [`Error::Closed`] once the locker is closed.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped call leaves no observation behind.
    async fn observe(&self, name: &LockName) -> Result<Box<dyn LeaderChanges>, Error>;
}

/// Leading one election: a [`Lease`] on its name, with a term and a value.
///
/// Dropping a `Leadership` resigns in the background, as dropping a [`Lease`] releases it.
pub struct Leadership {
    lease: Lease,
    proclaim: Arc<dyn Proclaim>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", self.lease.name())
            .field("term", &self.lease.token())
            .finish()
    }
}

/// A leadership on `lease`, whose value `proclaim` writes. For backend authors.
pub fn leadership(lease: Lease, proclaim: Arc<dyn Proclaim>) -> Leadership {
    Leadership { lease, proclaim }
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &LockName {
        self.lease.name()
    }

    /// This leadership's term: its fencing token, above every earlier leader's.
    pub fn term(&self) -> FencingToken {
        self.lease.token()
    }

    /// Until when this leadership is certain (see [`Lease::deadline`]).
    pub fn deadline(&self) -> Instant {
        self.lease.deadline()
    }

    /// Whether the leadership is known lost (see [`Lease::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Whether this process may still act as the leader.
    ///
    /// # Errors
    /// [`Error::Lost`] when the leadership is lost or its deadline is too close.
    pub fn check(&self) -> Result<(), Error> {
        self.lease.check()
    }

    /// Resolves when the leadership is lost, before anyone else can lead (see
    /// [`Lease::lost`]).
    ///
    /// # Cancel safety
    /// Cancel-safe: the returned future owns what it needs and can be dropped at any time.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        self.lease.lost()
    }

    /// The lease underneath (its fencing token guards a resource as any lease's does).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Records `value` as this leader's value; observers see the change.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a value longer than [`MAX_VALUE_LEN`] (before any I/O);
    /// [`Error::Lost`] when the leadership is lost (checked before and at the server);
    /// [`Error::Unavailable`] or [`Error::Backend`] when the write fails.
    ///
    /// # Cancel safety
    /// Not cancel-safe in outcome: a dropped call may or may not have written the value.
    pub async fn proclaim(&self, value: &[u8]) -> Result<(), Error> {
        validate_value(value)?;
        self.lease.check()?;
        self.proclaim.proclaim(&self.lease, value).await
    }

    /// Gives the leadership up: the next campaign in line leads.
    ///
    /// # Errors
    /// As [`Lease::release`].
    ///
    /// # Cancel safety
    /// As [`Lease::release`]: a dropped call finishes the release in the background.
    pub async fn resign(self) -> Result<(), Error> {
        self.lease.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_longer_than_the_limit_is_refused_before_any_io() {
        assert!(validate_value(&vec![0; MAX_VALUE_LEN]).is_ok());
        let e = validate_value(&vec![0; MAX_VALUE_LEN + 1]).expect_err("too long");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("value"), "{e}");
    }
}
