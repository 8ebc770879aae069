//! The queue's requests: the put and re-read every queue's enqueue shares (the semaphore's
//! are in `semaphore/permits.rs`), and the mutex's, reader's and writer's enqueue and re-check.

use dlock_core::Error;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use tokio::time::Instant;

use crate::conn::{Etcd, get_kvs, header_revision};
use crate::error;
use crate::queue::{Queue, Rule};

/// What the enqueue transaction found.
#[derive(Debug)]
pub(crate) struct Enqueued {
    /// Our key's create revision (the fencing token once we own the lock).
    pub(crate) rev: i64,
    /// The store revision the reads were made at.
    pub(crate) header_rev: i64,
    /// What we wait behind (`None`: we hold).
    pub(crate) behind: Option<Behind>,
}

/// What a queued key waits behind.
#[derive(Debug)]
pub(crate) enum Behind {
    /// The newest key created before ours in the queue's `ahead` range (mutex, reader,
    /// writer): we hold once no such key is left.
    Key(String),
    /// This many keys of a semaphore were created before ours, as many as its permits or
    /// more: we hold once fewer are left.
    Permits(u64),
}

/// How the enqueue transaction ended.
#[derive(Debug)]
pub(crate) enum Enqueue {
    /// Our key is in the queue.
    Queued(Enqueued),
    /// etcd no longer knows our session lease (expired or revoked): no key of the session can
    /// exist, so the session is over and a new one must queue.
    SessionGone,
    /// Our key existed from an earlier request but vanished before we could read its place:
    /// queue again.
    KeyGone,
    /// Our key asks for something the queue refuses (a semaphore's permit count that differs
    /// from the one it is held with): fail. `rev`: our key's create revision when it exists
    /// (delete it first); `None` when it was never created.
    Refused { rev: Option<i64>, reason: String },
}

/// What re-checking after a wake-up found.
#[derive(Debug)]
pub(crate) enum Recheck {
    /// Our key is gone (lease expired or the key was deleted).
    KeyGone,
    /// No key below ours: we own the lock.
    Owner,
    /// Still waiting behind this key; the reads were made at `header_rev`.
    Behind {
        predecessor: String,
        header_rev: i64,
    },
}

/// How an enqueue transaction's put ended (see [`Etcd::put_unless_exists`]).
#[derive(Debug)]
pub(crate) enum Put {
    /// We created our key: its create revision is `header_rev`, the revision the reads were
    /// made at; `ops` holds the put's result, then the reads' results.
    Created {
        header_rev: i64,
        ops: Vec<TxnOpResponse>,
    },
    /// Our key existed already (a retried request of ours, or an older queue entry of this
    /// session), created at `rev`; the transaction ran at `header_rev`.
    Existed { rev: i64, header_rev: i64 },
    /// etcd no longer knows our session lease (see [`Enqueue::SessionGone`]).
    SessionGone,
}

impl Etcd {
    /// One transaction: create our `key` (carrying `value`) under the session lease unless it
    /// exists, and run `reads` in the same round trip; if it exists, read it (to keep its
    /// place, as etcd's `concurrency.Mutex` does). The mutex's, the read-write lock's and the
    /// semaphore's enqueue share it.
    ///
    /// A put under a lease etcd no longer knows fails with "lease not found": that is
    /// [`Put::SessionGone`], not an error (an operator revoked the lease, or it expired before
    /// our keep-alive told us).
    pub(crate) async fn put_unless_exists(
        &self,
        what: &str,
        key: &str,
        value: &[u8],
        lease: i64,
        reads: impl IntoIterator<Item = TxnOp>,
        deadline: Option<Instant>,
    ) -> Result<Put, Error> {
        let mut ops = vec![TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(lease)),
        )];
        ops.extend(reads);
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(ops)
            .or_else([TxnOp::get(key, None)]);
        let Some(resp) = self.txn_on_lease(what, txn, deadline).await? else {
            return Ok(Put::SessionGone);
        };
        let header_rev =
            header_revision(&resp).ok_or_else(|| error::unexpected(what, "no header"))?;
        let ops = resp.op_responses();
        if resp.succeeded() {
            return Ok(Put::Created { header_rev, ops });
        }
        let kvs = get_kvs(&ops, 0).ok_or_else(|| error::unexpected(what, "no key result"))?;
        let rev = kvs
            .first()
            .map(KeyValue::create_revision)
            .ok_or_else(|| error::unexpected(what, "compare failed but our key is absent"))?;
        Ok(Put::Existed { rev, header_rev })
    }

    /// Runs a transaction that may put under a session lease: `None` when etcd no longer
    /// knows the lease ("lease not found"; see [`Put::SessionGone`]).
    ///
    /// # Errors
    /// As [`Etcd::call`].
    pub(crate) async fn txn_on_lease(
        &self,
        what: &str,
        txn: Txn,
        deadline: Option<Instant>,
    ) -> Result<Option<TxnResponse>, Error> {
        self.call(what, deadline, |c| {
            let (mut kv, txn) = (c.kv_client(), txn.clone());
            async move {
                match kv.txn(txn).await {
                    Ok(resp) => Ok(Some(resp)),
                    Err(e) if error::is_lease_not_found(&e) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        })
        .await
    }

    /// One read-only transaction: our `key` (keys only), then `reads`. `None` when our key is
    /// gone (or is no longer the one created at `rev`); otherwise the revision the reads were
    /// made at and every result (our key's at 0, then the reads').
    pub(crate) async fn read_with_ours(
        &self,
        what: &str,
        key: &str,
        rev: i64,
        reads: impl IntoIterator<Item = TxnOp>,
        deadline: Option<Instant>,
    ) -> Result<Option<(i64, Vec<TxnOpResponse>)>, Error> {
        let mut ops = vec![TxnOp::get(key, Some(GetOptions::new().with_keys_only()))];
        ops.extend(reads);
        let resp = self.txn(what, deadline, Txn::new().and_then(ops)).await?;
        let header_rev =
            header_revision(&resp).ok_or_else(|| error::unexpected(what, "no header"))?;
        let ops = resp.op_responses();
        let mine = get_kvs(&ops, 0).ok_or_else(|| error::unexpected(what, "no key result"))?;
        if mine.first().is_none_or(|kv| kv.create_revision() != rev) {
            return Ok(None);
        }
        Ok(Some((header_rev, ops)))
    }

    /// One transaction: create our key under the session lease unless it exists, and read the
    /// contenders around it. Same compare and branches as etcd's `concurrency.Mutex`, plus the
    /// predecessor read in the same round trip (see [`Etcd::put_unless_exists`]).
    ///
    /// A semaphore's queue is enqueued by [`Etcd::enqueue_permits`]. For a reader, whose key
    /// lies outside the range it waits on, the newest key of that range is its predecessor.
    pub(crate) async fn enqueue(
        &self,
        q: &Queue,
        key: &str,
        lease: i64,
        deadline: Option<Instant>,
        value: &[u8],
    ) -> Result<Enqueue, Error> {
        const WHAT: &str = "enqueue transaction";
        if let Rule::Permits(permits) = q.rule {
            return self
                .enqueue_permits(&q.ahead, key, lease, deadline, value, permits)
                .await;
        }
        let range = q.ahead.as_str();
        // Whether our key is one of the range it waits on (all but a reader's).
        let in_range = key.starts_with(range);
        // After our put, our key has the highest create revision in the range: the two newest
        // keys are ours and our predecessor.
        let newest_two = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(2);
        let reads = [TxnOp::get(range, Some(newest_two))];
        match self
            .put_unless_exists(WHAT, key, value, lease, reads, deadline)
            .await?
        {
            Put::SessionGone => Ok(Enqueue::SessionGone),
            Put::Created { header_rev, ops } => {
                let kvs =
                    get_kvs(&ops, 1).ok_or_else(|| error::unexpected(WHAT, "no range result"))?;
                let rev = header_rev;
                let before = if in_range {
                    let mine = kvs
                        .first()
                        .ok_or_else(|| error::unexpected(WHAT, "our key is missing"))?;
                    if mine.key() != key.as_bytes() || mine.create_revision() != rev {
                        return Err(error::unexpected(
                            WHAT,
                            "our key is not the newest in its range",
                        ));
                    }
                    kvs.get(1)
                } else {
                    kvs.first()
                };
                let behind =
                    before.map(|kv| Behind::Key(String::from_utf8_lossy(kv.key()).into_owned()));
                Ok(Enqueue::Queued(Enqueued {
                    rev,
                    header_rev,
                    behind,
                }))
            }
            // Our key exists already (a retried request of ours, or an older queue entry of
            // this session): keep its place, as etcd's Mutex does.
            Put::Existed { rev, header_rev } => {
                Ok(match self.recheck(range, key, rev, deadline).await? {
                    Recheck::KeyGone => Enqueue::KeyGone,
                    Recheck::Owner => Enqueue::Queued(Enqueued {
                        rev,
                        header_rev,
                        behind: None,
                    }),
                    Recheck::Behind {
                        predecessor,
                        header_rev,
                    } => Enqueue::Queued(Enqueued {
                        rev,
                        header_rev,
                        behind: Some(Behind::Key(predecessor)),
                    }),
                })
            }
        }
    }

    /// One read-only transaction: does our key still exist with our revision, and which key is
    /// the newest below it.
    pub(crate) async fn recheck(
        &self,
        range: &str,
        key: &str,
        rev: i64,
        deadline: Option<Instant>,
    ) -> Result<Recheck, Error> {
        const WHAT: &str = "re-check transaction";
        let below_us = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_max_create_revision(rev.saturating_sub(1))
            .with_limit(1)
            .with_keys_only();
        let reads = [TxnOp::get(range, Some(below_us))];
        let Some((header_rev, ops)) = self.read_with_ours(WHAT, key, rev, reads, deadline).await?
        else {
            return Ok(Recheck::KeyGone);
        };
        let below = get_kvs(&ops, 1).ok_or_else(|| error::unexpected(WHAT, "no range result"))?;
        Ok(match below.first() {
            None => Recheck::Owner,
            Some(kv) => Recheck::Behind {
                predecessor: String::from_utf8_lossy(kv.key()).into_owned(),
                header_rev,
            },
        })
    }
}
