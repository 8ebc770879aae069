//! The skip allowlist's format (`dlock-conformance/skips.allow`): one
//! `backend | scenario | reason` per line. Std only: `xtask` compiles this same file
//! (`#[path]`) to check a whole report, without depending on the test kit.

/// One permitted skip: `backend | scenario | reason` in the allowlist file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedSkip {
    /// The backend's report name.
    pub backend: String,
    /// The scenario's name.
    pub scenario: String,
    /// The exact skip reason; `part: <reason>` for a part of a scenario that cannot run.
    pub reason: String,
}

/// Parses allowlist text (`file` names it in errors): one `backend | scenario | reason` per
/// line; blank lines and lines starting with `#` are ignored.
///
/// # Errors
/// The first malformed line, with its number.
pub fn parse(text: &str, file: &str) -> Result<Vec<AllowedSkip>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(3, '|').map(str::trim);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(b), Some(s), Some(r)) if !b.is_empty() && !s.is_empty() && !r.is_empty() => {
                out.push(AllowedSkip {
                    backend: b.into(),
                    scenario: s.into(),
                    reason: r.into(),
                });
            }
            _ => {
                return Err(format!(
                    "{file} line {}: want `backend | scenario | reason`, got {line:?}",
                    i + 1
                ));
            }
        }
    }
    Ok(out)
}
