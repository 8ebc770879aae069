//! The publishing gates: compile-only checks of what users of the published crates get.
//!
//! A step of `cargo xtask test` (a child `cargo xtask gates` at nice 19 beside the test step,
//! whose scenarios leave about half the CPU idle) and on their own as `cargo xtask gates`:
//!
//! 1. **MSRV**: the root manifest's `rust-version` checks the whole workspace, every target
//!    (`cargo +MSRV check --workspace --all-targets`; the toolchain is installed when missing).
//! 2. **Features**: dlock-any with each backend feature alone and with none (`memory:` only),
//!    and dlock-etcd without `tls`, check without a warning: what a user of one backend builds.
//! 3. **Metadata**: every publishable crate has what crates.io and docs.rs need, ships both
//!    license texts, and docs.rs never turns on the `testing` hooks.
//! 4. **Package**: `cargo package --no-verify` of every publishable crate, together (so the
//!    unpublished path dependencies between them resolve).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

/// The crate whose features are checked one at a time, and the one checked without `tls`.
const BY_URL: &str = "dlock-any";
const WITHOUT_TLS: &str = "dlock-etcd";

/// The crates.io category slugs this project uses or may (<https://crates.io/category_slugs>).
/// A category crates.io does not know fails `cargo publish`; add a real slug here to use it.
const CATEGORIES: [&str; 8] = [
    "asynchronous",
    "command-line-utilities",
    "concurrency",
    "database",
    "database-implementations",
    "network-programming",
    "api-bindings",
    "development-tools::testing",
];

/// The license texts each publishable crate ships (the manifests say `MIT OR Apache-2.0`).
const LICENSE_FILES: [&str; 2] = ["LICENSE-MIT", "LICENSE-APACHE"];

/// Runs every gate on the workspace at `root`, stopping at the first that fails.
///
/// # Errors
/// The failing gate and what it found.
pub fn run(root: &Path) -> Result<(), String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))
        .map_err(|e| format!("cannot read the root Cargo.toml: {e}"))?;
    let msrv = workspace_rust_version(&manifest)?;
    // How long each gate took, printed at the end: they run inside the CI's time budget.
    let mut took = Vec::new();
    let t = Instant::now();
    msrv_check(root, &msrv)?;
    took.push(format!("MSRV {msrv} {:.0?}", t.elapsed()));
    let t = Instant::now();
    let packages = packages(root)?;
    feature_checks(root, &packages)?;
    took.push(format!("features {:.0?}", t.elapsed()));
    eprintln!("\n==> publishing metadata");
    let publishable: Vec<&Value> = packages.iter().filter(|p| is_publishable(p)).collect();
    let mut findings = Vec::new();
    for p in &publishable {
        findings.extend(metadata_findings(p));
        findings.extend(license_findings(p));
    }
    if !findings.is_empty() {
        return Err(format!(
            "gate `publishing metadata`:\n  {}",
            findings.join("\n  ")
        ));
    }
    let placeholders: Vec<&str> = publishable
        .iter()
        .filter(|p| p["repository"].as_str().is_some_and(is_placeholder))
        .filter_map(|p| p["name"].as_str())
        .collect();
    if !placeholders.is_empty() {
        eprintln!(
            "note: the repository is still a placeholder (.invalid) in {}: set the real address before publishing",
            placeholders.join(", ")
        );
    }
    let t = Instant::now();
    package(root, &publishable)?;
    took.push(format!("package {:.0?}", t.elapsed()));
    eprintln!(
        "\ngates: {} publishable crates fine ({})",
        publishable.len(),
        took.join(", ")
    );
    Ok(())
}

/// The `rust-version` of the `[workspace.package]` table of a root manifest.
fn workspace_rust_version(manifest: &str) -> Result<String, String> {
    let mut table = "";
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            table = line;
            continue;
        }
        if table != "[workspace.package]" {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.trim() != "rust-version" {
            continue;
        }
        // A trailing `# comment` is no part of the value.
        let value = value.split('#').next().unwrap_or("");
        let version = value.trim().trim_matches('"');
        let well_formed = (2..=3).contains(&version.split('.').count())
            && version
                .split('.')
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        return if well_formed {
            Ok(version.to_owned())
        } else {
            Err(format!(
                "the root Cargo.toml's rust-version `{version}` is not a Rust version"
            ))
        };
    }
    Err("the root Cargo.toml declares no rust-version in [workspace.package]".into())
}

/// Whether `rustup toolchain list` output has the toolchain `version` (`1.88` is installed as
/// `1.88-<host>`).
fn has_toolchain(list: &str, version: &str) -> bool {
    list.lines().any(|l| {
        l.split_whitespace().next().is_some_and(|name| {
            name.strip_prefix(version)
                .is_some_and(|rest| rest.starts_with('-'))
        })
    })
}

/// Gate 1: installs the MSRV toolchain when missing and checks the workspace with it.
fn msrv_check(root: &Path, msrv: &str) -> Result<(), String> {
    let list = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .map_err(|e| format!("gate `MSRV` needs rustup to install Rust {msrv}: {e}"))?;
    if !has_toolchain(&String::from_utf8_lossy(&list.stdout), msrv) {
        eprintln!("\n==> installing Rust {msrv} (the MSRV) with rustup, profile minimal");
        crate::captured(
            Command::new("rustup").args(["toolchain", "install", msrv, "--profile", "minimal"]),
            "cannot run rustup",
            &format!("gate `MSRV`: rustup could not install Rust {msrv}"),
        )?;
    }
    // `rustup run` rather than `cargo +MSRV`: $CARGO is the toolchain's own cargo, not the
    // rustup proxy that understands `+`. It also overrides rust-toolchain.toml.
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "10", "rustup", "run", msrv, "cargo"])
        .args(["check", "--workspace", "--all-targets"])
        .current_dir(root)
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC");
    crate::step(&format!("MSRV {msrv}"), &mut cmd)
}

/// `cargo metadata --no-deps`: the workspace's packages.
fn packages(root: &Path) -> Result<Vec<Value>, String> {
    let out = crate::captured(
        crate::cargo()
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(root),
        "cannot run cargo metadata",
        "cargo metadata failed",
    )?;
    let meta: Value = serde_json::from_slice(&out)
        .map_err(|e| format!("cargo metadata's output does not parse: {e}"))?;
    Ok(meta["packages"].as_array().cloned().unwrap_or_default())
}

/// Gate 2: the feature sets users build, each checked without a warning.
fn feature_checks(root: &Path, packages: &[Value]) -> Result<(), String> {
    let by_url = packages
        .iter()
        .find(|p| p["name"] == BY_URL)
        .ok_or_else(|| format!("{BY_URL} is not in the workspace"))?;
    let mut sets: Vec<(&str, Vec<String>)> = vec![(BY_URL, Vec::new())];
    sets.extend(lone_features(by_url).into_iter().map(|f| (BY_URL, vec![f])));
    sets.push((WITHOUT_TLS, Vec::new()));
    for (krate, features) in sets {
        let mut cmd = crate::nice_cargo();
        cmd.args(["check", "-p", krate, "--no-default-features"])
            .args(["--message-format", "json"])
            .current_dir(root)
            .stdout(Stdio::piped());
        if !features.is_empty() {
            cmd.args(["--features", &features.join(",")]);
        }
        let name = format!("check {krate} with features [{}]", features.join(","));
        eprintln!("\n==> {name}: {cmd:?}");
        let out = cmd
            .output()
            .map_err(|e| format!("step `{name}` could not start: {e}"))?;
        let found = crate::cargo_json::diagnostics(&out.stdout);
        if !out.status.success() || !found.is_empty() {
            return Err(format!(
                "step `{name}` failed ({}, {} diagnostics):\n{}",
                out.status,
                found.len(),
                found.join("\n")
            ));
        }
    }
    Ok(())
}

/// A package's features other than `default`, each to be checked alone.
fn lone_features(package: &Value) -> Vec<String> {
    package["features"]
        .as_object()
        .map(|f| f.keys().filter(|k| *k != "default").cloned().collect())
        .unwrap_or_default()
}

/// Whether cargo metadata's package may be published: no `publish = false` (an empty list).
fn is_publishable(package: &Value) -> bool {
    package["publish"]
        .as_array()
        .is_none_or(|registries| !registries.is_empty())
}

/// Gate 3: what crates.io and docs.rs need from a publishable package's manifest.
fn metadata_findings(package: &Value) -> Vec<String> {
    let name = package["name"].as_str().unwrap_or("?");
    let mut found = Vec::new();
    let mut missing = |what: &str| found.push(format!("{name}: no {what} in Cargo.toml"));
    for field in [
        "description",
        "license",
        "repository",
        "readme",
        "rust_version",
    ] {
        if package[field].as_str().is_none_or(str::is_empty) {
            missing(&field.replace('_', "-"));
        }
    }
    let keywords = strings(&package["keywords"]);
    if keywords.is_empty() {
        missing("keywords");
    }
    if keywords.len() > 5 {
        found.push(format!(
            "{name}: {} keywords, crates.io takes 5",
            keywords.len()
        ));
    }
    for k in &keywords {
        let valid = k.len() <= 20
            && k.starts_with(|c: char| c.is_ascii_alphabetic())
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+'));
        if !valid {
            found.push(format!(
                "{name}: the keyword `{k}` is not one crates.io takes"
            ));
        }
    }
    let categories = strings(&package["categories"]);
    if categories.is_empty() {
        found.push(format!("{name}: no categories in Cargo.toml"));
    }
    for c in &categories {
        if !CATEGORIES.contains(&c.as_str()) {
            found.push(format!(
                "{name}: the category `{c}` is not a crates.io slug this gate knows (gates.rs CATEGORIES)"
            ));
        }
    }
    let has_lib = package["targets"].as_array().is_some_and(|t| {
        t.iter()
            .any(|t| strings(&t["kind"]).iter().any(|k| k == "lib"))
    });
    // `[package.metadata.docs.rs]` is the table `rs` in the table `docs`.
    let docs_rs = &package["metadata"]["docs"]["rs"];
    if has_lib && docs_rs.is_null() {
        found.push(format!(
            "{name}: no [package.metadata.docs.rs] (which features docs.rs documents)"
        ));
    }
    if package["features"].get("testing").is_some() {
        if docs_rs["all-features"] == true {
            found.push(format!(
                "{name}: docs.rs builds all features, `testing` (test hooks) included"
            ));
        }
        if strings(&docs_rs["features"]).iter().any(|f| f == "testing") {
            found.push(format!("{name}: docs.rs turns on `testing` (test hooks)"));
        }
        if strings(&package["features"]["default"])
            .iter()
            .any(|f| f == "testing")
        {
            found.push(format!(
                "{name}: `testing` (test hooks) is a default feature"
            ));
        }
    }
    found
}

/// The license texts missing from a publishable package's directory (cargo packages only it).
fn license_findings(package: &Value) -> Vec<String> {
    let name = package["name"].as_str().unwrap_or("?");
    let Some(dir) = package["manifest_path"]
        .as_str()
        .map(Path::new)
        .and_then(Path::parent)
    else {
        return vec![format!("{name}: cargo metadata gives no manifest path")];
    };
    LICENSE_FILES
        .iter()
        // `is_file` follows links: the crates link the root's texts.
        .filter(|f| !dir.join(f).is_file())
        .map(|f| format!("{name}: no {f} in {} (a link to ../{f})", dir.display()))
        .collect()
}

/// A repository address under the reserved `.invalid` domain: the owner has yet to set it.
fn is_placeholder(repository: &str) -> bool {
    repository
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .is_some_and(|host| host.ends_with(".invalid"))
}

fn strings(list: &Value) -> Vec<String> {
    list.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Gate 4: packages every publishable crate together; any cargo warning fails it.
fn package(root: &Path, publishable: &[&Value]) -> Result<(), String> {
    let mut cmd = crate::nice_cargo();
    // `--allow-dirty`: this checks what would be packaged, not that the work is committed.
    cmd.args(["package", "--no-verify", "--allow-dirty"])
        .current_dir(root);
    for p in publishable {
        cmd.args(["-p", p["name"].as_str().unwrap_or("?")]);
    }
    eprintln!("\n==> package: {cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| format!("step `package` could not start: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprint!("{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning") || l.starts_with("error"))
        .collect();
    if out.status.success() && warnings.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "step `package` failed ({}):\n{}",
            out.status,
            warnings.join("\n")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_msrv_comes_from_the_workspace_package_table() {
        let manifest = "[package]\nrust-version = \"1.70\"\n\n[workspace.package]\nedition = \"2024\"\n# why\nrust-version = \"1.88\"\nlicense = \"MIT\"\n";
        assert_eq!(workspace_rust_version(manifest), Ok("1.88".into()));
        assert_eq!(
            workspace_rust_version("[workspace.package]\nrust-version=\"1.88.1\" # why\n"),
            Ok("1.88.1".into())
        );
        assert!(workspace_rust_version("[package]\nrust-version = \"1.88\"\n").is_err());
        assert!(
            workspace_rust_version("[workspace.package]\nrust-version = \"stable\"\n").is_err()
        );
        assert!(workspace_rust_version("[workspace.package]\nrust-version = \"1.\"\n").is_err());
    }

    #[test]
    fn an_installed_toolchain_is_found_by_its_exact_version() {
        let list = "stable-x86_64-unknown-linux-gnu (active, default)\n1.88-x86_64-unknown-linux-gnu\n1.880-x\n";
        assert!(has_toolchain(list, "1.88"));
        assert!(!has_toolchain(list, "1.8"));
        assert!(!has_toolchain("1.88.0-x86_64-unknown-linux-gnu\n", "1.88"));
    }

    #[test]
    fn every_feature_but_default_is_checked_alone() {
        let p = json!({"features": {"default": ["redis", "zk"], "redis": [], "zk": []}});
        assert_eq!(lone_features(&p), vec!["redis".to_owned(), "zk".to_owned()]);
    }

    #[test]
    fn publish_false_is_an_empty_registry_list() {
        assert!(is_publishable(&json!({"publish": null})));
        assert!(is_publishable(&json!({"publish": ["crates-io"]})));
        assert!(!is_publishable(&json!({"publish": []})));
    }

    fn good() -> Value {
        json!({
            "name": "k",
            "description": "d",
            "license": "MIT OR Apache-2.0",
            "repository": "https://example.invalid/k",
            "readme": "README.md",
            "rust_version": "1.88",
            "keywords": ["lock", "c++"],
            "categories": ["concurrency"],
            "targets": [{"kind": ["lib"]}],
            "features": {"testing": []},
            "metadata": {"docs": {"rs": {"features": []}}},
        })
    }

    #[test]
    fn complete_metadata_passes() {
        assert_eq!(metadata_findings(&good()), Vec::<String>::new());
        assert!(is_placeholder("https://example.invalid/k"));
        assert!(!is_placeholder("https://github.com/o/k.invalid"));
    }

    #[test]
    fn missing_or_invalid_metadata_fails() {
        let mut p = good();
        p["description"] = Value::Null;
        p["keywords"] = json!(["a", "b", "c", "d", "e", "f", "has space"]);
        p["categories"] = json!(["locks"]);
        p["metadata"] = Value::Null;
        let found = metadata_findings(&p).join("\n");
        assert!(found.contains("k: no description"), "{found}");
        assert!(found.contains("7 keywords"), "{found}");
        assert!(found.contains("`has space`"), "{found}");
        assert!(found.contains("category `locks`"), "{found}");
        assert!(found.contains("no [package.metadata.docs.rs]"), "{found}");
        p["targets"] = json!([{"kind": ["bin"]}]);
        assert!(
            !metadata_findings(&p).join("\n").contains("docs.rs"),
            "a binary has no docs on docs.rs"
        );
    }

    #[test]
    fn docs_rs_or_default_features_with_the_test_hooks_fail() {
        for docs_rs in [
            json!({"all-features": true}),
            json!({"features": ["tls", "testing"]}),
        ] {
            let mut p = good();
            p["metadata"]["docs"]["rs"] = docs_rs;
            assert_eq!(metadata_findings(&p).len(), 1, "{p}");
        }
        let mut p = good();
        p["features"]["default"] = json!(["testing"]);
        assert_eq!(metadata_findings(&p).len(), 1);
        let mut p = good();
        p["features"] = json!({});
        p["metadata"]["docs"]["rs"] = json!({"all-features": true});
        assert!(metadata_findings(&p).is_empty(), "no hooks to leak");
    }
}
