//! The new scenarios' checks can fail: run against deliberately broken memory lockers.

use std::sync::Arc;

use dlock_conformance::memory::MemoryBackend;
use dlock_conformance::scenarios::Fencing;
use dlock_conformance::{Row, Scenario, Status, TestBackend};
use dlock_core::memory::Defect;
use support::{assert_caught, passes, run_printed};

mod support;

fn broken(defect: Defect) -> Arc<dyn TestBackend> {
    Arc::new(MemoryBackend::with_defect(defect))
}

/// Runs `scenario` on a memory locker with `defect`: the row must fail, for `why`.
fn caught(defect: Defect, scenario: Scenario, why: &str) -> Row {
    let label = format!("memory_{defect:?}").to_lowercase();
    let row = run_printed(broken(defect), &label, scenario);
    assert_caught(&row, &[why]);
    row
}

/// The correct memory backend passes `one_way_delay` (its renewals counted from the request),
/// with the server-side expiry checked: only the reply delay itself is a skipped part.
#[test]
fn one_way_delay_passes_on_the_reference() {
    let row = passes(Scenario::OneWayDelay);
    let parts = row.skipped_parts();
    assert!(
        parts.iter().all(|p| !p.contains("server-side expiry")),
        "{}",
        row.summary()
    );
}

/// A backend whose capabilities differ from its enrolment's declared table fails every
/// scenario before it runs (WakeAll reports herd_free = false).
#[test]
fn capabilities_must_match_the_declared_table() {
    use dlock_conformance::Declared;
    use dlock_conformance::scenarios::run_with;
    use dlock_core::FencingStrength;
    let declared = Declared {
        fair: true,
        herd_free: true,
        fencing: FencingStrength::Linearizable,
        crash_release_slack: dlock_conformance::Slack::fixed(std::time::Duration::from_millis(50)),
    };
    let row = run_with(
        broken(Defect::WakeAll),
        "memory_wakeall",
        Scenario::BadInput,
        Fencing::On,
        Some(declared),
    );
    assert_eq!(row.status, Status::Fail, "{}", row.summary());
    assert!(
        row.reason.contains("herd_free = false"),
        "{}",
        row.summary()
    );
}

/// A skip the allowlist does not name becomes a failure; a listed one stays a skip.
#[test]
fn unlisted_skips_fail() {
    let skip = |backend: &str, reason: &str| Row {
        backend: backend.into(),
        scenario: "short_blip".into(),
        status: Status::Skip,
        reason: reason.into(),
        figures: Default::default(),
    };
    let mut listed = skip(
        "memory",
        "in-process backend: there is no client↔server connection to fault",
    );
    listed.enforce_allowlist();
    assert_eq!(listed.status, Status::Skip, "{}", listed.summary());
    let mut unlisted = skip("redis", "no reason anyone agreed to");
    unlisted.enforce_allowlist();
    assert_eq!(unlisted.status, Status::Fail, "{}", unlisted.summary());
    assert!(unlisted.reason.contains("skips.allow"));
}

/// A `lost()` aimed at the deadline in only about a third of the trials (every third locker)
/// is caught too: each trial is judged, not the median.
#[test]
fn loss_trials_catch_a_loss_aimed_at_the_deadline_in_some_trials() {
    let row = caught(
        Defect::LossAtDeadlineSometimes,
        Scenario::LossTrials,
        "does not fire early enough",
    );
    let failed = row.figures.get("violations").and_then(|v| v.as_u64());
    assert!(
        failed.is_some_and(|n| (1..10).contains(&n)),
        "a minority of trials is late: {}",
        row.summary()
    );
}

/// The correct memory backend passes the same run, on every primitive (reads too).
#[test]
fn family_cancel_passes_on_the_reference() {
    let row = passes(Scenario::FamilyCancel);
    assert!(
        row.summary().contains("election,write,read,permit"),
        "{}",
        row.summary()
    );
}

/// The correct memory backend passes the same run, on every primitive.
#[test]
fn family_edges_passes_on_the_reference() {
    let row = passes(Scenario::FamilyEdges);
    assert!(
        row.summary().contains("permits,read_write,election"),
        "{}",
        row.summary()
    );
}

/// One test per control: a memory locker with the defect runs the scenario, and the row must
/// fail for the reason quoted. (The correct memory locker passes every one of these scenarios as
/// the `memory` conformance row, `tests/memory.rs`; so each control fails for its defect.)
macro_rules! controls {
    ($($(#[$doc:meta])* $test:ident: $defect:ident, $scenario:ident, $why:literal;)*) => {
        $(
            $(#[$doc])*
            #[test]
            fn $test() {
                caught(Defect::$defect, Scenario::$scenario, $why);
            }
        )*
    };
}

controls! {
    /// A server that expires the holder before the client's deadline is caught by `slow_grant`:
    /// the contender is granted before the lease's deadline.
    slow_grant_catches_early_expiry:
        EarlyExpiry, SlowGrant, "BEFORE the slow-granted lease's deadline";
    /// A `close()` that only ends the leases on the client is caught: the locks are still held at
    /// the server when it returns.
    close_catches_entries_left_at_the_server:
        CloseKeepsEntries, Close, "still held at the server after close returned";
    /// A client that counts each renewed deadline from the renewal's reply instead of its request
    /// (the server re-armed the TTL `REPLY_DELAY` before the instant the lease counts from) is
    /// caught by `one_way_delay`'s renewal-phase check: after a renewal the server expires the
    /// holder before the lease's deadline. Grants are honest, so only a check made after
    /// renewals can see it.
    one_way_delay_catches_a_renewal_counted_from_the_reply:
        RenewalFromReply, OneWayDelay, "the server expires the holder at the latest";
    /// A `lost()` that aims at the deadline itself, with no margin for its timer's lateness, is
    /// caught by `loss_trials`: the core declares it after the promised deadline, and no runtime
    /// stall that long excuses it.
    loss_trials_catch_a_loss_aimed_at_the_deadline:
        LossAtDeadline, LossTrials, "does not fire early enough";
    /// A server that grants a new campaign while another leader holds the name is caught by
    /// `election_single_leader`: two leaders' beliefs overlap.
    election_single_leader_catches_two_leaders:
        DoubleGrant, ElectionSingleLeader, "two leaders at once";
    /// A server that hands every leader the same term is caught by `election_single_leader`.
    election_single_leader_catches_repeated_terms:
        NoFencing, ElectionSingleLeader, "terms do not increase";
    /// A server that keeps a silent leader for three TTLs is caught by `election_failover`: the
    /// new leader comes later than TTL + slack.
    election_failover_catches_a_slow_expiry: SlowExpiry, ElectionFailover, "later than TTL + slack";
    /// Observers told only every other change are caught by `election_observe`.
    election_observe_catches_skipped_changes: ObserverSkips, ElectionObserve, "the observer saw";
    /// A writer granted while readers hold is caught by `rw_exclusion`.
    rw_exclusion_catches_a_writer_among_readers:
        WriterWithReaders, RwExclusion, "held together with a reader";
    /// Readers granted past a queued writer starve it: caught by `rw_writer_not_starved`.
    rw_writer_not_starved_catches_barging_readers:
        ReadersBarge, RwWriterNotStarved, "the writer was starved";
    /// A semaphore that grants one permit too many is caught by `semaphore_bound`.
    semaphore_bound_catches_one_permit_too_many:
        SemaphoreOverflow, SemaphoreBound, "permits held at once on a semaphore of 3";
    /// A server that keeps a silent permit holder for three TTLs is caught by
    /// `semaphore_crash_release`.
    semaphore_crash_release_catches_a_slow_expiry:
        SlowExpiry, SemaphoreCrashRelease, "later than TTL + slack";
    /// A request whose queue entry outlives its cancellation is caught by `family_cancel`.
    family_cancel_catches_a_cancelled_request_left_queued:
        CancelLeavesEntry, FamilyCancel, "a cancelled request left entries behind";
    /// Readers granted past a queued writer are caught by `family_edges`.
    family_edges_catches_readers_barging_past_a_waiting_writer:
        ReadersBarge, FamilyEdges, "let in ahead of it";
    /// A proclamation written whoever leads is caught by `family_edges`' broken leader.
    family_edges_catches_a_proclamation_without_its_leader_entry:
        UnguardedProclaim, FamilyEdges, "after the leader's entry was deleted";
    /// A server that expires entries at half the TTL hands a cut-off writer's name to a reader
    /// before the writer knows: caught by `rw_lost_before_stolen`.
    rw_lost_before_stolen_catches_an_early_expiry:
        EarlyExpiry, RwLostBeforeStolen, "learned of its loss";
    /// A server that keeps a silent holder for three TTLs is caught by `rw_lost_before_stolen`.
    rw_lost_before_stolen_catches_a_slow_expiry:
        SlowExpiry, RwLostBeforeStolen, "later than TTL + slack";
    /// An `inspect` that counts the holder's own entry as a waiter is caught: a held name nobody
    /// waits for shows one waiting.
    inspect_catches_the_holder_counted_as_waiting:
        InspectCountsHolder, Inspect, "a held name nobody waits for shows Some(1) waiting";
    /// A cancelled wait whose queue entry outlives `close` is caught by `close`: another client
    /// still sees the waiter queued when `close` has returned.
    close_catches_a_cancelled_wait_left_queued:
        CancelLeavesEntry, Close,
        "close returned with the cancelled waiter still queued: Some(1) waiting";
}
