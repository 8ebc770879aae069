//! The renewal backend: core's [`RenewalDriver`](dlock_core::backend::RenewalDriver) renews
//! all held locks of the locker in one [`RenewBackend::renew`] round, which sends ONE
//! keep-alive per session (`session.rs`), reconciles the session's keys and moves the session
//! to a new lease on a new raft term. The session itself is registered with the driver as an
//! internal lease (the "sentinel"), so it is kept alive while the locker only waits, and its
//! deadline is the deadline of every lock of the session.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{RenewBackend, Renewal};
use dlock_core::{Error, LossReason};
use tokio::time::Instant;

use crate::conn::Etcd;
use crate::reconcile::{Listing, confirm_gone, delete_orphans};
use crate::relocate::spawn_relocation;
use crate::session::{KeepAlive, Session, spawn_cleanup};
use crate::slots::{SlotGuard, Slots};

/// How long a round waits for the session's key listing after the keep-alive reply (at least;
/// as long as the keep-alive took, when that was longer, but never more than one attempt cap:
/// the listing is advisory and must not hold up an acknowledged keep-alive until the lease's
/// loss).
const LISTING_GRACE: Duration = Duration::from_millis(100);

/// What the renewal driver keeps per lease.
pub(crate) enum Entry {
    /// The session itself (the sentinel).
    Session(Arc<KeepAlive>),
    /// One held lock.
    Lock(LockEntry),
}

impl Entry {
    fn keep_alive(&self) -> &Arc<KeepAlive> {
        match self {
            Entry::Session(ka) => ka,
            Entry::Lock(l) => &l.session.ka,
        }
    }

    /// The session this entry belongs to (its identity, the session's first lease id).
    pub(crate) fn session_id(&self) -> i64 {
        self.keep_alive().id
    }
}

/// One held lock: its key and create revision, and the key's slot in the locker.
pub(crate) struct LockEntry {
    pub(crate) key: String,
    pub(crate) rev: i64,
    /// The session's generation when the key was attached (a later move may lose it).
    pub(crate) generation: u64,
    pub(crate) session: Arc<Session>,
    pub(crate) slot: Mutex<Option<SlotGuard>>,
}

impl LockEntry {
    fn take_slot(&self) -> Option<SlotGuard> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The renewal backend of one locker.
pub(crate) struct Backend {
    pub(crate) etcd: Etcd,
    /// The locker's key slots: a key whose slot is free is owned by nobody.
    pub(crate) slots: Slots,
    /// The locker's key prefix (only keys under it are reconciled).
    pub(crate) prefix: String,
}

/// What one session's keep-alive round found.
enum Round {
    /// Extended; the session's keys, when they were listed in time (and the session did not
    /// move to a new lease this round).
    Alive(Option<HashSet<String>>),
    /// etcd says the lease is gone.
    Gone,
    /// No answer this round (one session of several failed).
    Undecided,
}

#[async_trait]
impl RenewBackend for Backend {
    type Entry = Entry;

    /// `false`: a slow round runs until the leases' loss. A retry could not take a path this
    /// round does not take already: the keep-alive hedges onto the next member after each
    /// attempt cap and keeps the slow attempt in flight (`KeepAlive::renew`), while a retry
    /// would open a fresh stream whose reply is just as slow. Abandoning the round at three
    /// quarters of the validity left a retry a quarter, too short for a reply as slow as the
    /// one given up, so a reply that was late but in time lost the lease.
    fn abandon_slow_rounds(&self) -> bool {
        false
    }

    fn is_internal(&self, entry: &Entry) -> bool {
        matches!(entry, Entry::Session(_))
    }

    async fn renew(&self, entries: &[Arc<Entry>]) -> Result<Vec<Renewal>, Error> {
        // One keep-alive per session, whatever the number of locks it holds.
        let mut sessions: Vec<Arc<KeepAlive>> = Vec::new();
        for e in entries {
            let ka = e.keep_alive();
            if !sessions.iter().any(|s| s.id == ka.id) {
                sessions.push(Arc::clone(ka));
            }
        }
        let several = sessions.len() > 1;
        let mut rounds: HashMap<i64, Round> = HashMap::with_capacity(sessions.len());
        for ka in sessions {
            // No keep-alive while the session moves to a new lease: one sent to the old lease
            // would not extend the keys already moved. The session's leases stay undecided
            // (their deadlines, set by the round that saw the new term, hold on both leases)
            // and are retried soon; holding `moving` for reading until the keep-alive's reply
            // keeps a move from starting meanwhile.
            let Ok(not_moving) = ka.moving.try_read() else {
                tracing::debug!(
                    lease = format_args!("{:x}", ka.lease()),
                    "the session is moving to a new lease; renewal retried after the move"
                );
                rounds.insert(ka.id, Round::Undecided);
                continue;
            };
            // The session's keys are listed beside the keep-alive, on the same connection.
            let listing = Listing::start(&self.etcd, ka.lease());
            let started = Instant::now();
            let round = match ka.renew().await {
                Ok((true, ka_term)) => {
                    let grace = started
                        .elapsed()
                        .max(LISTING_GRACE)
                        .min(self.etcd.attempt_cap.max(LISTING_GRACE));
                    let listed = listing.within(grace).await;
                    let seen = ka_term
                        .into_iter()
                        .chain(listed.as_ref().and_then(|l| l.term))
                        .max();
                    match seen {
                        Some(term) if ka.term() == 0 => {
                            ka.learn_term(term);
                            Round::Alive(listed.map(|l| l.keys))
                        }
                        Some(term) if term > ka.term() => {
                            // A new raft term: a leader of an older term may still revoke
                            // our lease as expired (etcd-io/etcd#15247). Move to a lease it
                            // never knew.
                            // The move runs in a task of its own, outside this round's budget.
                            drop(not_moving);
                            spawn_relocation(&ka, &self.slots, held_keys(entries, ka.id), term);
                            Round::Alive(None)
                        }
                        _ => Round::Alive(listed.map(|l| l.keys)),
                    }
                }
                Ok((false, _)) => {
                    tracing::warn!(
                        lease = format_args!("{:x}", ka.lease()),
                        "etcd says the session lease is gone"
                    );
                    Round::Gone
                }
                Err(e) if several => {
                    tracing::debug!(lease = format_args!("{:x}", ka.lease()), error = %e, "keep-alive failed; retrying this session");
                    Round::Undecided
                }
                Err(e) => return Err(e),
            };
            rounds.insert(ka.id, round);
        }
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let id = e.session_id();
            let lease = e.keep_alive().lease();
            out.push(match rounds.get(&id) {
                Some(Round::Alive(_))
                    if matches!(&**e, Entry::Lock(lock) if lock.session.ka.lost_since(&lock.key, lock.generation)) =>
                {
                    Renewal::Lost(LossReason::Gone(format!(
                        "etcd lease {lease:x}: the key was gone when the session moved to a lease of a new raft term"
                    )))
                }
                Some(Round::Alive(listed)) => match (&**e, listed) {
                    (Entry::Lock(lock), Some(keys)) if !keys.contains(&lock.key) => {
                        if confirm_gone(&self.etcd, &lock.key, lock.rev, lease).await {
                            tracing::warn!(key = %lock.key, "a held lock's key was deleted at the server");
                            Renewal::Lost(LossReason::Gone(format!(
                                "etcd key {} was deleted",
                                lock.key
                            )))
                        } else {
                            Renewal::Extended
                        }
                    }
                    _ => Renewal::Extended,
                },
                Some(Round::Undecided) => Renewal::Retry,
                Some(Round::Gone) | None => Renewal::Lost(LossReason::SessionEnded(format!(
                    "etcd lease {lease:x} expired or was revoked"
                ))),
            });
        }
        for (id, round) in rounds {
            if let Round::Alive(Some(keys)) = round {
                let lease = entries
                    .iter()
                    .find(|e| e.session_id() == id)
                    .map(|e| e.keep_alive().lease());
                if let Some(lease) = lease {
                    delete_orphans(&self.etcd, &self.slots, &self.prefix, lease, keys);
                }
            }
        }
        Ok(out)
    }

    async fn release(&self, entry: &Entry) -> Result<(), Error> {
        match entry {
            Entry::Session(ka) => self.etcd.revoke(ka.lease()).await,
            Entry::Lock(lock) => match self.etcd.delete_guarded(&lock.key, lock.rev, None).await {
                Ok(_) => {
                    drop(lock.take_slot());
                    Ok(())
                }
                Err(e) => {
                    // Never leak the key of a live session: keep deleting in the background.
                    if let Some(slot) = lock.take_slot() {
                        spawn_cleanup(
                            self.etcd.clone(),
                            lock.key.clone(),
                            Some(lock.rev),
                            Arc::clone(&lock.session),
                            slot,
                        );
                    }
                    Err(e)
                }
            },
        }
    }
}

/// The keys and create revisions of the locks session `id` holds.
fn held_keys(entries: &[Arc<Entry>], id: i64) -> Vec<(String, i64)> {
    entries
        .iter()
        .filter_map(|e| match &**e {
            Entry::Lock(lock) if lock.session.id() == id => Some((lock.key.clone(), lock.rev)),
            _ => None,
        })
        .collect()
}
