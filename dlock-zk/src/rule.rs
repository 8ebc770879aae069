//! Grant rules: when a contender's node holds, and what it watches until then.
//!
//! One rule per primitive, each the one of the Curator recipe with the same layout:
//!
//! - mutex, election, semaphore guard (`lock-`, `latch-`): holds when first; watches its
//!   predecessor.
//! - read lease (`__READ__`, queued with `__WRIT__`): holds while no write node precedes it;
//!   watches the last write node before it (Curator's reader watches the first; both are
//!   correct, and the last one goes only after every earlier writer, so its deletion nearly
//!   always grants the reader instead of moving it to the next writer).
//! - write lease (`__WRIT__`, queued with `__READ__`): holds when first; watches its
//!   predecessor of either kind.
//! - semaphore permit (`lease-`, under `leases`, see `semaphore`): holds while fewer than N
//!   lease nodes precede it; watches the children of `leases`.
//!
//! A permit waiter watches the whole `leases` list because holders release in any order: the
//! node N places ahead may outlive a permit freed nearer to it. It is herd-free all the same:
//! only the holder of the semaphore's guard mutex waits there (see `semaphore`).

use crate::keys::{LEASE_MARKER, READ_MARKER, WRITE_MARKER, sort_key, sorted_by};

/// Which primitive a contender queues for (and so its node-name marker, its order and when it
/// holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// First in line holds: the mutex (`lock-`), the election (`latch-`), the semaphore guard.
    First(&'static str),
    /// A read lease: holds while no write node precedes it.
    Read,
    /// A write lease: holds when first among read and write nodes.
    Write,
    /// A semaphore permit: holds while fewer than `permits` lease nodes precede it.
    Lease {
        /// The semaphore's permit count.
        permits: u32,
    },
}

/// What a contender does after a listing.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// The node holds.
    Granted,
    /// Wait for this child (a name, not a path) to change or go.
    Node(String),
    /// Wait for the parent's children to change.
    Children,
}

impl Rule {
    /// The node-name marker written after the protection prefix.
    pub(crate) fn marker(self) -> &'static str {
        match self {
            Rule::First(marker) => marker,
            Rule::Read => READ_MARKER,
            Rule::Write => WRITE_MARKER,
            Rule::Lease { .. } => LEASE_MARKER,
        }
    }

    /// The children of the parent in creation order (`keys::CreationOrder` of the suffix the
    /// matching Curator recipe sorts by; Curator's own order until the parent's cversion wraps).
    pub(crate) fn sort(self, children: Vec<String>) -> Vec<String> {
        sorted_by(children, |c| self.key(c))
    }

    /// The text after the marker the matching Curator recipe sorts by: the node's sequence.
    pub(crate) fn key(self, child: &str) -> &str {
        match self {
            Rule::Read | Rule::Write => rw_sort_key(child),
            other => sort_key(child, other.marker()),
        }
    }

    /// Whether the node at `index` of `sorted` holds, and what it watches if not.
    pub(crate) fn turn(self, sorted: &[String], index: usize) -> Turn {
        let ahead = sorted.get(..index).unwrap_or(sorted);
        match self {
            Rule::First(_) | Rule::Write => match ahead.last() {
                None => Turn::Granted,
                Some(prev) => Turn::Node(prev.clone()),
            },
            Rule::Read => match ahead.iter().rev().find(|n| n.contains(WRITE_MARKER)) {
                None => Turn::Granted,
                Some(writer) => Turn::Node(writer.clone()),
            },
            Rule::Lease { permits } => {
                if ahead.len() < usize::try_from(permits).unwrap_or(usize::MAX) {
                    Turn::Granted
                } else {
                    Turn::Children
                }
            }
        }
    }
}

/// Curator's sort key for the nodes of a read-write lock (its sorting driver): the text after
/// the last `__READ__`, then after the last `__WRIT__` of that.
pub(crate) fn rw_sort_key(child: &str) -> &str {
    sort_key(sort_key(child, READ_MARKER), WRITE_MARKER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::LOCK_MARKER;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn rw_nodes_sort_by_sequence_whatever_their_kind() {
        let sorted = Rule::Read.sort(names(&[
            "_c_ff-__WRIT__0000000003",
            "_c_00-__READ__0000000004",
            "_c_aa-__READ__0000000001",
            "_c_bb-__WRIT__0000000002",
        ]));
        assert_eq!(
            sorted,
            [
                "_c_aa-__READ__0000000001",
                "_c_bb-__WRIT__0000000002",
                "_c_ff-__WRIT__0000000003",
                "_c_00-__READ__0000000004",
            ]
        );
        assert_eq!(rw_sort_key("_c_x-__WRIT__0000000009"), "0000000009");
    }

    #[test]
    fn readers_go_together_until_a_writer_and_watch_the_last_writer_before_them() {
        let q = names(&["r1", "r2", "w-__WRIT__3", "r4", "w-__WRIT__5", "r6"]);
        assert_eq!(Rule::Read.turn(&q, 0), Turn::Granted);
        assert_eq!(Rule::Read.turn(&q, 1), Turn::Granted);
        assert_eq!(Rule::Read.turn(&q, 3), Turn::Node("w-__WRIT__3".into()));
        assert_eq!(Rule::Read.turn(&q, 5), Turn::Node("w-__WRIT__5".into()));
        assert_eq!(Rule::Write.turn(&q, 2), Turn::Node("r2".into()));
        assert_eq!(Rule::Write.turn(&q[2..], 0), Turn::Granted);
        assert_eq!(
            Rule::First(LOCK_MARKER).turn(&q, 1),
            Turn::Node("r1".into())
        );
    }

    /// ZooKeeper's suffix for a parent cversion (`%010d` of a signed 32-bit int).
    fn seq(cversion: i32) -> String {
        format!("{cversion:010}")
    }

    /// The grant each rule makes to the node of `index` (in creation order) after sorting a
    /// listing in which the nodes appear in reverse.
    fn turn_of(rule: Rule, created: &[String], index: usize) -> Turn {
        let mut listed = created.to_vec();
        listed.reverse();
        let sorted = rule.sort(listed);
        let at = sorted
            .iter()
            .position(|n| *n == created[index])
            .expect("the node is listed");
        rule.turn(&sorted, at)
    }

    /// The last node created before the parent's cversion wrapped holds; the first one created
    /// after it must wait for it (mutex, election and semaphore guard alike).
    #[test]
    fn a_node_created_after_the_wrap_waits_for_the_holder_from_before_it() {
        for marker in [LOCK_MARKER, crate::keys::LATCH_MARKER] {
            let rule = Rule::First(marker);
            let created = names(&[
                &format!("_c_b-{marker}{}", seq(i32::MAX)),
                &format!("_c_a-{marker}{}", seq(i32::MIN)),
                &format!("_c_c-{marker}{}", seq(i32::MIN + 1)),
            ]);
            assert_eq!(turn_of(rule, &created, 0), Turn::Granted, "{marker}");
            assert_eq!(
                turn_of(rule, &created, 1),
                Turn::Node(created[0].clone()),
                "{marker}"
            );
            assert_eq!(
                turn_of(rule, &created, 2),
                Turn::Node(created[1].clone()),
                "{marker}"
            );
        }
    }

    #[test]
    fn readers_and_writers_keep_their_order_across_the_wrap() {
        let created = names(&[
            &format!("_c_r1-__READ__{}", seq(i32::MAX - 1)),
            &format!("_c_w2-__WRIT__{}", seq(i32::MAX)),
            &format!("_c_r3-__READ__{}", seq(i32::MIN)),
            &format!("_c_w4-__WRIT__{}", seq(i32::MIN + 1)),
        ]);
        assert_eq!(turn_of(Rule::Read, &created, 0), Turn::Granted);
        assert_eq!(
            turn_of(Rule::Write, &created, 1),
            Turn::Node(created[0].clone())
        );
        assert_eq!(
            turn_of(Rule::Read, &created, 2),
            Turn::Node(created[1].clone())
        );
        assert_eq!(
            turn_of(Rule::Write, &created, 3),
            Turn::Node(created[2].clone())
        );
    }

    #[test]
    fn permits_beyond_n_wait_across_the_wrap() {
        let created = names(&[
            &format!("_c_a-lease-{}", seq(i32::MAX - 1)),
            &format!("_c_b-lease-{}", seq(i32::MAX)),
            &format!("_c_c-lease-{}", seq(i32::MIN)),
            &format!("_c_d-lease-{}", seq(i32::MIN + 5)),
        ]);
        let rule = Rule::Lease { permits: 2 };
        assert_eq!(turn_of(rule, &created, 0), Turn::Granted);
        assert_eq!(turn_of(rule, &created, 1), Turn::Granted);
        assert_eq!(turn_of(rule, &created, 2), Turn::Children);
        assert_eq!(turn_of(rule, &created, 3), Turn::Children);
    }

    #[test]
    fn a_permit_holds_while_fewer_than_n_precede_it() {
        let q = names(&["a", "b", "c", "d"]);
        let rule = Rule::Lease { permits: 3 };
        assert_eq!(rule.turn(&q, 2), Turn::Granted);
        assert_eq!(rule.turn(&q, 3), Turn::Children);
        assert_eq!(Rule::Lease { permits: 1 }.turn(&q, 0), Turn::Granted);
        assert_eq!(rule.marker(), "lease-");
    }
}
