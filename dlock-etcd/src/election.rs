//! [`Election`] on etcd, in the layout of etcd's own `concurrency.Election` (and `etcdctl
//! elect`), which is the `concurrency.Mutex` layout: each campaigner puts ONE key
//! `<prefix>/<name>/<session lease hex>` whose value is its proclamation; the key with the
//! lowest create revision leads, and that revision is its term (the lock's fencing token).
//!
//! Observing reads the whole range at one revision, then watches it from the next revision
//! on: every event is applied in revision order to a local copy of the range, and the leader
//! is recomputed after each revision, so every leader and every proclamation is seen, in
//! order — a proclamation of the value the leader already has too, as dlock-zk reports it
//! (a put on the leader's key on the lease it has). A put that only moves the key to another
//! lease (the session moved to a lease of a new raft term, see `relocate.rs`) is no
//! proclamation and is not reported. A compacted or cancelled watch fails the observation
//! (nothing is skipped silently).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use async_trait::async_trait;
use dlock_core::backend::{ElectionBackend, Proclaim, leadership};
use dlock_core::{
    AcquireOptions, Error, FencingToken, Leader, LeaderChanges, Leadership, Lease, LockName,
    LossReason,
};
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchOptions, WatchStream,
};

use crate::conn::Etcd;
use crate::error;
use crate::locker::EtcdLocker;

/// Writes a leader's value: a put on its key, only while the key still has the create
/// revision it led with, keeping the key's lease.
struct EtcdProclaim {
    etcd: Etcd,
    key: String,
    rev: i64,
}

#[async_trait]
impl Proclaim for EtcdProclaim {
    async fn proclaim(&self, lease: &Lease, value: &[u8]) -> Result<(), Error> {
        let put = PutOptions::new().with_ignore_lease();
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::put(self.key.as_str(), value, Some(put))]);
        let resp = self.etcd.txn("proclaim", None, txn).await?;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(Error::Lost(LossReason::Gone(format!(
                "{}: etcd key {} is gone or re-created",
                lease.name(),
                self.key
            ))))
        }
    }
}

/// One key of an election's range: the key, its value and its lease.
type Entry = (String, Vec<u8>, i64);

/// The first key (lowest create revision) of `kvs`, as a leader.
fn first(range: &BTreeMap<i64, Entry>) -> Option<Leader> {
    range.iter().next().map(|(rev, (_, value, _))| Leader {
        term: FencingToken(rev.unsigned_abs()),
        value: value.clone(),
    })
}

/// One observation: the range as of the last applied revision, and the watch from there.
struct EtcdChanges {
    stream: WatchStream,
    /// Create revision → (key, value, lease), for every key of the range.
    range: BTreeMap<i64, Entry>,
    /// Key → create revision.
    revs: HashMap<String, i64>,
    /// The last leader reported (or found at the start).
    last: Option<Leader>,
    /// Changes found and not yet returned.
    pending: VecDeque<Leader>,
}

impl EtcdChanges {
    /// Applies the events of one revision; queues a change when the leader or its value
    /// differs from the last one, or when the leader proclaimed (its key was written again on
    /// the lease it has, whatever the value).
    fn apply(&mut self, events: &[etcd_client::Event]) {
        // Create revisions of keys written again on their own lease in this revision.
        let mut proclaimed = Vec::new();
        for ev in events {
            let Some(kv) = ev.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            match ev.event_type() {
                EventType::Put => {
                    let rev = kv.create_revision();
                    if let Some(old) = self.revs.insert(key.clone(), rev)
                        && old != rev
                    {
                        self.range.remove(&old);
                    }
                    if self
                        .range
                        .get(&rev)
                        .is_some_and(|(_, _, lease)| *lease == kv.lease())
                    {
                        proclaimed.push(rev);
                    }
                    self.range
                        .insert(rev, (key, kv.value().to_vec(), kv.lease()));
                }
                EventType::Delete => {
                    if let Some(rev) = self.revs.remove(&key) {
                        self.range.remove(&rev);
                    }
                }
            }
        }
        let now = first(&self.range);
        let leader_proclaimed = now.as_ref().is_some_and(|l| {
            self.last.as_ref().is_some_and(|last| last.term == l.term)
                && proclaimed
                    .iter()
                    .any(|&rev| rev.unsigned_abs() == l.term.get())
        });
        if now.is_some() && (now != self.last || leader_proclaimed) {
            self.pending.extend(now.clone());
        }
        self.last = now;
    }
}

#[async_trait]
impl LeaderChanges for EtcdChanges {
    async fn next(&mut self) -> Result<Leader, Error> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Ok(change);
            }
            let resp = self
                .stream
                .message()
                .await
                .map_err(|e| error::map("election watch", e))?;
            let Some(resp) = resp else {
                return Err(Error::unavailable(
                    "election watch: the stream ended; changes may have been missed",
                    None,
                ));
            };
            if resp.canceled() || resp.compact_revision() > 0 {
                return Err(Error::unavailable(
                    format!(
                        "election watch cancelled (compacted at revision {}); changes may have been missed",
                        resp.compact_revision()
                    ),
                    None,
                ));
            }
            // Apply revision by revision: a leader that came and went within one response is
            // still reported.
            let events = resp.events();
            let mut start = 0;
            while start < events.len() {
                let rev = events[start]
                    .kv()
                    .map_or(0, etcd_client::KeyValue::mod_revision);
                let mut end = start + 1;
                while end < events.len()
                    && events[end]
                        .kv()
                        .map_or(0, etcd_client::KeyValue::mod_revision)
                        == rev
                {
                    end += 1;
                }
                self.apply(&events[start..end]);
                start = end;
            }
        }
    }
}

#[async_trait]
impl ElectionBackend for EtcdLocker {
    async fn run_campaign(
        &self,
        name: &LockName,
        value: &[u8],
        opts: AcquireOptions,
    ) -> Result<Leadership, Error> {
        let Some((lease, key)) = self.lock_mutex(name, opts.wait, false, value).await? else {
            return Err(error::unexpected("campaign", "no lease after waiting"));
        };
        let rev = i64::try_from(lease.token().get())
            .map_err(|_| error::unexpected("campaign", "token out of range"))?;
        let proclaim = EtcdProclaim {
            etcd: self.inner.etcd.clone(),
            key,
            rev,
        };
        Ok(leadership(lease, Arc::new(proclaim)))
    }

    async fn read_leader(&self, name: &LockName) -> Result<Option<Leader>, Error> {
        let range = self.range_of(name);
        let opts = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let resp = self
            .inner
            .etcd
            .call("leader read", None, |c| {
                let (mut kv, range, opts) = (c.kv_client(), range.clone(), opts.clone());
                async move { kv.get(range, Some(opts)).await }
            })
            .await?;
        Ok(resp.kvs().first().map(|kv| Leader {
            term: FencingToken(kv.create_revision().unsigned_abs()),
            value: kv.value().to_vec(),
        }))
    }

    async fn follow(&self, name: &LockName) -> Result<Box<dyn LeaderChanges>, Error> {
        let range = self.range_of(name);
        let etcd = &self.inner.etcd;
        let resp = etcd
            .call("election read", None, |c| {
                let (mut kv, range) = (c.kv_client(), range.clone());
                async move { kv.get(range, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let at = resp
            .header()
            .map(etcd_client::ResponseHeader::revision)
            .ok_or_else(|| error::unexpected("election read", "no header"))?;
        let mut changes_range = BTreeMap::new();
        let mut revs = HashMap::new();
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            revs.insert(key.clone(), kv.create_revision());
            changes_range.insert(kv.create_revision(), (key, kv.value().to_vec(), kv.lease()));
        }
        let member = etcd.members.preferred();
        let client = etcd
            .members
            .client(member)
            .await
            .map_err(|e| error::map("election watch", e))?;
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(at + 1);
        let stream = tokio::time::timeout(etcd.request_timeout, async {
            client
                .watch_client()
                .watch(range.as_str(), Some(opts))
                .await
        })
        .await
        .map_err(|_| error::no_reply("election watch", etcd.request_timeout))?
        .map_err(|e| error::map("election watch", e))?;
        let last = first(&changes_range);
        Ok(Box::new(EtcdChanges {
            stream,
            range: changes_range,
            revs,
            pending: last.clone().into_iter().collect(),
            last,
        }))
    }
}
