//! Acquiring: enqueue our key on the session, wait for our turn, hand out the lease.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{AcquireOptions, Error, ErrorKind, FencingToken, Lease, LockName, LossReason};
use tokio::time::Instant;

use crate::conn::Etcd;
use crate::enqueue::{Behind, Enqueue};
use crate::error;
use crate::locker::EtcdLocker;
use crate::queue::{Queue, Rule};
use crate::renew::{Entry, LockEntry};
use crate::semaphore::PermitWait;
use crate::session::{Session, spawn_cleanup};
use crate::slots::{Busy, SlotGuard};
use crate::watch::Turn;

/// How one queue attempt (on one session) ended.
enum Attempt {
    /// The lease and our key.
    Granted(Lease, String),
    NotOwner,
    Timeout,
    Requeue,
}

/// Our queue key until it is either handed to a lease or deleted. Dropping it (a cancelled
/// acquire) deletes the key in the background.
struct Pending {
    etcd: Etcd,
    key: String,
    rev: Option<i64>,
    session: Arc<Session>,
    slot: Option<SlotGuard>,
}

impl Pending {
    /// Deletes our key now; on failure keeps deleting in the background.
    async fn delete_now(mut self) {
        let Some(slot) = self.slot.take() else { return };
        let result = match self.rev {
            Some(rev) => self.etcd.delete_guarded(&self.key, rev, None).await,
            None => self.etcd.delete_unknown(&self.key).await,
        };
        match result {
            Ok(_) => drop(slot),
            Err(e) => {
                tracing::warn!(key = %self.key, error = %e, "deleting our queue key failed; retrying in the background");
                spawn_cleanup(
                    self.etcd.clone(),
                    self.key.clone(),
                    self.rev,
                    Arc::clone(&self.session),
                    slot,
                );
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            spawn_cleanup(
                self.etcd.clone(),
                self.key.clone(),
                self.rev,
                Arc::clone(&self.session),
                slot,
            );
        }
    }
}

/// The first pause before a request without a reply in time is sent again within the wait.
const FIRST_RETRY: Duration = Duration::from_millis(20);
/// The longest such pause.
const MAX_RETRY: Duration = Duration::from_millis(500);

/// What one acquire asks: until when it may wait, whether it only tries, and the value its
/// key carries (a campaign's, a permit count; empty for a lock or a read-write lease).
#[derive(Clone, Copy)]
struct Ask<'a> {
    deadline: Option<Instant>,
    try_only: bool,
    value: &'a [u8],
}

/// The error of a key its queue refuses: a permit count other than the semaphore's.
fn refused(reason: String) -> Error {
    Error::InvalidOption {
        option: "permits",
        reason,
    }
}

/// Whether a failed request of an acquire is sent again: etcd did not answer (`Unavailable`,
/// the outcome is unknown), the acquire waits (not a `try_acquire`) with a bounded wait, and
/// the wait has room for the pause and another attempt. An acquire without a bounded wait
/// gives up after one request timeout, as before.
fn retry_within(e: &Error, deadline: Option<Instant>, try_only: bool, pause: Duration) -> bool {
    e.kind() == ErrorKind::Unavailable
        && !try_only
        && deadline.is_some_and(|d| Instant::now() + pause < d)
}

impl EtcdLocker {
    /// Sends the enqueue transaction, and sends it again while etcd does not answer and the
    /// wait lasts (see [`retry_within`]). Repeating it is safe and resolves an earlier attempt
    /// whose outcome is unknown: the key is `<range>/<session lease>`, so an attempt that
    /// applied left exactly our key, which the next one finds and keeps (etcd's Mutex does the
    /// same). The grant's deadline never counts from these requests but from the session's
    /// last acknowledged keep-alive, which the key's expiry (the lease's) is never earlier
    /// than. `None`: the session ended meanwhile.
    ///
    /// # Errors
    /// The last error when it is not retried; the caller's `Pending` then deletes the key
    /// in the background (and the keep-alive round deletes it if an attempt applies later).
    async fn enqueue_within(
        &self,
        name: &LockName,
        q: &Queue,
        key: &str,
        session: &Session,
        ask: Ask<'_>,
    ) -> Result<Option<(Enqueue, u64)>, Error> {
        let Ask {
            deadline,
            try_only,
            value,
        } = ask;
        let etcd = &self.inner.etcd;
        let mut backoff = FIRST_RETRY;
        loop {
            // No move to a new lease runs while we attach our key to the current one; the
            // generation tells the grant whether a move happened since.
            let moving = session.ka.moving.read().await;
            let generation = session.ka.generation();
            let enqueued = etcd.enqueue(q, key, session.lease(), deadline, value).await;
            drop(moving);
            let e = match enqueued {
                Ok(enqueued) => return Ok(Some((enqueued, generation))),
                Err(e) => e,
            };
            if !retry_within(&e, deadline, try_only, backoff) {
                return Err(e);
            }
            tracing::debug!(lock = %name, %key, error = %e, retry_in = ?backoff, "enqueue outcome unknown; sending it again on the same key");
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                _ = session.ended() => return Ok(None),
            }
            if !session.is_live() {
                return Ok(None);
            }
            backoff = (backoff * 2).min(MAX_RETRY);
        }
    }

    /// Acquires the mutex `name` (or tries once), our key carrying `value`: the lease and
    /// our key.
    pub(crate) async fn lock_mutex(
        &self,
        name: &LockName,
        wait: Option<Duration>,
        try_only: bool,
        value: &[u8],
    ) -> Result<Option<(Lease, String)>, Error> {
        let q = Queue::mutex(self.range_of(name));
        self.lock_in(name, &q, wait, try_only, value).await
    }

    /// Waits in `q` for `name`, as [`Locker::acquire`](dlock_core::Locker::acquire) does, our
    /// key carrying `value`.
    pub(crate) async fn acquire_in(
        &self,
        name: &LockName,
        q: &Queue,
        opts: AcquireOptions,
        value: &[u8],
    ) -> Result<Lease, Error> {
        match self.lock_in(name, q, opts.wait, false, value).await? {
            Some((lease, _)) => Ok(lease),
            None => Err(error::unexpected("acquire", "no lease after waiting")),
        }
    }

    /// Acquires `name` in the queue `q` (a mutex, a reader, a writer, a permit), or tries
    /// once, our key carrying `value`: the lease and our key.
    ///
    /// # Errors
    /// As [`Locker::acquire`](dlock_core::Locker::acquire); [`Error::InvalidOption`] when the
    /// queue refuses our key (a permit count other than the semaphore's).
    ///
    /// # Cancel safety
    /// Dropping the future deletes our queue key in the background (see `Pending`).
    pub(crate) async fn lock_in(
        &self,
        name: &LockName,
        q: &Queue,
        wait: Option<Duration>,
        try_only: bool,
        value: &[u8],
    ) -> Result<Option<(Lease, String)>, Error> {
        let started = Instant::now();
        let result = self
            .lock_until(name, q, wait, try_only, started, value)
            .await;
        match (result, wait) {
            // The wait ended while a request was out, but etcd had been answering through the
            // second half of the wait: the wait ran out, etcd did not. `Unavailable` is kept
            // for a wait that ends while etcd is out of reach for much of it.
            (Err(e), Some(w))
                if e.kind() == ErrorKind::Unavailable
                    && started.elapsed() >= w
                    && self.inner.etcd.replied_since(started + w / 2) =>
            {
                tracing::debug!(lock = %name, error = %e, "the wait ended with a request out");
                Err(Error::Timeout {
                    waited: started.elapsed(),
                })
            }
            (result, _) => result,
        }
    }

    /// [`EtcdLocker::lock`] for an acquire that started at `started`.
    async fn lock_until(
        &self,
        name: &LockName,
        q: &Queue,
        wait: Option<Duration>,
        try_only: bool,
        started: Instant,
        value: &[u8],
    ) -> Result<Option<(Lease, String)>, Error> {
        let deadline = wait.map(|w| started + w);
        let mut counted_wait = false;
        let mut backoff = FIRST_RETRY;
        loop {
            let session = match self.session(deadline).await {
                Ok(session) => session,
                // A lease grant without a reply in time: grant again while the wait lasts (a
                // grant that applied late leaves an unused lease, which expires).
                Err(e) if retry_within(&e, deadline, try_only, backoff) => {
                    tracing::debug!(lock = %name, error = %e, retry_in = ?backoff, "session lease grant failed; retrying within the wait");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_RETRY);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let key = q.key(session.id());
            let slot = if try_only {
                match self.inner.slots.try_lock(&key) {
                    Ok(slot) => slot,
                    // Another task of this locker holds or queues for this name.
                    Err(Busy::Owned) => return Ok(None),
                    // A background delete of an earlier key of ours, which says nothing about
                    // who holds the lock: wait for it, for one request at most.
                    Err(Busy::Cleaning) => {
                        let within = self.inner.etcd.request_timeout;
                        match tokio::time::timeout(within, self.inner.slots.lock(&key)).await {
                            Ok(slot) => slot,
                            Err(_) => {
                                return Err(Error::unavailable(
                                    format!(
                                        "try_acquire: the delete of an earlier queue key of this locker is still unconfirmed after {within:?}"
                                    ),
                                    None,
                                ));
                            }
                        }
                    }
                }
            } else {
                match deadline {
                    None => self.inner.slots.lock(&key).await,
                    Some(d) => {
                        match tokio::time::timeout_at(d, self.inner.slots.lock(&key)).await {
                            Ok(slot) => slot,
                            Err(_) => {
                                return Err(Error::Timeout {
                                    waited: started.elapsed(),
                                });
                            }
                        }
                    }
                }
            };
            let pending = Pending {
                etcd: self.inner.etcd.clone(),
                key,
                rev: None,
                session,
                slot: Some(slot),
            };
            match self
                .attempt(
                    name,
                    q,
                    pending,
                    Ask {
                        deadline,
                        try_only,
                        value,
                    },
                    &mut counted_wait,
                )
                .await?
            {
                Attempt::Granted(lease, key) => return Ok(Some((lease, key))),
                Attempt::NotOwner => return Ok(None),
                Attempt::Timeout => {
                    return Err(Error::Timeout {
                        waited: started.elapsed(),
                    });
                }
                Attempt::Requeue => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Error::Timeout {
                            waited: started.elapsed(),
                        });
                    }
                }
            }
        }
    }

    /// Enqueues on one session and waits for ownership.
    async fn attempt(
        &self,
        name: &LockName,
        q: &Queue,
        mut pending: Pending,
        ask: Ask<'_>,
        counted_wait: &mut bool,
    ) -> Result<Attempt, Error> {
        let Ask {
            deadline, try_only, ..
        } = ask;
        let inner = &self.inner;
        let session = Arc::clone(&pending.session);
        // On error `pending` is dropped: the key (revision unknown) is deleted in the background.
        let Some((enqueued, generation)) = self
            .enqueue_within(name, q, &pending.key, &session, ask)
            .await?
        else {
            // The session ended while etcd did not answer: queue again on a new one.
            return Ok(Attempt::Requeue);
        };
        let enq = match enqueued {
            Enqueue::Queued(enq) => enq,
            Enqueue::SessionGone => {
                // etcd dropped the session lease (revoked, or expired before a keep-alive
                // reply told us): it has no key left anywhere. End the session now, so its
                // locks are announced lost and the next attempt queues on a new lease,
                // instead of failing the acquire or ever granting on the removed key.
                let id = session.id();
                tracing::info!(
                    lock = %name,
                    lease = format_args!("{:x}", session.lease()),
                    "etcd no longer knows the session lease; queueing on a new session"
                );
                inner.driver.lose_where(
                    &LossReason::SessionEnded(format!(
                        "etcd lease {:x} expired or was revoked",
                        session.lease()
                    )),
                    |e| e.session_id() == id,
                );
                return Ok(Attempt::Requeue);
            }
            Enqueue::KeyGone => {
                tracing::debug!(lock = %name, key = %pending.key, "our queue key vanished while enqueueing; queueing again");
                return Ok(Attempt::Requeue);
            }
            Enqueue::Refused { rev, reason } => {
                // Without a key (`None`), the delete only confirms that no earlier attempt of
                // this enqueue created one.
                pending.rev = rev;
                pending.delete_now().await;
                return Err(refused(reason));
            }
        };
        if enq.rev <= 0 {
            return Err(error::unexpected(
                "enqueue transaction",
                format!("create revision {}", enq.rev),
            ));
        }
        let rev = enq.rev;
        pending.rev = Some(rev);
        if let Some(behind) = enq.behind {
            if try_only {
                pending.delete_now().await;
                return Ok(Attempt::NotOwner);
            }
            if !*counted_wait {
                *counted_wait = true;
                inner.etcd.counters.add_waits(1);
            }
            let turn = match (behind, q.rule) {
                (Behind::Permits(ahead), Rule::Permits(permits)) => {
                    let wait = PermitWait {
                        name,
                        range: &q.ahead,
                        key: &pending.key,
                        rev,
                        permits,
                    };
                    self.wait_permits(wait, ahead, enq.header_rev, &session, deadline)
                        .await
                }
                (Behind::Key(pred), _) => {
                    self.wait_turn(
                        name,
                        &q.ahead,
                        &pending.key,
                        rev,
                        pred,
                        enq.header_rev,
                        &session,
                        deadline,
                    )
                    .await
                }
                (Behind::Permits(_), Rule::Last) => {
                    return Err(error::unexpected(
                        "enqueue",
                        "a permit count for a queue without permits",
                    ));
                }
            };
            match turn {
                Ok(Turn::Owner) => {}
                Ok(Turn::Requeue) => return Ok(Attempt::Requeue),
                Ok(Turn::Timeout) => {
                    pending.delete_now().await;
                    return Ok(Attempt::Timeout);
                }
                Ok(Turn::Refused(reason)) => {
                    pending.delete_now().await;
                    return Err(refused(reason));
                }
                // etcd failed until the wait ended: `pending` deletes the key in the background.
                Err(e) => return Err(e),
            }
        }
        // We own the lock if our session is still alive: never grant on a dead lease (the
        // grant could be stale), nor on a key a move to a new lease found gone.
        let ka = Arc::clone(&session.ka);
        let moving = ka.moving.read().await;
        if !session.is_live() {
            return Ok(Attempt::Requeue);
        }
        if ka.lost_since(&pending.key, generation) {
            tracing::debug!(lock = %name, key = %pending.key, "our queue key was gone when the session moved to a new lease; queueing again");
            return Ok(Attempt::Requeue);
        }
        let start = session.last_ack_start();
        let key = pending.key.clone();
        let slot = pending.slot.take();
        drop(pending);
        let entry = Entry::Lock(LockEntry {
            key: key.clone(),
            rev,
            generation,
            session,
            slot: Mutex::new(slot),
        });
        let token =
            u64::try_from(rev).map_err(|_| error::unexpected("grant", "negative revision"))?;
        let lease = inner
            .driver
            .register(name.clone(), FencingToken(token), start, entry);
        drop(moving);
        inner.etcd.counters.add_grants(1);
        tracing::debug!(lock = %name, token, "lock granted");
        Ok(Attempt::Granted(lease, key))
    }
}
