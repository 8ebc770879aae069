//! The one scenario list. Each row names a scenario's variant (with its docs) and the function
//! that runs it; the function's name is the scenario's name. From it come the [`Scenario`]
//! enum, [`Scenario::ALL`], [`Scenario::name`], the runner's dispatch and the tests
//! `conformance_tests!` generates, so a scenario is added in one place (and its function).
//!
//! [`Scenario`]: crate::Scenario
//! [`Scenario::ALL`]: crate::Scenario::ALL
//! [`Scenario::name`]: crate::Scenario::name

/// Expands the scenario list for `@define` (the enum, `ALL`, `name`, `dispatch`; inside
/// `scenarios`) or `@tests MODULE` (one test per scenario; inside `conformance_tests!`).
#[doc(hidden)]
#[macro_export]
macro_rules! __scenarios {
    (@$mode:ident $($arg:tt)*) => {
        $crate::__scenarios_apply! { @$mode [$($arg)*]
            /// 8 clients × 50 read-sleep-write sections: exact count, no overlapping holds.
            MutualExclusion = exclusion::mutual_exclusion,
            /// Tokens strictly increase across grants, also after a forced expiry.
            FencingMonotonic = exclusion::fencing_monotonic,
            /// A fenced resource rejects the stale holder's write after a takeover.
            FencedResource = exclusion::fenced_resource,
            /// `try_acquire` on a held name returns `None` at once and leaves nothing behind.
            TryAcquireHeld = basic::try_acquire_held,
            /// A bounded wait returns `Timeout` and leaves nothing behind.
            WaitTimeout = basic::wait_timeout,
            /// A dropped pending acquire leaves nothing behind; the next waiter gets the lock promptly.
            Cancel = queue::cancel,
            /// 16 queued waiters are granted in enqueue order.
            Fifo = queue::fifo,
            /// Wakeups per release and requests per handoff stay flat for N = 1, 8, 32 waiters.
            Herd = herd::herd,
            /// A lease stays held for ≥ 5 × TTL while a contender keeps failing.
            Renewal = lease::renewal,
            /// A holder cut off from the servers learns of the loss before a contender gets the lock.
            LostBeforeStolen = lease::lost_before_stolen,
            /// [`Scenario::LostBeforeStolen`] in 20 trials, 5 at a time; the minimum margin is reported.
            LossTrials = lease::loss_trials,
            /// A waiter granted by a release and cut off at once learns of the loss before a
            /// contender gets the lock: the handed-over grant's own deadline is judged.
            HandoffLostBeforeStolen = lease::handoff_lost_before_stolen,
            /// A holder broken from the server side learns of it within the TTL.
            LostAfterBreak = lease::lost_after_break,
            /// Release is idempotent; a retried release never deletes a newer holder's lock.
            ReleaseIdempotent = basic::release_idempotent,
            /// `close()` ends every lease at once (`lost()` says `Closed`, not counted as a loss),
            /// frees the locks at the server before it returns, and the closed locker grants nothing;
            /// a wait cancelled just before `close` leaves no queue entry behind, and a closed
            /// election refuses `campaign`, `leader` and `observe`.
            Close = close::close,
            /// `inspect` shows no holder on a free name, the lease's token and a remaining TTL that
            /// covers its deadline on a held one, the exact number of queued waiters, each grant
            /// and release; and it creates nothing at the server.
            Inspect = inspect::inspect,
            /// The holder's link goes silent for 0.3 × TTL: the lease survives, same token.
            ShortBlip = network::short_blip,
            /// A release whose reply is lost returns within a bound; its retry never deletes the next
            /// holder's lock.
            ReleaseReplyLost = network::release_reply_lost,
            /// A SIGKILLed holder process's lock is free within [TTL − drift, TTL + slack].
            CrashRelease = crash::crash_release,
            /// A holder process frozen (SIGSTOP) past its TTL: taken over with a higher token, its late
            /// write rejected by the fenced resource, its lease known lost after SIGCONT.
            PausedHolder = crash::paused_holder,
            /// A waiter process in the middle of the queue is SIGKILLed: the next waiter re-targets,
            /// does not jump the holder, and gets the lock right after the holder releases.
            WaiterCrash = crash::waiter_crash,
            /// On a private cluster under a contended workload: Redlock 1 and 2 of 5 nodes killed or
            /// paused keep working; etcd / ZooKeeper follower killed, leader killed, leader paused
            /// break no checker (fenced safety, tokens, belief overlap).
            MinorityNodesDown = nodes::minority_nodes_down,
            /// On a private cluster: a majority of nodes killed makes an acquire fail within its wait,
            /// with no partial entries; the lock works again once they are back.
            MajorityNodesDown = nodes::majority_nodes_down,
            /// `a`, `a/b` and `ab` never block each other.
            NameIsolation = basic::name_isolation,
            /// Bad names, TTLs and waits give typed errors before any I/O.
            BadInput = basic::bad_input,
            /// The core re-entrancy wrapper over the backend.
            Reentrancy = basic::reentrancy,
            /// Replies (server→client only) delayed past the request timeout during acquire, then
            /// renewal stopped: nobody else is granted before the lease's deadline, and the server's
            /// expiry of the holder is never earlier than that deadline.
            SlowGrant = slow::slow_grant,
            /// Renewal replies delayed (requests not): over many renewals the server's expiry is never
            /// earlier than the lease's deadline, and nobody else is granted.
            OneWayDelay = slow::one_way_delay,
            /// Every server node restarted (Redis without persistence: a forced break; etcd and
            /// ZooKeeper keep their data): no grant while a lease is still believed held (Redis
            /// excepted), and every token after the restart is above every token before.
            ServerRestart = restart::server_restart,
            /// Acquires dropped while their enqueue request is at the server and its reply is held:
            /// nothing of theirs stays on the server, and the next contender is granted promptly.
            CancelMidEnqueue = enqueue::cancel_mid_enqueue,
            /// On a cluster, the holder's server cut from the leader: the holder's `lost()` fires
            /// before anyone else is granted.
            LeaderPartition = partition::leader_partition,
            /// The control of [`Scenario::LeaderPartition`]: a lease held through a follower of a
            /// private cluster with proxied peer links, with no fault, for 10 TTLs: no loss.
            FollowerHold = partition::follower_hold,
            /// 1,000 leases on one locker, one broken at the server: it is lost within TTL + slack,
            /// the others stay held.
            ManyLeasesBreak = many::many_leases_break,
            /// 4 campaigners × 5 terms: no two leaders' beliefs overlap, terms strictly increase, the
            /// server records each leader's term and value while it leads.
            ElectionSingleLeader = election::election_single_leader,
            /// The leader's link dies: a follower leads within TTL + slack, after the old leader's
            /// `lost()` fired, with a higher term.
            ElectionFailover = election::election_failover,
            /// An observer sees every leader change and proclamation, in order, none extra.
            ElectionObserve = election::election_observe,
            /// Two readers hold together while a writer waits; then 6 clients mixing reads and writes:
            /// a writer overlaps nobody, its token orders it against the leases before and after it.
            RwExclusion = family::rw_exclusion,
            /// Readers keep the name read-held without a gap: a writer is still granted (FIFO across
            /// modes), within TTL + 1 s.
            RwWriterNotStarved = family::rw_writer_not_starved,
            /// A semaphore of 3: 3 held at once and a fourth kept waiting; then 8 clients churning:
            /// never more than 3 held; the count agreed.
            SemaphoreBound = family::semaphore_bound,
            /// The only permit's holder is cut off: the waiter gets it within TTL + slack, after the
            /// holder's `lost()` fired, with a higher token.
            SemaphoreCrashRelease = family::semaphore_crash_release,
            /// For each family primitive the backend has: a request dropped while queued leaves
            /// nothing behind, and the next one is granted promptly.
            FamilyCancel = family::family_cancel,
            /// For each family primitive the backend has: zero or too many permits and an
            /// election value too long refused as invalid input before any I/O; a permit count
            /// other than the semaphore's refused without disturbing its waiter or a correct
            /// count; a reader behind a waiting writer waits for it; a fresh name has no leader,
            /// a refused proclamation changes nothing, and a leader whose entry was deleted at
            /// the server cannot proclaim.
            FamilyEdges = edges::family_edges,
            /// A writer cut off while a reader waits, then a reader cut off while a writer waits: each
            /// waiter granted within TTL + slack, after the holder's `lost()` fired, with a higher token.
            RwLostBeforeStolen = family::rw_lost_before_stolen,
            /// [`Scenario::CrashRelease`] for each family primitive the backend has: a SIGKILLed
            /// process's leadership, write lease or only permit is free within [TTL − drift,
            /// TTL + slack].
            FamilyCrashRelease = crash::family_crash_release,
        }
    };
}

/// The two uses of the list (see [`__scenarios!`](crate::__scenarios)).
#[doc(hidden)]
#[macro_export]
macro_rules! __scenarios_apply {
    (@define [] $($(#[$doc:meta])* $variant:ident = $module:ident :: $func:ident,)*) => {
        /// Every scenario, in report order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Scenario {
            $($(#[$doc])* $variant,)*
        }

        impl Scenario {
            /// Every scenario, in report order.
            pub const ALL: [Scenario; [$(stringify!($variant)),*].len()] = [$(Scenario::$variant),*];

            /// The scenario's name: its test's name and its column in the report.
            pub fn name(self) -> &'static str {
                match self {
                    $(Scenario::$variant => stringify!($func),)*
                }
            }
        }

        async fn dispatch(ctx: &Ctx) -> Result<(), Verdict> {
            match ctx.scenario {
                $(Scenario::$variant => $module::$func(ctx).await,)*
            }
        }
    };
    (@tests [$test_module:ident] $($(#[$doc:meta])* $variant:ident = $module:ident :: $func:ident,)*) => {
        $crate::conformance_tests!(@tests $test_module; $($func => $variant),*);
    };
}
