//! `dlock check` end to end: the built binary against a real redis-server started by the
//! conformance harness, directly (fit) and behind the harness's fault proxy delaying every
//! reply (unfit), and against `memory:`. Time limits here are safety bounds only.

mod support;

use std::process::Output;
use std::time::Duration;

use dlock_conformance::faults::{Direction, Mode, Proxy};
use serde_json::Value;
use support::{addr, dlock, output};

/// The documented exit code of a failed check (dlock-cli's README).
const UNFIT: i32 = 1;

/// How long one `dlock check` may take before the test fails rather than hangs.
const BOUND: Duration = Duration::from_secs(90);

/// A namespace unique to this process and call.
fn namespace() -> String {
    support::namespace("dlock-check-test")
}

/// Runs `dlock --json check ARGS` against `url` to completion within `BOUND`.
fn check(url: &str, args: &[&str]) -> (Output, Value) {
    let mut cmd = dlock(url);
    cmd.args(["--json", "check"]).args(args);
    let out = output(cmd, BOUND);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "one JSON object on stdout ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

/// The row of check `name`.
fn row<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("no row {name}: {report}"))
}

/// Checks that the rows `names` have `status` and a reason that contains `because`.
fn assert_rows(report: &Value, names: &[&str], status: &str, because: &str) {
    for name in names {
        let r = row(report, name);
        assert_eq!(r["status"], status, "{r}");
        assert!(
            r["reason"].as_str().is_some_and(|r| r.contains(because)),
            "{r}"
        );
    }
}

/// Checks that only fencing counters (with a TTL) stay under `namespace` at the server.
fn only_fencing_counters_left(namespace: &str) {
    for (key, pttl) in keys(namespace) {
        assert!(
            key.ends_with(":fence") && pttl > 0,
            "left behind: {key} (PTTL {pttl})"
        );
    }
}

/// The keys under `namespace` at the server, each with its PTTL.
fn keys(namespace: &str) -> Vec<(String, i64)> {
    let reply = dlock_conformance::redis_command(addr(), &["KEYS", &format!("{namespace}/*")])
        .expect("redis answers");
    // `*N\r\n` then `$len\r\nkey\r\n` per key.
    let names: Vec<String> = reply
        .split("\r\n")
        .filter(|l| !l.is_empty() && !l.starts_with('*') && !l.starts_with('$'))
        .map(str::to_owned)
        .collect();
    names
        .into_iter()
        .map(|k| {
            let ttl =
                dlock_conformance::redis_command(addr(), &["PTTL", &k]).expect("redis answers");
            let ttl = ttl
                .trim()
                .trim_start_matches(':')
                .parse()
                .expect("PTTL is an integer");
            (k, ttl)
        })
        .collect()
}

/// Against a healthy local Redis with a 2 s TTL: exit 0, `fit`, every check passes (or is
/// skipped with a reason), figures are there, and only the fencing counters stay at the
/// server (by design: a name's tokens must never restart; they expire on their own).
#[test]
fn a_healthy_redis_is_fit_and_nothing_stays_behind() {
    let ns = namespace();
    let url = format!("redis://{}?ttl=2s&namespace={ns}", addr());
    let (out, report) = check(&url, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{report:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report["fit"], true, "{report:#}");
    assert_eq!(report["backend"], "redis");
    assert_eq!(report["ttl_ms"], 2000.0);
    let rows = report["checks"].as_array().expect("checks");
    for r in rows {
        match r["status"].as_str() {
            Some("pass") => {}
            Some("skip") => assert!(
                r["reason"].as_str().is_some_and(|s| !s.is_empty()),
                "a skip says why: {r}"
            ),
            other => panic!("{other:?}: {r}"),
        }
    }
    for name in [
        "round_trip",
        "effective_ttl",
        "inspect",
        "try_acquire_held",
        "wait_timeout",
        "exclusion",
        "fifo",
        "cancel",
        "renewal",
        "cleanup",
    ] {
        let r = row(&report, name);
        assert_eq!(r["status"], "pass", "2 s TTL, a fair local Redis: {r}");
        assert!(
            r["figures"].as_object().is_some_and(|f| !f.is_empty()),
            "figures: {r}"
        );
    }
    let ttl = row(&report, "effective_ttl");
    assert!(
        ttl["figures"]["usable_ms"]
            .as_f64()
            .is_some_and(|u| u > 0.0),
        "{ttl}"
    );
    assert!(
        ttl["figures"]["promise_margin_ms"]
            .as_f64()
            .is_some_and(|m| m >= 0.0),
        "{ttl}"
    );
    assert!(row(&report, "round_trip")["figures"]["rtt_p50_ms"].is_number());
    only_fencing_counters_left(&ns);
}

/// Every reply delayed by 400 ms with a 1 s TTL: a round trip over TTL/3, which the Redis
/// client's request timeout (TTL/3) turns into failed calls; `round_trip` and `effective_ttl`
/// fail saying so, the deployment is unfit (exit 1), the later checks are skipped as not run,
/// and still nothing but fencing counters stays behind.
#[test]
fn replies_slower_than_a_third_of_the_ttl_make_it_unfit() {
    let proxy = Proxy::start(addr()).expect("proxy");
    proxy.set_direction(
        Direction::Downstream,
        Mode::Delay(Duration::from_millis(400)),
    );
    let ns = namespace();
    let url = format!("redis://{}?ttl=1s&namespace={ns}", proxy.addr());
    let (out, report) = check(&url, &["--samples", "3"]);
    assert_eq!(out.status.code(), Some(UNFIT), "{report:#}");
    assert_eq!(report["fit"], false, "{report:#}");
    assert_rows(&report, &["round_trip", "effective_ttl"], "fail", "TTL/3");
    assert_rows(&report, &["exclusion", "renewal"], "skip", "not run");
    // The audit's inspects time out like every other call: it cannot tell (the keys below can).
    assert_ne!(row(&report, "cleanup")["status"], "fail", "{report:#}");
    proxy.set(Mode::Pass);
    only_fencing_counters_left(&ns);
}

/// `memory:` works (one process: the lockers share the namespace's memory server).
#[test]
fn the_memory_backend_is_fit() {
    let (out, report) = check("memory:?ttl=1s", &["--samples", "5"]);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["fit"], true, "{report:#}");
    assert_eq!(report["backend"], "memory");
    assert_eq!(row(&report, "renewal")["status"], "pass", "{report:#}");
}

/// The human table names every check and the verdict; a bad `--clients` is a usage error.
#[test]
fn the_table_and_usage_errors() {
    let mut cmd = dlock("memory:?ttl=500ms");
    cmd.args(["check", "--samples", "3"]);
    let out = output(cmd, BOUND);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for needle in [
        "effective_ttl",
        "exclusion",
        "round trip:",
        "fit: yes",
        "memory:",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    let mut cmd = dlock("memory:");
    cmd.args(["check", "--clients", "1"]);
    let out = output(cmd, BOUND);
    assert_eq!(out.status.code(), Some(64));
}
