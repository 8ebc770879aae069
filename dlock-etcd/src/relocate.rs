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
//! A key whose guard fails is gone (the old lease was revoked, or the key deleted, before it
//! could move): it is lost, and an acquire queued on it queues again. A key whose transaction
//! had no answer counts as lost too (a lease may always be given up early; if the put did
//! land, the key is an orphan the reconciliation deletes). Enqueues and grants hold
//! [`KeepAlive::moving`] for reading, so no key is attached to the old lease during a move.
//!
//! This is a mitigation, not a cure: if the stale leader resumes before the move completed
//! (a stop shorter than the election plus one keep-alive round), its revocation still wins.

use std::collections::HashMap;

use dlock_core::Error;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::session::KeepAlive;
use crate::slots::Slots;

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
    // An enqueue in flight (retrying through the election) must not hold up the renewal round
    // for long: if it does not finish within one attempt, the next round moves.
    let Ok(_moving) = tokio::time::timeout(etcd.attempt_cap, ka.moving.write()).await else {
        return Err(Error::unavailable(
            "an enqueue on the session lease is in flight",
            None,
        ));
    };
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
    let mut lost = Vec::new();
    for (key, rev) in &keys {
        let mut when = vec![Compare::lease(key.as_str(), CompareOp::Equal, old)];
        if let Some(rev) = rev {
            when.push(Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                *rev,
            ));
        }
        let put = PutOptions::new().with_lease(new).with_ignore_value();
        let txn = Txn::new()
            .when(when)
            .and_then([TxnOp::put(key.as_str(), "", Some(put))]);
        let moved = etcd.txn("move a key to the new lease", None, txn).await;
        match moved {
            Ok(resp) if resp.succeeded() => {}
            Ok(_) => {
                tracing::warn!(%key, lease = format_args!("{old:x}"), "the key was gone before the session could move it to a lease of the new raft term");
                lost.push(key.clone());
            }
            Err(e) => {
                tracing::warn!(%key, error = %e, "moving the key to the new lease had no answer; counted as lost");
                lost.push(key.clone());
            }
        }
    }
    let count = lost.len();
    ka.switch(new, term, lost, &owned).await;
    tracing::info!(
        old = format_args!("{old:x}"),
        new = format_args!("{new:x}"),
        term,
        moved = keys.len() - count,
        lost = count,
        "session moved to a lease of the new raft term"
    );
    let etcd = etcd.clone();
    tokio::spawn(async move {
        if let Err(e) = etcd.revoke(old).await {
            tracing::debug!(lease = format_args!("{old:x}"), error = %e, "revoking the old session lease failed; it expires");
        }
    });
    Ok(count)
}
