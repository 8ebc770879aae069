//! What a backend guarantees.

use std::time::Duration;

/// How strong a backend's fencing tokens are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencingStrength {
    /// Tokens come from one linearizable counter (Redis single node, etcd revision, ZooKeeper
    /// zxid): strictly increasing as long as the server keeps its data.
    Linearizable,
    /// Tokens are monotonic only under the algorithm's timing and persistence assumptions
    /// (Redlock: bounded clock drift, nodes that do not lose data on restart).
    Assumed,
    /// No fencing tokens.
    None,
}

/// The lock-family primitives a backend offers beside its mutex ([`crate::Locker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Primitives {
    /// It implements [`crate::Election`].
    pub election: bool,
    /// It implements [`crate::RwLocker`].
    pub read_write: bool,
    /// It implements [`crate::Semaphore`].
    pub semaphore: bool,
}

impl Primitives {
    /// The mutex only (Redlock).
    pub const MUTEX_ONLY: Primitives = Primitives {
        election: false,
        read_write: false,
        semaphore: false,
    };

    /// Every primitive: election, read-write lock and semaphore.
    pub const ALL: Primitives = Primitives {
        election: true,
        read_write: true,
        semaphore: true,
    };
}

/// What a backend guarantees. Conformance scenarios are gated on these.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Grants follow enqueue order.
    pub fair: bool,
    /// A release wakes exactly one waiter.
    pub herd_free: bool,
    /// How strong the fencing tokens are.
    pub fencing: FencingStrength,
    /// After a holder crashes, the lock is free again within this bound (the TTL).
    pub crash_release_within: Duration,
    /// Slack, beyond `crash_release_within`, that the backend needs to notice a crash (session
    /// expiry checks, timer granularity).
    pub crash_release_slack: Duration,
    /// The primitives offered beside the mutex, all on the same lease and fencing contract.
    pub primitives: Primitives,
}

impl Capabilities {
    /// Capabilities of a backend that is neither fair nor herd-free, with linearizable fencing
    /// and no primitive but the mutex.
    pub fn new(crash_release_within: Duration) -> Self {
        Capabilities {
            fair: false,
            herd_free: false,
            fencing: FencingStrength::Linearizable,
            crash_release_within,
            crash_release_slack: Duration::from_millis(500),
            primitives: Primitives::MUTEX_ONLY,
        }
    }

    /// Sets [`Capabilities::fair`] and [`Capabilities::herd_free`].
    pub fn with_fair_queue(mut self, fair: bool, herd_free: bool) -> Self {
        self.fair = fair;
        self.herd_free = herd_free;
        self
    }

    /// Sets [`Capabilities::fencing`].
    pub fn with_fencing(mut self, fencing: FencingStrength) -> Self {
        self.fencing = fencing;
        self
    }

    /// Sets [`Capabilities::crash_release_slack`].
    pub fn with_crash_release_slack(mut self, slack: Duration) -> Self {
        self.crash_release_slack = slack;
        self
    }

    /// Sets [`Capabilities::primitives`].
    pub fn with_primitives(mut self, primitives: Primitives) -> Self {
        self.primitives = primitives;
        self
    }
}
