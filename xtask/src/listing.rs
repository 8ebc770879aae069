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
    /// Lists the test binaries that enrol `backends` (one cargo run per crate and target, the
    /// way `cargo xtask conform` runs them; cargo builds them first if needed).
    ///
    /// # Errors
    /// As [`Listing::add_listed`].
    pub fn ask(root: &Path, backends: &[Backend]) -> Result<Listing, String> {
        let mut targets: Vec<(&str, &str)> = backends.iter().map(|b| (b.krate, b.target)).collect();
        targets.sort_unstable();
        targets.dedup();
        let mut listing = Listing::default();
        for (krate, target) in targets {
            listing.add_listed(root, &["-p", krate, "--test", target])?;
        }
        Ok(listing)
    }

    /// Lists every test binary of the workspace, built as `cargo test --workspace` builds them
    /// (the same features, so nothing is rebuilt after that step).
    ///
    /// # Errors
    /// As [`Listing::add_listed`].
    pub fn ask_workspace(root: &Path) -> Result<Listing, String> {
        let mut listing = Listing::default();
        listing.add_listed(root, &["--workspace", "--tests"])?;
        Ok(listing)
    }

    /// Adds what each test binary of `cargo test SELECTION` lists (`--list --format terse`),
    /// binary by binary, so a lib's unit test module that shares a backend's name (`redlock`)
    /// never mixes with that backend's enrolment.
    ///
    /// # Errors
    /// A binary that cannot be built or listed, or one that enrols a module xtask's
    /// [`BACKENDS`] does not know (it would never be run or judged).
    fn add_listed(&mut self, root: &Path, selection: &[&str]) -> Result<(), String> {
        let what = format!("the tests of {}", selection.join(" "));
        for (exe, _) in crate::cargo_json::test_executables(root, selection, "build", &what)? {
            let listed = crate::captured(
                Command::new(&exe)
                    .current_dir(root)
                    .args(["--list", "--format", "terse"]),
                &format!("cannot run {exe} --list"),
                &format!("{exe} --list failed"),
            )?;
            for (module, tests) in parse(&String::from_utf8_lossy(&listed)) {
                if !BACKENDS.iter().any(|b| b.module == module) {
                    return Err(format!(
                        "{exe} enrols `{module}`, which xtask's BACKENDS does not list: it \
                         would never be run or judged"
                    ));
                }
                self.modules.entry(module).or_default().extend(tests);
            }
        }
        Ok(())
    }

    /// Whether `backend`'s module is enrolled in its test binary.
    pub fn enrolled(&self, backend: &Backend) -> bool {
        self.modules.contains_key(backend.module)
    }

    /// The scenarios each of `backends` must have rows for: a row of
    /// [`SUBSET_ROWS`](crate::conform::SUBSET_ROWS), the ones its binary lists; every other,
    /// every scenario any of them lists.
    pub fn expected(&self, backends: &[Backend]) -> crate::conform::Expected {
        let mut expected = crate::conform::Expected::default();
        for b in backends {
            let mine = self.scenarios(std::slice::from_ref(b));
            if crate::conform::SUBSET_ROWS.contains(&b.name) {
                expected.only.insert(b.name.to_string(), mine);
            } else {
                expected.all.extend(mine);
            }
        }
        expected
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

/// Parses one binary's `--list --format terse` output (`path::to::test: test` lines) into the enrolled
/// modules (those with the enrolment mark) and their scenario tests (the names not starting
/// with `__`, the macro's helpers).
pub fn parse(listed: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut all: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in listed.lines() {
        let Some(path) = line.trim().strip_suffix(": test") else {
            continue;
        };
        // Only `module::test`: deeper paths are a lib's unit tests, never an enrolment's.
        if let Some((module, test)) = path.split_once("::")
            && !test.contains("::")
        {
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
                      redis::tally::tests::a_unit_test: test\n\
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
