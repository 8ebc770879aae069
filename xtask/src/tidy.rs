//! `cargo xtask tidy`: the workspace rules no compiler checks.
//!
//! 1. Every source file is in ARCHITECTURE.md's code map, and every file the map names exists.
//! 2. The backend crates do not depend on each other.
//! 3. No public `*_for_test` function outside the `testing` cargo feature.
//! 4. Every library crate users build on has its README as crate docs and forbids unsafe code.
//!
//! Each rule is a function from file contents to findings, so its tests can show it failing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The backend crates: none may depend on another.
const BACKENDS: [&str; 3] = ["dlock-redis", "dlock-etcd", "dlock-zk"];

/// Crates exempt from rule 4, with the reason.
const NOT_USER_LIBRARIES: [(&str, &str); 3] = [
    (
        "dlock-conformance",
        "the test kit: spawns, signals and reaps server processes through libc",
    ),
    ("dlock-bench", "a benchmark binary"),
    ("xtask", "project automation"),
];

/// Runs every rule on the workspace at `root`.
///
/// # Errors
/// Every finding, one per line.
pub fn run(root: &Path) -> Result<(), String> {
    let members = members(root)?;
    let mut findings = Vec::new();
    let map = read(&root.join("ARCHITECTURE.md"))?;
    let mut files = Vec::new();
    for m in &members {
        for f in sources(&root.join(m))? {
            let rel = f
                .strip_prefix(root)
                .map_err(|e| e.to_string())?
                .to_string_lossy()
                .replace('\\', "/");
            files.push(rel);
        }
    }
    findings.extend(code_map(&map, &members, &files));
    for m in &members {
        let manifest = read(&root.join(m).join("Cargo.toml"))?;
        findings.extend(backend_deps(m, &manifest));
    }
    for f in &files {
        if f.contains("/src/") {
            findings.extend(ungated_hooks(f, &read(&root.join(f))?));
        }
    }
    for m in &members {
        if NOT_USER_LIBRARIES.iter().any(|(n, _)| n == m) {
            continue;
        }
        let lib = root.join(m).join("src/lib.rs");
        let main = root.join(m).join("src/main.rs");
        let crate_root = if lib.exists() { lib } else { main };
        findings.extend(crate_root_rules(m, &read(&crate_root)?));
    }
    if findings.is_empty() {
        eprintln!(
            "tidy: {} files in {} crates: code map, backend dependencies, test hooks, crate roots all fine",
            files.len(),
            members.len()
        );
        Ok(())
    } else {
        Err(format!("tidy:\n  {}", findings.join("\n  ")))
    }
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The workspace members, from the root manifest's `members = [ … ]`.
fn members(root: &Path) -> Result<Vec<String>, String> {
    let manifest = read(&root.join("Cargo.toml"))?;
    let list = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .ok_or("the root Cargo.toml has no `members = [ … ]`")?;
    Ok(list
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect())
}

/// Every `.rs` file of a crate (its `target` directory aside), sorted.
fn sources(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries =
            std::fs::read_dir(&d).map_err(|e| format!("cannot list {}: {e}", d.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// One crate's part of the code map: its lines, from the crate's line to the next crate's.
fn sections<'a>(map: &'a str, members: &[String]) -> Vec<(String, Vec<&'a str>)> {
    let block = map
        .split_once("## Code map")
        .and_then(|(_, rest)| rest.split("```").nth(1))
        .unwrap_or("");
    let mut out: Vec<(String, Vec<&str>)> = Vec::new();
    for line in block.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if !line.starts_with(' ') {
            let krate = first.trim_end_matches('/');
            if first.ends_with('/') && members.iter().any(|m| m == krate) {
                out.push((krate.to_owned(), Vec::new()));
                continue;
            }
        }
        if let Some((_, lines)) = out.last_mut() {
            lines.push(line);
        }
    }
    out
}

/// The path-like words of a code-map line's first column (`tests/a.rs, b.rs` gives both).
fn first_column(line: &str) -> Vec<&str> {
    let trimmed = line.trim_start();
    // The description starts after a run of two spaces.
    let column = trimmed.split("  ").next().unwrap_or("");
    column
        .split([',', ' '])
        .map(str::trim)
        .filter(|w| w.ends_with(".rs") || w.ends_with('/'))
        .collect()
}

/// Rule 1: files missing from the map, and map entries naming no file.
pub fn code_map(map: &str, members: &[String], files: &[String]) -> Vec<String> {
    let sections = sections(map, members);
    let mut findings = Vec::new();
    for m in members {
        if !sections.iter().any(|(k, _)| k == m) {
            findings.push(format!(
                "ARCHITECTURE.md: the code map has no section for the crate {m}/"
            ));
        }
    }
    for (krate, lines) in &sections {
        let prefix = format!("{krate}/");
        let ours: Vec<&str> = files
            .iter()
            .filter_map(|f| f.strip_prefix(&prefix))
            .collect();
        // Entries: the first column's paths; a deeper-indented bare name is in the directory
        // of the entry above it; `dir/*.rs` entries list file stems in their description.
        let mut named: BTreeSet<String> = BTreeSet::new();
        let mut globs: Vec<(String, String)> = Vec::new();
        let mut dir = String::new();
        let mut in_glob = false;
        for line in lines {
            // Entries sit 2 spaces in (a path in the crate) or 4 (a name in the directory of
            // the entry above); deeper lines continue a description.
            let indent = line.len() - line.trim_start().len();
            if indent != 2 && indent != 4 {
                if let (true, Some((_, text))) = (in_glob, globs.last_mut()) {
                    text.push(' ');
                    text.push_str(line.trim());
                }
                continue;
            }
            in_glob = false;
            for w in first_column(line) {
                let path = if w.contains('/') {
                    w.to_owned()
                } else {
                    format!("{dir}{w}")
                };
                if let Some(d) = path.strip_suffix("*.rs") {
                    let text = line.trim_start().split_once("  ").map_or("", |(_, t)| t);
                    globs.push((d.to_owned(), text.trim().to_owned()));
                    in_glob = true;
                    continue;
                }
                if indent == 2 {
                    dir = path
                        .rsplit_once('/')
                        .map_or(String::new(), |(d, _)| format!("{d}/"));
                }
                named.insert(path);
            }
        }
        for f in &ours {
            let listed = named.contains(*f)
                || named
                    .iter()
                    .any(|n| n.ends_with('/') && f.starts_with(n.as_str()))
                || globs.iter().any(|(d, text)| {
                    f.strip_prefix(d.as_str())
                        .and_then(|rest| rest.strip_suffix(".rs"))
                        .is_some_and(|stem| {
                            !stem.contains('/')
                                && text
                                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                                    .any(|w| w == stem)
                        })
                });
            if !listed {
                findings.push(format!(
                    "ARCHITECTURE.md: {krate}/{f} is not in the code map"
                ));
            }
        }
        for n in &named {
            if n.ends_with(".rs") && !ours.contains(&n.as_str()) {
                findings.push(format!(
                    "ARCHITECTURE.md: the code map names {krate}/{n}, which does not exist"
                ));
            }
        }
    }
    findings
}

/// Rule 2: a backend crate's manifest naming another backend crate.
pub fn backend_deps(krate: &str, manifest: &str) -> Vec<String> {
    if !BACKENDS.contains(&krate) {
        return Vec::new();
    }
    manifest
        .lines()
        .filter_map(|l| {
            let key = l.split(['=', '.', ' ']).next()?.trim();
            (BACKENDS.contains(&key) && key != krate).then(|| {
                format!("{krate}/Cargo.toml depends on the backend crate {key}: backends stay independent")
            })
        })
        .collect()
}

/// Rule 3: public `*_for_test` functions of `file` without `#[cfg(feature = "testing")]` among
/// the attributes and docs right above them.
pub fn ungated_hooks(file: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let l = line.trim_start();
        let signature = l
            .strip_prefix("pub fn ")
            .or_else(|| l.strip_prefix("pub async fn "));
        let is_hook = signature
            .and_then(|s| s.split(['(', '<']).next())
            .is_some_and(|name| name.ends_with("_for_test"));
        if !is_hook {
            continue;
        }
        let gated = lines[..i]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("#[") || l.starts_with("///"))
            .any(|l| l.starts_with("#[cfg(feature = \"testing\")]"));
        if !gated {
            found.push(format!(
                "{file}:{}: a public test hook outside the `testing` feature: {l}",
                i + 1
            ));
        }
    }
    found
}

/// Rule 4: a user-facing crate's root without its README as docs or without
/// `forbid(unsafe_code)`.
pub fn crate_root_rules(krate: &str, root: &str) -> Vec<String> {
    let mut found = Vec::new();
    if !root.contains("#![doc = include_str!(\"../README.md\")]") {
        found.push(format!(
            "{krate}: the crate root does not take its docs from README.md (#![doc = include_str!(\"../README.md\")])"
        ));
    }
    if !root.contains("#![forbid(unsafe_code)]") {
        found.push(format!(
            "{krate}: the crate root does not #![forbid(unsafe_code)]"
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "# A\n\n## Code map\n\n```\nCargo.toml   x\ncore/        the core\n  src/lib.rs          root\n  src/a/mod.rs        a\n    b.rs              b, beside mod.rs\n  tests/x.rs, y.rs    two tests\n  tests/*.rs          alpha, beta,\n                      gamma\nother/       more\n  src/main.rs         main\n```\n\n## Next\n";

    fn members() -> Vec<String> {
        vec!["core".into(), "other".into()]
    }

    fn files(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_complete_map_passes() {
        let all = files(&[
            "core/src/lib.rs",
            "core/src/a/mod.rs",
            "core/src/a/b.rs",
            "core/tests/x.rs",
            "core/tests/y.rs",
            "core/tests/alpha.rs",
            "core/tests/gamma.rs",
            "other/src/main.rs",
        ]);
        assert_eq!(code_map(MAP, &members(), &all), Vec::<String>::new());
    }

    #[test]
    fn an_unmapped_file_a_stale_entry_and_a_missing_crate_fail() {
        let some = files(&["core/src/lib.rs", "core/src/new.rs", "core/tests/delta.rs"]);
        let found = code_map(MAP, &members(), &some);
        let text = found.join("\n");
        assert!(
            text.contains("core/src/new.rs is not in the code map"),
            "{text}"
        );
        assert!(
            text.contains("core/tests/delta.rs is not in the code map"),
            "{text}"
        );
        assert!(
            text.contains("names core/src/a/b.rs, which does not exist"),
            "{text}"
        );
        let mut three = members();
        three.push("third".into());
        let found = code_map(MAP, &three, &files(&[]));
        assert!(
            found
                .iter()
                .any(|f| f.contains("no section for the crate third/")),
            "{found:?}"
        );
    }

    #[test]
    fn a_backend_depending_on_another_fails() {
        let manifest = "[dependencies]\ndlock-core.workspace = true\ndlock-etcd = { path = \"../dlock-etcd\" }\n";
        assert_eq!(backend_deps("dlock-redis", manifest).len(), 1);
        assert!(backend_deps("dlock-etcd", manifest).is_empty(), "itself");
        assert!(
            backend_deps("dlock-any", manifest).is_empty(),
            "not a backend"
        );
    }

    #[test]
    fn an_ungated_hook_fails_and_a_gated_one_passes() {
        let text = "/// Docs.\n#[cfg(feature = \"testing\")]\npub fn a_for_test() {}\n\n/// Docs.\n#[doc(hidden)]\npub async fn b_for_test(x: u8) {}\npub fn c_for_testing() {}\n";
        let found = ungated_hooks("f.rs", text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("f.rs:7:"), "{found:?}");
    }

    #[test]
    fn a_crate_root_without_readme_docs_or_forbid_fails() {
        let good = "#![doc = include_str!(\"../README.md\")]\n#![forbid(unsafe_code)]\n";
        assert!(crate_root_rules("k", good).is_empty());
        assert_eq!(crate_root_rules("k", "//! Docs.\n").len(), 2);
    }
}
