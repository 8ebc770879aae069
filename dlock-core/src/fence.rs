//! The resource side of fencing: reject operations that carry a stale token.
//!
//! A lock alone cannot protect a resource from a holder that was paused (GC, SIGSTOP, a slow
//! disk) past its lease: it wakes up believing it still holds the lock. The resource must check
//! the token that came with the grant and reject any operation whose token is lower than the
//! highest it has accepted. [`FenceGuard`] does that in memory; the recipes below do it where
//! the data lives.
//!
//! # Recipe: SQL
//! Keep the highest accepted token next to the data and make the write conditional on it, in
//! one statement:
//! ```sql
//! UPDATE accounts SET balance = $1, fence = $token
//!  WHERE id = $2 AND fence <= $token;
//! -- 0 rows updated => a newer holder has written: abort, do not retry with the same token.
//! ```
//!
//! # Recipe: Redis (Lua compare-and-set)
//! ```lua
//! -- KEYS[1] = data key, KEYS[2] = its fence key, ARGV[1] = token, ARGV[2] = value
//! local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
//! if tonumber(ARGV[1]) < seen then return 0 end
//! redis.call('SET', KEYS[2], ARGV[1])
//! redis.call('SET', KEYS[1], ARGV[2])
//! return 1
//! ```
//!
//! # Recipe: etcd (transaction)
//! Compare the fence key's value (stored as a zero-padded decimal so that byte order is numeric
//! order) and write both keys only if ours is not lower:
//! ```text
//! Txn
//!   If:   value("/data/x/fence") <= "%020d" token      (or the key does not exist: version == 0)
//!   Then: Put("/data/x", value), Put("/data/x/fence", "%020d" token)
//!   Else: nothing — a newer holder has written
//! ```

use std::sync::Mutex;

use crate::FencingToken;
use crate::sync::lock;

/// An operation was rejected because a newer token has already been accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {offered}: token {highest} was already accepted")]
pub struct FenceRejected {
    /// The token that came with the rejected operation.
    pub offered: FencingToken,
    /// The highest token accepted so far.
    pub highest: FencingToken,
}

/// An in-memory fence: accepts an operation whose token is at least the highest seen, rejects
/// lower ones, atomically with the operation itself.
///
/// # Equal tokens
/// An operation with a token EQUAL to the highest accepted is accepted: that is how one holder
/// writes more than once, and a fence cannot tell holders apart by anything but their tokens.
/// This is sound only because every grant's token is unique — a backend that hands the same
/// token to two holders (e.g. a Redis server restarted without persistence resetting its
/// counter) defeats every fence, this one and the SQL / Lua / etcd recipes below alike. Token
/// uniqueness is therefore the backend's promise, checked by the conformance suite's token
/// checker; a resource that must survive a backend breaking it has to store a holder identity
/// next to the token and reject an equal token from another identity.
///
/// ```
/// use dlock_core::{FenceGuard, FencingToken};
/// let guard = FenceGuard::new(0u64);
/// guard.apply(FencingToken(7), |v| *v += 1).expect("holder A");
/// // A second grant that (wrongly) carries token 7 is indistinguishable from holder A:
/// guard.apply(FencingToken(7), |v| *v += 1).expect("equal tokens are accepted");
/// assert_eq!(guard.read(|v| *v), 2);
/// ```
///
/// ```
/// use dlock_core::{FenceGuard, FencingToken};
/// let guard = FenceGuard::new(0u64);
/// guard.apply(FencingToken(5), |v| *v += 1).expect("fresh token");
/// assert!(guard.apply(FencingToken(4), |v| *v += 1).is_err()); // a stale holder
/// assert_eq!(guard.read(|v| *v), 1);
/// ```
#[derive(Debug, Default)]
pub struct FenceGuard<T> {
    inner: Mutex<(Option<FencingToken>, T)>,
}

impl<T> FenceGuard<T> {
    /// A guard around `value`, having accepted no token yet.
    pub fn new(value: T) -> Self {
        FenceGuard {
            inner: Mutex::new((None, value)),
        }
    }

    /// Runs `op` on the value if `token` is not lower than every token accepted so far, and
    /// records it as the highest. Check and operation happen under one lock.
    ///
    /// # Errors
    /// [`FenceRejected`] when a higher token was accepted before; `op` does not run.
    pub fn apply<R>(
        &self,
        token: FencingToken,
        op: impl FnOnce(&mut T) -> R,
    ) -> Result<R, FenceRejected> {
        let mut guard = lock(&self.inner);
        if let Some(highest) = guard.0
            && token < highest
        {
            return Err(FenceRejected {
                offered: token,
                highest,
            });
        }
        guard.0 = Some(token);
        Ok(op(&mut guard.1))
    }

    /// Reads the value.
    pub fn read<R>(&self, op: impl FnOnce(&T) -> R) -> R {
        let guard = lock(&self.inner);
        op(&guard.1)
    }

    /// The highest token accepted so far.
    pub fn highest(&self) -> Option<FencingToken> {
        lock(&self.inner).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_token_is_accepted_lower_rejected() {
        let g = FenceGuard::new(Vec::new());
        g.apply(FencingToken(3), |v| v.push(3)).expect("first");
        g.apply(FencingToken(3), |v| v.push(3))
            .expect("same holder again");
        let err = g.apply(FencingToken(2), |v| v.push(2)).expect_err("stale");
        assert_eq!(
            err,
            FenceRejected {
                offered: FencingToken(2),
                highest: FencingToken(3)
            }
        );
        g.apply(FencingToken(9), |v| v.push(9)).expect("newer");
        assert_eq!(g.read(Clone::clone), vec![3, 3, 9]);
        assert_eq!(g.highest(), Some(FencingToken(9)));
    }
}
