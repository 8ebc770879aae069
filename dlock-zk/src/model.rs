//! An election observer's model of the queue: the nodes the events describe, the leader
//! reported last, and the parent's data version and proclamation record (see `observe`).

use std::collections::{BTreeMap, VecDeque};

use dlock_core::{FencingToken, Leader};
use zookeeper_client as zk;

use crate::error::map;
use crate::keys::{CreationOrder, LATCH_MARKER, ambiguous, sort_key};
use crate::record::{Record, decode};

/// A node's read: its data and stat, or why it could not be read.
pub(crate) type Read = Result<(Vec<u8>, zk::Stat), zk::Error>;

/// A queued node's value, as far as the observer knows it.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    czxid: i64,
    /// The data version read.
    version: i32,
    /// The data version the events seen so far account for: when it differs from `version`,
    /// the node was written (from outside: dlock and Curator never write a queued node) before
    /// the observer could read what it held earlier.
    pub(crate) accounted: i32,
    data: Vec<u8>,
}

/// The reported leader.
#[derive(Debug, Clone)]
pub(crate) struct Current {
    pub(crate) name: String,
    czxid: i64,
    /// How many of its proclamations were reported (0: its campaign value was).
    version: i32,
}

/// The parent node as the observer knows it (`None`: absent).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parent {
    /// Unknown until first read after a create.
    pub(crate) czxid: Option<i64>,
    pub(crate) version: i32,
}

/// The queue as the events describe it.
#[derive(Debug, Default)]
pub(crate) struct Model {
    /// Every queued node by (its sequence suffix, name): the first in [`CreationOrder`] leads.
    /// `None`: its data could not be read before it was deleted.
    pub(crate) nodes: BTreeMap<(String, String), Option<Known>>,
    pub(crate) leader: Option<Current>,
    pub(crate) parent: Option<Parent>,
    /// The parent's latest proclamation record, if its data is one: a node it names has the
    /// record's value instead of its own data.
    pub(crate) record: Option<Record>,
}

/// A node's entry in [`Model::nodes`]: its sequence suffix, then the name.
pub(crate) fn key(name: &str) -> (String, String) {
    (sort_key(name, LATCH_MARKER).to_owned(), name.to_owned())
}

fn term(czxid: i64) -> FencingToken {
    FencingToken(u64::try_from(czxid).unwrap_or_default())
}

impl Model {
    /// The node `name`'s entry after the read `read` (`None` when it was deleted first).
    pub(crate) fn known(read: Read, accounted: i32) -> Result<Option<Known>, String> {
        match read {
            Ok((data, stat)) => Ok(Some(Known {
                czxid: stat.czxid,
                version: stat.version,
                accounted,
                data,
            })),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map("observe (reading a node)", e).to_string()),
        }
    }

    /// Recomputes the leader after a change; a new leader is reported into `out`.
    pub(crate) fn settle(&mut self, out: &mut VecDeque<Leader>) -> Result<(), String> {
        let suffixes = || self.nodes.keys().map(|(suffix, _)| suffix.as_str());
        let first = if ambiguous(suffixes()) {
            // The suffixes no longer tell the order (see `keys::ambiguous`): the czxids read
            // do, but only if every node was read.
            if let Some(((_, name), _)) = self.nodes.iter().find(|(_, k)| k.is_none()) {
                return Err(format!(
                    "{name} went before the observer could read it, and the queue's sequence numbers no longer tell whether it led"
                ));
            }
            self.nodes
                .iter()
                .min_by_key(|(_, known)| known.as_ref().map(|k| k.czxid))
        } else {
            let order = CreationOrder::of(suffixes());
            self.nodes.iter().min_by(|((a, an), _), ((b, bn), _)| {
                order.rank(a).cmp(&order.rank(b)).then_with(|| an.cmp(bn))
            })
        };
        let Some(((_, name), known)) = first else {
            self.leader = None;
            return Ok(());
        };
        if self.leader.as_ref().is_some_and(|l| l.name == *name) {
            return Ok(());
        }
        let (name, known) = (name.clone(), known.clone());
        let Some(k) = known else {
            return Err(format!(
                "the leader {name} resigned before the observer could read its value"
            ));
        };
        if k.version != k.accounted {
            return Err(format!(
                "the leader {name}'s node was written before the observer could read the value it campaigned with"
            ));
        }
        // A leader found by a snapshot may have proclaimed already.
        let (value, version) = match &self.record {
            Some(r) if r.czxid == k.czxid => (r.value.clone(), r.version),
            _ => (k.data, 0),
        };
        out.push_back(Leader {
            term: term(k.czxid),
            value,
        });
        self.leader = Some(Current {
            name,
            czxid: k.czxid,
            version,
        });
        Ok(())
    }

    /// Applies one proclamation: the parent's data as read after its change event.
    pub(crate) fn proclaimed(
        &mut self,
        read: Read,
        out: &mut VecDeque<Leader>,
    ) -> Result<(), String> {
        let Some(parent) = self.parent else {
            return Err("the election's parent changed while it was thought absent".into());
        };
        let (data, stat) = match read {
            Ok(r) => r,
            Err(zk::Error::NoNode) => {
                return Err(
                    "the election's parent was deleted before a proclamation could be read".into(),
                );
            }
            Err(e) => return Err(map("observe (reading a proclamation)", e).to_string()),
        };
        // The event announced this version; the read may find later ones, whose history
        // still holds it unless more proclamations than it keeps came between.
        let expected = parent.version.saturating_add(1);
        if parent.czxid.is_some_and(|c| c != stat.czxid) {
            return Err(
                "the election's parent was deleted and created again between an event and its read"
                    .into(),
            );
        }
        let found = decode(&data, stat.version)
            .and_then(|history| history.into_iter().find(|r| r.at == expected));
        if found.is_none() && stat.version != expected {
            return Err(format!(
                "proclamations were missed (the parent's data is at version {}, and its history no longer holds version {expected})",
                stat.version
            ));
        }
        self.parent = Some(Parent {
            czxid: Some(stat.czxid),
            version: expected,
        });
        // Data that is no record was written from outside: no leader change.
        let Some(record) = found else {
            self.record = None;
            return Ok(());
        };
        let Some(leader) = self.leader.as_mut() else {
            return Err("a proclamation was recorded while nobody led".into());
        };
        if record.czxid != leader.czxid || record.version != leader.version.saturating_add(1) {
            return Err(format!(
                "a proclamation (term {}, version {}) does not follow the leader the observer knows (term {}, version {})",
                record.czxid, record.version, leader.czxid, leader.version
            ));
        }
        leader.version = record.version;
        out.push_back(Leader {
            term: term(record.czxid),
            value: record.value.clone(),
        });
        self.record = Some(record);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(czxid: i64) -> zk::Stat {
        zk::Stat {
            czxid,
            mzxid: czxid,
            pzxid: czxid,
            ctime: 0,
            mtime: 0,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 1,
            data_length: 1,
            num_children: 0,
        }
    }

    /// ZooKeeper's suffix for a parent cversion (`%010d` of a signed 32-bit int).
    fn seq(cversion: i32) -> String {
        format!("{cversion:010}")
    }

    /// Once the parent's cversion stopped at 2^31 - 1, nodes share the suffix `2147483647`:
    /// the leader is the one with the lowest czxid, whatever its name.
    #[test]
    fn the_leader_is_the_oldest_node_when_suffixes_tie() {
        let mut model = Model::default();
        let older = format!("_c_f-latch-{}", seq(i32::MAX));
        let newer = format!("_c_0-latch-{}", seq(i32::MAX));
        let pending = format!("_c_1-latch-{}", seq(i32::MIN));
        for (name, czxid) in [(&newer, 20), (&pending, 15), (&older, 10)] {
            let known = Model::known(Ok((name.as_bytes().to_vec(), stat(czxid))), 0).expect("read");
            model.nodes.insert(key(name), known);
        }
        let mut out = VecDeque::new();
        model.settle(&mut out).expect("settles");
        assert_eq!(out.pop_front().expect("a leader").term, FencingToken(10));
        model.nodes.remove(&key(&older));
        model.settle(&mut out).expect("settles");
        assert_eq!(out.pop_front().expect("a leader").term, FencingToken(15));
        // A node deleted before it was read cannot be placed: the observation fails.
        model.nodes.insert(key(&older), None);
        assert!(model.settle(&mut out).is_err());
    }

    /// The observer's leader is the node created first, also when the parent's cversion wrapped
    /// between it and later campaigns.
    #[test]
    fn the_leader_is_the_node_created_before_the_wrap() {
        let mut model = Model::default();
        let first = format!("_c_b-latch-{}", seq(i32::MAX));
        let second = format!("_c_a-latch-{}", seq(i32::MIN));
        let third = format!("_c_c-latch-{}", seq(i32::MIN + 1));
        for (name, czxid) in [(&third, 30), (&second, 20), (&first, 10)] {
            let known = Model::known(Ok((name.as_bytes().to_vec(), stat(czxid))), 0).expect("read");
            model.nodes.insert(key(name), known);
        }
        let mut out = VecDeque::new();
        model.settle(&mut out).expect("settles");
        let leader = out.pop_front().expect("a new leader");
        assert_eq!(leader.term, FencingToken(10));
        assert_eq!(leader.value, first.as_bytes());
        assert!(out.is_empty());
        model.nodes.remove(&key(&first));
        model.settle(&mut out).expect("settles");
        assert_eq!(
            out.pop_front().expect("a new leader").term,
            FencingToken(20)
        );
        model.nodes.remove(&key(&second));
        model.settle(&mut out).expect("settles");
        assert_eq!(
            out.pop_front().expect("a new leader").term,
            FencingToken(30)
        );
    }
}
