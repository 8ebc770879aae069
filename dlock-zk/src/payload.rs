//! The data written into each lock node: who holds (or waits for) it.
//!
//! Curator writes the client's address into its lock nodes and operators' tools show a lock
//! node's data as text; dlock writes one line of `key=value` fields instead:
//!
//! ```text
//! host=<host name> pid=<process id> locker=<locker id>
//! ```
//!
//! The payload never takes part in contention (Curator and dlock order nodes by name only).

/// The longest host name written (longer names are cut).
const MAX_HOST: usize = 255;

/// The payload of a locker whose id is `locker_id`, for this host and process.
pub(crate) fn node_payload(locker_id: &str) -> Vec<u8> {
    let host = gethostname::gethostname();
    format!(
        "host={} pid={} locker={locker_id}",
        field(&host.to_string_lossy()),
        std::process::id()
    )
    .into_bytes()
}

/// A value that cannot break the `key=value key=value` form: no spaces, `=` or control
/// characters, bounded length, never empty.
fn field(value: &str) -> String {
    let cleaned: String = value
        .chars()
        .take(MAX_HOST)
        .map(|c| {
            if c.is_whitespace() || c.is_control() || c == '=' {
                '_'
            } else {
                c
            }
        })
        .collect();
    if cleaned.is_empty() {
        "unknown".to_owned()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_stay_parseable() {
        assert_eq!(field("db-1.example"), "db-1.example");
        assert_eq!(field("a b=c\n"), "a_b_c_");
        assert_eq!(field(""), "unknown");
        assert_eq!(field(&"x".repeat(400)).len(), MAX_HOST);
        let text = String::from_utf8(node_payload("L1")).unwrap_or_default();
        let keys: Vec<&str> = text
            .split(' ')
            .filter_map(|f| f.split_once('=').map(|(k, _)| k))
            .collect();
        assert_eq!(keys, ["host", "pid", "locker"], "{text}");
        assert!(text.ends_with(" locker=L1"), "{text}");
    }
}
