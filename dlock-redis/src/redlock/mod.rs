//! Redlock over N independent Redis nodes: `RedlockLocker` and its `LockBackend` impl; its
//! builder, acquire, renewal and quorum arithmetic beside it.

mod acquire;
mod builder;
mod inspect;
mod quorum;
mod raise;
mod renew;
mod tally;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Counters, LockBackend, RenewalDriver};
use dlock_core::{
    AcquireOptions, Capabilities, Error, FencingStrength, Lease, LockName, Primitives, Stats,
};

pub use builder::RedlockLockerBuilder;
use renew::{RedlockBackend, Renewer};

/// The most nodes a Redlock locker accepts.
pub const MAX_NODES: usize = 63;

/// A lock over N independent Redis masters (the Redlock algorithm).
///
/// - **Acquire**: `SET NX PX` with a random 128-bit owner value and, only when that granted,
///   the node's next token (one small script), sent to every node at once, each bounded by a small per-node timeout. The lock
///   is granted when a quorum (N/2+1) agreed and the validity `TTL − elapsed − (TTL·1% + 2 ms)`
///   (saturating) is still positive. Otherwise every node that may hold the key is unlocked
///   (those that granted, and those whose reply was lost or unreadable; not those that answered
///   that another owner holds it, where the refused `SET NX` wrote nothing) and, when waiting,
///   the attempt is retried after a random delay. One node's error never aborts an attempt; it is counted as a refusal and
///   reported in [`Error::QuorumNotReached`] when it matters. When so many nodes are down
///   (refused, reset) that no quorum is possible, acquire returns that error at once; slow
///   nodes are retried until the wait ends.
/// - **Fencing**: the token is the maximum of the counters of the granting nodes; before the
///   lease is handed out, every granting node whose counter is lower is raised to it, so that
///   a majority holds a counter ≥ the token and the next grant's majority (which intersects
///   it) can only produce a larger one. Every other node (it refused, was slow or down) is
///   raised to the token in the background, retried until it answers while the locker lives,
///   so that one node restarted empty and one that missed grants cannot form a quorum that
///   repeats a token (the uncontended grant, where every node granted at the same counter,
///   needs neither).
/// - **Renewal**: compare-and-`PEXPIRE` of every held lease on every node in one round trip;
///   a lease is extended when a majority confirmed it within its validity. A round ends as
///   soon as the answers so far settle every lease, so a dead or hung node never holds up a
///   majority that already answered. Each lease gets its own verdict: one that this round
///   cannot decide keeps its deadline and is retried soon, without failing the others. A key
///   that expired or vanished on a node (restart) is never re-created there.
/// - **Release**: compare-and-delete on every node.
///
/// # Assumptions
/// Redlock's safety, and the monotonicity of its fencing tokens, hold only when:
/// - clocks of clients and servers advance at nearly the same RATE (the 1 % + 2 ms drift
///   allowance); no absolute synchronisation is needed;
/// - a node that restarts either keeps its data (AOF with `appendfsync always`) or stays down
///   for longer than the TTL before it rejoins; a node that forgets its keys AND its fence
///   counters while a majority still agrees cannot grant on its own, but repeated amnesia of
///   a majority can break both mutual exclusion and token order;
/// - a holder finishes its work within the lease's deadline (watch [`Lease::lost`]) and the
///   protected resource checks the fencing token.
///
/// # Cancel safety
/// Dropping a pending `acquire` or `try_acquire` unlocks every node in the background; a
/// failed attempt unlocks every node before it returns.
///
/// Redlock is not fair: waiters retry after random delays, so it reports neither `fair` nor
/// `herd_free`, and its fencing strength is [`FencingStrength::Assumed`].
///
/// ```no_run
/// use std::time::Duration;
/// use dlock_core::{AcquireOptions, LockName, Locker};
/// use dlock_redis::RedlockLocker;
/// # async fn demo() -> Result<(), dlock_core::Error> {
/// let locker = RedlockLocker::builder()
///     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .ttl(Duration::from_secs(10))
///     .build()
///     .await?;
/// let lease = locker.acquire(&LockName::new("report")?, AcquireOptions::wait(Duration::from_secs(5))).await?;
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockLocker {
    inner: Arc<RInner>,
}

/// The locker's state, shared by its clones.
struct RInner {
    backend: Arc<RedlockBackend>,
    driver: RenewalDriver<Renewer>,
    counters: Arc<Counters>,
    prefix: String,
    ttl: Duration,
    retry_delay: Duration,
}

impl std::fmt::Debug for RedlockLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockLocker")
            .field("nodes", &self.inner.backend.nodes)
            .field("quorum", &self.inner.backend.quorum)
            .field("prefix", &self.inner.prefix)
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

impl RedlockLocker {
    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.inner.backend.quorum
    }

    /// How many leases the locker holds and renews now.
    pub fn held(&self) -> usize {
        self.inner.driver.len()
    }
}

#[async_trait]
impl LockBackend for RedlockLocker {
    fn closed(&self) -> bool {
        self.inner.driver.is_closed()
    }

    fn live_counters(&self) -> Option<&Counters> {
        Some(&self.inner.counters)
    }

    async fn lock(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        acquire::acquire(&self.inner, name, opts.wait).await
    }

    async fn try_lock(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        acquire::try_acquire(&self.inner, name).await
    }

    /// Reads every node at once (one read-only script each, within the node timeout): the
    /// holder is the owner value a quorum of them hold; see `redlock::inspect`.
    async fn state(&self, name: &LockName) -> Result<dlock_core::LockState, Error> {
        inspect::inspect(&self.inner, name).await
    }

    fn lease_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Ends every lease and deletes its key on every node (guarded deletes, all at once).
    async fn shutdown(&self) -> Result<(), Error> {
        self.inner.driver.close().await
    }

    fn guarantees(&self) -> Capabilities {
        Capabilities::new(self.inner.ttl)
            .with_fair_queue(false, false)
            .with_fencing(FencingStrength::Assumed)
            .with_crash_release_slack(Duration::from_millis(250))
            // One server cannot record a leader, readers or permits for a quorum: see the
            // crate docs.
            .with_primitives(Primitives::MUTEX_ONLY)
    }

    fn counters(&self) -> Stats {
        self.inner.counters.snapshot()
    }
}
