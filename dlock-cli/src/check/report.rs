//! `dlock check`'s rows (one per check: pass, fail or skip, a reason, figures) and the report
//! they make: the human table or one JSON object.

use std::time::Duration;

use dlock_core::Capabilities;
use serde_json::{Map, Value, json};

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// The deployment did what the check asks.
    Pass,
    /// It did not: the deployment is unfit for this lock (or the check could not run).
    Fail,
    /// The check did not apply or was not asked for; the reason says which.
    Skip,
}

impl Status {
    /// As printed and in the JSON report.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// The check's name (`round_trip`, `effective_ttl`, …).
    pub(crate) name: &'static str,
    /// Its outcome.
    pub(crate) status: Status,
    /// Why it failed or was skipped; a note (or empty) when it passed.
    pub(crate) reason: String,
    /// What it measured, in insertion order (milliseconds are `_ms`).
    pub(crate) figures: Map<String, Value>,
}

impl Row {
    /// A passing row without figures yet.
    pub(crate) fn pass(name: &'static str) -> Self {
        Row {
            name,
            status: Status::Pass,
            reason: String::new(),
            figures: Map::new(),
        }
    }

    /// A failed row.
    pub(crate) fn fail(name: &'static str, reason: impl Into<String>) -> Self {
        Row::pass(name).failed(reason)
    }

    /// A skipped row.
    pub(crate) fn skip(name: &'static str, reason: impl Into<String>) -> Self {
        Row {
            status: Status::Skip,
            reason: reason.into(),
            ..Row::pass(name)
        }
    }

    /// Adds a figure.
    pub(crate) fn figure(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.figures.insert(key.to_string(), value.into());
        self
    }

    /// Adds a duration figure in milliseconds (`key` should end in `_ms`).
    pub(crate) fn ms(self, key: &str, d: Duration) -> Self {
        self.figure(key, ms(d))
    }

    /// Marks the row failed with `reason` (its figures stay).
    pub(crate) fn failed(mut self, reason: impl Into<String>) -> Self {
        self.status = Status::Fail;
        self.reason = reason.into();
        self
    }

    /// Adds a note to a passing row's reason.
    pub(crate) fn note(mut self, note: impl Into<String>) -> Self {
        if !self.reason.is_empty() {
            self.reason.push_str("; ");
        }
        self.reason.push_str(&note.into());
        self
    }

    /// Whether the row failed.
    pub(crate) fn is_fail(&self) -> bool {
        self.status == Status::Fail
    }

    fn json(&self) -> Value {
        json!({
            "name": self.name,
            "status": self.status.as_str(),
            "reason": self.reason,
            "figures": Value::Object(self.figures.clone()),
        })
    }
}

/// Milliseconds with two decimals (a local round trip is well under one).
pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 100_000.0).round() / 100.0
}

/// Signed milliseconds `a − b` with two decimals.
pub(crate) fn signed_ms(a: tokio::time::Instant, b: tokio::time::Instant) -> f64 {
    if a >= b { ms(a - b) } else { -ms(b - a) }
}

/// What the report says about the deployment besides the rows.
pub(crate) struct Header<'a> {
    /// The URL, passwords hidden.
    pub(crate) url: &'a str,
    /// The URL's scheme.
    pub(crate) backend: &'a str,
    /// The locker's TTL.
    pub(crate) ttl: Duration,
    /// The locker's capabilities.
    pub(crate) caps: &'a Capabilities,
    /// The lock-name prefix every check used.
    pub(crate) prefix: &'a str,
    /// How many contending clients the checks used.
    pub(crate) clients: usize,
}

/// The whole report.
pub(crate) struct Report<'a> {
    /// What was checked.
    pub(crate) header: Header<'a>,
    /// One row per check, in the order they ran.
    pub(crate) rows: &'a [Row],
}

impl Report<'_> {
    /// Whether no check failed.
    pub(crate) fn fit(&self) -> bool {
        !self.rows.iter().any(Row::is_fail)
    }

    /// A figure of the named row.
    fn figure(&self, row: &str, key: &str) -> Option<&Value> {
        self.rows
            .iter()
            .find(|r| r.name == row)
            .and_then(|r| r.figures.get(key))
    }

    /// The JSON report: `{"url","backend","ttl_ms","capabilities","prefix","clients",
    /// "checks":[{"name","status","reason","figures"}],"fit"}`.
    pub(crate) fn json(&self) -> Value {
        let h = &self.header;
        json!({
            "url": h.url,
            "backend": h.backend,
            "ttl_ms": ms(h.ttl),
            "capabilities": caps_json(h.caps),
            "prefix": h.prefix,
            "clients": h.clients,
            "checks": self.rows.iter().map(Row::json).collect::<Vec<_>>(),
            "fit": self.fit(),
        })
    }

    /// The human report: a header, the table, the measured round trip and the effective TTLs,
    /// and the verdict.
    pub(crate) fn human(&self) -> String {
        let h = &self.header;
        let mut out = String::new();
        let caps = h.caps;
        out.push_str(&format!("url:       {}\n", h.url));
        out.push_str(&format!("backend:   {}\n", h.backend));
        out.push_str(&format!(
            "ttl:       {}\n",
            humantime::format_duration(h.ttl)
        ));
        out.push_str(&format!(
            "locker:    fair {}, herd-free {}, fencing {}, crash release within {}\n",
            yes_no(caps.fair),
            yes_no(caps.herd_free),
            fencing(caps),
            humantime::format_duration(caps.crash_release_within)
        ));
        out.push_str(&format!(
            "names:     {}/… ({} clients)\n\n",
            h.prefix, h.clients
        ));
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(5);
        out.push_str(&format!(
            "{:width$}  {:6}  figures / reason\n",
            "check", "result"
        ));
        for r in self.rows {
            let mut text = figures_text(&r.figures);
            if !r.reason.is_empty() {
                if !text.is_empty() {
                    text.push_str(" — ");
                }
                text.push_str(&r.reason);
            }
            out.push_str(&format!(
                "{:width$}  {:6}  {text}\n",
                r.name,
                r.status.as_str()
            ));
        }
        out.push('\n');
        // A figure that is not a number (ZooKeeper's `expires_within_ms` is "unknown") is
        // shown as it is, without a unit.
        let shown = |v: Option<&Value>| match v {
            None => "not measured".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => format!("{v} ms"),
        };
        out.push_str(&format!(
            "round trip:       {} (p50)\n",
            shown(self.figure("round_trip", "rtt_p50_ms"))
        ));
        out.push_str(&format!(
            "lease usable:     {} (the lease's deadline − the grant)\n",
            shown(self.figure("effective_ttl", "usable_ms"))
        ));
        out.push_str(&format!(
            "server keeps it:  {} (inspect's expires_within right after the grant)\n",
            shown(self.figure("effective_ttl", "expires_within_ms"))
        ));
        out.push_str(if self.fit() {
            "fit: yes (every check passed or was skipped)\n"
        } else {
            "fit: NO (a check failed)\n"
        });
        out
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// The fencing strength in lower case (`linearizable`, `assumed`, `none`).
pub(crate) fn fencing(caps: &Capabilities) -> String {
    format!("{:?}", caps.fencing).to_lowercase()
}

fn caps_json(caps: &Capabilities) -> Value {
    json!({
        "fair": caps.fair,
        "herd_free": caps.herd_free,
        "fencing": fencing(caps),
        "crash_release_within_ms": ms(caps.crash_release_within),
    })
}

/// `k=v, k=v` (strings unquoted).
fn figures_text(figures: &Map<String, Value>) -> String {
    figures
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_keep_two_decimals_and_a_sign() {
        assert_eq!(ms(Duration::from_micros(1234)), 1.23);
        let a = tokio::time::Instant::now();
        let b = a + Duration::from_millis(5);
        assert_eq!(signed_ms(a, b), -5.0);
        assert_eq!(signed_ms(b, a), 5.0);
    }

    #[test]
    fn one_failed_row_makes_the_deployment_unfit() {
        let caps = Capabilities::new(Duration::from_secs(2));
        let rows = vec![
            Row::pass("a").ms("x_ms", Duration::from_millis(3)),
            Row::skip("b", "not asked"),
        ];
        let header = Header {
            url: "memory:",
            backend: "memory",
            ttl: Duration::from_secs(2),
            caps: &caps,
            prefix: "dlock-check/1",
            clients: 3,
        };
        let report = Report {
            header,
            rows: &rows,
        };
        assert!(report.fit());
        assert_eq!(report.json()["checks"][0]["figures"]["x_ms"], 3.0);
        let rows = vec![Row::pass("a"), Row::fail("b", "broken")];
        let report = Report {
            rows: &rows,
            ..report
        };
        assert!(!report.fit());
        assert_eq!(report.json()["fit"], false);
        assert!(report.human().contains("broken"), "{}", report.human());
    }
}
