//! The committed skip allowlist (`dlock-conformance/skips.allow`) applied to a conformance
//! report: a skip or skipped part it does not name fails, and so does a row it names that no
//! longer skips (so the file stays true).

use std::path::Path;

use serde_json::Value;

/// Where the allowlist lives, relative to the workspace root.
pub const FILE: &str = "dlock-conformance/skips.allow";

/// The allowlist's format, shared with the suite's own check of a row
/// (`dlock_conformance::report`).
#[path = "../../dlock-conformance/src/report/skips.rs"]
mod skips;

/// One permitted skip: `backend | scenario | reason` (`part: <reason>` for a skipped part).
pub use skips::AllowedSkip as Allowed;

/// Parses the allowlist text (blank lines and `#` comments ignored).
///
/// # Errors
/// The first malformed line.
pub fn parse(text: &str) -> Result<Vec<Allowed>, String> {
    skips::parse(text, FILE)
}

/// Reads and parses the allowlist under `root`.
///
/// # Errors
/// When it cannot be read or parsed.
pub fn load(root: &Path) -> Result<Vec<Allowed>, String> {
    let path = root.join(FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read the skip allowlist {}: {e}", path.display()))?;
    parse(&text)
}

fn field<'a>(row: &'a Value, key: &str) -> &'a str {
    row.get(key).and_then(Value::as_str).unwrap_or("")
}

fn parts(row: &Value) -> Vec<String> {
    row.get("figures")
        .and_then(|f| f.get("skipped_parts"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|p| format!("part: {p}"))
                .collect()
        })
        .unwrap_or_default()
}

/// The problems of `rows` (of `backends`) against `allowed`: unlisted skips and skipped parts,
/// and listed ones that did not happen although the row ran.
pub fn check(backends: &[&str], rows: &[Value], allowed: &[Allowed]) -> Vec<String> {
    let mut out = Vec::new();
    let listed = |b: &str, s: &str, reason: &str| {
        allowed
            .iter()
            .any(|a| a.backend == b && a.scenario == s && a.reason == reason)
    };
    for r in rows {
        let (b, s) = (field(r, "backend"), field(r, "scenario"));
        if !backends.contains(&b) {
            continue;
        }
        if field(r, "status") == "skip" && !listed(b, s, field(r, "reason")) {
            out.push(format!(
                "{b}::{s}: skipped without a row in {FILE}: {}",
                field(r, "reason")
            ));
        }
        for p in parts(r) {
            if !listed(b, s, &p) {
                out.push(format!("{b}::{s}: {p} — not in {FILE}"));
            }
        }
    }
    for a in allowed
        .iter()
        .filter(|a| backends.contains(&a.backend.as_str()))
    {
        let Some(r) = rows
            .iter()
            .find(|r| field(r, "backend") == a.backend && field(r, "scenario") == a.scenario)
        else {
            continue; // a missing row is reported as such
        };
        let happened = match a.reason.strip_prefix("part: ") {
            Some(_) => parts(r).contains(&a.reason),
            None => field(r, "status") == "skip" && field(r, "reason") == a.reason,
        };
        if !happened && field(r, "status") != "fail" {
            out.push(format!(
                "{}::{}: {FILE} allows the skip {:?}, but the scenario did not skip so: remove the row",
                a.backend, a.scenario, a.reason
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unlisted_and_stale_skips_are_problems() {
        let allowed = parse(
            "# comment\nmemory | short_blip | no link\nzk | slow_grant | part: no expiry\nredis | fifo | gone\n",
        )
        .expect("parses");
        assert_eq!(allowed.len(), 3);
        let rows = vec![
            json!({"backend":"memory","scenario":"short_blip","status":"skip","reason":"no link","figures":{}}),
            json!({"backend":"memory","scenario":"herd","status":"skip","reason":"why not","figures":{}}),
            json!({"backend":"zk","scenario":"slow_grant","status":"pass","reason":"","figures":{"skipped_parts":["no expiry"]}}),
            json!({"backend":"zk","scenario":"one_way_delay","status":"pass","reason":"","figures":{"skipped_parts":["unlisted"]}}),
            json!({"backend":"redis","scenario":"fifo","status":"pass","reason":"","figures":{}}),
        ];
        let problems = check(&["memory", "zk", "redis"], &rows, &allowed);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("memory::herd"));
        assert!(problems[1].contains("zk::one_way_delay") && problems[1].contains("unlisted"));
        assert!(problems[2].contains("redis::fifo") && problems[2].contains("remove the row"));
        assert!(check(&["memory"], &rows[..1], &allowed).is_empty());
        assert!(parse("memory | only two").is_err());
    }
}
