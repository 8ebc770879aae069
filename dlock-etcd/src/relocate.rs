//! Moving a session to a lease granted in a new raft term.
//!
//! etcd before the fix of etcd-io/etcd#15247 (e.g. 3.4.23) has a stale-lessor bug: a leader
//! that was stopped for longer than a lease's TTL and then resumes, before it learns it lost the
//! leadership, proposes the revocation of every lease its own lessor thinks expired — and the
//! new leader commits it, although the lease was kept alive through the new leader meanwhile.
//! Every key of such a lease is deleted long before the deadline our keep-alives promise.
//!
//! A leader of an older term never knows a lease granted after it lost the leadership (it only
//! applies that grant after it caught up with, and so stepped down to, the new leader), so it
//! cannot revoke it. When a keep-alive round shows a raft term higher than the one our lease was
//! granted in, the session moves:
//! 1. grant a new lease (its TTL runs from no earlier than this request's send time, which is
//!    after the round's send time the renewed deadlines are computed from);
//! 2. re-attach every key of the session that this locker owns (held locks and queue entries,
//!    i.e. every key with a taken slot and the session's suffix) with a transaction guarded by
//!    the key's current lease (and, for a held lock, its create revision): a put with
//!    `ignore_value` keeps the key's value and create revision — the fencing token and the
//!    queue position — and only changes its lease;
//! 3. switch the session to the new lease and revoke the old one (in the background; it only
//!    holds keys nobody owns now).
//!
//! The move runs in a task of its own ([`spawn_relocation`]), never inside a renewal round:
//! the driver may abandon a round after part of the leases' validity, and a move cut short
//! would leave the keys moved so far on a lease nobody keeps alive (and the next attempt would
//! find them off the old lease and count them lost). While the move runs, every round of the
//! session sends no keep-alive and leaves the session's leases undecided
//! ([`Renewal::Retry`](dlock_core::backend::Renewal::Retry)): their deadlines stay where the
//! round that saw the new term put them, which both leases outlive (the old one was kept alive
//! by that round, the new one is granted after it). Keys move [`BATCH`] per transaction, each
//! key in a nested transaction of its own, so one request moves many keys while each key keeps
//! its own guard and verdict; [`KeepAlive::moving`] is held for writing only that long.
//!
//! A key whose guard fails is gone (the old lease was revoked, or the key deleted, before it
//! could move): it is lost, and an acquire queued on it queues again — unless the key's own
//! read (the nested transaction's failure branch) shows it already on the new lease with its
//! create revision: an earlier attempt of the same request (hedged onto another member, see
//! [`Etcd::call`](crate::conn::Etcd::call)) applied first, and the key moved. A batch that had
//! no answer counts its keys as lost (a lease may always be given up early; if the puts did
//! land, the keys are orphans the reconciliation deletes). Enqueues and grants hold
//! [`KeepAlive::moving`] for reading, so no key is attached to the old lease during a move.
//!
//! This is a mitigation, not a cure: if the stale leader resumes before the move completed
//! (a stop shorter than the election plus one keep-alive round), its revocation still wins.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use dlock_core::Error;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use crate::conn::Etcd;
use crate::session::KeepAlive;
use crate::slots::Slots;

/// Keys moved per transaction. etcd refuses a transaction with more than `--max-txn-ops`
/// operations (128 by default) at one level, nested transactions counting against what their
/// parent leaves: 64 nested transactions of 2 compares, 1 put and 1 read stay well within it.
pub(crate) const BATCH: usize = 64;

/// Starts moving the session of `ka` to a new lease in a task of its own, unless a move of
/// this session is already running. `held`: the held locks' keys and create revisions; `seen`:
/// the raft term newer than the one the session's lease was granted in.
pub(crate) fn spawn_relocation(
    ka: &Arc<KeepAlive>,
    slots: &Slots,
    held: Vec<(String, i64)>,
    seen: u64,
) {
    if ka.relocating.swap(true, Ordering::AcqRel) {
        return;
    }
    let (ka, slots) = (Arc::clone(ka), slots.clone());
    tokio::spawn(async move {
        // Cleared however the task ends (a panic too), so a later round can move again.
        let _running = Running(&ka);
        if let Err(e) = relocate(&ka, &slots, &held, seen).await {
            tracing::warn!(lease = format_args!("{:x}", ka.lease()), error = %e, "moving the session to a lease of the new raft term failed; retried next round");
        }
    });
}

/// Marks a session's move as running until dropped.
struct Running<'a>(&'a KeepAlive);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.relocating.store(false, Ordering::Release);
    }
}

/// Moves the session of `ka` to a new lease, because raft term `seen` is newer than the one its
/// lease was granted in. `held`: the held locks' keys and create revisions. Returns how many
/// keys were lost.
///
/// # Errors
/// [`Error::Unavailable`] when the new lease could not be granted, or an enqueue on the old
/// lease did not finish within one attempt: the session stays on its lease, and the next round
/// tries again.
pub(crate) async fn relocate(
    ka: &KeepAlive,
    slots: &Slots,
    held: &[(String, i64)],
    seen: u64,
) -> Result<usize, Error> {
    let etcd = &ka.etcd;
    // An enqueue in flight (retrying through the election) must not hold up the move for
    // long: if it does not finish within one attempt, the next round starts another move.
    let Ok(_moving) = tokio::time::timeout(etcd.attempt_cap, ka.moving.write()).await else {
        return Err(Error::unavailable(
            "an enqueue on the session lease is in flight",
            None,
        ));
    };
    let began = tokio::time::Instant::now();
    let old = ka.lease();
    let ttl = ka.ttl_secs;
    let granted = etcd
        .call("lease grant (new raft term)", None, |c| {
            let mut leases = c.lease_client();
            async move { leases.grant(ttl, None).await }
        })
        .await?;
    let new = granted.id();
    let term = granted.header().map_or(seen, |h| h.raft_term().max(seen));
    // Every key this locker owns on this session: queue keys (slot taken, create revision
    // possibly unknown here) and held locks (create revision known).
    let suffix = format!("/{:x}", ka.id);
    let owned: Vec<String> = slots
        .keys()
        .into_iter()
        .filter(|k| k.ends_with(&suffix))
        .collect();
    let mut keys: HashMap<String, Option<i64>> = owned.iter().map(|k| (k.clone(), None)).collect();
    for (key, rev) in held {
        keys.insert(key.clone(), Some(*rev));
    }
    let keys: Vec<(String, Option<i64>)> = keys.into_iter().collect();
    let mut lost = Vec::new();
    for batch in keys.chunks(BATCH) {
        lost.extend(move_batch(etcd, batch, old, new).await);
    }
    let count = lost.len();
    ka.switch(new, term, lost, &owned).await;
    tracing::info!(
        old = format_args!("{old:x}"),
        new = format_args!("{new:x}"),
        term,
        moved = keys.len() - count,
        lost = count,
        elapsed_ms = began.elapsed().as_millis(),
        "session moved to a lease of the new raft term"
    );
    // A key whose move had no answer may still be on the old lease, and a held one is
    // believed until the next round reports it lost: revoking would delete it and grant the
    // next waiter first (found by dlock-model's etcd model). The old lease then expires on
    // its own, after every deadline it backed.
    if count > 0 {
        tracing::debug!(
            lease = format_args!("{old:x}"),
            lost = count,
            "the old session lease is left to expire: keys not moved may still be on it"
        );
        return Ok(count);
    }
    let etcd = etcd.clone();
    tokio::spawn(async move {
        if let Err(e) = etcd.revoke(old).await {
            tracing::debug!(lease = format_args!("{old:x}"), error = %e, "revoking the old session lease failed; it expires");
        }
    });
    Ok(count)
}

/// Moves the keys of `batch` (key, create revision when known) from lease `old` to lease `new`
/// in one transaction, one nested transaction per key. Returns the keys that did not move.
async fn move_batch(
    etcd: &Etcd,
    batch: &[(String, Option<i64>)],
    old: i64,
    new: i64,
) -> Vec<String> {
    let txn = Txn::new().and_then(
        batch
            .iter()
            .map(|(key, rev)| TxnOp::txn(move_one(key, *rev, old, new)))
            .collect::<Vec<_>>(),
    );
    let resp = match etcd.txn("move keys to the new lease", None, txn).await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::warn!(keys = batch.len(), error = %e, "moving keys to the new lease had no answer; counted as lost");
            return batch.iter().map(|(key, _)| key.clone()).collect();
        }
    };
    let replies = resp.op_responses();
    let mut lost = Vec::new();
    for (i, (key, rev)) in batch.iter().enumerate() {
        let verdict = match replies.get(i) {
            Some(TxnOpResponse::Txn(one)) => moved(one, *rev, new),
            _ => Moved::Unknown,
        };
        match verdict {
            Moved::Yes => {}
            Moved::Gone => {
                tracing::warn!(%key, lease = format_args!("{old:x}"), "the key was gone before the session could move it to a lease of the new raft term");
                lost.push(key.clone());
            }
            Moved::Unknown => {
                tracing::warn!(%key, "etcd's reply to moving the key to the new lease is malformed; counted as lost");
                lost.push(key.clone());
            }
        }
    }
    lost
}

/// The nested transaction that moves `key` from lease `old` to lease `new`: guarded by the
/// key's lease (and its create revision `rev`, when known), a put with `ignore_value` that
/// keeps the value and create revision; otherwise a read of the key.
fn move_one(key: &str, rev: Option<i64>, old: i64, new: i64) -> Txn {
    let mut when = vec![Compare::lease(key, CompareOp::Equal, old)];
    if let Some(rev) = rev {
        when.push(Compare::create_revision(key, CompareOp::Equal, rev));
    }
    let put = PutOptions::new().with_lease(new).with_ignore_value();
    Txn::new()
        .when(when)
        .and_then([TxnOp::put(key, "", Some(put))])
        .or_else([TxnOp::get(key, None)])
}

/// What one key's nested transaction says.
#[derive(Debug, PartialEq, Eq)]
enum Moved {
    /// The key is on the new lease.
    Yes,
    /// The key is gone, or belongs to another lease or incarnation.
    Gone,
    /// The reply is not the shape asked for.
    Unknown,
}

/// Reads the verdict of one key's nested transaction ([`move_one`]): moved when the guard
/// held, or when the key's read shows it on `new` already (with create revision `rev`, when
/// known) — an earlier attempt of the same request moved it.
fn moved(one: &TxnResponse, rev: Option<i64>, new: i64) -> Moved {
    if one.succeeded() {
        return Moved::Yes;
    }
    let replies = one.op_responses();
    let Some(TxnOpResponse::Get(read)) = replies.first() else {
        return Moved::Unknown;
    };
    match read.kvs().first() {
        Some(kv) if kv.lease() == new && rev.is_none_or(|r| kv.create_revision() == r) => {
            Moved::Yes
        }
        _ => Moved::Gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EtcdLocker;
    use dlock_conformance::servers::{Cluster, ServerKind};
    use etcd_client::{GetOptions, LeaseGrantOptions, PutOptions as Put};

    /// Issue 9: a move request hedged onto a second member when the first was slow to answer
    /// applies twice; the second application's guard fails (the key is on the new lease
    /// already) and, if its reply comes first, the key must still count as moved. Here the first
    /// application is the same request sent once before; `move_batch` then sees what the
    /// hedged attempt would.
    #[test]
    fn a_move_applied_twice_counts_the_key_moved() {
        let Ok(cluster) = Cluster::shared(ServerKind::Etcd, 1) else {
            assert!(std::env::var_os("CI").is_none(), "etcd unavailable");
            return;
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let locker = EtcdLocker::builder()
                .endpoints(cluster.endpoints())
                .prefix(format!(
                    "dlock-test/etcd-unit-{}/relocate",
                    std::process::id()
                ))
                .build()
                .await
                .expect("locker");
            let etcd = locker.inner.etcd.clone();
            let mut c = locker.client().clone();
            let grant = |c: &mut etcd_client::Client| {
                let mut c = c.clone();
                async move {
                    c.lease_grant(10, None::<LeaseGrantOptions>)
                        .await
                        .expect("grant")
                        .id()
                }
            };
            let (old, new) = (grant(&mut c).await, grant(&mut c).await);
            let prefix = format!("dlock-test/etcd-unit-{}/relocate/", std::process::id());
            let mut batch = Vec::new();
            for (i, known) in [(0, true), (1, false)] {
                let key = format!("{prefix}k{i}/{old:x}");
                c.put(key.as_str(), "v", Some(Put::new().with_lease(old)))
                    .await
                    .expect("put");
                let rev = c.get(key.as_str(), None).await.expect("get").kvs()[0].create_revision();
                batch.push((key, known.then_some(rev)));
            }
            // A key gone before the move is lost, whatever the repetition.
            let gone = format!("{prefix}gone/{old:x}");
            batch.push((gone.clone(), None));

            // The first (slow) attempt applies...
            assert_eq!(
                move_batch(&etcd, &batch, old, new).await,
                vec![gone.clone()]
            );
            // ...then the hedged attempt applies too, and its reply is the one read.
            assert_eq!(
                move_batch(&etcd, &batch, old, new).await,
                vec![gone],
                "a key moved by the first attempt is reported lost by the second"
            );
            let kvs = c
                .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
                .await
                .expect("read")
                .kvs()
                .to_vec();
            assert_eq!(kvs.len(), 2);
            assert!(kvs.iter().all(|kv| kv.lease() == new && kv.value() == b"v"));
            for id in [old, new] {
                let _ = c.lease_revoke(id).await;
            }
        });
    }
}
