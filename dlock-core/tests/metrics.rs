//! The `metrics` feature as an operator scrapes it: a Prometheus recorder renders exactly the
//! text the exporter's `/metrics` endpoint serves, after a grant, a release, a timeout, a
//! failed renewal round and a loss on the memory backend. Each test labels its locker with a
//! tier of its own, so the tests sharing the process-wide recorder never count each other.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock_core::memory::MemoryServer;
use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker, LossReason, MemoryLocker};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

const TTL: Duration = Duration::from_secs(1);

/// The process-wide Prometheus recorder, installed once, with histogram buckets.
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets(&[0.01, 0.1, 0.2, 1.0, 10.0])
            .and_then(PrometheusBuilder::install_recorder)
            .unwrap_or_else(|e| panic!("installing the Prometheus recorder: {e}"));
        dlock_core::describe_metrics();
        handle
    })
}

/// One sample of the rendered text: its value, when a line has exactly this name and labels.
fn sample(text: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<&str, &str> = labels.iter().copied().collect();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, rest) = series.split_once('{').unwrap_or((series, "}"));
            let got: BTreeMap<&str, &str> = rest
                .strip_suffix('}')?
                .split(',')
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k, v.trim_matches('"')))
                })
                .collect();
            (name == metric && got == want).then(|| value.parse().ok())?
        })
}

/// [`sample`], or a panic that shows the rendered text of this tier.
fn expect(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    sample(text, metric, labels).unwrap_or_else(|| {
        let ours: Vec<&str> = text.lines().filter(|l| l.contains("dlock_")).collect();
        panic!("no {metric} {labels:?} in:\n{}", ours.join("\n"))
    })
}

fn locker(server: &Arc<MemoryServer>, tier: &str, lock_names: bool) -> MemoryLocker {
    MemoryLocker::builder()
        .ttl(TTL)
        .server(Arc::clone(server))
        .metrics_tier(tier)
        .metrics_lock_names(lock_names)
        .build()
        .expect("valid options")
}

#[tokio::test(start_paused = true)]
async fn the_exported_text_counts_grants_timeouts_failed_rounds_and_losses() {
    let metrics = recorder();
    let server = MemoryServer::new();
    let locker = locker(&server, "scrape", false);
    let name = LockName::new("metrics/job").expect("valid");
    let l = [("backend", "memory"), ("tier", "scrape")];
    let with = |extra: (&'static str, &'static str)| {
        let mut all = l.to_vec();
        all.push(extra);
        all
    };

    // A grant held across a renewal round, a contender that times out, a release.
    let lease = locker
        .acquire(&name, AcquireOptions::forever())
        .await
        .expect("free");
    let contender = locker
        .acquire(&name, AcquireOptions::wait(Duration::from_millis(100)))
        .await
        .map(drop)
        .expect_err("held");
    assert_eq!(contender.kind(), ErrorKind::Timeout);
    tokio::time::sleep(TTL / 2).await;
    let text = metrics.render();
    assert_eq!(expect(&text, "dlock_held_leases", &l), 1.0);
    assert_eq!(expect(&text, "dlock_waiters", &l), 0.0);
    lease.release().await.expect("released");

    // A second grant whose renewals fail at the server: failed rounds, then a loss.
    let lease = locker
        .acquire(&name, AcquireOptions::forever())
        .await
        .expect("free again");
    server.fail_renewals(true);
    assert_eq!(lease.lost().await, LossReason::Expired);
    server.fail_renewals(false);

    let text = metrics.render();
    assert_eq!(expect(&text, "dlock_grants_total", &l), 2.0);
    assert_eq!(expect(&text, "dlock_releases_total", &l), 1.0);
    assert_eq!(expect(&text, "dlock_acquire_timeouts_total", &l), 1.0);
    assert_eq!(
        expect(&text, "dlock_losses_total", &with(("reason", "expired"))),
        1.0
    );
    assert_eq!(expect(&text, "dlock_held_leases", &l), 0.0);
    let rounds = expect(&text, "dlock_renewal_rounds_total", &l);
    let failed = expect(&text, "dlock_renewal_failed_rounds_total", &l);
    assert!(failed >= 1.0, "{failed} failed rounds");
    assert!(
        rounds > failed,
        "the first lease's round succeeded: {rounds} rounds"
    );
    assert_eq!(
        expect(&text, "dlock_renewal_round_seconds_count", &l),
        rounds
    );
    assert_eq!(locker.stats().renewal_failures as f64, failed);

    // Acquire waits by outcome: two grants at once, the timeout after its 100 ms wait.
    let granted = with(("outcome", "granted"));
    assert_eq!(
        expect(&text, "dlock_acquire_wait_seconds_count", &granted),
        2.0
    );
    assert_eq!(
        expect(&text, "dlock_acquire_wait_seconds_sum", &granted),
        0.0
    );
    let timeout = with(("outcome", "timeout"));
    assert_eq!(
        expect(&text, "dlock_acquire_wait_seconds_count", &timeout),
        1.0
    );
    let mut le = timeout.clone();
    le.push(("le", "0.01"));
    assert_eq!(expect(&text, "dlock_acquire_wait_seconds_bucket", &le), 0.0);
    le.pop();
    le.push(("le", "0.1"));
    assert_eq!(expect(&text, "dlock_acquire_wait_seconds_bucket", &le), 1.0);

    // Hold times: the release after TTL/2, the loss a margin before the TTL.
    assert_eq!(expect(&text, "dlock_hold_seconds_count", &l), 2.0);
    let mut le = l.to_vec();
    le.push(("le", "0.2"));
    assert_eq!(expect(&text, "dlock_hold_seconds_bucket", &le), 0.0);
    le.pop();
    le.push(("le", "1"));
    assert_eq!(expect(&text, "dlock_hold_seconds_bucket", &le), 2.0);

    // The lock's name is no label unless asked for.
    assert!(!text.contains("lock=\"metrics/job\""), "{text}");
}

#[tokio::test(start_paused = true)]
async fn lock_names_are_a_label_only_when_asked_for() {
    let metrics = recorder();
    let server = MemoryServer::new();
    let named = locker(&server, "named", true);
    let name = LockName::new("metrics/named").expect("valid");
    let lease = named
        .acquire(&name, AcquireOptions::forever())
        .await
        .expect("free");
    lease.release().await.expect("released");
    let text = metrics.render();
    let l = [
        ("backend", "memory"),
        ("tier", "named"),
        ("lock", "metrics/named"),
    ];
    assert_eq!(expect(&text, "dlock_grants_total", &l), 1.0);
    assert_eq!(expect(&text, "dlock_releases_total", &l), 1.0);
    // Gauges and renewal rounds are per locker, never per lock.
    assert_eq!(
        expect(&text, "dlock_held_leases", &l[..2]),
        0.0,
        "the gauge has no lock label"
    );
}

#[test]
fn a_bad_tier_is_refused_before_the_locker_exists() {
    let e = MemoryLocker::builder()
        .metrics_tier("no spaces")
        .build()
        .expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("metrics_tier"), "{e}");
}
