//! cargo's `--message-format json` output, read in one place: building test binaries to find
//! their executables (each with its package's directory), and the compiler diagnostics.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Builds the test binaries of `cargo test SELECTION` in `root` and returns each test executable
/// with its package's directory (where cargo runs it).
///
/// # Errors
/// `cannot run cargo to {verb} {what}` when cargo does not start, `cannot build {what}` with
/// cargo's stderr when the build fails.
pub fn test_executables(
    root: &Path,
    selection: &[&str],
    verb: &str,
    what: &str,
) -> Result<Vec<(String, PathBuf)>, String> {
    let out = crate::captured(
        crate::cargo()
            .current_dir(root)
            .args(["test", "-q", "--no-run", "--message-format=json"])
            .args(selection),
        &format!("cannot run cargo to {verb} {what}"),
        &format!("cannot build {what}"),
    )?;
    Ok(executables(&out))
}

/// The messages of cargo's stdout, one JSON object a line (any other line is skipped).
fn messages(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The test executables in cargo's stdout, each with its package's directory.
fn executables(stdout: &[u8]) -> Vec<(String, PathBuf)> {
    messages(stdout)
        .into_iter()
        .filter(|m| m["reason"] == "compiler-artifact" && m["profile"]["test"] == true)
        .filter_map(|m| {
            let exe = m["executable"].as_str()?.to_string();
            let dir = Path::new(m["manifest_path"].as_str()?).parent()?;
            Some((exe, dir.to_path_buf()))
        })
        .collect()
}

/// The warnings and errors rustc reported in cargo's stdout, rendered. Registry crates' warnings
/// never appear (cargo caps their lints), so these are the workspace's own.
pub fn diagnostics(stdout: &[u8]) -> Vec<String> {
    messages(stdout)
        .into_iter()
        .filter(|m| m["reason"] == "compiler-message")
        .filter(|m| matches!(m["message"]["level"].as_str(), Some("warning" | "error")))
        .map(|m| {
            m["message"]["rendered"]
                .as_str()
                .unwrap_or("(a diagnostic without text)")
                .to_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_and_diagnostics_are_read_from_one_stream() {
        let out = [
            r#"{"reason":"compiler-artifact","manifest_path":"/w/dlock-zk/Cargo.toml","profile":{"test":true},"executable":"/t/conformance_prod-1"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/x/Cargo.toml","profile":{"test":false},"executable":null}"#,
            r#"{"reason":"compiler-message","message":{"level":"warning","rendered":"warning: unused import"}}"#,
            r#"{"reason":"compiler-message","message":{"level":"note","rendered":"note: x"}}"#,
            "not json",
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        let exe = (
            "/t/conformance_prod-1".to_string(),
            PathBuf::from("/w/dlock-zk"),
        );
        assert_eq!(executables(out.as_bytes()), [exe]);
        assert_eq!(diagnostics(out.as_bytes()), ["warning: unused import"]);
    }
}
