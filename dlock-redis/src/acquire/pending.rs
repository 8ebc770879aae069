//! A request until it is granted (a mutex acquire, a read, write or permit request): what it
//! may have left at the server is withdrawn when the acquire ends without a lease, including
//! when its future is dropped.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, LockName};

use super::notify::Notifier;
use crate::error::{is_slow, is_unreachable};
use crate::keys::{FamilyKeys, Keys};
use crate::renew::{Held, SingleBackend, Slot};
use crate::wait::Wait;

/// How long a timed-out acquire waits for its withdrawal before returning.
pub(super) const CLEANUP_GRACE: Duration = Duration::from_millis(100);

/// The least pause before an attempt follows one that found the sentinels' master
/// unreachable.
const UNREACHABLE_PAUSE: Duration = Duration::from_millis(100);

/// A request in flight or a queue entry of one name.
pub(super) struct Pending {
    backend: Arc<SingleBackend>,
    notifier: Arc<Notifier>,
    pub(super) keys: Keys,
    /// What a grant holds: the mutex key, or a member of the name's holders.
    slot: Slot,
    /// The owner value (for a [`Slot::Holder`]: our member, `<mode>:<owner>`).
    pub(super) owner: String,
    /// Our queue entry, registered for notifications (a mutex acquire has one once it queues).
    pub(super) entry: Option<String>,
    /// Something may be left at the server (a grant whose reply we did not see, a queue entry).
    pub(super) dirty: bool,
}

impl Pending {
    /// A request for `slot` of the name whose keys are `keys`, with nothing left at the server
    /// yet.
    pub(super) fn new(
        backend: &Arc<SingleBackend>,
        notifier: &Arc<Notifier>,
        keys: Keys,
        slot: Slot,
        owner: String,
    ) -> Self {
        Pending {
            backend: Arc::clone(backend),
            notifier: Arc::clone(notifier),
            keys,
            slot,
            owner,
            entry: None,
            dirty: false,
        }
    }

    /// Gives back a grant: the mutex key (compare-and-delete; in fair mode it goes to the
    /// queue's head), or our member and queue entry. `dirty` is left as it is.
    pub(super) async fn give_back(&self) -> Result<(), Error> {
        match self.slot {
            Slot::Lock => self
                .backend
                .release_keys(&self.keys, &self.owner)
                .await
                .map(|_| ()),
            Slot::Holder => {
                let entry = self.entry.as_deref().unwrap_or_default();
                self.backend
                    .withdraw_member(&FamilyKeys::of(&self.keys), &self.owner, entry)
                    .await
            }
        }
    }

    /// Settles the request as granted: nothing is left to withdraw; what the renewal driver
    /// keeps.
    pub(super) fn into_held(mut self) -> Held {
        self.dirty = false;
        Held {
            keys: self.keys.clone(),
            owner: std::mem::take(&mut self.owner),
            slot: self.slot,
        }
    }

    /// The withdrawal as a task of its own; the request is clean afterwards. `failed` is
    /// logged when the withdrawal fails.
    fn withdraw_task(&mut self, failed: &'static str) -> impl Future<Output = ()> + Send + 'static {
        self.dirty = false;
        let backend = Arc::clone(&self.backend);
        let keys = self.keys.clone();
        let slot = self.slot;
        let owner = std::mem::take(&mut self.owner);
        let entry = self.entry.clone();
        async move {
            if let Err(e) = cleanup(&backend, &keys, slot, &owner, entry.as_deref()).await {
                tracing::warn!(lock = %keys.lock, error = %e, "{failed}");
            }
        }
    }

    /// Gives up waiting: withdraws (waiting for it at most [`CLEANUP_GRACE`], so that a hung
    /// server cannot hold the caller long past its wait; the withdrawal then finishes in the
    /// background), then reports the timeout.
    pub(super) async fn timeout(&mut self, wait: &Wait) -> Error {
        if self.dirty {
            let (done, finished) = tokio::sync::oneshot::channel();
            let task = self.withdraw_task(
                "withdrawing a timed-out waiter failed; its entry expires on its own",
            );
            self.backend.background.spawn(async move {
                task.await;
                let _ = done.send(());
            });
            let _ = tokio::time::timeout(CLEANUP_GRACE, finished).await;
        }
        wait.timeout()
    }

    /// After an attempt failed with `e`: `Ok` when the reply was only slow (a loaded or
    /// briefly hung server: the request may or may not have been applied) and the wait goes
    /// on, and also when a node found through Redis Sentinel could not be reached (refused,
    /// reset: the master may be moving; the next attempt asks the sentinels again);
    /// otherwise the error that ends the acquire: the timeout once the wait is over
    /// (withdrawn first, see [`timeout`](Self::timeout)), or `e` when the server is down or
    /// refusing (dropping the request withdraws in the background).
    pub(super) async fn after_failure(
        &mut self,
        e: Error,
        wait: &Wait,
        name: &LockName,
    ) -> Result<(), Error> {
        if wait.is_over() {
            return Err(self.timeout(wait).await);
        }
        if is_slow(&e) {
            tracing::debug!(lock = %name, error = %e, "slow reply; trying again within the wait");
            return Ok(());
        }
        if self.backend.node.follows_failovers() && is_unreachable(&e) {
            // The master the sentinels named is gone (killed, or its connections closed by
            // the failover): the next attempt asks the sentinels again. Paced, so a wait
            // across a failover does not ask them in a tight loop.
            tracing::debug!(lock = %name, error = %e, "master unreachable; trying again within the wait");
            tokio::time::sleep_until(wait.wake_at(UNREACHABLE_PAUSE)).await;
            return Ok(());
        }
        Err(e)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(entry) = &self.entry {
            self.notifier.unregister(entry);
        }
        if !self.dirty {
            return;
        }
        let task =
            self.withdraw_task("cleanup of a cancelled acquire failed; it expires on its own");
        if !self.backend.background.spawn(task) {
            tracing::warn!(lock = %self.keys.lock, "acquire dropped outside a runtime; its entry expires on its own");
        }
    }
}

/// Removes whatever a request may have left at the server: a mutex waiter's queue entry
/// (passing the baton when it was the head) and a lock an unseen reply may have granted, or a
/// family request's queue entry and a member an unseen reply may have added.
async fn cleanup(
    backend: &SingleBackend,
    keys: &Keys,
    slot: Slot,
    owner: &str,
    entry: Option<&str>,
) -> Result<(), Error> {
    match (slot, entry) {
        (Slot::Lock, Some(entry)) => backend.withdraw_waiter(keys, owner, entry).await,
        (Slot::Lock, None) => backend.release_keys(keys, owner).await.map(|_| ()),
        (Slot::Holder, entry) => {
            backend
                .withdraw_member(&FamilyKeys::of(keys), owner, entry.unwrap_or_default())
                .await
        }
    }
}
