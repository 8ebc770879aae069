//! The body of a plain HTTP/1.x response read to EOF, for the probes' text endpoints. The
//! probes ask over HTTP/1.0, so a server replies with a plain body; a chunked body is still
//! decoded, since a chunk boundary can fall anywhere, a sample line included.

/// The body of a `2xx` response; `None` for any other status or a malformed response.
pub fn body(response: &str) -> Option<String> {
    let (head, rest) = response.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?;
    let mut parts = status.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    if !parts.next()?.starts_with('2') {
        return None;
    }
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
        })
    });
    if chunked {
        dechunk(rest)
    } else {
        Some(rest.to_string())
    }
}

/// Joins the chunks of a chunked body (extensions and trailers ignored); `None` when a size
/// line is not hex or a chunk is shorter than its size (a truncated reply).
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size_line, after) = rest.split_once("\r\n")?;
        let hex = size_line.split(';').next()?.trim();
        let size = usize::from_str_radix(hex, 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_chunked_bodies() {
        assert_eq!(
            body("HTTP/1.0 200 OK\r\nA: b\r\n\r\nx 1\ny 2\n").as_deref(),
            Some("x 1\ny 2\n")
        );
        let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n3\r\nx 1\r\n4;e=1\r\n\ny 2\r\n1\r\n\n\r\n0\r\n\r\n";
        assert_eq!(body(chunked).as_deref(), Some("x 1\ny 2\n"));
    }

    #[test]
    fn refuses_what_is_not_a_whole_2xx_reply() {
        assert_eq!(body("HTTP/1.1 500 Oops\r\n\r\nx 1\n"), None);
        assert_eq!(body("SSH-2.0\r\n\r\n"), None);
        assert_eq!(body("HTTP/1.1 200 OK\r\n"), None);
        let truncated = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nff\r\nx 1\n";
        assert_eq!(body(truncated), None);
        let bad_size = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n";
        assert_eq!(body(bad_size), None);
    }
}
