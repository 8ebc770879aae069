//! Fencing tokens.

use std::fmt;

/// A fencing token: strictly greater than the token of every earlier grant of the same name.
///
/// Pass it to every resource the lock protects, and have the resource reject tokens lower than
/// the highest it has seen (see [`FenceGuard`](crate::FenceGuard)). That is what keeps a paused
/// or partitioned former holder from corrupting data after its lease expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token's value.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}
