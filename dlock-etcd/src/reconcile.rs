//! Reconciling a session's keys with what the locker owns, once per keep-alive round.
//!
//! A request whose outcome is unknown (an enqueue cut by a timeout, a retried enqueue whose
//! first attempt applies late) can leave a key on the session lease that no acquire owns: its
//! cleanup read ran before the key was created. The keep-alive would keep such a key alive
//! forever and block every other contender. So every round also asks etcd for the session's
//! keys (`LeaseTimeToLive` with keys, sent beside the keep-alive):
//! - a key under our prefix whose slot is free (no acquire, lease or cleanup of this locker
//!   owns it) is an orphan and is deleted, guarded by our lease;
//! - a held lock whose key is not listed is confirmed with a read and, if its key is gone (or
//!   is another incarnation), is lost: someone deleted it by hand.

use std::collections::HashSet;
use std::time::Duration;

use dlock_core::Error;
use etcd_client::{Compare, CompareOp, GetOptions, LeaseTimeToLiveOptions, Txn, TxnOp};
use tokio::task::JoinHandle;

use crate::conn::Etcd;
use crate::slots::Slots;

/// What a listing found: the lease's keys and the raft term of the member that answered.
pub(crate) struct Listed {
    pub(crate) keys: HashSet<String>,
    pub(crate) term: Option<u64>,
}

/// The session's keys, being listed in the background; dropping it abandons the listing.
pub(crate) struct Listing(JoinHandle<Result<Listed, Error>>);

impl Drop for Listing {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Listing {
    /// Starts listing the keys attached to lease `id`.
    pub(crate) fn start(etcd: &Etcd, id: i64) -> Self {
        let etcd = etcd.clone();
        Listing(tokio::spawn(async move {
            let resp = etcd
                .call("lease time-to-live", None, |c| {
                    let mut leases = c.lease_client();
                    async move {
                        leases
                            .time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
                            .await
                    }
                })
                .await?;
            Ok(Listed {
                keys: resp
                    .keys()
                    .iter()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .collect(),
                term: resp.header().map(|h| h.raft_term()),
            })
        }))
    }

    /// The listed keys if they arrive within `grace`; `None` when the listing failed or is
    /// late (this round is then not reconciled; the next one is).
    pub(crate) async fn within(mut self, grace: Duration) -> Option<Listed> {
        match tokio::time::timeout(grace, &mut self.0).await {
            Ok(Ok(Ok(keys))) => Some(keys),
            Ok(Ok(Err(e))) => {
                tracing::debug!(error = %e, "listing the session's keys failed; not reconciled this round");
                None
            }
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

/// Whether our held key is really gone: a linearizable read of `key` finds nothing, or
/// another incarnation (another create revision or lease). A failed read is not proof.
pub(crate) async fn confirm_gone(etcd: &Etcd, key: &str, rev: i64, lease: i64) -> bool {
    let read = etcd
        .call("read a held key", None, |c| {
            let mut kv = c.kv_client();
            async move { kv.get(key, Some(GetOptions::new().with_keys_only())).await }
        })
        .await;
    match read {
        Ok(resp) => resp
            .kvs()
            .first()
            .is_none_or(|kv| kv.create_revision() != rev || kv.lease() != lease),
        Err(e) => {
            tracing::debug!(%key, error = %e, "could not confirm a held key; checked again next round");
            false
        }
    }
}

/// Deletes, in the background, every key of `listed` under `prefix/` that this locker does
/// not own (its slot is free), guarded by `lease` so that nothing but our own orphan goes.
pub(crate) fn delete_orphans(
    etcd: &Etcd,
    slots: &Slots,
    prefix: &str,
    lease: i64,
    listed: HashSet<String>,
) {
    let under = format!("{prefix}/");
    for key in listed {
        if !key.starts_with(&under) {
            continue;
        }
        // Holding the slot keeps any acquire of this locker off the key while we delete it.
        let Ok(slot) = slots.try_lock(&key) else {
            continue;
        };
        let slot = slot.cleaning();
        tracing::info!(%key, lease = format_args!("{lease:x}"), "deleting a queue key no acquire or lease owns");
        let etcd = etcd.clone();
        tokio::spawn(async move {
            let txn = Txn::new()
                .when([Compare::lease(key.as_str(), CompareOp::Equal, lease)])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            let result = etcd.txn("delete an orphan key", None, txn).await;
            if let Err(e) = result {
                tracing::warn!(%key, error = %e, "deleting an orphan key failed; retried next round");
            }
            drop(slot);
        });
    }
}
