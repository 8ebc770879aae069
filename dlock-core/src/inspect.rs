//! A read-only look at one lock: who holds it, until when at most, and how many wait.

use std::time::Duration;

use crate::FencingToken;

/// What [`Locker::inspect`](crate::Locker::inspect) saw of one name at the server.
///
/// It is a snapshot: by the time the caller reads it, the holder may have released or lost the
/// lock and a waiter may hold it. Use it to show a lock's state to people and scripts, never
/// to decide who may act (that is what leases and fencing tokens are for).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LockState {
    /// The current holder, or `None` when nobody holds the name.
    pub holder: Option<HolderState>,
    /// How many requests wait in the name's queue behind the holder; `None` where the backend
    /// keeps no queue (Redis in spin mode, Redlock), so waiters cannot be counted.
    pub waiting: Option<usize>,
}

/// The holder of a name, as the server records it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderState {
    /// The holder's fencing token, the one its [`Lease::token`](crate::Lease::token) returned;
    /// `None` where the server does not record it beside the holder.
    pub token: Option<FencingToken>,
    /// The server-side entry that holds the lock: the Redis key, the etcd key, the ZooKeeper
    /// node path, or `memory:<owner>`.
    pub entry: String,
    /// What that entry stores (the owner id, a leader's value), where the backend stores one;
    /// empty otherwise. Lossy UTF-8: it is for display.
    pub value: String,
    /// At most how long the server keeps the lock for this holder if it stops renewing: the
    /// key's or lease's remaining TTL. `None` where no remaining time can be read (a ZooKeeper
    /// holder lasts as long as its session, whose expiry only the server's leader knows).
    pub expires_within: Option<Duration>,
}

impl LockState {
    /// A state with the given holder and queue (for backends; the fields are public to read).
    pub fn new(holder: Option<HolderState>, waiting: Option<usize>) -> Self {
        LockState { holder, waiting }
    }

    /// Whether someone holds the name.
    pub fn is_held(&self) -> bool {
        self.holder.is_some()
    }
}

impl HolderState {
    /// A holder record (for backends; the fields are public to read).
    pub fn new(
        token: Option<FencingToken>,
        entry: impl Into<String>,
        value: impl Into<String>,
        expires_within: Option<Duration>,
    ) -> Self {
        HolderState {
            token,
            entry: entry.into(),
            value: value.into(),
            expires_within,
        }
    }
}
