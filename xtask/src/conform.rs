//! `cargo xtask conform [--backend memory,redis,…] [--json FILE]`: runs the one conformance
//! scenario list against every enrolled backend on real servers, prints the scenario × backend
//! table, writes the rows as JSON, and fails on any failure or missing row. Installing missing
//! server binaries is `install::ensure_servers`, run before this.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::listing::Listing;

/// One backend of the report: where its tests live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    /// The report name (`etcd-cluster`).
    pub name: &'static str,
    /// The crate whose test target enrols it.
    pub krate: &'static str,
    /// The integration test target (file `tests/<target>.rs`).
    pub target: &'static str,
    /// The module `conformance_tests!` expands to (`etcd_cluster`).
    pub module: &'static str,
}

/// Every known backend, in report order.
pub const BACKENDS: [Backend; 22] = [
    Backend {
        name: "memory",
        krate: "dlock-conformance",
        target: "memory",
        module: "memory",
    },
    Backend {
        name: "redis",
        krate: "dlock-redis",
        target: "conformance",
        module: "redis",
    },
    Backend {
        name: "redis-spin",
        krate: "dlock-redis",
        target: "conformance",
        module: "redis_spin",
    },
    Backend {
        name: "redlock",
        krate: "dlock-redis",
        target: "conformance",
        module: "redlock",
    },
    Backend {
        name: "redlock-degraded",
        krate: "dlock-redis",
        target: "conformance",
        module: "redlock_degraded",
    },
    Backend {
        name: "redis-acl",
        krate: "dlock-redis",
        target: "conformance",
        module: "redis_acl",
    },
    Backend {
        name: "redis-tls",
        krate: "dlock-redis",
        target: "conformance",
        module: "redis_tls",
    },
    Backend {
        name: "redis-sentinel",
        krate: "dlock-redis",
        target: "conformance_sentinel",
        module: "redis_sentinel",
    },
    Backend {
        name: "redis-cluster",
        krate: "dlock-redis",
        target: "conformance_cluster",
        module: "redis_cluster",
    },
    Backend {
        name: "etcd",
        krate: "dlock-etcd",
        target: "conformance",
        module: "etcd",
    },
    Backend {
        name: "etcd-cluster",
        krate: "dlock-etcd",
        // Its own binary: with the etcd row, 24 test threads starved the three members
        // (many_leases_break, leader_partition; r45).
        target: "conformance_cluster",
        module: "etcd_cluster",
    },
    Backend {
        name: "etcd-tls",
        krate: "dlock-etcd",
        // Its own binary: with the other two etcd rows, 24 test threads starved 2 cores.
        target: "conformance_tls",
        module: "etcd_tls",
    },
    Backend {
        name: "etcd-auth",
        krate: "dlock-etcd",
        target: "conformance_auth",
        module: "etcd_auth",
    },
    Backend {
        name: "zk",
        krate: "dlock-zk",
        target: "conformance",
        module: "zk",
    },
    Backend {
        name: "zk-cluster",
        krate: "dlock-zk",
        // Its own binary: with the zk row, 24 test threads starved 2 cores (short_blip, r36).
        target: "conformance_cluster",
        module: "zk_cluster",
    },
    Backend {
        name: "zk-tls",
        krate: "dlock-zk",
        target: "conformance_secure",
        module: "zk_tls",
    },
    Backend {
        name: "zk-digest",
        krate: "dlock-zk",
        target: "conformance_secure",
        module: "zk_digest",
    },
    // The timing scenarios at the servers' defaults ([`SUBSET_ROWS`]): their own binaries,
    // which `cargo xtask test` runs beside the compile steps (they mostly wait on long leases).
    Backend {
        name: "zk-prod",
        krate: "dlock-zk",
        target: "conformance_prod",
        module: "zk_prod",
    },
    Backend {
        name: "zk-prod-30",
        krate: "dlock-zk",
        target: "conformance_prod",
        module: "zk_prod_30",
    },
    Backend {
        name: "etcd-prod",
        krate: "dlock-etcd",
        target: "conformance_prod",
        module: "etcd_prod",
    },
    Backend {
        name: "redis-10s",
        krate: "dlock-redis",
        target: "conformance_prod",
        module: "redis_10s",
    },
    // The mutex scenarios through dlock-any's tiered router over Redis + etcd ([`SUBSET_ROWS`]).
    Backend {
        name: "tiered",
        krate: "dlock-any",
        target: "conformance_tiered",
        // Not `tiered`: `cargo xtask test` skips this row's tests by `<module>::` in every
        // binary, and dlock-any's own unit tests live under `tiered::`.
        module: "tiered_row",
    },
];

/// Parsed command line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// Selected backends (all when the flag is absent).
    pub backends: Vec<Backend>,
    /// Where to write the JSON rows.
    pub json: Option<PathBuf>,
    /// Run the soak for this long instead of the scenarios.
    pub soak: Option<std::time::Duration>,
    /// The soak's seed (random when absent).
    pub seed: Option<u64>,
    /// Judge the rows already written to this directory instead of running the suite.
    pub from: Option<PathBuf>,
}

const USAGE: &str = "usage: cargo xtask conform [--backend memory,redis,redis-spin,redlock,redlock-degraded,redis-acl,redis-tls,redis-sentinel,redis-cluster,etcd,etcd-cluster,etcd-tls,etcd-auth,zk,zk-cluster,zk-tls,zk-digest] [--json FILE] [--from ROWS_DIR] [--soak DURATION (10m, 90s) [--seed N]]";

/// Parses `conform`'s arguments (without the subcommand itself).
///
/// # Errors
/// A message with the usage for unknown flags or backends.
pub fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut opts = Options::default();
    let mut names: Option<Vec<String>> = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag {
            "--backend" | "--backends" => {
                let v = value()?;
                names.get_or_insert_with(Vec::new).extend(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                );
            }
            "--json" => opts.json = Some(PathBuf::from(value()?)),
            "--from" => opts.from = Some(PathBuf::from(value()?)),
            "--soak" => opts.soak = Some(soak::parse_duration(&value()?)?),
            "--seed" => {
                let v = value()?;
                opts.seed = Some(
                    v.parse()
                        .map_err(|_| format!("--seed wants a number, not {v:?}\n{USAGE}"))?,
                );
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    opts.backends = match names {
        None => BACKENDS.to_vec(),
        Some(names) => {
            let mut out = Vec::new();
            for n in names {
                let b = BACKENDS
                    .iter()
                    .find(|b| b.name == n || b.module == n)
                    .ok_or_else(|| format!("unknown backend {n:?}\n{USAGE}"))?;
                if !out.contains(b) {
                    out.push(*b);
                }
            }
            out
        }
    };
    Ok(opts)
}

/// The workspace root: `$DLOCK_WORKSPACE` when set, else the parent of the xtask crate.
pub(crate) fn workspace_root() -> PathBuf {
    if let Some(root) = std::env::var_os("DLOCK_WORKSPACE") {
        return PathBuf::from(root);
    }
    let xtask = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().map(Path::to_path_buf).unwrap_or(xtask)
}

/// One cell of the table.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Row(Value),
    Missing,
}

/// The report over collected rows.
#[derive(Debug, Default)]
pub struct Report {
    /// Every row, as written by the suite (plus synthetic failure rows for missing ones).
    pub rows: Vec<Value>,
    /// Human-readable problems that make the run fail.
    pub failures: Vec<String>,
}

fn field<'a>(row: &'a Value, key: &str) -> &'a str {
    row.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Reads every `*.json` row in `dir`.
///
/// # Errors
/// When the directory cannot be read; unparsable files are reported as failures instead.
pub fn read_rows(dir: &Path) -> Result<(Vec<Value>, Vec<String>), String> {
    let mut rows = Vec::new();
    let mut bad = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for p in paths {
        match std::fs::read_to_string(&p)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| e.to_string()))
        {
            Ok(v) if v.is_object() => rows.push(v),
            Ok(_) => bad.push(format!("{}: not a JSON object", p.display())),
            Err(e) => bad.push(format!("{}: {e}", p.display())),
        }
    }
    Ok((rows, bad))
}

/// Builds the report for `backends` (the enrolled ones) from `rows`: every failed row and every
/// missing (backend, scenario) pair is a failure. The scenario set is the union over backends.
#[cfg(test)]
pub fn build_report(backends: &[&'static str], rows: Vec<Value>) -> Report {
    build_report_with(backends, rows, &Expected::default())
}

/// The rows enrolled with a list of scenarios (`conformance_tests!(…, only = […])`): the
/// timing scenarios at the servers' default settings. Each must have a row for every scenario
/// its binary lists; every other row, for every scenario of the suite.
pub const SUBSET_ROWS: [&str; 5] = ["zk-prod", "zk-prod-30", "etcd-prod", "redis-10s", "tiered"];

/// The scenarios that must have rows.
#[derive(Debug, Default, Clone)]
pub struct Expected {
    /// Scenarios every row enrolled with the whole suite must have, even if no backend wrote
    /// one (the suite's own scenario list).
    pub all: BTreeSet<String>,
    /// The scenarios of each row of [`SUBSET_ROWS`], by report name.
    pub only: BTreeMap<String, BTreeSet<String>>,
}

impl From<BTreeSet<String>> for Expected {
    fn from(all: BTreeSet<String>) -> Self {
        Expected {
            all,
            only: BTreeMap::new(),
        }
    }
}

/// Builds the report for `backends` from `rows`, where `expected` names the scenarios that must
/// have a row (see [`Expected`]).
pub fn build_report_with(
    backends: &[&'static str],
    rows: Vec<Value>,
    expected: &Expected,
) -> Report {
    let mut report = Report::default();
    let mut suite: BTreeSet<String> = rows
        .iter()
        .filter(|r| !expected.only.contains_key(field(r, "backend")))
        .map(|r| field(r, "scenario").to_string())
        .collect();
    suite.extend(expected.all.iter().cloned());
    for b in backends {
        let mine: Vec<&Value> = rows.iter().filter(|r| field(r, "backend") == *b).collect();
        if mine.is_empty() {
            report.failures.push(format!(
                "{b}: no rows at all (its tests did not run or did not build)"
            ));
        }
        let scenarios = expected.only.get(*b).unwrap_or(&suite);
        for s in scenarios {
            match mine.iter().find(|r| field(r, "scenario") == s) {
                Some(r) if field(r, "status") == "fail" => {
                    report
                        .failures
                        .push(format!("{b}::{s}: {}", field(r, "reason")));
                }
                Some(_) => {}
                None if !mine.is_empty() => {
                    report.failures.push(format!(
                        "{b}::{s}: no row (the test did not run or crashed)"
                    ));
                    report.rows.push(serde_json::json!({
                        "backend": b, "scenario": s, "status": "fail",
                        "reason": "no row: the test did not run or crashed", "figures": {}
                    }));
                }
                None => {}
            }
        }
    }
    let wanted: BTreeSet<&str> = backends.iter().copied().collect();
    report.rows.extend(
        rows.into_iter()
            .filter(|r| wanted.contains(field(r, "backend"))),
    );
    report.rows.sort_by(|a, b| {
        (field(a, "backend"), field(a, "scenario"))
            .cmp(&(field(b, "backend"), field(b, "scenario")))
    });
    report
}

fn short(status: &str) -> &'static str {
    match status {
        "pass" => "pass",
        "fail" => "FAIL",
        "skip" => "skip",
        _ => "?",
    }
}

fn figures_text(row: &Value) -> String {
    row.get("figures")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| match v {
                    Value::String(s) => format!("{k}={s}"),
                    other => format!("{k}={other}"),
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// Renders the scenario × backend table, then failures, skips (with reasons) and figures.
pub fn render(backends: &[&'static str], not_enrolled: &[&'static str], report: &Report) -> String {
    let mut cells: BTreeMap<(String, String), Cell> = BTreeMap::new();
    let mut scenarios: BTreeSet<String> = BTreeSet::new();
    for r in &report.rows {
        scenarios.insert(field(r, "scenario").to_string());
        cells.insert(
            (
                field(r, "scenario").to_string(),
                field(r, "backend").to_string(),
            ),
            Cell::Row(r.clone()),
        );
    }
    let width = scenarios.iter().map(String::len).max().unwrap_or(8).max(8);
    let col = |b: &str| b.len().max(6);
    let mut out = String::new();
    out.push_str(&format!("{:width$}", "scenario"));
    for b in backends {
        out.push_str(&format!(" | {:w$}", b, w = col(b)));
    }
    out.push('\n');
    out.push_str(&"-".repeat(width));
    for b in backends {
        out.push_str(&format!("-+-{}", "-".repeat(col(b))));
    }
    out.push('\n');
    for s in &scenarios {
        out.push_str(&format!("{s:width$}"));
        for b in backends {
            let text = match cells
                .get(&(s.clone(), b.to_string()))
                .unwrap_or(&Cell::Missing)
            {
                Cell::Row(r) => short(field(r, "status")),
                Cell::Missing => "—",
            };
            out.push_str(&format!(" | {:w$}", text, w = col(b)));
        }
        out.push('\n');
    }
    if !not_enrolled.is_empty() {
        out.push_str(&format!(
            "\nNOT ENROLLED (no test binary runs them; this fails the run): {}\n",
            not_enrolled.join(", ")
        ));
    }
    let section = |title: &str, status: &str, out: &mut String| {
        let lines: Vec<String> = report
            .rows
            .iter()
            .filter(|r| field(r, "status") == status)
            .map(|r| {
                format!(
                    "  {}::{}: {}",
                    field(r, "backend"),
                    field(r, "scenario"),
                    field(r, "reason")
                )
            })
            .collect();
        if !lines.is_empty() {
            out.push_str(&format!("\n{title}:\n{}\n", lines.join("\n")));
        }
    };
    section("FAILURES", "fail", &mut out);
    section("skips", "skip", &mut out);
    let parts: Vec<String> = report
        .rows
        .iter()
        .flat_map(|r| {
            let head = format!("  {}::{}", field(r, "backend"), field(r, "scenario"));
            r.get("figures")
                .and_then(|f| f.get("skipped_parts"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(move |p| format!("{head}: {p}"))
        })
        .collect();
    if !parts.is_empty() {
        out.push_str(&format!(
            "\nskipped parts (the rest of the scenario ran):\n{}\n",
            parts.join("\n")
        ));
    }
    let figs: Vec<String> = report
        .rows
        .iter()
        .filter(|r| {
            r.get("figures")
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
        })
        .map(|r| {
            format!(
                "  {}::{}: {}",
                field(r, "backend"),
                field(r, "scenario"),
                figures_text(r)
            )
        })
        .collect();
    if !figs.is_empty() {
        out.push_str(&format!("\nfigures:\n{}\n", figs.join("\n")));
    }
    let others: Vec<&String> = report
        .failures
        .iter()
        .filter(|f| f.contains("no row"))
        .collect();
    if !others.is_empty() {
        out.push_str(&format!(
            "\nmissing rows:\n{}\n",
            others
                .iter()
                .map(|f| format!("  {f}"))
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    out
}

/// Runs `cargo xtask conform` with `args` (the arguments after `conform`).
///
/// # Errors
/// A summary when any scenario failed, a backend's rows are missing, or the run could not
/// start; the table has been printed by then.
pub fn run(args: &[String]) -> Result<(), String> {
    let opts = parse_args(args)?;
    let root = workspace_root();
    let listing = Listing::ask(&root, &opts.backends)?;
    let (enrolled_backends, not_enrolled): (Vec<Backend>, Vec<Backend>) =
        opts.backends.iter().partition(|b| listing.enrolled(b));
    let expected = listing.expected(&enrolled_backends);
    if let Some(duration) = opts.soak {
        let soaked = soak::run(&root, &enrolled_backends, duration, opts.seed);
        let dropped = enrolment_failures(&not_enrolled);
        if !dropped.is_empty() {
            let mut all = dropped;
            all.extend(soaked.err());
            return Err(format!("soak failed:\n  {}", all.join("\n  ")));
        }
        return soaked;
    }
    if let Some(dir) = &opts.from {
        return judge(
            &root,
            dir,
            &enrolled_backends,
            &not_enrolled,
            &expected,
            opts.json.as_deref(),
            Vec::new(),
        );
    }
    let report_dir = std::env::temp_dir().join(format!("dlock-conform-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&report_dir);
    std::fs::create_dir_all(&report_dir)
        .map_err(|e| format!("cannot create {}: {e}", report_dir.display()))?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut crate_failures = Vec::new();
    // One cargo test run per (crate, target), filtered to the selected modules.
    let mut groups: Vec<((&str, &str), Vec<&str>)> = Vec::new();
    for b in &enrolled_backends {
        match groups.iter_mut().find(|(k, _)| *k == (b.krate, b.target)) {
            Some((_, mods)) => mods.push(b.module),
            None => groups.push(((b.krate, b.target), vec![b.module])),
        }
    }
    for ((krate, target), modules) in &groups {
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(&root)
            .args(["test", "-p", krate, "--test", target, "--"]);
        cmd.args(modules.iter().map(|m| format!("{m}::")));
        cmd.arg("--test-threads=32")
            .env("DLOCK_REPORT_DIR", &report_dir);
        println!("conform: running {} {}", krate, modules.join(","));
        match cmd.status() {
            Ok(s) if s.success() => {}
            Ok(s) => crate_failures.push(format!(
                "cargo test -p {krate} --test {target} exited with {s}"
            )),
            Err(e) => crate_failures.push(format!("cannot run cargo for {krate}: {e}")),
        }
    }
    let judged = judge(
        &root,
        &report_dir,
        &enrolled_backends,
        &not_enrolled,
        &expected,
        opts.json.as_deref(),
        crate_failures,
    );
    let _ = std::fs::remove_dir_all(&report_dir);
    judged
}

/// One failure for each backend of xtask's table that no test binary enrols: it would never be
/// run or judged, so it fails the run instead of dropping out of the table in silence.
pub fn enrolment_failures(not_enrolled: &[Backend]) -> Vec<String> {
    not_enrolled
        .iter()
        .map(|b| {
            format!(
                "{}: in xtask's backend table, but no test binary enrols it (no \
                 conformance_tests! module `{}` in {} --test {})",
                b.name, b.module, b.krate, b.target
            )
        })
        .collect()
}

/// Judges the rows the suite wrote to `dir` for `backends`: builds the report (failed and
/// missing rows fail, and so does every backend of `not_enrolled`: see
/// [`enrolment_failures`]), applies the committed skip allowlist, prints the table, writes the JSON
/// rows to `json` when given. `cargo xtask conform` and `cargo xtask test` both end here, so CI
/// sees the same table.
///
/// `run_failures` are the cargo runs that failed; they are reported when no row explains them.
///
/// # Errors
/// The failures, one a line.
pub fn judge(
    root: &Path,
    dir: &Path,
    backends: &[Backend],
    not_enrolled: &[Backend],
    expected: &Expected,
    json: Option<&Path>,
    run_failures: Vec<String>,
) -> Result<(), String> {
    let (rows, bad) = read_rows(dir)?;
    let names: Vec<&'static str> = backends.iter().map(|b| b.name).collect();
    let skipped_names: Vec<&'static str> = not_enrolled.iter().map(|b| b.name).collect();
    let mut report = build_report_with(&names, rows, expected);
    report.failures.extend(bad);
    report.failures.extend(enrolment_failures(not_enrolled));
    match crate::allowlist::load(root) {
        Ok(allowed) => {
            report
                .failures
                .extend(crate::allowlist::check(&names, &report.rows, &allowed))
        }
        Err(e) => report.failures.push(e),
    }
    println!("\n{}", render(&names, &skipped_names, &report));
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&Value::Array(report.rows.clone()))
            .map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!(
            "conform: wrote {} rows to {}",
            report.rows.len(),
            path.display()
        );
    }
    if names.is_empty() {
        return Err("no selected backend is enrolled".into());
    }
    // A crate whose run failed without any failed row explains nothing: report it.
    if report.failures.is_empty() && !run_failures.is_empty() {
        report.failures.extend(run_failures);
    }
    if report.failures.is_empty() {
        println!("conform: every scenario passed or was skipped with a reason");
        Ok(())
    } else {
        Err(format!(
            "conformance failed:\n  {}",
            report.failures.join("\n  ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Owned strings of `v` (arguments, output lines); the soak's tests use it too.
    pub(super) fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_backends_and_json() {
        let o = parse_args(&s(&[
            "--backend",
            "memory,etcd-cluster",
            "--json",
            "out.json",
        ]))
        .expect("valid");
        assert_eq!(
            o.backends.iter().map(|b| b.name).collect::<Vec<_>>(),
            ["memory", "etcd-cluster"]
        );
        assert_eq!(o.json, Some(PathBuf::from("out.json")));
        let o = parse_args(&s(&["--backend=zk_cluster"])).expect("module names work too");
        assert_eq!(o.backends[0].name, "zk-cluster");
        assert_eq!(
            parse_args(&[]).expect("defaults").backends.len(),
            BACKENDS.len()
        );
        assert!(parse_args(&s(&["--backend", "mysql"])).is_err());
        assert!(parse_args(&s(&["--frobnicate"])).is_err());
        assert!(parse_args(&s(&["--json"])).is_err());
    }

    #[test]
    fn parses_soak_and_seed() {
        let o = parse_args(&s(&["--soak", "10m", "--seed=42", "--backend", "zk"])).expect("parses");
        assert_eq!(o.soak, Some(std::time::Duration::from_secs(600)));
        assert_eq!(o.seed, Some(42));
        assert_eq!(o.backends.len(), 1);
        assert!(parse_args(&s(&["--soak", "soon"])).is_err());
        assert!(parse_args(&s(&["--soak", "1m", "--seed", "x"])).is_err());
        assert_eq!(parse_args(&s(&[])).expect("parses").soak, None);
    }

    fn row(b: &str, sc: &str, st: &str) -> Value {
        json!({"backend": b, "scenario": sc, "status": st, "reason": if st == "pass" { "" } else { "because" }, "figures": {"x_ms": 1.5}})
    }

    #[test]
    fn a_subset_row_needs_its_own_scenarios_only() {
        let mut expected = Expected::from(BTreeSet::from(["a".to_string(), "b".to_string()]));
        expected
            .only
            .insert("zk-prod".into(), BTreeSet::from(["b".to_string()]));
        let rows = || {
            vec![
                row("memory", "a", "pass"),
                row("memory", "b", "pass"),
                row("zk-prod", "b", "pass"),
            ]
        };
        let ok = build_report_with(&["memory", "zk-prod"], rows(), &expected);
        assert!(ok.failures.is_empty(), "{:?}", ok.failures);
        // A scenario of its list without a row fails it; the suite's others do not.
        expected.only.insert(
            "zk-prod".into(),
            BTreeSet::from(["b".to_string(), "c".to_string()]),
        );
        let missing = build_report_with(&["memory", "zk-prod"], rows(), &expected);
        assert_eq!(missing.failures.len(), 1, "{:?}", missing.failures);
        assert!(missing.failures[0].contains("zk-prod::c: no row"));
    }

    #[test]
    fn failures_and_missing_rows_fail_the_report() {
        let ok = build_report(
            &["memory", "redis"],
            vec![
                row("memory", "a", "pass"),
                row("memory", "b", "skip"),
                row("redis", "a", "pass"),
                row("redis", "b", "pass"),
            ],
        );
        assert!(ok.failures.is_empty(), "{:?}", ok.failures);
        assert_eq!(ok.rows.len(), 4);

        let failed = build_report(&["memory"], vec![row("memory", "a", "fail")]);
        assert_eq!(failed.failures.len(), 1);

        let missing = build_report(
            &["memory", "redis"],
            vec![
                row("memory", "a", "pass"),
                row("memory", "b", "pass"),
                row("redis", "a", "pass"),
            ],
        );
        assert_eq!(missing.failures.len(), 1, "{:?}", missing.failures);
        assert!(missing.failures[0].contains("redis::b"));
        assert!(missing.rows.iter().any(|r| field(r, "backend") == "redis"
            && field(r, "scenario") == "b"
            && field(r, "status") == "fail"));

        let expected: BTreeSet<String> = ["a".to_string(), "never_ran".to_string()].into();
        let unrun = build_report_with(
            &["memory"],
            vec![row("memory", "a", "pass")],
            &expected.clone().into(),
        );
        assert!(
            unrun
                .failures
                .iter()
                .any(|f| f.contains("memory::never_ran: no row")),
            "a scenario no backend ran is a missing row: {:?}",
            unrun.failures
        );

        let absent = build_report(&["memory", "zk"], vec![row("memory", "a", "pass")]);
        assert!(
            absent.failures.iter().any(|f| f.starts_with("zk: no rows")),
            "{:?}",
            absent.failures
        );
    }

    #[test]
    fn table_shows_status_reasons_and_figures() {
        let report = build_report(
            &["memory", "redis"],
            vec![
                row("memory", "herd", "pass"),
                row("redis", "herd", "skip"),
                row("memory", "fifo", "fail"),
                row("redis", "fifo", "pass"),
            ],
        );
        let text = render(&["memory", "redis"], &["zk"], &report);
        let herd = text
            .lines()
            .find(|l| l.starts_with("herd"))
            .expect("herd line");
        assert!(herd.contains("pass") && herd.contains("skip"), "{herd}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("fifo") && l.contains("FAIL"))
        );
        assert!(text.contains("memory::fifo: because"));
        assert!(text.contains("redis::herd: because"));
        assert!(text.contains("x_ms=1.5"));
        assert!(text.contains("NOT ENROLLED") && text.contains("zk"));
    }

    /// A backend of the table that no test binary enrols fails the judgement, even when every
    /// row of the enrolled ones passed; without it the same rows pass.
    #[test]
    fn a_backend_nobody_enrols_fails_the_run() {
        let dir = std::env::temp_dir().join(format!("conform-enrol-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let only = Backend {
            name: "judge-test-only",
            krate: "none",
            target: "none",
            module: "judge_test_only",
        };
        std::fs::write(
            dir.join("only__a.json"),
            json!({"backend": only.name, "scenario": "a", "status": "pass", "reason": "", "figures": {}})
                .to_string(),
        )
        .expect("write");
        let expected: BTreeSet<String> = ["a".to_string()].into();
        let root = workspace_root();
        let zk = BACKENDS
            .iter()
            .find(|b| b.name == "zk")
            .copied()
            .expect("zk is in the table");
        let expected = Expected::from(expected);
        let clean = judge(&root, &dir, &[only], &[], &expected, None, Vec::new());
        let dropped = judge(&root, &dir, &[only], &[zk], &expected, None, Vec::new());
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            clean,
            Ok(()),
            "the control passes with every backend enrolled"
        );
        let err = dropped.expect_err("a backend nobody enrols fails the run");
        assert!(
            err.contains("zk: in xtask's backend table, but no test binary enrols it"),
            "{err}"
        );
    }

    #[test]
    fn rows_are_read_from_a_directory() {
        let dir = std::env::temp_dir().join(format!("conform-rows-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join("memory__a.json"),
            row("memory", "a", "pass").to_string(),
        )
        .expect("write");
        std::fs::write(dir.join("broken.json"), "{not json").expect("write");
        std::fs::write(dir.join("ignored.txt"), "x").expect("write");
        let (rows, bad) = read_rows(&dir).expect("readable");
        assert_eq!(rows.len(), 1);
        assert_eq!(bad.len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// `cargo xtask conform --soak DURATION [--seed N]`: every selected backend's hidden `__soak`
/// test, all at once, each in its own process with `DLOCK_SOAK=<seconds>,<seed>`.
mod soak {
    use std::io::{BufRead, BufReader};
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use serde_json::Value;

    use super::Backend;

    /// `10m`, `90s`, `1h` or plain seconds.
    pub fn parse_duration(text: &str) -> Result<Duration, String> {
        let t = text.trim();
        let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
        let n: u64 = num
            .parse()
            .map_err(|_| format!("bad duration {text:?}: want e.g. 10m, 90s, 1h"))?;
        let secs = match unit {
            "" | "s" => n,
            "m" => n * 60,
            "h" => n * 3600,
            _ => return Err(format!("bad duration unit in {text:?}: want s, m or h")),
        };
        if secs == 0 {
            return Err("the soak needs a duration above zero".into());
        }
        Ok(Duration::from_secs(secs))
    }

    /// Builds the test binary of `krate`'s `target` and returns its path.
    fn build(root: &Path, krate: &str, target: &str) -> Result<PathBuf, String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(root)
            .args(["test", "-p", krate, "--test", target, "--no-run"])
            .args(["--message-format=json"])
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !out.status.success() {
            return Err(format!("building {krate} --test {target} failed"));
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == target)
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .ok_or_else(|| format!("no test executable for {krate} --test {target}"))
    }

    /// One backend's soak from its `DLOCK_SOAK` lines and exit status: `Ok` with the line to
    /// show for a result (or, with `ci` false, a skip), `Err` with why it failed. A run
    /// without a result line fails, and so does any skip under `ci`: the soak cannot pass
    /// with nothing tested there.
    pub fn judge_one(lines: &[String], success: bool, ci: bool) -> Result<String, String> {
        let result = lines.iter().find(|l| l.starts_with("DLOCK_SOAK result"));
        let last = lines
            .last()
            .cloned()
            .unwrap_or_else(|| "no soak report".into());
        match result {
            Some(line) if success => Ok(line.clone()),
            _ if success && last.starts_with("DLOCK_SOAK skipped") && !ci => Ok(last),
            _ if last.starts_with("DLOCK_SOAK skipped") => {
                Err(format!("{last} (under CI a skip is a failure)"))
            }
            _ => Err(last),
        }
    }

    /// Runs the soak; fails when any backend's soak failed, did not report, or (under `CI`)
    /// skipped.
    pub fn run(
        root: &Path,
        backends: &[Backend],
        duration: Duration,
        seed: Option<u64>,
    ) -> Result<(), String> {
        if backends.is_empty() {
            return Err("no selected backend is enrolled".into());
        }
        let seed = seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 % 1_000_000)
                .unwrap_or(1)
        });
        println!(
            "soak: {}s, seed {seed}, backends {}",
            duration.as_secs(),
            backends
                .iter()
                .map(|b| b.name)
                .collect::<Vec<_>>()
                .join(",")
        );
        let mut exes = Vec::new();
        for b in backends {
            let exe = match exes
                .iter()
                .find(|(k, _): &&((&str, &str), PathBuf)| k.0 == b.krate && k.1 == b.target)
            {
                Some((_, e)) => e.clone(),
                None => build(root, b.krate, b.target)?,
            };
            exes.push(((b.krate, b.target), exe.clone()));
        }
        let began = Instant::now();
        let mut running = Vec::new();
        for (b, (_, exe)) in backends.iter().zip(&exes) {
            let mut child = Command::new(exe)
                .current_dir(root.join(b.krate))
                .args([
                    &format!("{}::__soak", b.module),
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("DLOCK_SOAK", format!("{},{seed}", duration.as_secs()))
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("cannot start the {} soak: {e}", b.name))?;
            let stdout = child.stdout.take();
            let name = b.name;
            let reader = std::thread::spawn(move || {
                let mut found = Vec::new();
                if let Some(out) = stdout {
                    for line in BufReader::new(out).lines().map_while(Result::ok) {
                        if let Some(at) = line.find("DLOCK_SOAK ") {
                            println!("soak[{name}]: {}", &line[at..]);
                            found.push(line[at..].to_string());
                        }
                    }
                }
                found
            });
            running.push((b.name, child, reader));
        }
        let mut failures = Vec::new();
        let mut table = Vec::new();
        let ci = std::env::var_os("CI").is_some();
        for (name, mut child, reader) in running {
            let status = child
                .wait()
                .map_err(|e| format!("waiting for {name}: {e}"))?;
            let lines = reader.join().unwrap_or_default();
            match judge_one(&lines, status.success(), ci) {
                Ok(line) => table.push(format!("{name:<18} {line}")),
                Err(why) => failures.push(format!("{name}: {why} (exit {status})")),
            }
        }
        println!(
            "\nsoak results (seed {seed}, {}s each, {:.0}s wall clock):",
            duration.as_secs(),
            began.elapsed().as_secs_f64()
        );
        for row in &table {
            println!("  {row}");
        }
        if failures.is_empty() {
            println!("soak: no violation (promise, belief, token, fenced safety)");
            Ok(())
        } else {
            Err(format!(
                "soak failed (seed {seed}):\n  {}",
                failures.join("\n  ")
            ))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::conform::tests::s as lines;

        /// A skip passes only outside CI; a run without a result line never passes.
        #[test]
        fn a_soak_passes_only_with_a_result_and_skips_only_outside_ci() {
            let result = lines(&["DLOCK_SOAK result backend=memory seed=1 secs=60 grants=90"]);
            assert!(judge_one(&result, true, true).is_ok());
            assert!(
                judge_one(&result, false, true).is_err(),
                "a failed exit fails"
            );
            let skipped = lines(&["DLOCK_SOAK skipped backend=zk reason=\"no zkServer\""]);
            assert!(
                judge_one(&skipped, true, false).is_ok(),
                "a skip outside CI"
            );
            let err = judge_one(&skipped, true, true).expect_err("a skip under CI fails");
            assert!(err.contains("under CI a skip is a failure"), "{err}");
            let failed = lines(&["DLOCK_SOAK failed backend=redis reason=\"too little\""]);
            assert!(judge_one(&failed, false, false).is_err());
            assert_eq!(
                judge_one(&[], true, false),
                Err("no soak report".to_string()),
                "a run that printed nothing fails"
            );
        }

        #[test]
        fn durations_parse() {
            assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
            assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
            assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
            assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
            assert!(parse_duration("0m").is_err());
            assert!(parse_duration("ten").is_err());
            assert!(parse_duration("5d").is_err());
        }
    }
}
