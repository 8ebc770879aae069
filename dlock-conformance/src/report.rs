//! One result row per (backend, scenario), printed and written as JSON for `cargo xtask conform`.

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
