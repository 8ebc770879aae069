//! The proclamation records an election keeps in the data of its parent node.
//!
//! A proclamation writes only the parent's data: its record, naming the leader (its node's
//! czxid), the leadership's proclamation count, the parent data version it is written as, and
//! the value; the same multi checks that the leader's node is still there. The node keeps the
//! value it campaigned with: Curator's `LeaderLatch` watches its predecessor with a one-shot
//! data watch and acts only on its deletion, so writing the node would leave a Curator follower
//! waiting for good (see `election`). Curator's `LeaderLatch` never reads the latch path's data.
//!
//! ZooKeeper's watch events carry no data, and the parent outlives a leader that proclaims and
//! resigns at once. So the parent keeps a short history: the newest record first, then the
//! records of the parent versions before it, consecutive, up to [`HISTORY_RECORDS`] records
//! and [`HISTORY_BYTES`] bytes. An observer whose read of one change's data arrives only after
//! later proclamations still finds the record of the version its event announced, unless more
//! than the history holds were made meanwhile; then it knows it missed one.
//!
//! The leader's value is the newest record's when the record names its term, else its node's
//! data. Each record is one header line, then exactly `len` bytes of value:
//!
//! ```text
//! dlock-proclamation term=<czxid> version=<proclamations by this leader> at=<parent version> len=<bytes>
//! <value>
//! ```

use dlock_core::MAX_VALUE_LEN;

/// The header's first word.
const TAG: &str = "dlock-proclamation";

/// The most records the parent keeps (the newest included).
pub(crate) const HISTORY_RECORDS: usize = 8;

/// The most bytes the parent's data holds: older records are dropped to stay within it (the
/// newest record is always kept). Four of the largest values; far below ZooKeeper's 1 MiB
/// default request limit (`jute.maxbuffer`).
pub(crate) const HISTORY_BYTES: usize = 4 * MAX_VALUE_LEN;

/// One proclamation as the parent's data records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The leader's node's czxid (the leadership's term).
    pub(crate) czxid: i64,
    /// How many proclamations the leader made, this one included (1 for its first).
    pub(crate) version: i32,
    /// The parent's data version this record was written as.
    pub(crate) at: i32,
    /// The proclaimed value.
    pub(crate) value: Vec<u8>,
}

impl Record {
    fn header(&self) -> String {
        format!(
            "{TAG} term={} version={} at={} len={}\n",
            self.czxid,
            self.version,
            self.at,
            self.value.len()
        )
    }
}

/// The parent data holding `newest`, then as many of `older` (newest first, as [`decode`]
/// returns them) as continue it without a gap and fit the history's bounds.
pub(crate) fn encode(newest: &Record, older: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    push(&mut out, newest);
    let mut next_at = newest.at.saturating_sub(1);
    for (kept, r) in (1..).zip(older) {
        let fits = out.len() + r.header().len() + r.value.len() <= HISTORY_BYTES;
        if kept >= HISTORY_RECORDS || r.at != next_at || !fits {
            break;
        }
        push(&mut out, r);
        next_at = r.at.saturating_sub(1);
    }
    out
}

fn push(out: &mut Vec<u8>, r: &Record) {
    out.extend_from_slice(r.header().as_bytes());
    out.extend_from_slice(&r.value);
}

/// The records in `data` read at parent data version `version`, newest first; `None` when
/// `data` is not a history whose newest record was written as `version` with consecutive
/// versions before it (any bytes are accepted: this is server input).
pub(crate) fn decode(data: &[u8], version: i32) -> Option<Vec<Record>> {
    let mut records = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let (record, after) = decode_one(rest)?;
        let expected = version.checked_sub(i32::try_from(records.len()).ok()?)?;
        if record.at != expected {
            return None;
        }
        records.push(record);
        rest = after;
    }
    (!records.is_empty()).then_some(records)
}

/// The first record of `data` and what follows it.
fn decode_one(data: &[u8]) -> Option<(Record, &[u8])> {
    let end = data.iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&data[..end]).ok()?;
    let mut words = header.split(' ');
    if words.next()? != TAG {
        return None;
    }
    let mut field = |key: &str| words.next()?.strip_prefix(key)?.strip_prefix('=');
    let czxid = field("term")?.parse().ok()?;
    let version = field("version")?.parse().ok()?;
    let at = field("at")?.parse().ok()?;
    let len: usize = field("len")?.parse().ok()?;
    if words.next().is_some() {
        return None;
    }
    let body = &data[end + 1..];
    if body.len() < len {
        return None;
    }
    let (value, rest) = body.split_at(len);
    let record = Record {
        czxid,
        version,
        at,
        value: value.to_vec(),
    };
    Some((record, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(at: i32, value: &[u8]) -> Record {
        Record {
            czxid: 4_294_967_300,
            version: at + 6,
            at,
            value: value.to_vec(),
        }
    }

    #[test]
    fn a_record_round_trips_any_value() {
        for value in [&b""[..], b"x", b"line\nbreak", &[0, 255, 10, 13]] {
            let newest = record(7, value);
            assert_eq!(decode(&encode(&newest, &[]), 7), Some(vec![newest]));
        }
    }

    #[test]
    fn the_history_keeps_consecutive_records_newest_first() {
        let older: Vec<Record> = (1..=5).rev().map(|at| record(at, b"v\nx")).collect();
        let newest = record(6, b"new");
        let history = decode(&encode(&newest, &older), 6).expect("a history");
        assert_eq!(history.len(), 6);
        assert_eq!(history[0], newest);
        assert_eq!(&history[1..], &older[..]);
    }

    #[test]
    fn the_history_is_bounded_in_records_and_bytes() {
        let older: Vec<Record> = (1..=20).rev().map(|at| record(at, b"v")).collect();
        let history = decode(&encode(&record(21, b"n"), &older), 21).expect("a history");
        assert_eq!(history.len(), HISTORY_RECORDS);
        assert_eq!(history.last().map(|r| r.at), Some(14));

        let big = vec![7u8; MAX_VALUE_LEN];
        let older: Vec<Record> = (1..=5).rev().map(|at| record(at, &big)).collect();
        let data = encode(&record(6, &big), &older);
        assert!(data.len() <= HISTORY_BYTES, "{} bytes", data.len());
        let history = decode(&data, 6).expect("a history");
        assert!(history.len() >= 2, "kept {}", history.len());
    }

    #[test]
    fn a_gap_ends_the_history() {
        let older = vec![record(4, b"a"), record(2, b"b")];
        let history = decode(&encode(&record(5, b"n"), &older), 5).expect("a history");
        assert_eq!(history.len(), 2);
    }

    #[test]
    fn anything_else_is_no_history() {
        let good = encode(&record(3, b"x"), &[]);
        assert_eq!(decode(&good, 4), None, "written as another version");
        let mut trailing = good.clone();
        trailing.extend_from_slice(b"junk");
        assert_eq!(decode(&trailing, 3), None);
        for data in [
            &b""[..],
            b"no newline",
            b"other term=1 version=2 at=1 len=1\nx",
            b"dlock-proclamation term=x version=2 at=1 len=1\nx",
            b"dlock-proclamation term=1 version=99999999999 at=1 len=1\nx",
            b"dlock-proclamation term=1 version=2 len=1\nx",
            b"dlock-proclamation term=1 version=2 at=1\nx",
            b"dlock-proclamation term=1 version=2 at=1 len=5\nx",
            b"dlock-proclamation term=1 version=2 at=1 len=1 extra=3\nx",
            &[0xff, 0xfe, b'\n'],
        ] {
            assert_eq!(decode(data, 1), None, "{:?}", String::from_utf8_lossy(data));
        }
    }
}
