//! The production-settings rows ([`SUBSET_ROWS`]) run beside the
//! compile steps of `cargo xtask test`: their binaries mostly wait on 10–30 s leases, so run
//! in line they would add minutes to the run for little CPU. They are started from the built
//! test executables (as cargo would run them: from their package's directory), write their rows
//! to the same report directory as every other row, and are judged with them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::conform::{BACKENDS, SUBSET_ROWS};

/// The test filter that keeps the subset rows out of the main `cargo test` run (they ran
/// beside the compile steps): one `--skip` per module; libtest skips names containing it.
pub fn skip_args() -> Vec<String> {
    modules()
        .flat_map(|m| ["--skip".to_string(), format!("{m}::")])
        .collect()
}

fn modules() -> impl Iterator<Item = &'static str> {
    BACKENDS
        .iter()
        .filter(|b| SUBSET_ROWS.contains(&b.name))
        .map(|b| b.module)
}

/// The running binaries, with where each one's output goes.
pub struct Running {
    children: Vec<(String, Child, PathBuf)>,
}

/// Starts every built test binary that enrols a subset row, writing rows to `report_dir`.
///
/// # Errors
/// When cargo cannot list the built executables or one of them cannot be started.
pub fn start(root: &Path, report_dir: &Path) -> Result<Running, String> {
    let mut targets: Vec<(&str, &str)> = BACKENDS
        .iter()
        .filter(|b| SUBSET_ROWS.contains(&b.name))
        .map(|b| (b.krate, b.target))
        .collect();
    targets.sort_unstable();
    targets.dedup();
    let selection: Vec<&str> = targets
        .iter()
        .flat_map(|(krate, target)| ["-p", krate, "--test", target])
        .collect();
    let found = crate::cargo_json::test_executables(
        root,
        &selection,
        "find",
        "the production rows' binaries",
    )?;
    if found.len() != targets.len() {
        return Err(format!(
            "expected {} production-row binaries, cargo built {}: {found:?}",
            targets.len(),
            found.len()
        ));
    }
    let mut children = Vec::new();
    for (exe, package_dir) in found {
        let log = std::env::temp_dir().join(format!(
            "dlock-prod-{}-{}.log",
            std::process::id(),
            children.len()
        ));
        let file = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = file
            .try_clone()
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        eprintln!("\n==> production rows (beside the compile steps): {exe}");
        let child = Command::new(&exe)
            .current_dir(&package_dir)
            // Every scenario of the binary at once: they mostly sleep on long leases, and the
            // rows on several nodes are gated to 8 at a time by the harness.
            .env("RUST_TEST_THREADS", "16")
            .env("DLOCK_REPORT_DIR", report_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("cannot start {exe}: {e}"))?;
        children.push((exe, child, log));
    }
    Ok(Running { children })
}

impl Running {
    /// Waits for every binary, prints each one's output, and fails when any failed.
    ///
    /// # Errors
    /// One line per binary that exited unsuccessfully (its failed rows are judged too).
    pub fn wait(self) -> Result<(), String> {
        let mut failures = Vec::new();
        for (exe, mut child, log) in self.children {
            let status = child.wait();
            let output = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            eprintln!("\n==> production rows: {exe}\n{output}");
            match status {
                Ok(s) if s.success() => {}
                Ok(s) => failures.push(format!("{exe} exited with {s}")),
                Err(e) => failures.push(format!("cannot wait for {exe}: {e}")),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "production rows failed:\n  {}",
                failures.join("\n  ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subset_row_is_in_the_table_and_skipped_in_the_main_run() {
        for name in SUBSET_ROWS {
            assert!(
                BACKENDS.iter().any(|b| b.name == name),
                "{name} is not in BACKENDS"
            );
        }
        let args = skip_args();
        assert_eq!(args.len(), 2 * SUBSET_ROWS.len());
        assert!(args.contains(&"zk_prod::".to_string()));
        // A module filter never skips a lab row.
        for b in BACKENDS.iter().filter(|b| !SUBSET_ROWS.contains(&b.name)) {
            let test = format!("{}::mutual_exclusion", b.module);
            assert!(
                args.iter()
                    .all(|a| a == "--skip" || !test.contains(a.as_str())),
                "{test} would be skipped"
            );
        }
    }
}
