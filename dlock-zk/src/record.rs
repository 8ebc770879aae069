//! The proclamation record an election keeps in the data of its parent node.
//!
//! A proclamation writes only the parent's data: this record, naming the leader (its node's
//! czxid), the leadership's proclamation count and the value; the same multi checks that the
//! leader's node is still there. The node keeps the value it campaigned with: Curator's
//! `LeaderLatch` watches its predecessor with a one-shot data watch and acts only on its
//! deletion, so writing the node would leave a Curator follower waiting for good (see
//! `election`). ZooKeeper's watch events carry no data, and the parent outlives a leader that
//! proclaims and resigns at once; its data version counts proclamations, so an observer reads
//! every proclaimed value or knows it missed one. Curator's `LeaderLatch` never reads the latch
//! path's data.
//!
//! The leader's value is the record's when the record names its term, else its node's data.
//! The record is one header line, then the value's bytes:
//!
//! ```text
//! dlock-proclamation term=<czxid> version=<proclamations by this leader, this one included>
//! <value>
//! ```

/// The header's first word.
const TAG: &str = "dlock-proclamation";

/// One proclamation as the parent's data records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The leader's node's czxid (the leadership's term).
    pub(crate) czxid: i64,
    /// How many proclamations the leader made, this one included (1 for its first).
    pub(crate) version: i32,
    /// The proclaimed value.
    pub(crate) value: Vec<u8>,
}

/// The parent data recording that the leader `czxid` proclaimed `value`, its `version`th
/// proclamation.
pub(crate) fn encode(czxid: i64, version: i32, value: &[u8]) -> Vec<u8> {
    let header = format!("{TAG} term={czxid} version={version}\n");
    let mut out = Vec::with_capacity(header.len() + value.len());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(value);
    out
}

/// The record in `data`, or `None` when `data` is not one (any bytes are accepted: this is
/// server input).
pub(crate) fn decode(data: &[u8]) -> Option<Record> {
    let end = data.iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&data[..end]).ok()?;
    let mut words = header.split(' ');
    if words.next()? != TAG {
        return None;
    }
    let czxid = words.next()?.strip_prefix("term=")?.parse().ok()?;
    let version = words.next()?.strip_prefix("version=")?.parse().ok()?;
    if words.next().is_some() {
        return None;
    }
    Some(Record {
        czxid,
        version,
        value: data[end + 1..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_any_value() {
        for value in [&b""[..], b"x", b"line\nbreak", &[0, 255, 10, 13]] {
            let data = encode(4_294_967_300, 7, value);
            assert_eq!(
                decode(&data),
                Some(Record {
                    czxid: 4_294_967_300,
                    version: 7,
                    value: value.to_vec()
                })
            );
        }
    }

    #[test]
    fn anything_else_is_no_record() {
        for data in [
            &b""[..],
            b"no newline",
            b"other term=1 version=2\nx",
            b"dlock-proclamation term=x version=2\nx",
            b"dlock-proclamation term=1 version=99999999999\nx",
            b"dlock-proclamation term=1\nx",
            b"dlock-proclamation term=1 version=2 extra=3\nx",
            &[0xff, 0xfe, b'\n'],
        ] {
            assert_eq!(decode(data), None, "{:?}", String::from_utf8_lossy(data));
        }
    }
}
