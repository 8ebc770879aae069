//! The etcd requests of the lock algorithm, each bounded by a timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Counters, Error};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::time::Instant;

use crate::errors;
use crate::members::Members;
use crate::queue::{Queue, Rule};

/// The etcd clients with the locker's request timeout and counters.
#[derive(Clone)]
pub(crate) struct Etcd {
    /// The balanced client over every endpoint (handed to users).
    pub(crate) client: Client,
    /// One client per member: the locker's own requests go to one member at a time.
    pub(crate) members: Arc<Members>,
    pub(crate) request_timeout: Duration,
    /// The cap of one attempt of a request: beyond it the member counts as hung and the next
    /// attempt goes to another member.
    pub(crate) attempt_cap: Duration,
    pub(crate) counters: Arc<Counters>,
    /// Whether the client authenticates (user and password): a stale token is refreshed.
    pub(crate) authenticates: bool,
    /// When a request last got a reply from etcd (tells a wait that ended while etcd was
    /// answering from one cut short by an outage).
    pub(crate) last_reply: Arc<std::sync::Mutex<Option<Instant>>>,
}

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
    /// Our key (created at `rev`) asks for something the queue refuses (a semaphore's permit
    /// count that differs from the one it is held with): delete it and fail.
    Refused { rev: i64, reason: String },
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

impl Etcd {
    /// Notes that etcd answered a request just now.
    fn replied(&self) {
        *self.last_reply.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// Whether etcd answered some request of this locker at or after `since`.
    pub(crate) fn replied_since(&self, since: Instant) -> bool {
        self.last_reply
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at >= since)
    }

    /// Runs one request, retrying it while etcd is unreachable (a dead or hung member, a leader
    /// election), bounded by the request timeout and by `deadline` (the caller's wait). Each
    /// attempt goes to the preferred member. An attempt still unanswered after
    /// [`Etcd::attempt_cap`] is not abandoned: the member is skipped and the same request is
    /// sent to the next member as well, and the first reply wins — so a member that hangs
    /// costs one cap, while a reply that is merely slow still counts. Every request dlock
    /// sends is safe to repeat (create-or-reuse, guarded delete, reads, watches; a repeated
    /// lease grant leaves at most an unused lease that expires). A request cut by the timeout
    /// or the deadline gets [`Error::Unavailable`]: etcd did not answer in time.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        what: &str,
        deadline: Option<Instant>,
        mut op: F,
    ) -> Result<T, Error>
    where
        F: FnMut(&Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        use futures::StreamExt;
        use futures::stream::FuturesUnordered;

        let started = Instant::now();
        let mut until = started + self.request_timeout;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        let members = self.members.len().max(1);
        let mut backoff = Duration::from_millis(5);
        // Attempts run side by side, each calling `op` once its member's client is ready.
        let op = std::sync::Mutex::new(&mut op);
        let op = &op;
        let attempt = |member: usize| async move {
            let client = self.members.client(member).await?;
            let fut = {
                let mut op = op.lock().unwrap_or_else(|p| p.into_inner());
                (*op)(&client)
            };
            fut.await
        };
        let mut in_flight = FuturesUnordered::new();
        let launch = |in_flight: &mut FuturesUnordered<_>| -> usize {
            self.counters.add_requests(1);
            let member = self.members.preferred();
            let fut = attempt(member);
            in_flight.push(async move { (member, fut.await) });
            member
        };
        let mut newest = launch(&mut in_flight);
        let mut hedge_at = Instant::now() + self.attempt_cap;
        let mut last_err: Option<Error> = None;
        loop {
            // Hedge only onto another member, and never more attempts than members.
            let may_hedge = members > 1 && in_flight.len() < members;
            let next = tokio::select! {
                next = in_flight.next(), if !in_flight.is_empty() => next,
                () = tokio::time::sleep_until(hedge_at), if may_hedge && hedge_at < until => {
                    self.members.skip(newest);
                    tracing::debug!(what, "etcd member slow to answer; sending the request to the next one too");
                    newest = launch(&mut in_flight);
                    hedge_at = Instant::now() + self.attempt_cap;
                    continue;
                }
                () = tokio::time::sleep_until(until) => {
                    return Err(last_err.unwrap_or_else(|| errors::no_reply(what, started.elapsed())));
                }
            };
            let Some((member, result)) = next else {
                continue;
            };
            let e = match result {
                Ok(v) => {
                    self.replied();
                    return Ok(v);
                }
                Err(e) => e,
            };
            if errors::is_stale_auth(&e) {
                // Credentials refused now is final; a refresh without reply is retried.
                if let Err(refused) = self.refresh_auth(member, until).await {
                    if !refused.is_retryable() {
                        return Err(refused);
                    }
                }
            }
            let err = errors::map(what, e);
            if err.kind() != dlock_core::ErrorKind::Unavailable {
                return Err(err);
            }
            self.members.skip(member);
            if in_flight.is_empty() {
                if Instant::now() + backoff >= until {
                    return Err(err);
                }
                tracing::debug!(error = %err, retry_in = ?backoff, "etcd request failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
                newest = launch(&mut in_flight);
                hedge_at = Instant::now() + self.attempt_cap;
            }
            last_err = Some(err);
        }
    }

    /// Gets a new auth token for `member` (ours expired, or the auth store changed), by
    /// `until`.
    ///
    /// # Errors
    /// [`Error::Backend`] when etcd refuses our credentials now (e.g. the password changed);
    /// [`Error::Unavailable`] when it does not answer in time.
    pub(crate) async fn refresh_auth(&self, member: usize, until: Instant) -> Result<(), Error> {
        if !self.authenticates {
            return Ok(());
        }
        self.counters.add_requests(1);
        let started = Instant::now();
        let refresh = async {
            let client = self.members.client(member).await?;
            client.refresh_token().await
        };
        match tokio::time::timeout_at(until, refresh).await {
            Ok(Ok(())) => {
                tracing::debug!("auth token refreshed");
                Ok(())
            }
            Ok(Err(e)) => Err(errors::map("auth token refresh", e)),
            Err(_) => Err(errors::no_reply("auth token refresh", started.elapsed())),
        }
    }

    /// One transaction: create our key under the session lease unless it exists, and read the
    /// contenders around it. Same compare and branches as etcd's `concurrency.Mutex`, plus the
    /// predecessor read in the same round trip.
    ///
    /// A put under a lease etcd no longer knows fails with "lease not found": that is
    /// [`Enqueue::SessionGone`], not an error (an operator revoked the lease, or it expired
    /// before our keep-alive told us).
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
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(range, Some(newest_two)),
            ])
            .or_else([TxnOp::get(key, None)]);
        let reply = self
            .call(WHAT, deadline, |c| {
                let (mut kv, txn) = (c.kv_client(), txn.clone());
                async move {
                    match kv.txn(txn).await {
                        Ok(resp) => Ok(Some(resp)),
                        Err(e) if errors::is_lease_not_found(&e) => Ok(None),
                        Err(e) => Err(e),
                    }
                }
            })
            .await?;
        let Some(resp) = reply else {
            return Ok(Enqueue::SessionGone);
        };
        let header_rev =
            header_revision(&resp).ok_or_else(|| errors::unexpected(WHAT, "no header"))?;
        let ops = resp.op_responses();
        if resp.succeeded() {
            let kvs =
                get_kvs(&ops, 1).ok_or_else(|| errors::unexpected(WHAT, "no range result"))?;
            let rev = header_rev;
            let before = if in_range {
                let mine = kvs
                    .first()
                    .ok_or_else(|| errors::unexpected(WHAT, "our key is missing"))?;
                if mine.key() != key.as_bytes() || mine.create_revision() != rev {
                    return Err(errors::unexpected(
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
        } else {
            // Our key exists already (a retried request of ours, or an older queue entry of
            // this session): keep its place, as etcd's Mutex does.
            let kvs = get_kvs(&ops, 0).ok_or_else(|| errors::unexpected(WHAT, "no key result"))?;
            let rev = kvs
                .first()
                .map(KeyValue::create_revision)
                .ok_or_else(|| errors::unexpected(WHAT, "compare failed but our key is absent"))?;
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
        let txn = Txn::new().and_then([
            TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
            TxnOp::get(range, Some(below_us)),
        ]);
        let resp = self
            .call(WHAT, deadline, |c| {
                let (mut kv, txn) = (c.kv_client(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?;
        let header_rev =
            header_revision(&resp).ok_or_else(|| errors::unexpected(WHAT, "no header"))?;
        let ops = resp.op_responses();
        let mine = get_kvs(&ops, 0).ok_or_else(|| errors::unexpected(WHAT, "no key result"))?;
        if mine.first().is_none_or(|kv| kv.create_revision() != rev) {
            return Ok(Recheck::KeyGone);
        }
        let below = get_kvs(&ops, 1).ok_or_else(|| errors::unexpected(WHAT, "no range result"))?;
        Ok(match below.first() {
            None => Recheck::Owner,
            Some(kv) => Recheck::Behind {
                predecessor: String::from_utf8_lossy(kv.key()).into_owned(),
                header_rev,
            },
        })
    }

    /// Deletes `key` if its create revision is still `rev` (never a newer incarnation).
    /// Returns whether it deleted something.
    pub(crate) async fn delete_guarded(
        &self,
        key: &str,
        rev: i64,
        deadline: Option<Instant>,
    ) -> Result<bool, Error> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key, None)]);
        let resp = self
            .call("guarded delete", deadline, |c| {
                let (mut kv, txn) = (c.kv_client(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?;
        Ok(resp.succeeded())
    }

    /// Deletes `key` whatever its revision, after reading it (used when an enqueue reply was
    /// lost and our revision is unknown; the caller owns the key's slot, so no other user of
    /// the key exists). Returns whether it deleted something.
    pub(crate) async fn delete_unknown(&self, key: &str) -> Result<bool, Error> {
        let resp = self
            .call("read before delete", None, |c| {
                let mut kv = c.kv_client();
                async move { kv.get(key, Some(GetOptions::new().with_keys_only())).await }
            })
            .await?;
        match resp.kvs().first() {
            None => Ok(false),
            Some(found) => {
                self.delete_guarded(key, found.create_revision(), None)
                    .await
            }
        }
    }

    /// Revokes a session lease; a lease that is already gone counts as revoked.
    pub(crate) async fn revoke(&self, lease: i64) -> Result<(), Error> {
        self.call("lease revoke", None, |c| {
            let mut leases = c.lease_client();
            async move {
                match leases.revoke(lease).await {
                    Ok(_) => Ok(()),
                    Err(e) if errors::is_lease_not_found(&e) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .await
    }
}

pub(crate) fn header_revision(resp: &TxnResponse) -> Option<i64> {
    resp.header().map(etcd_client::ResponseHeader::revision)
}

pub(crate) fn get_kvs(ops: &[TxnOpResponse], at: usize) -> Option<&[KeyValue]> {
    match ops.get(at)? {
        TxnOpResponse::Get(get) => Some(get.kvs()),
        _ => None,
    }
}

/// The count of the range read at `at` in a transaction's results.
pub(crate) fn get_count(ops: &[TxnOpResponse], at: usize) -> Option<i64> {
    match ops.get(at)? {
        TxnOpResponse::Get(get) => Some(get.count()),
        _ => None,
    }
}
