//! Redlock's `inspect`: every node read at once, the holder is the owner value a quorum holds.

use std::time::Duration;

use dlock_core::{Error, FencingToken, HolderState, LockName, LockState, NodeError};
use futures::future::join_all;

use super::RInner;
use super::quorum::token_plan;
use crate::inspect::{self, NodeView};
use crate::keys::Keys;

/// Reads the name on every node concurrently (each within the node timeout, writing nothing)
/// and reports the owner a quorum of the nodes that answered hold; no waiters are counted
/// (Redlock keeps no queue).
///
/// # Errors
/// [`Error::QuorumNotReached`] when fewer than a quorum of nodes answered (each failed node's
/// cause listed), as an acquire reports it.
pub(super) async fn inspect(inner: &RInner, name: &LockName) -> Result<LockState, Error> {
    let b = &inner.backend;
    let keys = Keys::new(&inner.prefix, name);
    let replies = join_all(
        b.nodes
            .iter()
            .map(|node| inspect::read(node, &keys, false, b.node_timeout, &b.counters)),
    )
    .await;
    let mut views = Vec::with_capacity(b.nodes.len());
    let mut causes = Vec::new();
    for (node, reply) in b.nodes.iter().zip(replies) {
        match reply {
            Ok(view) => views.push(view),
            Err(e) => causes.push(NodeError {
                node: node.display.to_string(),
                cause: e.to_string(),
            }),
        }
    }
    if views.len() < b.quorum {
        return Err(Error::QuorumNotReached {
            needed: b.quorum,
            granted: views.len(),
            causes,
        });
    }
    let holder = majority(&views, b.quorum).map(|m| {
        HolderState::new(
            m.token,
            keys.lock,
            String::from_utf8_lossy(m.owner),
            m.expires_within,
        )
    });
    Ok(LockState::new(holder, None))
}

/// The holder a quorum of nodes agree on.
#[derive(Debug, PartialEq, Eq)]
struct Majority<'a> {
    owner: &'a [u8],
    token: Option<FencingToken>,
    /// `None`: a quorum of its keys has no expiry.
    expires_within: Option<Duration>,
}

/// The owner value at least `quorum` of `views` hold (at most one can: a quorum is a strict
/// majority of all the nodes), with:
/// - `expires_within`: the quorum-th longest remaining TTL among the nodes holding it. Once
///   that many keys expired, fewer than a quorum hold it and another acquire can win, so this
///   is how long the lock stays the holder's if it stops renewing (as far as the nodes that
///   answered tell: a node that did not answer may hold a longer key, never a shorter one
///   that matters to the quorum-th).
/// - `token`: the highest fence counter among the nodes holding it. The grant's token is the
///   highest counter of its granting nodes, and laggards were raised to it until at least a
///   quorum held it ([`token_plan`], the same rule the grant used). A node never grants
///   again while it holds the key, so a holding node's counter is at most the token; and
///   the quorum whose counters equal the token intersects the quorum holding the key, so at
///   least one holding node shows the token itself. Counters of nodes NOT holding the key say
///   nothing (a failed attempt may have raised them), so they are left out.
fn majority(views: &[NodeView], quorum: usize) -> Option<Majority<'_>> {
    let owner = views
        .iter()
        .filter_map(|v| v.holder.as_deref())
        .find(|owner| {
            views
                .iter()
                .filter(|v| v.holder.as_deref() == Some(*owner))
                .count()
                >= quorum
        })?;
    let holding: Vec<&NodeView> = views
        .iter()
        .filter(|v| v.holder.as_deref() == Some(owner))
        .collect();
    // Longest first; a key without expiry (`None`) is the longest of all.
    let mut left: Vec<Option<Duration>> = holding.iter().map(|v| v.pttl).collect();
    left.sort_by(|a, b| match (a, b) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (Some(a), Some(b)) => b.cmp(a),
    });
    let counters: Vec<(usize, u64)> = holding
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.fence.map(|t| (i, t.0)))
        .collect();
    Some(Majority {
        owner,
        token: token_plan(&counters).map(|(max, _)| FencingToken(max)),
        expires_within: left.get(quorum.checked_sub(1)?).copied().flatten(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(owner: Option<&str>, pttl_ms: Option<u64>, fence: Option<u64>) -> NodeView {
        NodeView {
            holder: owner.map(|o| o.as_bytes().to_vec()),
            pttl: pttl_ms.map(Duration::from_millis),
            fence: fence.map(FencingToken),
            waiting: 0,
        }
    }

    #[test]
    fn the_majority_owner_wins_over_a_disagreeing_node() {
        let views = [
            view(Some("a"), Some(900), Some(7)),
            view(Some("a"), Some(1000), Some(7)),
            view(Some("b"), Some(5000), Some(9)),
            view(Some("a"), Some(800), Some(5)),
            view(None, None, Some(8)),
        ];
        assert_eq!(
            majority(&views, 3),
            Some(Majority {
                owner: b"a",
                token: Some(FencingToken(7)),
                expires_within: Some(Duration::from_millis(800)),
            })
        );
    }

    #[test]
    fn the_quorum_th_longest_key_bounds_the_hold() {
        let views = [
            view(Some("a"), Some(300), Some(4)),
            view(Some("a"), None, None),
            view(Some("a"), Some(700), Some(4)),
        ];
        let m = majority(&views, 2).expect("a majority");
        assert_eq!(m.expires_within, Some(Duration::from_millis(700)));
        assert_eq!(m.token, Some(FencingToken(4)));
    }

    #[test]
    fn a_split_or_a_minority_shows_no_holder() {
        let split = [
            view(Some("a"), Some(900), Some(1)),
            view(Some("a"), Some(900), Some(1)),
            view(Some("b"), Some(900), Some(2)),
            view(Some("b"), Some(900), Some(2)),
            view(None, None, None),
        ];
        assert_eq!(majority(&split, 3), None);
        assert_eq!(majority(&[], 1), None);
    }
}
