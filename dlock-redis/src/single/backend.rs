//! The single-node renewal backend: batched compare-and-PEXPIRE (mutex keys) and
//! compare-and-re-score (read-write and semaphore holders) in one round trip, and guarded
//! release.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{Counters, Error, LossReason, RenewBackend, Renewal};

use crate::conn::{Node, millis};
use crate::family_scripts;
use crate::keys::{FamilyKeys, Keys};
use crate::scripts::{self, scripts};

/// What a held lease holds at the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The mutex key `keys.lock`, holding `owner`.
    Lock,
    /// The member `owner` of the name's holders set (a read, write or permit lease).
    Holder,
}

/// One held lease: its keys, our owner value (for a [`Slot::Holder`]: our member) and what it
/// holds.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) keys: Keys,
    pub(crate) owner: String,
    pub(crate) slot: Slot,
}

/// Renews and releases the leases of one [`RedisLocker`](crate::RedisLocker).
pub(crate) struct SingleBackend {
    pub(crate) node: Node,
    pub(crate) ttl: Duration,
    pub(crate) fair: bool,
    pub(crate) channel_prefix: String,
    pub(crate) request_timeout: Duration,
    pub(crate) counters: Arc<Counters>,
}

impl SingleBackend {
    /// Compare-and-delete; in fair mode also notifies the head waiter.
    pub(crate) async fn release_keys(&self, keys: &Keys, owner: &str) -> Result<bool, Error> {
        let s = scripts();
        let deleted: i64 = if self.fair {
            let mut inv = s.release_fair.prepare_invoke();
            inv.key(&keys.lock)
                .key(&keys.queue)
                .key(&keys.deadlines)
                .arg(owner)
                .arg(&self.channel_prefix)
                .arg(millis(self.ttl));
            self.node
                .invoke("release", &inv, self.request_timeout, &self.counters)
                .await?
        } else {
            let mut inv = s.release_plain.prepare_invoke();
            inv.key(&keys.lock).arg(owner);
            self.node
                .invoke("release", &inv, self.request_timeout, &self.counters)
                .await?
        };
        Ok(deleted == 1)
    }

    /// Withdraws a mutex waiter: its queue entry; if the lock is ours (an unseen grant) or
    /// reserved for us, passes it on; if we were the head, tells the new head.
    pub(crate) async fn withdraw_waiter(
        &self,
        keys: &Keys,
        owner: &str,
        entry: &str,
    ) -> Result<(), Error> {
        let mut inv = scripts().withdraw.prepare_invoke();
        inv.key(&keys.lock)
            .key(&keys.queue)
            .key(&keys.deadlines)
            .arg(owner)
            .arg(entry)
            .arg(&self.channel_prefix)
            .arg(millis(self.ttl));
        self.node
            .invoke::<i64>("withdraw", &inv, self.request_timeout, &self.counters)
            .await
            .map(|_| ())
    }

    /// Guarded release of a holder `member`; tells the queued requests that may go now.
    pub(crate) async fn release_member(
        &self,
        keys: &FamilyKeys,
        member: &str,
    ) -> Result<bool, Error> {
        let mut inv = family_scripts::family_scripts().release.prepare_invoke();
        inv.key(&keys.holders)
            .key(&keys.queue)
            .key(&keys.deadlines)
            .arg(member)
            .arg(&self.channel_prefix);
        let deleted: i64 = self
            .node
            .invoke("release", &inv, self.request_timeout, &self.counters)
            .await?;
        Ok(deleted == 1)
    }

    /// Withdraws a family request: its queue entry, and its member if an unseen grant added it.
    pub(crate) async fn withdraw_member(
        &self,
        keys: &FamilyKeys,
        member: &str,
        entry: &str,
    ) -> Result<(), Error> {
        let mut inv = family_scripts::family_scripts().withdraw.prepare_invoke();
        inv.key(&keys.holders)
            .key(&keys.queue)
            .key(&keys.deadlines)
            .arg(member)
            .arg(entry)
            .arg(&self.channel_prefix);
        self.node
            .invoke::<i64>("withdraw", &inv, self.request_timeout, &self.counters)
            .await
            .map(|_| ())
    }
}

fn wrong_length(node: &str) -> Error {
    Error::backend(
        format!("unexpected reply to renew from {node}: wrong length"),
        None,
    )
}

#[async_trait]
impl RenewBackend for SingleBackend {
    type Entry = Held;

    async fn renew(&self, entries: &[Arc<Held>]) -> Result<Vec<Renewal>, Error> {
        // ONE round trip over every held lease (chunked script calls in one pipeline): the
        // mutex keys first, then the holders of read-write locks and semaphores.
        let (locks, members): (Vec<usize>, Vec<usize>) =
            (0..entries.len()).partition(|&i| entries[i].slot == Slot::Lock);
        let mut pipe = scripts::renew_pipeline(
            millis(self.ttl),
            locks
                .iter()
                .map(|&i| (entries[i].keys.lock.as_str(), entries[i].owner.as_str())),
        );
        let lock_chunks = locks.len().div_ceil(scripts::RENEW_CHUNK);
        let holders: Vec<(String, &str)> = members
            .iter()
            .map(|&i| {
                let e = &entries[i];
                (FamilyKeys::of(&e.keys).holders, e.owner.as_str())
            })
            .collect();
        if !holders.is_empty() {
            let pairs: Vec<(&str, &str)> = holders.iter().map(|(k, m)| (k.as_str(), *m)).collect();
            family_scripts::add_renewals(&mut pipe, millis(self.ttl), &pairs);
        }
        // The driver bounds the call by the leases' remaining validity.
        let mut chunks: Vec<Vec<i64>> = self
            .node
            .pipeline("renew", &pipe, self.ttl, &self.counters)
            .await?;
        if chunks.len() < lock_chunks {
            return Err(wrong_length(&self.node.display));
        }
        let member_chunks = chunks.split_off(lock_chunks);
        let lock_replies = scripts::flatten_renewals(chunks, locks.len())
            .ok_or_else(|| wrong_length(&self.node.display))?;
        let member_replies = scripts::flatten_renewals(member_chunks, members.len())
            .ok_or_else(|| wrong_length(&self.node.display))?;
        let mut out = vec![Renewal::Retry; entries.len()];
        for (i, r) in locks.into_iter().zip(lock_replies) {
            out[i] = if r == 1 {
                Renewal::Extended
            } else {
                Renewal::Lost(LossReason::Gone(
                    "the lock key is gone or holds another owner".into(),
                ))
            };
        }
        for (i, r) in members.into_iter().zip(member_replies) {
            out[i] = if r == 1 {
                Renewal::Extended
            } else {
                Renewal::Lost(LossReason::Gone(
                    "the holder's entry is gone or expired".into(),
                ))
            };
        }
        Ok(out)
    }

    async fn release(&self, entry: &Held) -> Result<(), Error> {
        match entry.slot {
            Slot::Lock => self.release_keys(&entry.keys, &entry.owner).await,
            Slot::Holder => {
                self.release_member(&FamilyKeys::of(&entry.keys), &entry.owner)
                    .await
            }
        }
        .map(|_| ())
    }
}
