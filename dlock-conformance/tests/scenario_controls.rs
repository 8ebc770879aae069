//! The new scenarios' checks can fail: run against deliberately broken memory lockers.

use std::sync::Arc;

use dlock_conformance::memory::MemoryBackend;
use dlock_conformance::scenarios::{Fencing, run_control};
use dlock_conformance::{Row, Scenario, Status, TestBackend};
use dlock_core::memory::Defect;

fn broken(defect: Defect) -> Arc<dyn TestBackend> {
    Arc::new(MemoryBackend::with_defect(defect))
}

/// Runs `scenario` on a memory locker with `defect`: the row must fail, for `why`.
fn caught(defect: Defect, scenario: Scenario, why: &str) -> Row {
    let label = format!("memory_{defect:?}").to_lowercase();
    let row = run_control(broken(defect), &label, scenario, Fencing::On);
    println!("{}", row.summary());
    assert_eq!(row.status, Status::Fail, "{}", row.summary());
    assert!(row.reason.contains(why), "{}", row.summary());
    row
}

/// Runs `scenario` on the correct memory locker: the row must pass.
fn passes(scenario: Scenario) -> Row {
    let row = run_control(
        Arc::new(MemoryBackend::new()),
        "memory",
        scenario,
        Fencing::On,
    );
    assert_eq!(row.status, Status::Pass, "{}", row.summary());
    row
}

/// A server that expires the holder before the client's deadline is caught by `slow_grant`:
/// the contender is granted before the lease's deadline.
#[test]
fn slow_grant_catches_early_expiry() {
    caught(
        Defect::EarlyExpiry,
        Scenario::SlowGrant,
        "BEFORE the slow-granted lease's deadline",
    );
}

/// A `close()` that only ends the leases on the client is caught: the locks are still held at
/// the server when it returns.
#[test]
fn close_catches_entries_left_at_the_server() {
    caught(
        Defect::CloseKeepsEntries,
        Scenario::Close,
        "still held at the server after close returned",
    );
}

/// The correct memory backend passes `close`, its cancelled wait and election included.
#[test]
fn close_passes_on_the_reference() {
    passes(Scenario::Close);
}

/// The correct memory backend passes the same run (so the control fails for the defect).
#[test]
fn slow_grant_passes_on_the_reference() {
    passes(Scenario::SlowGrant);
}

/// A client that counts each renewed deadline from the renewal's reply instead of its request
/// (the server re-armed the TTL `REPLY_DELAY` before the instant the lease counts from) is
/// caught by `one_way_delay`'s renewal-phase check: after a renewal the server expires the
/// holder before the lease's deadline. Grants are honest, so only a check made after
/// renewals can see it.
#[test]
fn one_way_delay_catches_a_renewal_counted_from_the_reply() {
    caught(
        Defect::RenewalFromReply,
        Scenario::OneWayDelay,
        "the server expires the holder at the latest",
    );
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

/// A `lost()` that aims at the deadline itself, with no margin for its timer's lateness, is
/// caught by `loss_trials`: the core declares it after the promised deadline, and no runtime
/// stall that long excuses it.
#[test]
fn loss_trials_catch_a_loss_aimed_at_the_deadline() {
    caught(
        Defect::LossAtDeadline,
        Scenario::LossTrials,
        "does not fire early enough",
    );
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

/// The correct memory backend passes the same run.
#[test]
fn loss_trials_pass_on_the_reference() {
    passes(Scenario::LossTrials);
}

/// A server that grants a new campaign while another leader holds the name is caught by
/// `election_single_leader`: two leaders' beliefs overlap.
#[test]
fn election_single_leader_catches_two_leaders() {
    caught(
        Defect::DoubleGrant,
        Scenario::ElectionSingleLeader,
        "two leaders at once",
    );
}

/// A server that hands every leader the same term is caught by `election_single_leader`.
#[test]
fn election_single_leader_catches_repeated_terms() {
    caught(
        Defect::NoFencing,
        Scenario::ElectionSingleLeader,
        "terms do not increase",
    );
}

/// The correct memory backend passes the same run.
#[test]
fn election_single_leader_passes_on_the_reference() {
    passes(Scenario::ElectionSingleLeader);
}

/// A server that keeps a silent leader for three TTLs is caught by `election_failover`: the
/// new leader comes later than TTL + slack.
#[test]
fn election_failover_catches_a_slow_expiry() {
    caught(
        Defect::SlowExpiry,
        Scenario::ElectionFailover,
        "later than TTL + slack",
    );
}

/// The correct memory backend passes the same run.
#[test]
fn election_failover_passes_on_the_reference() {
    passes(Scenario::ElectionFailover);
}

/// Observers told only every other change are caught by `election_observe`.
#[test]
fn election_observe_catches_skipped_changes() {
    caught(
        Defect::ObserverSkips,
        Scenario::ElectionObserve,
        "the observer saw",
    );
}

/// The correct memory backend passes the same run.
#[test]
fn election_observe_passes_on_the_reference() {
    passes(Scenario::ElectionObserve);
}

/// A writer granted while readers hold is caught by `rw_exclusion`.
#[test]
fn rw_exclusion_catches_a_writer_among_readers() {
    caught(
        Defect::WriterWithReaders,
        Scenario::RwExclusion,
        "held together with a reader",
    );
}

/// The correct memory backend passes the same run.
#[test]
fn rw_exclusion_passes_on_the_reference() {
    passes(Scenario::RwExclusion);
}

/// Readers granted past a queued writer starve it: caught by `rw_writer_not_starved`.
#[test]
fn rw_writer_not_starved_catches_barging_readers() {
    caught(
        Defect::ReadersBarge,
        Scenario::RwWriterNotStarved,
        "the writer was starved",
    );
}

/// The correct memory backend passes the same run.
#[test]
fn rw_writer_not_starved_passes_on_the_reference() {
    passes(Scenario::RwWriterNotStarved);
}

/// A semaphore that grants one permit too many is caught by `semaphore_bound`.
#[test]
fn semaphore_bound_catches_one_permit_too_many() {
    caught(
        Defect::SemaphoreOverflow,
        Scenario::SemaphoreBound,
        "permits held at once on a semaphore of 3",
    );
}

/// The correct memory backend passes the same run.
#[test]
fn semaphore_bound_passes_on_the_reference() {
    passes(Scenario::SemaphoreBound);
}

/// A server that keeps a silent permit holder for three TTLs is caught by
/// `semaphore_crash_release`.
#[test]
fn semaphore_crash_release_catches_a_slow_expiry() {
    caught(
        Defect::SlowExpiry,
        Scenario::SemaphoreCrashRelease,
        "later than TTL + slack",
    );
}

/// The correct memory backend passes the same run.
#[test]
fn semaphore_crash_release_passes_on_the_reference() {
    passes(Scenario::SemaphoreCrashRelease);
}

/// A request whose queue entry outlives its cancellation is caught by `family_cancel`.
#[test]
fn family_cancel_catches_a_cancelled_request_left_queued() {
    caught(
        Defect::CancelLeavesEntry,
        Scenario::FamilyCancel,
        "a cancelled request left entries behind",
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

/// Readers granted past a queued writer are caught by `family_edges`.
#[test]
fn family_edges_catches_readers_barging_past_a_waiting_writer() {
    caught(
        Defect::ReadersBarge,
        Scenario::FamilyEdges,
        "let in ahead of it",
    );
}

/// A proclamation written whoever leads is caught by `family_edges`' broken leader.
#[test]
fn family_edges_catches_a_proclamation_without_its_leader_entry() {
    caught(
        Defect::UnguardedProclaim,
        Scenario::FamilyEdges,
        "after the leader's entry was deleted",
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

/// A server that expires entries at half the TTL hands a cut-off writer's name to a reader
/// before the writer knows: caught by `rw_lost_before_stolen`.
#[test]
fn rw_lost_before_stolen_catches_an_early_expiry() {
    caught(
        Defect::EarlyExpiry,
        Scenario::RwLostBeforeStolen,
        "learned of its loss",
    );
}

/// A server that keeps a silent holder for three TTLs is caught by `rw_lost_before_stolen`.
#[test]
fn rw_lost_before_stolen_catches_a_slow_expiry() {
    caught(
        Defect::SlowExpiry,
        Scenario::RwLostBeforeStolen,
        "later than TTL + slack",
    );
}

/// The correct memory backend passes the same run.
#[test]
fn rw_lost_before_stolen_passes_on_the_reference() {
    passes(Scenario::RwLostBeforeStolen);
}

/// An `inspect` that counts the holder's own entry as a waiter is caught: a held name nobody
/// waits for shows one waiting.
#[test]
fn inspect_catches_the_holder_counted_as_waiting() {
    caught(
        Defect::InspectCountsHolder,
        Scenario::Inspect,
        "a held name nobody waits for shows Some(1) waiting",
    );
}

/// The correct memory backend passes `inspect`.
#[test]
fn inspect_passes_on_the_reference() {
    passes(Scenario::Inspect);
}

/// A cancelled wait whose queue entry outlives `close` is caught by `close`: another client
/// still sees the waiter queued when `close` has returned.
#[test]
fn close_catches_a_cancelled_wait_left_queued() {
    caught(
        Defect::CancelLeavesEntry,
        Scenario::Close,
        "close returned with the cancelled waiter still queued: Some(1) waiting",
    );
}
