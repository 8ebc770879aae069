//! Connection handling: the etcd clients (the balanced one and one per member,
//! `conn/members.rs`) and the requests of the lock algorithm on them, each bounded by a
//! timeout and hedged onto another member when one hangs.

mod deletes;
mod members;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
use dlock_core::backend::Counters;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::time::Instant;

use crate::error;
pub(crate) use deletes::DeleteQueue;
pub(crate) use members::Members;

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
    /// Guarded deletes waiting to be sent together (`conn/deletes.rs`).
    pub(crate) deletes: Arc<DeleteQueue>,
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
                    return Err(last_err.unwrap_or_else(|| error::no_reply(what, started.elapsed())));
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
            if error::is_stale_auth(&e) {
                // Credentials refused now is final; a refresh without reply is retried.
                if let Err(refused) = self.refresh_auth(member, until).await
                    && !refused.is_retryable()
                {
                    return Err(refused);
                }
            }
            let err = error::map(what, e);
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
    /// [`Error::AccessDenied`] when etcd refuses our credentials now (e.g. the password
    /// changed); [`Error::Unavailable`] when it does not answer in time.
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
            Ok(Err(e)) => Err(error::map("auth token refresh", e)),
            Err(_) => Err(error::no_reply("auth token refresh", started.elapsed())),
        }
    }

    /// Runs one transaction (see [`Etcd::call`]).
    pub(crate) async fn txn(
        &self,
        what: &str,
        deadline: Option<Instant>,
        txn: Txn,
    ) -> Result<TxnResponse, Error> {
        self.call(what, deadline, |c| {
            let (mut kv, txn) = (c.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Deletes `key` if its create revision is still `rev` (never a newer incarnation).
    /// Returns whether it deleted something. Without a deadline the delete may share a
    /// transaction with others waiting at the same time (see [`Etcd::delete_batched`]).
    pub(crate) async fn delete_guarded(
        &self,
        key: &str,
        rev: i64,
        deadline: Option<Instant>,
    ) -> Result<bool, Error> {
        if deadline.is_none() {
            return self.delete_batched(key, rev).await;
        }
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key, None)]);
        let resp = self.txn("guarded delete", deadline, txn).await?;
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
                    Err(e) if error::is_lease_not_found(&e) => Ok(()),
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
