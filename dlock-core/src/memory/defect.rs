//! Deliberate defects of the in-memory backend, for proving that the conformance checkers can
//! fail. Public only with the `testing` feature.
#![cfg_attr(not(feature = "testing"), allow(dead_code))]

use std::time::Duration;

/// Deliberate defects, for proving that conformance checkers can fail. Never use them otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Defect {
    /// Every grant carries token 1.
    NoFencing,
    /// Release deletes whoever holds the name.
    UnguardedRelease,
    /// A release wakes every waiter, not just the head.
    WakeAll,
    /// A release wakes the head waiter and the one behind it, which re-checks in vain: two
    /// wake-ups (and requests) per release, however many wait.
    WakeTwo,
    /// A woken waiter reads the queue an entry at a time (one request each, at most a page of
    /// five) to learn whether it is the head, instead of being told: one wake-up per release,
    /// but the requests per handoff grow with the queue up to five more.
    PagedQueueRead,
    /// The server expires holders at half the TTL, before the client's deadline.
    EarlyExpiry,
    /// Grants ignore the queue order (newest waiter first).
    Lifo,
    /// The grant's reply takes [`REPLY_DELAY`] after the server armed the TTL (every other
    /// grant: odd tokens), and the client counts the deadline from the reply instead of the
    /// request: the lease promises [`REPLY_DELAY`] more than the server keeps it.
    DeadlineFromReply,
    /// A waiter granted when a release woke it counts its deadline from [`REPLY_DELAY`] after
    /// the request that granted it, as a direct handoff that counts from the wake-up message's
    /// arrival instead of the waiter's own last request would: the handed-over lease promises
    /// [`REPLY_DELAY`] more than the server keeps it. Grants on a free name or after a holder's
    /// expiry are honest, and so is every renewal.
    HandoffFromWake,
    /// The server expires an entry 50 ms before the client's deadline, on grants and renewals
    /// alike: someone else can be granted before the promised deadline.
    LateLoss,
    /// The client's `lost()` aims at the deadline itself, with no margin for its timer's own
    /// lateness (the server is honest): under load it resolves after the deadline.
    LossAtDeadline,
    /// As [`Defect::LossAtDeadline`] in every third locker built with this defect (process
    /// wide), the others honest: `lost()` is late in about a third of a scenario's trials,
    /// which a judgement of the median trial alone would pass.
    LossAtDeadlineSometimes,
    /// A grant that follows a holder which expired or was broken (rather than released) reuses
    /// that holder's token, as a server that lost its last counter increment would.
    ReusedToken,
    /// A grant that follows a holder which expired or was broken (rather than released) is
    /// handed a token LOWER than that holder's (the counter's previous value), as a server
    /// that restored an old counter would: the later grant's writes are refused by a token
    /// guard, the superseded holder's accepted.
    LowerTokenAfterLapse,
    /// Every other grant (while the fence is odd) ignores the current holder and replaces it:
    /// two holders (leaders) at once.
    DoubleGrant,
    /// A read-write writer is granted while readers hold the name (it only waits for another
    /// writer).
    WriterWithReaders,
    /// Readers are granted past queued writers (the reader-preferring lock that starves
    /// writers).
    ReadersBarge,
    /// A semaphore grants one permit more than it has.
    SemaphoreOverflow,
    /// A request dropped while queued keeps its queue entry (until its locker is dropped).
    CancelLeavesEntry,
    /// Election observers are told only every other leader change, as a watch that keeps
    /// only the latest value would tell a slow observer.
    ObserverSkips,
    /// The server keeps a holder that stopped renewing for three TTLs instead of one: safe
    /// (the holder's deadline is honest), but a crashed leader or holder blocks everyone for
    /// far longer than the TTL.
    SlowExpiry,
    /// The first attempt's grant reply "times out" ([`REPLY_DELAY`], every other grant: odd
    /// tokens); the retry finds its own earlier grant and takes it without re-arming the TTL,
    /// yet the deadline is counted from the retry (the fair-mode Redis re-grant defect).
    StaleRegrant,
    /// One lease found lost in a renewal round fails the whole round: every lease renewed with
    /// it is reported lost too (the Redlock batch-verdict defect).
    BatchLoss,
    /// Every renewal's reply takes [`REPLY_DELAY`] after the server re-armed the TTL, and the
    /// client counts the renewed deadline from the reply instead of the request: after each
    /// renewal (grants are honest) the server expires the holder [`REPLY_DELAY`] before the
    /// lease's deadline. The real bug: a client that sets `deadline = now + TTL` when a
    /// keep-alive or `PEXPIRE` reply arrives, so a slow reply path stretches every promise.
    /// (The shared renewal driver counts from the request, so the server arms the renewed TTL
    /// [`REPLY_DELAY`] short instead: the same gap.)
    RenewalFromReply,
    /// `close()` ends the leases on the client but deletes nothing at the server: the locks
    /// stay held there until their TTL runs out, and the closed locker still grants.
    CloseKeepsEntries,
    /// A leader's proclamation is written whoever the server records as leader (no guard on
    /// the holder's own entry): a leader whose entry is gone still "proclaims".
    UnguardedProclaim,
    /// `inspect` counts the holder's own queue entry among the waiters, as a reader of a
    /// ZooKeeper or etcd queue that forgets the holder is its first entry would.
    InspectCountsHolder,
}

/// How late the grant reply of [`Defect::DeadlineFromReply`], [`Defect::StaleRegrant`] and
/// [`Defect::HandoffFromWake`] (and the renewal reply of [`Defect::RenewalFromReply`]) is.
pub const REPLY_DELAY: Duration = Duration::from_millis(200);
