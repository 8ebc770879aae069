#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod capabilities;
mod election;
mod error;
mod fence;
mod lease;
mod locker;
pub mod memory;
mod name;
mod options;
mod reentrant;
mod renewal;
mod rw;
mod semaphore;
mod stats;
mod token;
mod with_lock;

pub use capabilities::{Capabilities, FencingStrength, Primitives};
pub use election::{
    Election, Leader, LeaderChanges, Leadership, MAX_VALUE_LEN, Proclaim, validate_value,
};
pub use error::{BoxError, Error, ErrorKind, LossReason, NameError, NodeError, Result};
pub use fence::{FenceGuard, FenceRejected};
pub use lease::{Lease, Releaser};
pub use locker::Locker;
pub use memory::{MemoryLocker, MemoryServer};
pub use name::LockName;
pub use options::{AcquireOptions, MAX_TTL, MAX_WAIT, MIN_TTL, drift, loss_margin, validate_ttl};
pub use reentrant::Reentrant;
pub use renewal::{RenewBackend, Renewal, RenewalDriver};
pub use rw::RwLocker;
pub use semaphore::{MAX_PERMITS, Semaphore, validate_permits};
pub use stats::{Counters, Stats};
pub use token::FencingToken;
pub use with_lock::{LeaseView, LockerExt};

/// The workspace README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
