//! [`Locker::inspect`](dlock_core::Locker::inspect) on etcd: one linearizable range read of
//! the name's lock range, then `LeaseTimeToLive` of the holder's lease.
//!
//! The holder is decided as the grant decides it (`Etcd::enqueue`, `Etcd::recheck`): a mutex
//! key holds once no key of the range it waits on was created before it. The mutex waits on
//! its whole range, read, write and permit keys included, so the holder is the range's oldest
//! key when that key is a mutex key; when the oldest is another primitive's (a name used for
//! two primitives), no mutex key holds and every mutex key waits.

use std::time::Duration;

use dlock_core::{Error, FencingToken, HolderState, LockName, LockState};
use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};

use crate::conn::Etcd;
use crate::error;
use crate::keys;
use crate::locker::EtcdLocker;
use crate::queue::Queue;

/// How many times the range is read when the holder's lease is found gone (its keys go with
/// it, so a new read shows the next holder).
const READS: usize = 3;

/// The mutex's queue in a range's keys, oldest (lowest create revision) first: the index of
/// the holding key, if a mutex key holds, and how many mutex keys wait.
fn mutex_queue<'a>(
    q: &Queue,
    keys_by_age: impl IntoIterator<Item = &'a [u8]>,
) -> (Option<usize>, usize) {
    let mut holder = None;
    let mut mutex_keys = 0;
    for (i, key) in keys_by_age.into_iter().enumerate() {
        if keys::is_contender_key(&q.key_range, key) {
            if i == 0 {
                holder = Some(0);
            }
            mutex_keys += 1;
        }
    }
    (holder, mutex_keys - usize::from(holder.is_some()))
}

/// At most how long etcd keeps lease `id`: `Ok(None)` when the lease is gone, `Some(None)` for
/// a key without a lease (kept until deleted).
///
/// etcd reports whole seconds rounded down (`int64(remaining.Seconds())`), so one second is
/// added: the value is never shorter than what the server keeps.
async fn lease_left(etcd: &Etcd, id: i64) -> Result<Option<Option<Duration>>, Error> {
    if id == 0 {
        return Ok(Some(None));
    }
    let ttl = etcd
        .call("lease time-to-live", None, |c| {
            let mut leases = c.lease_client();
            async move {
                match leases.time_to_live(id, None).await {
                    Ok(resp) => Ok(resp.ttl()),
                    Err(e) if error::is_lease_not_found(&e) => Ok(-1),
                    Err(e) => Err(e),
                }
            }
        })
        .await?;
    Ok(u64::try_from(ttl)
        .ok()
        .map(|secs| Some(Duration::from_secs(secs.saturating_add(1)))))
}

impl EtcdLocker {
    /// [`Locker::inspect`](dlock_core::Locker::inspect): the mutex of `name` as etcd holds it.
    pub(crate) async fn inspect_mutex(&self, name: &LockName) -> Result<LockState, Error> {
        let range = self.range_of(name);
        let q = Queue::mutex(range);
        let etcd = &self.inner.etcd;
        let mut read = 0;
        loop {
            read += 1;
            let kvs = self.read_range(&q.ahead).await?;
            let (holder, waiting) = mutex_queue(&q, kvs.iter().map(KeyValue::key));
            let Some(kv) = holder.and_then(|i| kvs.get(i)) else {
                return Ok(LockState::new(None, Some(waiting)));
            };
            let expires_within = match lease_left(etcd, kv.lease()).await? {
                Some(left) => left,
                // The holder's lease ended after our read: read the range again.
                None if read < READS => continue,
                // Still the same view: the key is being deleted with its lease.
                None => Some(Duration::ZERO),
            };
            let holder = HolderState::new(
                u64::try_from(kv.create_revision()).ok().map(FencingToken),
                String::from_utf8_lossy(kv.key()),
                String::from_utf8_lossy(kv.value()),
                expires_within,
            );
            return Ok(LockState::new(Some(holder), Some(waiting)));
        }
    }

    /// Every key of `range`, oldest first: one linearizable range read.
    async fn read_range(&self, range: &str) -> Result<Vec<KeyValue>, Error> {
        let by_age = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let resp = self
            .inner
            .etcd
            .call("inspect read", None, |c| {
                let (mut kv, by_age) = (c.kv_client(), by_age.clone());
                async move { kv.get(range, Some(by_age)).await }
            })
            .await?;
        Ok(resp.kvs().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(keys: &[&str]) -> (Option<usize>, usize) {
        let q = Queue::mutex("p/n/".to_owned());
        mutex_queue(&q, keys.iter().map(|k| k.as_bytes()))
    }

    #[test]
    fn the_oldest_mutex_key_holds_and_the_others_wait() {
        assert_eq!(queue(&[]), (None, 0));
        assert_eq!(queue(&["p/n/a1"]), (Some(0), 0));
        assert_eq!(queue(&["p/n/a1", "p/n/b2", "p/n/c3"]), (Some(0), 2));
    }

    #[test]
    fn an_older_key_of_another_primitive_blocks_the_mutex() {
        // A reader came first: the mutex waits on it, so no mutex key holds.
        assert_eq!(queue(&["p/n/read/1/a1", "p/n/b2", "p/n/c3"]), (None, 2));
        // Family keys behind the holder are not the mutex's waiters.
        assert_eq!(
            queue(&["p/n/a1", "p/n/permit/2/b2", "p/n/write/3/c3"]),
            (Some(0), 0)
        );
    }
}
