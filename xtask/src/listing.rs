//! What the conformance test binaries enrol, asked from the binaries themselves
//! (`cargo test -p CRATE --test TARGET -- --list --format terse`) rather than read from their
//! sources: a backend is enrolled when its module holds the `__crash_holder` test that only
//! `conformance_tests!` generates, and its scenarios are the module's other tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use crate::conform::{BACKENDS, Backend};

/// The test `conformance_tests!` adds to every module it expands: the mark of an enrolment.
const ENROLMENT_MARK: &str = "__crash_holder";

/// The enrolled modules of the listed test binaries and each one's scenario tests.
#[derive(Debug, Default)]
pub struct Listing {
    modules: BTreeMap<String, BTreeSet<String>>,
}

impl Listing {
    /// Lists every test binary that enrols one of `backends` (one cargo run per crate and
    /// target; cargo builds them first if needed).
    ///
    /// # Errors
    /// A binary that cannot be built or listed, or one that enrols a module xtask does not know
    /// (it would never be run or judged).
    pub fn ask(root: &Path, backends: &[Backend]) -> Result<Listing, String> {
        let mut targets: Vec<(&str, &str)> = backends.iter().map(|b| (b.krate, b.target)).collect();
        targets.sort_unstable();
        targets.dedup();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut listing = Listing::default();
        for (krate, target) in targets {
            let out = Command::new(&cargo)
                .current_dir(root)
                .args(["test", "-q", "-p", krate, "--test", target, "--"])
                .args(["--list", "--format", "terse"])
                .output()
                .map_err(|e| format!("cannot run cargo to list {krate}'s {target} tests: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "cannot list {krate}'s {target} tests ({}):\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            for (module, tests) in parse(&String::from_utf8_lossy(&out.stdout)) {
                if !BACKENDS
                    .iter()
                    .any(|b| b.module == module && (b.krate, b.target) == (krate, target))
                {
                    return Err(format!(
                        "{krate}'s {target} tests enrol `{module}`, which xtask's BACKENDS \
                         does not list there: it would never be run or judged"
                    ));
                }
                listing.modules.entry(module).or_default().extend(tests);
            }
        }
        Ok(listing)
    }

    /// Whether `backend`'s module is enrolled in its test binary.
    pub fn enrolled(&self, backend: &Backend) -> bool {
        self.modules.contains_key(backend.module)
    }

    /// Every scenario any of `backends` runs: each must have a row for every backend.
    pub fn scenarios(&self, backends: &[Backend]) -> BTreeSet<String> {
        backends
            .iter()
            .filter_map(|b| self.modules.get(b.module))
            .flatten()
            .cloned()
            .collect()
    }
}

/// Parses `--list --format terse` output (`path::to::test: test` lines) into the enrolled
/// modules (those with the enrolment mark) and their scenario tests (the names not starting
/// with `__`, the macro's helpers).
pub fn parse(listed: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut all: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in listed.lines() {
        let Some(path) = line.trim().strip_suffix(": test") else {
            continue;
        };
        if let Some((module, test)) = path.split_once("::") {
            all.entry(module.to_string())
                .or_default()
                .insert(test.to_string());
        }
    }
    all.into_iter()
        .filter(|(_, tests)| tests.contains(ENROLMENT_MARK))
        .map(|(module, tests)| {
            let scenarios = tests.into_iter().filter(|t| !t.starts_with("__")).collect();
            (module, scenarios)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_with_the_mark_are_enrolled_with_their_scenarios() {
        let listed = "redis::mutual_exclusion: test\nredis::__crash_holder: test\n\
                      redis::__soak: test\nredis_spin::fifo: test\n\
                      redis_spin::__crash_holder: test\nsupport::helper_works: test\n\
                      top_level_test: test\n";
        let got = parse(listed);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["redis", "redis_spin"]);
        assert_eq!(
            got["redis"].iter().collect::<Vec<_>>(),
            ["mutual_exclusion"],
            "helpers (`__…`) are not scenarios"
        );
        let listing = Listing { modules: got };
        let find = |n| *BACKENDS.iter().find(|b| b.name == n).expect("known");
        assert!(listing.enrolled(&find("redis-spin")));
        assert!(
            !listing.enrolled(&find("redlock")),
            "a module absent from the listing is not enrolled"
        );
        assert_eq!(
            listing
                .scenarios(&[find("redis"), find("redis-spin")])
                .into_iter()
                .collect::<Vec<_>>(),
            ["fifo", "mutual_exclusion"]
        );
    }

    #[test]
    fn a_module_without_the_mark_is_not_enrolled() {
        let got = parse("zk::mutual_exclusion: test\nzk::fifo: test\n");
        assert!(got.is_empty(), "{got:?}");
    }
}
