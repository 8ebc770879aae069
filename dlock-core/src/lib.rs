#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod background;
mod capabilities;
mod common;
mod contract;
mod election;
mod error;
mod fence;
mod inspect;
mod lease;
mod locker;
pub mod memory;
mod metrics;
mod name;
mod options;
mod reentrant;
mod renewal;
mod rw;
mod semaphore;
mod stats;
mod sync;
mod token;
mod with_lock;

#[cfg(feature = "metrics")]
pub use crate::metrics::describe_metrics;
pub use capabilities::{Capabilities, FencingStrength, Primitives};
pub use common::{
    CommonOptions, MAX_METRICS_TIER_LEN, MAX_NAMESPACE_LEN, validate_metrics_tier,
    validate_namespace,
};
pub use election::{Election, Leader, LeaderChanges, Leadership, MAX_VALUE_LEN};
pub use error::{BoxError, Error, ErrorKind, LossReason, NameError, NodeError, Result};
pub use fence::{FenceGuard, FenceRejected};
pub use inspect::{HolderState, LockState};
pub use lease::{Lease, Releaser};
pub use locker::Locker;
pub use memory::{MemoryLocker, MemoryServer};
pub use name::LockName;
pub use options::{AcquireOptions, MAX_TTL, MAX_WAIT, MIN_TTL};
pub use reentrant::Reentrant;
pub use rw::RwLocker;
pub use semaphore::{MAX_PERMITS, Semaphore};
pub use stats::Stats;
pub use token::FencingToken;
pub use with_lock::{LeaseView, LockerExt};

// The crate's own modules name the backend tier from the root, as they always did.
pub(crate) use backend::*;

pub mod backend;
