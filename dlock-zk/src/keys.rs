//! Znode layout, compatible with Curator's `InterProcessMutex`, `LeaderLatch`,
//! `InterProcessReadWriteLock` and `InterProcessSemaphoreV2`.
//!
//! A lock `name` lives in the parent `<root>/<name.encoded()>`; every contender is an
//! EPHEMERAL_SEQUENTIAL child `_c_<uuid>-<marker><sequence>`, the marker being `lock-` for a
//! mutex ([`LOCK_MARKER`], as `InterProcessMutex`), `latch-` for an election
//! ([`LATCH_MARKER`], as `LeaderLatch`), `__READ__` / `__WRIT__` for a read-write lock
//! ([`READ_MARKER`], [`WRITE_MARKER`], as `InterProcessReadWriteLock`). A semaphore uses two
//! children of the parent, as `InterProcessSemaphoreV2`: [`SEMAPHORE_LOCKS`] (a mutex of
//! `lock-` nodes guarding acquisition) and [`SEMAPHORE_LEASES`] (`lease-` nodes,
//! [`LEASE_MARKER`]). Contenders are ordered by the sequence after the last marker, so the
//! protection prefix never changes the order ([`CreationOrder`]; the per-primitive order and
//! grant rule are in `rule`). Once the parent's cversion reaches 2^31 - 1 the sequences no
//! longer tell creation order ([`ambiguous`]) and the grant paths order by czxid instead
//! (`contend::in_creation_order`).

use std::fmt::Write as _;

use dlock_core::Error;

/// The lock-name marker Curator's `InterProcessMutex` uses.
pub(crate) const LOCK_MARKER: &str = "lock-";
/// The node-name marker Curator's `LeaderLatch` uses.
pub(crate) const LATCH_MARKER: &str = "latch-";
/// The read-node marker of Curator's `InterProcessReadWriteLock`.
pub(crate) const READ_MARKER: &str = "__READ__";
/// The write-node marker of Curator's `InterProcessReadWriteLock`.
pub(crate) const WRITE_MARKER: &str = "__WRIT__";
/// The lease-node marker of Curator's `InterProcessSemaphoreV2`.
pub(crate) const LEASE_MARKER: &str = "lease-";
/// The child of a semaphore's parent holding its guard mutex (`InterProcessSemaphoreV2`).
pub(crate) const SEMAPHORE_LOCKS: &str = "locks";
/// The child of a semaphore's parent holding its lease nodes (`InterProcessSemaphoreV2`).
pub(crate) const SEMAPHORE_LEASES: &str = "leases";
/// The protection prefix Curator puts before the uuid.
pub(crate) const PROTECTED_PREFIX: &str = "_c_";

/// The parent node of a lock: `<root>/<encoded name>`.
pub(crate) fn parent_path(root: &str, encoded: &str) -> String {
    let mut p = String::with_capacity(root.len() + 1 + encoded.len());
    p.push_str(root.trim_end_matches('/'));
    p.push('/');
    p.push_str(encoded);
    p
}

/// The path given to a sequential create: `<parent>/_c_<uuid>-<marker>`.
pub(crate) fn create_prefix(parent: &str, uuid: &str, marker: &str) -> String {
    let mut p = String::with_capacity(parent.len() + 48);
    let _ = write!(p, "{parent}/{PROTECTED_PREFIX}{uuid}-{marker}");
    p
}

/// Curator's sort key for a child of a lock's parent (`fixForSorting` of its standard lock
/// driver): the text after the last `marker`, or the whole name when there is none.
pub(crate) fn sort_key<'a>(child: &'a str, marker: &str) -> &'a str {
    // A byte scan from the end: names are short, and it runs for every child of every listing
    // (`str::rfind` builds a two-way searcher per call).
    let found = if marker.is_empty() {
        Some(child.len())
    } else {
        child
            .as_bytes()
            .windows(marker.len())
            .rposition(|w| w == marker.as_bytes())
    };
    found
        .and_then(|at| child.get(at + marker.len()..))
        .unwrap_or(child)
}

/// Whether `child` was created by the contender with this protection uuid.
pub(crate) fn is_ours(child: &str, uuid: &str) -> bool {
    child
        .strip_prefix(PROTECTED_PREFIX)
        .and_then(|rest| rest.strip_prefix(uuid))
        .is_some_and(|rest| rest.starts_with('-'))
}

/// The children of a lock's parent by the sequence after the last `marker` (`lock-` for a
/// mutex, `latch-` for an election), in [`CreationOrder`].
#[cfg(test)]
pub(crate) fn sorted_contenders(children: Vec<String>, marker: &str) -> Vec<String> {
    sorted_by(children, |c| sort_key(c, marker))
}

/// `children` in [`CreationOrder`] of the sequences `key` gives (ties, which sequential nodes
/// never have, by name).
pub(crate) fn sorted_by(children: Vec<String>, key: impl Fn(&str) -> &str) -> Vec<String> {
    let order = CreationOrder::of(children.iter().map(|c| key(c)));
    // Each child is ranked once (a listing is sorted on every wake-up of every waiter).
    let mut ranked: Vec<((bool, u32, &str), &str, usize)> = children
        .iter()
        .enumerate()
        .map(|(i, c)| (order.rank(key(c)), c.as_str(), i))
        .collect();
    ranked.sort_unstable();
    let places: Vec<usize> = ranked.into_iter().map(|(_, _, i)| i).collect();
    let mut slots: Vec<Option<String>> = children.into_iter().map(Some).collect();
    places
        .into_iter()
        .filter_map(|i| slots.get_mut(i).and_then(Option::take))
        .collect()
}

/// The sequence a sequential node's suffix encodes: ZooKeeper appends `%010d` of the parent's
/// cversion, a signed 32-bit int (`0000000007`, after 2^31 - 1 changes `-2147483648`, later
/// `-000000005`). `None` for any other text (a child created by name).
pub(crate) fn sequence(suffix: &str) -> Option<i32> {
    let digits = suffix.strip_prefix('-').unwrap_or(suffix);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    suffix.parse().ok()
}

/// Whether the sequence suffixes of a listing may not be in creation order: some suffix is
/// `2147483647` or negative.
///
/// A parent's cversion stops at 2^31 - 1 on ZooKeeper 3.8 (measured in
/// `tests/locking/sequences.rs`): a create names its node with the cversion and raises it by
/// one, but the server's tree keeps a new cversion only when it is larger, and one past
/// 2^31 - 1 is -2^31. So every child created afterwards is named `…2147483647` (ties, in no
/// order), except a create made while another one on the same parent is still pending, which
/// gets `-2147483648`, `-2147483647`, … from the pending change. A server whose cversion does
/// wrap names later nodes with negative sequences. Either way only the nodes' czxids order them: callers that decide grants read those instead.
pub(crate) fn ambiguous<'a>(suffixes: impl IntoIterator<Item = &'a str>) -> bool {
    suffixes
        .into_iter()
        .filter_map(sequence)
        .any(|seq| seq == i32::MAX || seq < 0)
}

/// The order in which the nodes of one listing were created, from their sequence suffixes.
///
/// Where the parent's cversion wraps past 2^31 - 1 to -2^31 (and past -1 to 0), neither the
/// suffix text (Curator's order, in which every node created after the wrap sorts first) nor
/// its numeric value orders nodes from both sides of a wrap. Sequences are compared in serial-number arithmetic instead (RFC 1982, on the 2^32
/// circle): the oldest live node is the one after the largest gap between live sequences,
/// and each node ranks by its distance from it. That is creation order on a server whose
/// cversion wraps, whenever the live nodes' sequences span less than 2^31 — 2^31 child changes
/// while the oldest node lives. ZooKeeper 3.8 does not wrap but stops (see [`ambiguous`]),
/// and then only czxids tell the order: the grant paths check [`ambiguous`] first. Before the end of the sequence space (every sequence in 0..2^31 - 1) it is the text
/// order Curator uses, so dlock and Curator contenders agree.
///
/// Children whose suffix is no sequence rank after every sequential node, by text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CreationOrder {
    /// The sequence (as an unsigned value on the circle) of the oldest live node.
    oldest: u32,
}

/// A sequence's place on the 2^32 circle (its two's-complement bits).
fn unsigned(seq: i32) -> u32 {
    u32::from_ne_bytes(seq.to_ne_bytes())
}

impl CreationOrder {
    /// The order of the nodes with these suffixes.
    pub(crate) fn of<'a>(suffixes: impl IntoIterator<Item = &'a str>) -> Self {
        // Two's complement: -2^31 follows 2^31 - 1, as on the server.
        let mut seqs: Vec<u32> = suffixes
            .into_iter()
            .filter_map(sequence)
            .map(unsigned)
            .collect();
        seqs.sort_unstable();
        seqs.dedup();
        let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) else {
            return CreationOrder { oldest: 0 };
        };
        // The gap from the highest value around the circle to the lowest first: without a
        // wrap among the live nodes it is the largest, and the oldest is the lowest.
        let mut oldest = first;
        let mut widest = first.wrapping_sub(last);
        for pair in seqs.windows(2) {
            if let [a, b] = *pair {
                let gap = b.wrapping_sub(a);
                if gap > widest {
                    widest = gap;
                    oldest = b;
                }
            }
        }
        if seqs.len() > 1 && widest <= 1 << 31 {
            tracing::warn!(
                oldest = i32::from_ne_bytes(oldest.to_ne_bytes()),
                "the live sequential nodes span half the sequence space or more: their creation order is ambiguous"
            );
        }
        CreationOrder { oldest }
    }

    /// The place of the node with this suffix: sequential nodes by their distance from the
    /// oldest, then the others by text.
    pub(crate) fn rank<'a>(&self, suffix: &'a str) -> (bool, u32, &'a str) {
        match sequence(suffix) {
            Some(seq) => (false, unsigned(seq).wrapping_sub(self.oldest), ""),
            None => (true, 0, suffix),
        }
    }
}

/// The parent of a node's path (`/` for a top-level node).
pub(crate) fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The last segment of a path.
pub(crate) fn node_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Validates an absolute znode path given as the locker's prefix: `/` or `/a/b` (no trailing
/// `/`, no `.`/`..` segment, segments of `[A-Za-z0-9._:@+=-]`, not under the reserved
/// `/zookeeper`).
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), Error> {
    let bad = |why: String| Error::invalid_option("prefix", why);
    if prefix == "/" {
        return Ok(());
    }
    let Some(rest) = prefix.strip_prefix('/') else {
        return Err(bad(format!("{prefix:?} must start with '/'")));
    };
    for seg in rest.split('/') {
        if seg.is_empty() {
            return Err(bad("empty path segment ('//' or a trailing '/')".into()));
        }
        if seg == "." || seg == ".." {
            return Err(bad(format!("segment {seg:?} is not allowed")));
        }
        if let Some(c) = seg.chars().find(|c| {
            !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-' | '@' | '+' | '='))
        }) {
            return Err(bad(format!(
                "character {c:?} is not allowed in a znode name (allowed: [A-Za-z0-9._:@+=-])"
            )));
        }
    }
    if rest == "zookeeper" || rest.starts_with("zookeeper/") {
        return Err(bad("/zookeeper is reserved by the server".into()));
    }
    Ok(())
}

/// Joins the prefix and the namespace (checked by core: segments of `[A-Za-z0-9._-]`, each a
/// valid znode name) into the locker's base path.
pub(crate) fn join_prefix(prefix: &str, ns: Option<&str>) -> String {
    match ns {
        None => prefix.to_owned(),
        Some(ns) if prefix == "/" => format!("/{ns}"),
        Some(ns) => format!("{prefix}/{ns}"),
    }
}

/// Validates a ZooKeeper connect string: `host:port[,host:port…][/chroot]`, each address
/// optionally prefixed by `tcp://`.
pub(crate) fn validate_connect(connect: &str) -> Result<(), Error> {
    let bad = |why: String| Error::invalid_option("connect", why);
    if connect.trim().is_empty() {
        return Err(bad("the connect string is empty".into()));
    }
    let (hosts, chroot) = match connect.find('/') {
        // A `tcp://` scheme contains slashes; look for the chroot after the last address.
        _ if connect.contains("://") => split_chroot_after_schemes(connect),
        Some(i) => (&connect[..i], Some(&connect[i..])),
        None => (connect, None),
    };
    if let Some(chroot) = chroot {
        validate_prefix(chroot).map_err(|e| bad(format!("bad chroot {chroot:?}: {e}")))?;
    }
    for addr in hosts.split(',') {
        let addr = addr.strip_prefix("tcp://").unwrap_or(addr);
        if addr.contains("://") {
            return Err(bad(format!(
                "{addr:?}: only the tcp:// scheme is supported"
            )));
        }
        let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
            let Some((h, p)) = rest.split_once("]:") else {
                return Err(bad(format!("{addr:?} is not [ipv6]:port")));
            };
            (h, p)
        } else {
            let Some((h, p)) = addr.rsplit_once(':') else {
                return Err(bad(format!("{addr:?} has no port (host:port)")));
            };
            (h, p)
        };
        if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(bad(format!("{addr:?} has an invalid host")));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(bad(format!("{addr:?} has an invalid port {port:?}"))),
        }
    }
    Ok(())
}

/// The member addresses of a (validated) connect string, without the chroot.
pub(crate) fn connect_hosts(connect: &str) -> Vec<String> {
    let hosts = if connect.contains("://") {
        split_chroot_after_schemes(connect).0
    } else {
        connect.split('/').next().unwrap_or(connect)
    };
    hosts.split(',').map(str::to_owned).collect()
}

fn split_chroot_after_schemes(connect: &str) -> (&str, Option<&str>) {
    let last = connect.rsplit(',').next().unwrap_or(connect);
    let base = connect.len() - last.len();
    let after_scheme = last.find("://").map_or(0, |i| i + 3);
    match last[after_scheme..].find('/') {
        Some(i) => {
            let at = base + after_scheme + i;
            (&connect[..at], Some(&connect[at..]))
        }
        None => (connect, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_key_is_the_text_after_the_last_marker() {
        let key = |c| sort_key(c, LOCK_MARKER);
        assert_eq!(key("_c_1b2c-lock-0000000007"), "0000000007");
        assert_eq!(key("_c_lock-x-lock-0000000012"), "0000000012");
        assert_eq!(key("lock-0000000003"), "0000000003");
        assert_eq!(key("_c_abc-lock--000000003"), "-000000003");
        assert_eq!(key("_c_abc-lock-"), "");
        assert_eq!(key("other"), "other");
        assert_eq!(
            sort_key("_c_1b2c-latch-0000000007", LATCH_MARKER),
            "0000000007"
        );
        assert_eq!(
            sort_key("_c_1b2c-lock-0000000007", LATCH_MARKER),
            "_c_1b2c-lock-0000000007"
        );
    }

    #[test]
    fn contenders_sort_by_sequence_not_by_uuid() {
        let sorted = sorted_contenders(
            vec![
                "_c_ffff-lock-0000000002".into(),
                "_c_0000-lock-0000000010".into(),
                "junk".into(),
                "_c_aaaa-lock-0000000001".into(),
            ],
            LOCK_MARKER,
        );
        // As in Curator, a child without the marker takes part with its whole name as key.
        assert_eq!(
            sorted,
            [
                "_c_aaaa-lock-0000000001",
                "_c_ffff-lock-0000000002",
                "_c_0000-lock-0000000010",
                "junk"
            ]
        );
    }

    #[test]
    fn ties_go_by_name_and_non_sequential_children_by_their_text_whatever_the_input_order() {
        let want = [
            "_c_a-lock-0000000004",
            "_c_b-lock-0000000004",
            "_c_c-lock-0000000009",
            "alpha",
            "zeta",
        ];
        // Every rotation and its reverse.
        for turn in 0..want.len() {
            let mut input: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
            input.rotate_left(turn);
            assert_eq!(sorted_contenders(input.clone(), LOCK_MARKER), want);
            input.reverse();
            assert_eq!(sorted_contenders(input, LOCK_MARKER), want);
        }
    }

    /// ZooKeeper's suffix for a parent cversion (`%010d` of a signed 32-bit int).
    pub(crate) fn suffix(cversion: i32) -> String {
        format!("{cversion:010}")
    }

    #[test]
    fn suffixes_are_formatted_as_zookeeper_formats_them() {
        assert_eq!(suffix(7), "0000000007");
        assert_eq!(suffix(i32::MAX), "2147483647");
        assert_eq!(suffix(i32::MAX.wrapping_add(1)), "-2147483648");
        assert_eq!(suffix(-5), "-000000005");
    }

    /// Nodes created in this order as the parent's cversion passes 2^31 - 1 (the wrap) and then
    /// -1 (back to 0): each must sort after every node created before it.
    #[test]
    fn contenders_keep_creation_order_across_a_cversion_wrap() {
        for start in [i32::MAX - 3, -3, i32::MAX - 7, 0, i32::MIN] {
            let created: Vec<String> = (0..8)
                .map(|i| format!("_c_{i:02}-lock-{}", suffix(start.wrapping_add(i))))
                .collect();
            let mut listed = created.clone();
            listed.reverse();
            listed.swap(1, 5);
            assert_eq!(
                sorted_contenders(listed, LOCK_MARKER),
                created,
                "created from cversion {start}"
            );
        }
    }

    /// Gaps in the sequence (nodes deleted, changes by others) do not change the order as long
    /// as the live sequences span less than 2^31.
    #[test]
    fn order_is_by_serial_arithmetic_within_half_the_sequence_space() {
        let oldest = suffix(i32::MAX - 1_000_000_000);
        let middle = suffix(i32::MAX);
        let newest = suffix(i32::MAX.wrapping_add(1_000_000_000));
        let sorted = sorted_contenders(
            vec![
                format!("_c_n-lock-{newest}"),
                "junk".into(),
                format!("_c_m-lock-{middle}"),
                format!("_c_o-lock-{oldest}"),
            ],
            LOCK_MARKER,
        );
        assert_eq!(
            sorted,
            [
                format!("_c_o-lock-{oldest}"),
                format!("_c_m-lock-{middle}"),
                format!("_c_n-lock-{newest}"),
                "junk".into(),
            ]
        );
    }

    /// Before any wrap (every suffix non-negative, ten digits) the order is Curator's: the
    /// suffixes compared as text.
    #[test]
    fn without_a_wrap_the_order_is_curators_text_order() {
        let names: Vec<String> = [5, 0, 1_999_999_999, 10, 2_147_483_647, 9]
            .iter()
            .map(|s| format!("_c_x{s}-latch-{}", suffix(*s)))
            .collect();
        let mut by_text = names.clone();
        by_text.sort_by(|a, b| sort_key(a, LATCH_MARKER).cmp(sort_key(b, LATCH_MARKER)));
        assert_eq!(sorted_contenders(names, LATCH_MARKER), by_text);
    }

    #[test]
    fn suffixes_from_the_end_of_the_sequence_space_are_ambiguous() {
        let key = |c: &'static str| sort_key(c, LOCK_MARKER);
        assert!(!ambiguous(["0000000001", "2147483646", "junk"]));
        assert!(ambiguous(["0000000001", "2147483647"]));
        assert!(ambiguous([key("_c_a-lock--2147483648")]));
        assert!(ambiguous([key("_c_a-lock--000000005")]));
        assert!(!ambiguous([key("_c_a-lock-0000000005")]));
    }

    #[test]
    fn ownership_is_by_uuid() {
        assert!(is_ours("_c_abc-lock-0000000001", "abc"));
        assert!(!is_ours("_c_abcd-lock-0000000001", "abc"));
        assert!(!is_ours("abc-lock-0000000001", "abc"));
    }

    #[test]
    fn layout() {
        assert_eq!(parent_path("/dlock", "a%2Fb"), "/dlock/a%2Fb");
        assert_eq!(parent_path("/", "a"), "/a");
        assert_eq!(
            create_prefix("/dlock/a", "u", LOCK_MARKER),
            "/dlock/a/_c_u-lock-"
        );
        assert_eq!(
            create_prefix("/dlock/a", "u", LATCH_MARKER),
            "/dlock/a/_c_u-latch-"
        );
        assert_eq!(node_name("/dlock/a/_c_u-lock-1"), "_c_u-lock-1");
        assert_eq!(parent_of("/dlock/a/_c_u-lock-1"), "/dlock/a");
        assert_eq!(parent_of("/a"), "/");
        assert_eq!(join_prefix("/dlock", Some("t/1")), "/dlock/t/1");
        assert_eq!(join_prefix("/", Some("t")), "/t");
    }

    #[test]
    fn prefixes() {
        for ok in ["/", "/dlock", "/a/b-c/d_e.f"] {
            assert!(validate_prefix(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "dlock",
            "/a/",
            "//a",
            "/a/../b",
            "/a/./b",
            "/zookeeper",
            "/zookeeper/x",
            "/a b",
            "/é",
        ] {
            assert!(validate_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts_of_a_connect_string() {
        assert_eq!(connect_hosts("a:1"), ["a:1"]);
        assert_eq!(connect_hosts("a:1,b:2/chroot/x"), ["a:1", "b:2"]);
        assert_eq!(
            connect_hosts("tcp://a:1,tcp://b:2/chroot"),
            ["tcp://a:1", "tcp://b:2"]
        );
        assert_eq!(connect_hosts("[::1]:2181"), ["[::1]:2181"]);
    }

    #[test]
    fn connect_strings() {
        for ok in [
            "127.0.0.1:2181",
            "a:1,b:2,c:3",
            "a:1,b:2/chroot/x",
            "tcp://a:1,tcp://b:2/chroot",
            "[::1]:2181",
        ] {
            assert!(validate_connect(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            " ",
            "host",
            "host:",
            "host:0",
            "host:99999",
            ":2181",
            "a:1,,b:2",
            "a:1/bad/",
            "http://a:1",
        ] {
            assert!(validate_connect(bad).is_err(), "{bad}");
        }
    }
}
