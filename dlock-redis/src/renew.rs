//! `RenewBackend` for `RedisLocker`: renewal rounds of batched compare-and-PEXPIRE (mutex
//! keys) and compare-and-re-score (read-write and semaphore holders) in one round trip (one
//! per master on a cluster), and guarded release.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Background, Counters, RenewBackend, Renewal};
use dlock_core::{Error, LossReason};

use crate::conn::{Node, key_slot, millis};
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
    /// On a Redis Cluster: which master serves each slot, as last read, and when (`None` until
    /// the first renewal, and again after a renewal request failed: the next round reads it
    /// again; also read again once [`SLOT_MAP_MAX_AGE`] old).
    pub(crate) slot_map: std::sync::Mutex<Option<(tokio::time::Instant, Arc<SlotMap>)>>,
    /// The locker's background work (shared with its renewal driver, whose `close` waits for
    /// it): cancelled requests' withdrawals.
    pub(crate) background: Background,
}

/// How long a cluster's slot map is used before the next renewal round reads it again: a
/// resharding whose redirects the cluster connection follows (the round succeeds, at the cost of
/// an extra round trip to a master every round) is noticed within this time. One request.
pub(crate) const SLOT_MAP_MAX_AGE: Duration = Duration::from_secs(30);

/// Which master serves each cluster slot (`CLUSTER SLOTS`): the renewal batch is grouped by
/// master, one round trip each.
#[derive(Debug)]
pub(crate) struct SlotMap {
    /// Per slot: the index of its master in `masters`, `u32::MAX` when no master serves it.
    owner: Vec<u32>,
    masters: Vec<String>,
}

impl SlotMap {
    fn new(ranges: &[(u16, u16, String)]) -> Self {
        let mut owner = vec![u32::MAX; 16384];
        let mut masters: Vec<String> = Vec::new();
        for (start, end, addr) in ranges {
            let i = match masters.iter().position(|m| m == addr) {
                Some(i) => i,
                None => {
                    masters.push(addr.clone());
                    masters.len() - 1
                }
            };
            for slot in *start..=(*end).min(16383) {
                owner[usize::from(slot)] = u32::try_from(i).unwrap_or(u32::MAX);
            }
        }
        SlotMap { owner, masters }
    }

    /// The master serving `slot` (`None` when none does, as far as the map knows).
    fn master(&self, slot: u16) -> Option<&str> {
        let i = *self.owner.get(usize::from(slot))?;
        self.masters
            .get(usize::try_from(i).ok()?)
            .map(String::as_str)
    }
}

/// The leases of one slot in a cluster renewal: indexes into the batch, mutex keys and
/// holders apart.
#[derive(Default)]
struct SlotLeases {
    locks: Vec<usize>,
    members: Vec<usize>,
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
                .key(&keys.fence)
                .arg(owner)
                .arg(&self.channel_prefix)
                .arg(millis(self.ttl))
                .arg(scripts::fence_lifetime_ms());
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
            .key(&keys.fence)
            .arg(owner)
            .arg(entry)
            .arg(&self.channel_prefix)
            .arg(millis(self.ttl))
            .arg(scripts::fence_lifetime_ms());
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

/// The verdict of one renewal script reply (`1`: still ours, extended) on a lease holding
/// `slot`: the single-node and the cluster rounds both read their replies with it.
fn verdict(reply: i64, slot: Slot) -> Renewal {
    match (reply, slot) {
        (1, _) => Renewal::Extended,
        (_, Slot::Lock) => Renewal::Lost(LossReason::Gone(
            "the lock key is gone or holds another owner".into(),
        )),
        (_, Slot::Holder) => Renewal::Lost(LossReason::Gone(
            "the holder's entry is gone or expired".into(),
        )),
    }
}

fn wrong_length(node: &str) -> Error {
    Error::backend(
        format!("unexpected reply to renew from {node}: wrong length"),
        None,
    )
}

impl SingleBackend {
    /// The cluster's slot map: the last one read, or a new read (one request).
    async fn slot_map(&self) -> Result<Arc<SlotMap>, Error> {
        let known = self
            .slot_map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some((read_at, map)) = &known
            && read_at.elapsed() < SLOT_MAP_MAX_AGE
        {
            return Ok(Arc::clone(map));
        }
        // The read goes to any node, possibly the one that is down or frozen: a failed read
        // keeps the last map (a moved slot is still followed by the client's redirects), so
        // it never fails the other masters' renewals (a_frozen_master_does_not_cost_the_other_
        // masters_leases lost a live master's lease that way when the read hit the frozen one).
        // Within the same half-period bound as a master's renewal (see `renew_cluster`): the
        // read precedes the round's requests, so a read stuck on a frozen node delayed every
        // master's renewal by the whole request timeout.
        let ranges = match self
            .node
            .cluster_slots(self.request_timeout.min(self.ttl / 6), &self.counters)
            .await
        {
            Ok(ranges) => ranges,
            Err(e) => match known {
                Some((_, map)) => {
                    tracing::debug!(error = %e, "cannot read the slot map; renewing with the last one");
                    return Ok(map);
                }
                None => return Err(e),
            },
        };
        let map = Arc::new(SlotMap::new(&ranges));
        *self.slot_map.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((tokio::time::Instant::now(), Arc::clone(&map)));
        Ok(map)
    }

    /// Cluster renewal: the batch grouped by the master of each lease's slot, ONE round trip
    /// per master (a pipeline of one script call per slot, chunked like the single-server
    /// batch), all masters at once, each within the request timeout. A master whose request fails (down, slow, a slot moved
    /// away) leaves its leases undecided ([`Renewal::Retry`]: the driver retries them within
    /// their validity, and they are lost at their deadline at the latest) and makes the next
    /// round read the slot map again.
    async fn renew_cluster(&self, entries: &[Arc<Held>]) -> Result<Vec<Renewal>, Error> {
        use std::collections::BTreeMap;
        let map = self.slot_map().await?;
        let keys: Vec<String> = entries
            .iter()
            .map(|e| match e.slot {
                Slot::Lock => e.keys.lock.clone(),
                Slot::Holder => FamilyKeys::of(&e.keys).holders,
            })
            .collect();
        // master (or `?<slot>` for a slot no master serves in the map) → slot → leases
        let mut groups: BTreeMap<String, BTreeMap<u16, SlotLeases>> = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = key_slot(key);
            let master = match map.master(slot) {
                Some(m) => m.to_owned(),
                None => format!("?{slot}"),
            };
            let leases = groups.entry(master).or_default().entry(slot).or_default();
            match entries[i].slot {
                Slot::Lock => leases.locks.push(i),
                Slot::Holder => leases.members.push(i),
            }
        }
        let ttl_ms = millis(self.ttl);
        let requests = groups.into_iter().map(|(master, slots)| {
            let mut pipe = redis::pipe();
            let any_locks = slots.values().any(|s| !s.locks.is_empty());
            let any_members = slots.values().any(|s| !s.members.is_empty());
            // Loaded first (replies ignored): no NOSCRIPT inside the pipeline.
            if any_locks {
                pipe.load_script(&scripts().renew).ignore();
            }
            if any_members {
                pipe.load_script(&family_scripts::family_scripts().renew)
                    .ignore();
            }
            // One reply per call: the batch indexes it answers for.
            let mut calls: Vec<Vec<usize>> = Vec::new();
            let first_slot = slots.keys().next().copied().unwrap_or(0);
            for leases in slots.values() {
                for (list, script) in [
                    (&leases.locks, &scripts().renew),
                    (&leases.members, &family_scripts::family_scripts().renew),
                ] {
                    for chunk in list.chunks(scripts::RENEW_CHUNK) {
                        let mut inv = script.prepare_invoke();
                        inv.arg(ttl_ms);
                        for &i in chunk {
                            inv.key(keys[i].as_str());
                        }
                        for &i in chunk {
                            inv.arg(entries[i].owner.as_str());
                        }
                        pipe.invoke_script(&inv);
                        calls.push(chunk.to_vec());
                    }
                }
            }
            async move {
                // Each master within half a renewal period (TTL/6) at most, not the leases'
                // validity nor the whole request timeout: the round settles when the slowest
                // master answers, and a lease stays out of the next regular round while its
                // round is in flight. A frozen master held rounds for the request timeout
                // (TTL/3, one period), so the live masters' leases missed every other round and
                // were renewed only every ~2 periods + TTL/3, past their validity
                // (a_frozen_master_does_not_cost_the_other_masters_leases: 3 of 10 runs at 24
                // test threads, also with the client's response timeout set). A master slower
                // than this leaves its leases undecided: retried at once, lost at the deadline.
                let budget = self.request_timeout.min(self.ttl / 6);
                let replies: Result<Vec<Vec<i64>>, Error> = self
                    .node
                    .pipeline_to_slot("renew", &pipe, first_slot, budget, &self.counters)
                    .await;
                (master, calls, replies)
            }
        });
        let results = futures::future::join_all(requests).await;
        let mut out = vec![Renewal::Retry; entries.len()];
        let mut failed = None;
        let mut any_ok = false;
        for (master, calls, replies) in results {
            let replies = match replies {
                Ok(r) if r.len() == calls.len() => r,
                Ok(_) => {
                    failed = Some(wrong_length(&master));
                    continue;
                }
                Err(e) => {
                    tracing::debug!(master, error = %e, "cluster renewal on one master failed");
                    failed = Some(e);
                    continue;
                }
            };
            any_ok = true;
            for (call, reply) in calls.iter().zip(replies) {
                if reply.len() != call.len() {
                    failed = Some(wrong_length(&master));
                    continue;
                }
                for (&i, r) in call.iter().zip(reply) {
                    out[i] = verdict(r, entries[i].slot);
                }
            }
        }
        if let Some(e) = failed {
            // Read the slot map again next round (keeping this one in case that read fails).
            if let Some((read_at, _)) = self
                .slot_map
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
            {
                *read_at = read_at.checked_sub(SLOT_MAP_MAX_AGE).unwrap_or(*read_at);
            }
            if !any_ok {
                return Err(e);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl RenewBackend for SingleBackend {
    type Entry = Held;

    async fn renew(&self, entries: &[Arc<Held>]) -> Result<Vec<Renewal>, Error> {
        if self.node.is_cluster() {
            return self.renew_cluster(entries).await;
        }
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
        let replies = locks.into_iter().zip(lock_replies);
        for (i, r) in replies.chain(members.into_iter().zip(member_replies)) {
            out[i] = verdict(r, entries[i].slot);
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
