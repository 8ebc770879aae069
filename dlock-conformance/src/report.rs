//! One result row per (backend, scenario), printed and written as JSON for `cargo xtask conform`.

mod skips;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The environment variable naming the directory rows are written to.
pub const REPORT_DIR_VAR: &str = "DLOCK_REPORT_DIR";

/// A scenario's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Every check held.
    Pass,
    /// A check failed; `reason` says which.
    Fail,
    /// The scenario does not apply to the backend; `reason` says why.
    Skip,
}

/// One result row: `{"backend","scenario","status","reason","figures":{…}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The backend's report name (`redis`, `etcd-cluster`, …).
    pub backend: String,
    /// The scenario's name (`mutual_exclusion`, …).
    pub scenario: String,
    /// The outcome.
    pub status: Status,
    /// Why it failed or was skipped; empty on pass.
    pub reason: String,
    /// Measured figures (milliseconds, counts, ratios).
    pub figures: Map<String, Value>,
}

impl Row {
    /// Whether the scenario failed.
    pub fn failed(&self) -> bool {
        self.status == Status::Fail
    }

    /// Writes the row to `$DLOCK_REPORT_DIR/<backend>__<scenario>.json` when the variable is
    /// set. Errors are printed, not returned: a report problem must not change a test's outcome.
    pub fn write_if_requested(&self) {
        let Some(dir) = std::env::var_os(REPORT_DIR_VAR) else {
            return;
        };
        let path = PathBuf::from(dir).join(format!("{}__{}.json", self.backend, self.scenario));
        let written = serde_json::to_string_pretty(self)
            .map_err(|e| e.to_string())
            .and_then(|text| std::fs::write(&path, text).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("cannot write report row {}: {e}", path.display());
        }
    }

    /// A one-line summary: `backend::scenario: pass (figures)`.
    pub fn summary(&self) -> String {
        let status = match self.status {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        };
        let mut s = format!("{}::{}: {status}", self.backend, self.scenario);
        if !self.reason.is_empty() {
            s.push_str(&format!(" — {}", self.reason));
        }
        if !self.figures.is_empty() {
            s.push_str(&format!(" {}", Value::Object(self.figures.clone())));
        }
        s
    }
}

/// The committed allowlist of skips, `dlock-conformance/skips.allow`, compiled into the suite.
pub const ALLOWLIST: &str = include_str!("../skips.allow");

/// The figure under which a scenario lists the parts it could not run (each a reason that must
/// be allowlisted as `part: <reason>`).
pub const SKIPPED_PARTS: &str = "skipped_parts";

pub use skips::AllowedSkip;

/// Parses allowlist text: one `backend | scenario | reason` per line; blank lines and lines
/// starting with `#` are ignored.
///
/// # Errors
/// The first malformed line, with its number.
pub fn parse_allowlist(text: &str) -> Result<Vec<AllowedSkip>, String> {
    skips::parse(text, "skips.allow")
}

impl Row {
    /// The parts of the scenario that could not run (the [`SKIPPED_PARTS`] figure).
    pub fn skipped_parts(&self) -> Vec<String> {
        self.figures
            .get(SKIPPED_PARTS)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every skip in the row (the whole scenario, or parts of it) that `allowed` does not
    /// list, as `reason` / `part: reason`.
    pub fn unlisted_skips(&self, allowed: &[AllowedSkip]) -> Vec<String> {
        let listed = |reason: &str| {
            allowed.iter().any(|a| {
                a.backend == self.backend && a.scenario == self.scenario && a.reason == reason
            })
        };
        let mut out = Vec::new();
        if self.status == Status::Skip && !listed(&self.reason) {
            out.push(self.reason.clone());
        }
        for part in self.skipped_parts() {
            let part = format!("part: {part}");
            if !listed(&part) {
                out.push(part);
            }
        }
        out
    }

    /// Turns every skip that the committed [`ALLOWLIST`] does not name into a failure.
    pub fn enforce_allowlist(&mut self) {
        let allowed = match parse_allowlist(ALLOWLIST) {
            Ok(a) => a,
            Err(e) => {
                self.status = Status::Fail;
                self.reason = e;
                return;
            }
        };
        let unlisted = self.unlisted_skips(&allowed);
        if !unlisted.is_empty() {
            let was = if self.status == Status::Skip {
                "skipped"
            } else {
                "ran only in part"
            };
            self.status = Status::Fail;
            self.reason = format!(
                "{was} without a row in dlock-conformance/skips.allow: add `{} | {} | <reason>` only if this is meant: {}",
                self.backend,
                self.scenario,
                unlisted.join("; ")
            );
        }
    }
}
