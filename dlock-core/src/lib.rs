#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod background;
mod capabilities;
mod contract;
mod election;
mod error;
mod fence;
mod inspect;
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

pub mod backend {
    //! What a backend crate needs beyond the user API: the shared renewal driver and the
    //! contract it renews through, the request counters behind [`Stats`](crate::Stats), the
    //! clock-drift and loss-margin rules every lease deadline follows, the TTL check each
    //! builder runs before any I/O, and [`Proclaim`], a backend's write of a leader's
    //! value.
    //!
    //! The user traits ([`Locker`](crate::Locker) and the family) are implemented once in
    //! this crate over [`LockBackend`] and its siblings, with the closed check and every input
    //! check, so a backend writes neither.
    //!
    //! Users of a backend never need these. They are less stable than the crate root: they
    //! change when a backend needs something new of the shared machinery.

    pub use crate::background::Background;
    pub use crate::contract::{ElectionBackend, LockBackend, RwBackend, SemaphoreBackend};
    pub use crate::election::{Proclaim, leadership};
    pub use crate::options::{drift, loss_margin, validate_ttl};
    pub use crate::renewal::{RenewBackend, Renewal, RenewalDriver};
    pub use crate::stats::Counters;
}
