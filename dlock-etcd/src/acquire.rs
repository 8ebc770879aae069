//! Acquiring: enqueue our key on the session, wait for our turn, hand out the lease.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{Error, FencingToken, Lease, LockName, LossReason};
use tokio::time::Instant;

use crate::errors;
use crate::keys;
use crate::locker::EtcdLocker;
use crate::ops::{Enqueue, Etcd};
use crate::session::{Entry, LockEntry, Session, spawn_cleanup};
use crate::slots::SlotGuard;
use crate::wait::Turn;

/// How one queue attempt (on one session) ended.
enum Attempt {
    Granted(Lease),
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

impl EtcdLocker {
    pub(crate) async fn lock(
        &self,
        name: &LockName,
        wait: Option<Duration>,
        try_only: bool,
    ) -> Result<Option<Lease>, Error> {
        let started = Instant::now();
        let deadline = wait.map(|w| started + w);
        let range = keys::lock_range(&self.inner.cfg.prefix, name, self.inner.cfg.raw_names);
        let mut counted_wait = false;
        loop {
            let session = self.session(deadline).await?;
            let key = keys::contender_key(&range, session.id());
            let slot = if try_only {
                match self.inner.slots.try_lock(&key) {
                    Some(slot) => slot,
                    // Another task of this locker holds or queues for this name.
                    None => return Ok(None),
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
                .attempt(name, &range, pending, deadline, try_only, &mut counted_wait)
                .await?
            {
                Attempt::Granted(lease) => return Ok(Some(lease)),
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
        range: &str,
        mut pending: Pending,
        deadline: Option<Instant>,
        try_only: bool,
        counted_wait: &mut bool,
    ) -> Result<Attempt, Error> {
        let inner = &self.inner;
        let etcd = &inner.etcd;
        let session = Arc::clone(&pending.session);
        // On error `pending` is dropped: the key (revision unknown) is deleted in the background.
        // No move to a new lease runs while we attach our key to the current one.
        let moving = session.ka.moving.read().await;
        let generation = session.ka.generation();
        let enqueued = etcd
            .enqueue(range, &pending.key, session.lease(), deadline)
            .await;
        drop(moving);
        let enq = match enqueued? {
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
        };
        if enq.rev <= 0 {
            return Err(errors::unexpected(
                "enqueue transaction",
                format!("create revision {}", enq.rev),
            ));
        }
        let rev = enq.rev;
        pending.rev = Some(rev);
        if let Some(pred) = enq.predecessor {
            if try_only {
                pending.delete_now().await;
                return Ok(Attempt::NotOwner);
            }
            if !*counted_wait {
                *counted_wait = true;
                inner.etcd.counters.add_waits(1);
            }
            let turn = self
                .wait_turn(
                    name,
                    range,
                    &pending.key,
                    rev,
                    pred,
                    enq.header_rev,
                    &session,
                    deadline,
                )
                .await;
            match turn {
                Ok(Turn::Owner) => {}
                Ok(Turn::Requeue) => return Ok(Attempt::Requeue),
                Ok(Turn::Timeout) => {
                    pending.delete_now().await;
                    return Ok(Attempt::Timeout);
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
            key,
            rev,
            generation,
            session,
            slot: Mutex::new(slot),
        });
        let token =
            u64::try_from(rev).map_err(|_| errors::unexpected("grant", "negative revision"))?;
        let lease = inner
            .driver
            .register(name.clone(), FencingToken(token), start, entry);
        drop(moving);
        inner.etcd.counters.add_grants(1);
        tracing::debug!(lock = %name, token, "lock granted");
        Ok(Attempt::Granted(lease))
    }
}
