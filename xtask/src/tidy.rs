//! `cargo xtask tidy`: the workspace rules no compiler checks.
//!
//! 1. Every source file says what it is for: it opens with a `//!` doc comment (a crate root may
//!    take its README instead, `#![doc = include_str!(…)]`). ARCHITECTURE.md stays a map, not a
//!    file list: at most 25,000 bytes, with a `## ` section for every workspace member.
//! 2. The backend crates do not depend on each other.
//! 3. No public `*_for_test` function outside the `testing` cargo feature.
//! 4. Every library crate users build on has its README as crate docs and forbids unsafe code.
//! 5. The contract is core's: no backend crate implements a user trait (`Locker`, `Election`,
//!    `RwLocker`, `Semaphore`) or checks options, permits, values or a closed locker itself.
//! 6. Every backend crate has the same standard files for the same roles ([`STANDARD_FILES`]).
//!
//! Each rule is a function from file contents to findings, so its tests can show it failing.

use std::path::{Path, PathBuf};

/// The most bytes ARCHITECTURE.md may take (rule 1).
const MAP_LIMIT: usize = 25_000;

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
    findings.extend(architecture_map(&map, &members));
    for m in &members {
        let manifest = read(&root.join(m).join("Cargo.toml"))?;
        findings.extend(backend_deps(m, &manifest));
    }
    for b in BACKENDS {
        findings.extend(standard_files(b, &files));
    }
    for f in &files {
        let text = read(&root.join(f))?;
        findings.extend(module_docs(f, &text));
        if f.contains("/src/") {
            findings.extend(ungated_hooks(f, &text));
        }
        if BACKENDS.iter().any(|b| f.starts_with(&format!("{b}/src/"))) {
            findings.extend(contract_outside_core(f, &text));
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
            "tidy: {} files in {} crates: module docs, architecture map, backend dependencies, test hooks, crate roots, contract in core, backend layout all fine",
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

/// Rule 1a: a source file that does not open with a `//!` doc comment. A crate root
/// (`src/lib.rs`, `src/main.rs`) may open with `#![doc = include_str!(…)]` instead: its README
/// is its doc comment.
pub fn module_docs(file: &str, text: &str) -> Vec<String> {
    let first = text.lines().next().unwrap_or("");
    let crate_root = ["src/lib.rs", "src/main.rs"]
        .iter()
        .any(|r| file == *r || file.ends_with(&format!("/{r}")));
    if first.starts_with("//!") || (crate_root && first.starts_with("#![doc = include_str!(")) {
        Vec::new()
    } else {
        vec![format!(
            "{file}: does not open with a `//!` doc comment saying what the file is for"
        )]
    }
}

/// Rule 1b: ARCHITECTURE.md over `MAP_LIMIT` bytes, or without a section for a member: a
/// `## ` heading naming the crate (as a whole word: `dlock-core` does not name `core`).
pub fn architecture_map(map: &str, members: &[String]) -> Vec<String> {
    let mut findings = Vec::new();
    if map.len() > MAP_LIMIT {
        findings.push(format!(
            "ARCHITECTURE.md: {} bytes, over the {MAP_LIMIT} a map may take (details belong in the crates' docs and READMEs)",
            map.len()
        ));
    }
    let headings: Vec<&str> = map.lines().filter_map(|l| l.strip_prefix("## ")).collect();
    for m in members {
        if !headings.iter().any(|h| names(h, m)) {
            findings.push(format!(
                "ARCHITECTURE.md: no section (a `## ` heading naming it) for the crate {m}"
            ));
        }
    }
    findings
}

/// Whether `text` contains `word` with no name character (alphanumeric, `-`, `_`) around it.
fn names(text: &str, word: &str) -> bool {
    let name_char = |c: char| c.is_alphanumeric() || c == '-' || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(name_char) && !after.is_some_and(name_char)
    })
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

/// The files every backend crate has at `src/`, each for the same role: the builder and its
/// validated options, the locker and its `LockBackend` impl, client errors mapped to dlock's,
/// the server-side layout of names, the renewal rounds, one file per primitive, TLS wiring,
/// and `inspect`.
pub const STANDARD_FILES: [&str; 11] = [
    "lib.rs",
    "builder.rs",
    "locker.rs",
    "error.rs",
    "keys.rs",
    "renew.rs",
    "election.rs",
    "rw.rs",
    "semaphore.rs",
    "tls.rs",
    "inspect.rs",
];

/// Rule 6: a backend crate missing one of the [`STANDARD_FILES`] (`files` are the workspace's
/// source paths, relative to its root).
pub fn standard_files(backend: &str, files: &[String]) -> Vec<String> {
    STANDARD_FILES
        .iter()
        .map(|f| format!("{backend}/src/{f}"))
        .filter(|path| !files.contains(path))
        .map(|path| format!("{path}: missing; every backend has the same files for the same roles"))
        .collect()
}

/// What only core's contract does: implement the user traits, and check input or a closed
/// locker before the backend is asked.
const CORE_ONLY: [(&str, &str); 8] = [
    (
        "impl Locker for",
        "implements `Locker` (implement `backend::LockBackend`)",
    ),
    (
        "impl Election for",
        "implements `Election` (implement `backend::ElectionBackend`)",
    ),
    (
        "impl RwLocker for",
        "implements `RwLocker` (implement `backend::RwBackend`)",
    ),
    (
        "impl Semaphore for",
        "implements `Semaphore` (implement `backend::SemaphoreBackend`)",
    ),
    ("opts.validate(", "checks acquire options"),
    ("validate_permits(", "checks a permit count"),
    ("validate_value(", "checks a leader's value"),
    ("check_open(", "checks for a closed locker"),
];

/// Rule 5: a backend's source doing what core's contract does once for every backend.
pub fn contract_outside_core(file: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (pattern, what) in CORE_ONLY {
            if code.contains(pattern) {
                found.push(format!(
                    "{file}:{}: {what}, which core's contract does for every backend",
                    i + 1
                ));
            }
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

    fn members() -> Vec<String> {
        vec!["core".into(), "other-tool".into()]
    }

    #[test]
    fn a_file_without_module_docs_fails() {
        assert!(module_docs("core/src/a.rs", "//! What a is for.\n\nuse x;\n").is_empty());
        assert!(module_docs("core/tests/t.rs", "//!\n").is_empty());
        let readme = "#![doc = include_str!(\"../README.md\")]\n";
        assert!(
            module_docs("core/src/lib.rs", readme).is_empty(),
            "crate root"
        );
        assert!(
            module_docs("other-tool/src/main.rs", readme).is_empty(),
            "crate root"
        );
        for (file, text) in [
            ("core/src/a.rs", "use x;\n"),
            ("core/src/a.rs", "\n//! Docs after a blank line.\n"),
            ("core/src/a.rs", "/// An item's docs.\nfn f() {}\n"),
            ("core/src/a.rs", "// A plain comment.\n"),
            ("core/src/a.rs", ""),
            ("core/src/a.rs", readme),
            ("core/src/lib/x.rs", readme),
            ("core/src/lib.rs", "#![forbid(unsafe_code)]\n"),
        ] {
            let found = module_docs(file, text);
            assert_eq!(found.len(), 1, "{file}: {text:?}");
            assert!(found[0].starts_with(file), "{found:?}");
        }
    }

    #[test]
    fn a_map_with_a_section_per_crate_passes() {
        let map =
            "# Architecture\n\n## Bird's-eye view\n\n## `core`: the contract\n\n## other-tool\n";
        assert_eq!(architecture_map(map, &members()), Vec::<String>::new());
    }

    #[test]
    fn a_missing_section_or_an_oversized_map_fails() {
        // `core` only as part of a longer name, in a deeper heading or in the text: no section.
        let map = "# A\n\n## core-extra\n\n### core\n\ncore\n\n## other-tool\n";
        let found = architecture_map(map, &members());
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("no section"), "{found:?}");
        assert!(found[0].ends_with("the crate core"), "{found:?}");

        let mut big = "## core\n## other-tool\n".to_owned();
        big.push_str(&"x".repeat(MAP_LIMIT - big.len()));
        assert!(
            architecture_map(&big, &members()).is_empty(),
            "at the limit"
        );
        big.push('x');
        let found = architecture_map(&big, &members());
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("25001 bytes"), "{found:?}");
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
    fn a_backend_checking_input_or_implementing_a_user_trait_fails() {
        let bad = "impl Semaphore for X {\n    fn f() { opts.validate()?; self.driver.check_open()?; }\n}\n";
        let found = contract_outside_core("dlock-zk/src/x.rs", bad);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("dlock-zk/src/x.rs:1: implements `Semaphore`"));
        let good = "impl SemaphoreBackend for X {}\n// opts.validate() is core's\n";
        assert!(contract_outside_core("dlock-zk/src/x.rs", good).is_empty());
    }

    #[test]
    fn a_backend_without_a_standard_file_fails() {
        let mut files: Vec<String> = STANDARD_FILES
            .iter()
            .map(|f| format!("dlock-zk/src/{f}"))
            .collect();
        assert!(standard_files("dlock-zk", &files).is_empty());
        files.retain(|f| !f.ends_with("/renew.rs"));
        let found = standard_files("dlock-zk", &files);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("dlock-zk/src/renew.rs: missing"));
    }

    #[test]
    fn a_crate_root_without_readme_docs_or_forbid_fails() {
        let good = "#![doc = include_str!(\"../README.md\")]\n#![forbid(unsafe_code)]\n";
        assert!(crate_root_rules("k", good).is_empty());
        assert_eq!(crate_root_rules("k", "//! Docs.\n").len(), 2);
    }
}
