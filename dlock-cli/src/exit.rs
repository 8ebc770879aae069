//! The exit codes of `dlock`, and how failures are reported (human text or `--json`).

use std::process::ExitCode;

use dlock_core::{Error, ErrorKind};
use serde_json::{Map, Value, json};

/// Bad usage: unknown option, missing `--url`/`DLOCK_URL`, a bad URL, lock name or duration
/// (sysexits' `EX_USAGE`).
pub const USAGE: u8 = 64;
/// The backend is unreachable, refused our credentials, or failed (sysexits' `EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// `--wait` elapsed before the lock was granted (sysexits' `EX_TEMPFAIL`; `flock -E`'s role).
pub const TIMEOUT: u8 = 75;
/// The lease was lost while the command ran; the command was sent SIGTERM (and SIGKILL after
/// `--grace`). Not a sysexits code: only dlock means it.
pub const LOST: u8 = 79;
/// `dlock leader`: nobody leads the election (like `grep`'s "no match").
pub const NO_LEADER: u8 = 1;
/// `dlock status`: nobody holds the lock.
pub const NOT_HELD: u8 = 1;
/// `dlock check`: a check failed, the deployment is unfit for this lock (like `status`'s and
/// `leader`'s 1, a "no" answer; `check` returns no other 1).
pub const UNFIT: u8 = 1;
/// The command was found but could not be executed (as shells do).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as shells do).
pub const NOT_FOUND: u8 = 127;

/// A failure of `dlock` itself (not of the command it runs).
#[derive(Debug)]
pub struct Failure {
    /// Short machine-readable kind: `usage`, `unavailable`, `timeout`, `lost`, `spawn`.
    pub kind: &'static str,
    /// The exit code.
    pub code: u8,
    /// What happened, for a human.
    pub message: String,
    /// Extra fields of the JSON report (name, url, token, …).
    pub fields: Map<String, Value>,
}

impl Failure {
    /// A failure of `kind` exiting with `code`.
    pub fn new(kind: &'static str, code: u8, message: impl Into<String>) -> Self {
        Failure {
            kind,
            code,
            message: message.into(),
            fields: Map::new(),
        }
    }

    /// A usage failure.
    pub fn usage(message: impl Into<String>) -> Self {
        Failure::new("usage", USAGE, message)
    }

    /// The failure a library error means: invalid input → usage, timeout → timeout, a lost
    /// lease → lost, anything else → unavailable.
    pub fn from_error(e: &Error) -> Self {
        let (kind, code) = match e.kind() {
            ErrorKind::InvalidInput => ("usage", USAGE),
            ErrorKind::Timeout => ("timeout", TIMEOUT),
            ErrorKind::Lost => ("lost", LOST),
            _ => ("unavailable", UNAVAILABLE),
        };
        Failure::new(kind, code, e.to_string())
    }

    /// Adds a field to the JSON report.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.to_string(), value.into());
        self
    }

    /// Prints the failure on stderr (one JSON object with `--json`) and returns its code.
    pub fn report(self, json: bool) -> ExitCode {
        if json {
            let mut obj = Map::new();
            obj.insert("error".into(), json!(self.kind));
            obj.insert("exit_code".into(), json!(self.code));
            obj.insert("message".into(), json!(self.message));
            obj.extend(self.fields);
            eprintln!("{}", Value::Object(obj));
        } else {
            eprintln!("dlock: {}", self.message);
        }
        ExitCode::from(self.code)
    }
}
