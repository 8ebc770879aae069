//! Splitting a renewal's reads of every held node into multi-read requests the server accepts.
//!
//! Renewal reads back EVERY held node each round (a node deleted by an operator must be known
//! lost within one period, whatever the number of leases). The reads go out as multi-read
//! requests pipelined behind one `sync`: one round trip however many requests. Each request
//! is kept well under ZooKeeper's default `jute.maxbuffer` (1 MiB − 1 byte): the server drops
//! the connection on a request larger than that, which would suspend every lease of the
//! session.

use std::ops::Range;

/// The most bytes one multi-read request may take (estimated): a quarter of the default
/// `jute.maxbuffer`, so a server configured with a smaller buffer, or a long chroot the
/// estimate misjudges, still leaves room.
pub(crate) const REQUEST_BUDGET: usize = 256 * 1024;

/// The most reads one multi-read request carries. The client declares a connection dead when
/// nothing arrives on it for its connection timeout (TTL/4 then, 2/5 of the TTL now), and a server
/// busy with one request answers nothing else meanwhile: on a loaded machine a single
/// multi-read of 1,000 nodes took over 500 ms, the client dropped the healthy connection, and
/// the round's retry came too late for every lease (`zk::many_leases_break`, 999 lost). Smaller
/// requests are answered one after another, each reply showing the connection alive.
pub(crate) const REQUEST_OPS: usize = 100;

/// Bytes of a multi-read request besides its paths: the request header (length, xid, opcode),
/// and the closing multi header.
const REQUEST_FIXED: usize = 4 + 4 + 4 + 9;

/// Bytes of one `getData` op besides its path: its multi header (type, done, err), the path's
/// length prefix and the watch flag.
const OP_FIXED: usize = 9 + 4 + 1;

/// Splits `paths` (in order) into consecutive ranges, one per multi-read request, each of at
/// most `budget` estimated bytes and [`REQUEST_OPS`] reads. `prefix` is the length the client prepends to every path (at
/// most the connect string's chroot). A path too long for any request still gets a range of
/// its own (the server decides; ZooKeeper paths are far below the budget in practice).
pub(crate) fn split<'a>(
    paths: impl IntoIterator<Item = &'a str>,
    prefix: usize,
    budget: usize,
) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut size, mut end) = (0, REQUEST_FIXED, 0);
    for (i, path) in paths.into_iter().enumerate() {
        let op = OP_FIXED + prefix + path.len();
        if i > start && (size + op > budget || i - start >= REQUEST_OPS) {
            out.push(start..i);
            start = i;
            size = REQUEST_FIXED;
        }
        size += op;
        end = i + 1;
    }
    if end > start {
        out.push(start..end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(n: usize, len: usize) -> Vec<String> {
        (0..n).map(|_| "x".repeat(len)).collect()
    }

    #[test]
    fn nothing_to_read_is_no_request() {
        assert!(split(std::iter::empty(), 0, REQUEST_BUDGET).is_empty());
    }

    #[test]
    fn a_thousand_typical_nodes_go_in_requests_of_at_most_request_ops() {
        // /dlock/<ns>/<name>/_c_<uuid>-lock-<seq>: about 100 bytes.
        let p = paths(1000, 100);
        let ranges = split(p.iter().map(String::as_str), 0, REQUEST_BUDGET);
        assert_eq!(ranges.len(), 1000 / REQUEST_OPS);
        assert!(ranges.iter().all(|r| r.len() == REQUEST_OPS));
    }

    #[test]
    fn ranges_cover_everything_in_order_within_the_budget() {
        let p: Vec<String> = (0..10_000).map(|i| "y".repeat(60 + i % 97)).collect();
        let prefix = 12;
        let ranges = split(p.iter().map(String::as_str), prefix, REQUEST_BUDGET);
        assert!(ranges.len() > 1, "{}", ranges.len());
        let mut next = 0;
        for r in &ranges {
            assert_eq!(r.start, next);
            assert!(!r.is_empty());
            let size: usize = REQUEST_FIXED
                + p[r.clone()]
                    .iter()
                    .map(|s| OP_FIXED + prefix + s.len())
                    .sum::<usize>();
            assert!(size <= REQUEST_BUDGET, "{size}");
            next = r.end;
        }
        assert_eq!(next, p.len());
        // 10,000 leases: requests of REQUEST_OPS reads (one round trip behind one sync).
        assert_eq!(ranges.len(), 10_000 / REQUEST_OPS);
    }

    #[test]
    fn an_oversized_path_gets_its_own_request() {
        let p = ["a".to_owned(), "b".repeat(300), "c".to_owned()];
        assert_eq!(
            split(p.iter().map(String::as_str), 0, 100),
            vec![0..1, 1..2, 2..3]
        );
    }
}
