//! `cargo xtask bench [--quick] [--backend redis,redlock,etcd,zk] [--workload all|flash-sale]
//! [--duration SECS] [--json FILE] [--out DIR]`:
//! builds and runs the `dlock-bench` binary in release mode (arguments passed through), then
//! says where the report, the JSON rows and the plot are.
//!
//! `cargo xtask bench --readme FILE [--from RESULTS_JSON]` runs no workload: it rewrites the
//! generated performance section of FILE (between the `dlock-bench:begin` / `end` markers) from
//! a run's `results.json` (default `target/dlock-bench/results.json`). Paths are relative to
//! the workspace root.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (xtask lives one level below it).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Where the bench writes: the value of `--out`, or `target/dlock-bench` in the workspace.
fn out_dir(args: &[String]) -> PathBuf {
    args.iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map_or_else(
            || workspace_root().join("target").join("dlock-bench"),
            PathBuf::from,
        )
}

/// Runs `cargo run --release -p dlock-bench -- <args>` from the workspace root.
///
/// # Errors
/// When cargo cannot start, the build fails, or the bench exits non-zero (a server that cannot
/// start, a workload error); the message names the exit status.
pub fn run(args: &[String]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root())
        .args(["run", "--release", "-p", "dlock-bench", "--"])
        .args(args);
    eprintln!("\n==> bench: {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start cargo for the bench: {e}"))?;
    let out = out_dir(args);
    if args.iter().any(|a| a == "--readme") {
        return if status.success() {
            Ok(())
        } else {
            Err(format!("dlock-bench --readme failed ({status})"))
        };
    }
    if !status.success() {
        return Err(format!(
            "dlock-bench failed ({status}); partial output, if any, in {}",
            out.display()
        ));
    }
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1));
    println!("\nbench report: {}", out.join("report.md").display());
    println!("JSON rows:    {}", out.join("results.json").display());
    if let Some(j) = json {
        println!("              {j}");
    }
    println!("plot:         {}", out.join("waiters.svg").display());
    // The JSON must parse: a truncated or empty file is a failed run.
    let text = std::fs::read_to_string(out.join("results.json"))
        .map_err(|e| format!("cannot read the bench's JSON rows: {e}"))?;
    let rows: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("bench JSON rows do not parse: {e}"))?;
    match rows.as_array() {
        Some(a) if !a.is_empty() => check_exclusion(a),
        _ => Err("the bench wrote no rows".to_string()),
    }
}

/// Fails on any row with `exclusion_violations` > 0, and on a stale write dlock's fenced
/// resource accepted in the flash sale (`stale_writes_fenced` > 0 for `dlock`; dlock-bench
/// already exits non-zero on either; this holds even for a results.json written by an older
/// binary).
fn check_exclusion(rows: &[serde_json::Value]) -> Result<(), String> {
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| {
            let nonzero = r["value"].as_f64() != Some(0.0);
            let stale = r["metric"] == "stale_writes_fenced" && r["impl"] == "dlock";
            (r["metric"] == "exclusion_violations" || stale) && nonzero
        })
        .map(|r| format!("{}/{}/{}", r["backend"], r["workload"], r["impl"]))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("exclusion violations in {}", bad.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_dir_follows_the_flag() {
        let args = vec![
            "--quick".to_string(),
            "--out".to_string(),
            "x/y".to_string(),
        ];
        assert_eq!(out_dir(&args), PathBuf::from("x/y"));
        assert!(out_dir(&[]).ends_with("target/dlock-bench"));
    }

    #[test]
    fn exclusion_violations_fail_the_bench() {
        let row = |v: serde_json::Value| {
            serde_json::json!({"backend": "redis", "workload": "contention-8",
                "impl": "dlock", "metric": "exclusion_violations", "value": v, "unit": "count"})
        };
        assert!(check_exclusion(&[row(0.0.into())]).is_ok());
        assert!(check_exclusion(&[row(1.0.into())]).is_err());
        assert!(check_exclusion(&[row(serde_json::Value::Null)]).is_err());
        let stale = |imp: &str, v: f64| {
            serde_json::json!({"backend": "etcd", "workload": "flash-sale-pauses",
                "impl": imp, "metric": "stale_writes_fenced", "value": v, "unit": "count"})
        };
        assert!(check_exclusion(&[stale("dlock", 0.0)]).is_ok());
        assert!(check_exclusion(&[stale("etcd-client", 2.0)]).is_ok());
        assert!(check_exclusion(&[stale("dlock", 1.0)]).is_err());
    }
}
