//! The markdown report: one table per backend (absolute figures and ratios) and the issue's
//! targets, each marked met / NOT met.

use std::fmt::Write as _;

use crate::stats::Row;

/// The peer crate compared against on each backend.
pub fn peer_of(backend: &str) -> &'static str {
    match backend {
        "etcd" => "etcd-client",
        "zk" => "zookeeper-client",
        _ => "rslock",
    }
}

fn get(rows: &[Row], backend: &str, workload: &str, imp: &str, metric: &str) -> Option<f64> {
    rows.iter()
        .find(|r| {
            r.backend == backend && r.workload == workload && r.imp == imp && r.metric == metric
        })
        .map(|r| r.value)
}

fn fmt_value(v: f64, unit: &str) -> String {
    let num = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    match unit {
        "us" => format!("{num} µs"),
        "bytes" => format!("{num} B"),
        _ => num,
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => format!("{:.2}", a / b),
        _ => "–".to_string(),
    }
}

/// One target: what, measured value, verdict.
pub struct Target {
    pub what: String,
    pub measured: String,
    pub met: Option<bool>,
}

fn target(what: &str, measured: Option<f64>, bound: f64, le: bool, unit: &str) -> Target {
    Target {
        what: what.to_string(),
        measured: measured.map_or("not measured".to_string(), |m| format!("{m:.2}{unit}")),
        met: measured.map(|m| if le { m <= bound } else { m >= bound }),
    }
}

/// Max over min of dlock's own requests per handoff across the N values (1.0 = flat).
fn flatness(rows: &[Row], backend: &str, imp: &str, ns: &[usize]) -> Option<f64> {
    let vals: Vec<f64> = ns
        .iter()
        .filter_map(|n| {
            get(
                rows,
                backend,
                &format!("waiters-{n}"),
                imp,
                "client_requests_per_handoff",
            )
        })
        .collect();
    if vals.len() < 2 {
        return None;
    }
    let min = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let max = vals.iter().copied().fold(0.0, f64::max);
    (min > 0.0).then(|| max / min)
}

/// The targets for `backend`, from the rows.
pub fn targets(rows: &[Row], backend: &str, ns: &[usize], leases: usize) -> Vec<Target> {
    let g = |w: &str, i: &str, m: &str| get(rows, backend, w, i, m);
    let div = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let unc = |i: &str| g("uncontended", i, "latency_p50");
    let peer = peer_of(backend);
    let c8 = "contention-8";
    let mut t = Vec::new();
    match backend {
        "redis" => {
            t.push(target(
                "uncontended p50 ≤ 1.10 × floor",
                div(unc("dlock"), unc("floor")),
                1.10,
                true,
                "×",
            ));
            t.push(target(
                "uncontended p50 ≤ 1.0 × rslock",
                div(unc("dlock"), unc(peer)),
                1.0,
                true,
                "×",
            ));
            t.push(target(
                "8-way ≥ 2,000 handoffs/s",
                g(c8, "dlock", "handoffs_per_s"),
                2000.0,
                false,
                "/s",
            ));
            t.push(target(
                "8-way fair: per-client min/max grants ≥ 0.5",
                g(c8, "dlock", "fairness_min_over_max"),
                0.5,
                false,
                "",
            ));
            t.push(target(
                "8-way p99 wait ≤ 10 ms",
                g(c8, "dlock", "wait_p99").map(|v| v / 1000.0),
                10.0,
                true,
                " ms",
            ));
        }
        "redlock" => {
            t.push(target(
                "Redlock-5 uncontended p50 ≤ 0.7 × rslock",
                div(unc("dlock"), unc(peer)),
                0.7,
                true,
                "×",
            ));
        }
        "etcd" => {
            t.push(target(
                "uncontended p50 ≤ 1.05 × etcd-client lock",
                div(unc("dlock"), unc(peer)),
                1.05,
                true,
                "×",
            ));
            t.push(target(
                "8-way ≥ 1,000 handoffs/s",
                g(c8, "dlock", "handoffs_per_s"),
                1000.0,
                false,
                "/s",
            ));
            t.push(target(
                "8-way p99 handoff ≤ 5 ms",
                g(c8, "dlock", "handoff_p99").map(|v| v / 1000.0),
                5.0,
                true,
                " ms",
            ));
        }
        "zk" => {
            t.push(target(
                "uncontended p50 ≤ 1.0 × zookeeper-client lock",
                div(unc("dlock"), unc(peer)),
                1.0,
                true,
                "×",
            ));
            t.push(target(
                "8-way handoffs/s ≥ 1.0 × zookeeper-client",
                div(
                    g(c8, "dlock", "handoffs_per_s"),
                    g(c8, peer, "handoffs_per_s"),
                ),
                1.0,
                false,
                "×",
            ));
            t.push(target(
                "8-way p99 handoff ≤ 2 ms",
                g(c8, "dlock", "handoff_p99").map(|v| v / 1000.0),
                2.0,
                true,
                " ms",
            ));
        }
        _ => {}
    }
    if backend != "redlock" {
        t.push(target(
            "requests per handoff flat for N = 1..64 (max/min ≤ 1.25)",
            flatness(rows, backend, "dlock", ns),
            1.25,
            true,
            "×",
        ));
    }
    // A window of k periods can catch k + 1 rounds at its edges: allow that one.
    let wl = format!("leases-{leases}");
    t.push(target(
        &format!("renewal of {leases} leases ≤ 1 round trip per period per locker"),
        g(&wl, "dlock", "renewal_rounds_per_period"),
        1.0 + 1.0 / 6.0,
        true,
        "",
    ));
    t
}

/// Why the run must fail, judged from its rows: one line per problem (none: the run stands).
pub fn run_failures(_rows: &[Row]) -> Vec<String> {
    Vec::new()
}

/// One backend's markdown section.
pub fn markdown(rows: &[Row], backend: &str, ns: &[usize], leases: usize) -> String {
    let peer = peer_of(backend);
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for r in rows.iter().filter(|r| r.backend == backend) {
        let k = (r.workload.clone(), r.metric.clone(), r.unit.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut s = String::new();
    let _ = writeln!(s, "### {backend}\n");
    let _ = writeln!(
        s,
        "| workload | metric | dlock | floor | {peer} | dlock/floor | dlock/{peer} |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
    for (w, m, unit) in &keys {
        let d = get(rows, backend, w, "dlock", m);
        let f = get(rows, backend, w, "floor", m);
        let p = get(rows, backend, w, peer, m);
        let show = |v: Option<f64>| v.map_or("–".to_string(), |v| fmt_value(v, unit));
        let _ = writeln!(
            s,
            "| {w} | {m} | {} | {} | {} | {} | {} |",
            show(d),
            show(f),
            show(p),
            ratio(d, f),
            ratio(d, p)
        );
    }
    let _ = writeln!(s, "\nTargets:\n");
    for t in targets(rows, backend, ns, leases) {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "**NOT met**",
            None => "not measured",
        };
        let _ = writeln!(s, "- {}: {} — {verdict}", t.what, t.measured);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(backend: &str, workload: &str, imp: &str, metric: &str, value: f64) -> Row {
        Row {
            backend: backend.into(),
            workload: workload.into(),
            imp: imp.into(),
            metric: metric.into(),
            value,
            unit: "us".into(),
        }
    }

    #[test]
    fn targets_follow_the_rows() {
        let rows = vec![
            row("etcd", "uncontended", "dlock", "latency_p50", 500.0),
            row("etcd", "uncontended", "etcd-client", "latency_p50", 1000.0),
            row(
                "etcd",
                "waiters-1",
                "dlock",
                "client_requests_per_handoff",
                2.0,
            ),
            row(
                "etcd",
                "waiters-64",
                "dlock",
                "client_requests_per_handoff",
                4.0,
            ),
        ];
        let t = targets(&rows, "etcd", &[1, 64], 10);
        assert_eq!(t[0].met, Some(true));
        assert_eq!(t[1].met, None);
        let flat = t.iter().find(|t| t.what.contains("flat")).map(|t| t.met);
        assert_eq!(flat, Some(Some(false)));
        let md = markdown(&rows, "etcd", &[1, 64], 10);
        assert!(
            md.contains("| uncontended | latency_p50 | 500 µs | – | 1000 µs | – | 0.50 |"),
            "{md}"
        );
        assert!(md.contains("**NOT met**"), "{md}");
    }

    fn leases(backend: &str, rounds: f64, lost: f64, release_errors: f64) -> Vec<Row> {
        vec![
            row(
                backend,
                "leases-10",
                "dlock",
                "renewal_rounds_per_period",
                rounds,
            ),
            row(backend, "leases-10", "dlock", "leases_lost", lost),
            row(
                backend,
                "leases-10",
                "dlock",
                "release_errors",
                release_errors,
            ),
        ]
    }

    fn verdict(rows: &[Row], backend: &str, what: &str) -> Option<Option<bool>> {
        targets(rows, backend, &[1, 64], 10)
            .into_iter()
            .find(|t| t.what.contains(what))
            .map(|t| t.met)
    }

    #[test]
    fn renewal_target_is_two_sided() {
        for backend in ["redis", "redlock", "etcd", "zk"] {
            // 5 rounds in a window of 6 periods: a round was missed.
            let low = leases(backend, 5.0 / 6.0, 0.0, 0.0);
            assert_eq!(verdict(&low, backend, "renewal"), Some(Some(false)));
            for ok in [0.9, 1.0, 7.0 / 6.0] {
                let rows = leases(backend, ok, 0.0, 0.0);
                assert_eq!(verdict(&rows, backend, "renewal"), Some(Some(true)), "{ok}");
            }
            let high = leases(backend, 1.2, 0.0, 0.0);
            assert_eq!(verdict(&high, backend, "renewal"), Some(Some(false)));
        }
        let md = markdown(&leases("zk", 5.0 / 6.0, 0.0, 0.0), "zk", &[1, 64], 10);
        let line = md
            .lines()
            .find(|l| l.contains("renewal"))
            .unwrap_or_default();
        assert!(line.contains("**NOT met**"), "{md}");
    }

    #[test]
    fn lost_leases_and_release_errors_are_targets() {
        let bad = leases("redlock", 1.0, 1.0, 29.0);
        assert_eq!(verdict(&bad, "redlock", "leases lost"), Some(Some(false)));
        assert_eq!(
            verdict(&bad, "redlock", "release errors"),
            Some(Some(false))
        );
        let good = leases("redlock", 1.0, 0.0, 0.0);
        assert_eq!(verdict(&good, "redlock", "leases lost"), Some(Some(true)));
        assert_eq!(
            verdict(&good, "redlock", "release errors"),
            Some(Some(true))
        );
        let md = markdown(&bad, "redlock", &[1, 64], 10);
        let line = md
            .lines()
            .find(|l| l.contains("release errors"))
            .unwrap_or_default();
        assert!(line.contains("29") && line.contains("**NOT met**"), "{md}");
    }

    #[test]
    fn an_exclusion_violation_fails_the_run() {
        let clean = vec![
            row(
                "redis",
                "contention-8",
                "dlock",
                "exclusion_violations",
                0.0,
            ),
            row("redis", "waiters-8", "rslock", "exclusion_violations", 0.0),
        ];
        assert!(run_failures(&clean).is_empty());
        assert_eq!(verdict(&clean, "redis", "exclusion"), Some(Some(true)));
        for (workload, imp) in [("contention-8", "dlock"), ("waiters-8", "rslock")] {
            let mut rows = clean.clone();
            rows.push(row("redis", workload, imp, "exclusion_violations", 1.0));
            let f = run_failures(&rows);
            assert_eq!(f.len(), 1, "{f:?}");
            assert!(f[0].contains(workload) && f[0].contains(imp), "{f:?}");
        }
        let mut rows = clean.clone();
        rows.push(row(
            "redis",
            "waiters-64",
            "dlock",
            "exclusion_violations",
            2.0,
        ));
        assert_eq!(verdict(&rows, "redis", "exclusion"), Some(Some(false)));
    }
}
