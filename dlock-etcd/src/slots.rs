//! Per-key exclusion inside one locker.
//!
//! Two tasks of the same locker contending for the same name would share one etcd key (the key
//! is derived from the session lease), and etcd's algorithm would hand both the lock. A slot per
//! key serializes them locally: only the slot's owner may create, hold or delete that key. A
//! background cleanup of a key keeps its slot until the key is confirmed gone, so a later
//! acquire never adopts a key whose delete may still land.
//!
//! A slot held by a cleanup (a background delete of a key no acquire owns any more) is marked
//! so: a `try_acquire` waits for it rather than report the lock as taken, since a cleanup says
//! nothing about who holds the lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// One key's slot: the mutex its owner holds, and whether that owner is a cleanup.
#[derive(Default)]
struct Slot {
    mutex: Arc<AsyncMutex<()>>,
    cleaning: AtomicBool,
}

type Map = HashMap<String, Arc<Slot>>;

/// Why [`Slots::try_lock`] did not take a slot.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Busy {
    /// An acquire or a held lease of this locker owns the key.
    Owned,
    /// A background delete of a key no acquire owns any more: free again within a request.
    Cleaning,
}

/// The slots of one locker, by etcd key. Clones share the slots.
#[derive(Default, Clone)]
pub(crate) struct Slots {
    map: Arc<Mutex<Map>>,
}

impl Slots {
    fn map(map: &Mutex<Map>) -> MutexGuard<'_, Map> {
        map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, key: &str) -> Arc<Slot> {
        let mut map = Self::map(&self.map);
        Arc::clone(map.entry(key.to_owned()).or_default())
    }

    /// Waits until the slot of `key` is free and takes it.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped wait takes nothing.
    pub(crate) async fn lock(&self, key: &str) -> SlotGuard {
        let slot = self.entry(key);
        let guard = Arc::clone(&slot.mutex).lock_owned().await;
        self.wrap(key, slot, guard)
    }

    /// Takes the slot of `key` if it is free; says who holds it otherwise.
    pub(crate) fn try_lock(&self, key: &str) -> Result<SlotGuard, Busy> {
        let slot = self.entry(key);
        match Arc::clone(&slot.mutex).try_lock_owned() {
            Ok(guard) => Ok(self.wrap(key, slot, guard)),
            Err(_) => {
                let busy = if slot.cleaning.load(Ordering::Acquire) {
                    Busy::Cleaning
                } else {
                    Busy::Owned
                };
                drop(slot);
                drop(self.forget_if_unused(key));
                Err(busy)
            }
        }
    }

    fn wrap(&self, key: &str, slot: Arc<Slot>, guard: OwnedMutexGuard<()>) -> SlotGuard {
        SlotGuard {
            map: Arc::clone(&self.map),
            key: key.to_owned(),
            slot: Some(slot),
            guard: Some(guard),
        }
    }

    fn forget_if_unused(&self, key: &str) -> Option<Arc<Slot>> {
        forget_if_unused(&self.map, key)
    }

    /// Every key with a slot entry (taken, or waited for).
    pub(crate) fn keys(&self) -> Vec<String> {
        Self::map(&self.map).keys().cloned().collect()
    }

    /// How many keys have a slot entry (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        Self::map(&self.map).len()
    }
}

/// Removes the map entry of `key` when nobody holds or waits for it; returns it so the caller
/// drops it outside the map lock.
fn forget_if_unused(map: &Mutex<Map>, key: &str) -> Option<Arc<Slot>> {
    let mut map = Slots::map(map);
    let unused = map.get(key).is_some_and(|m| Arc::strong_count(m) == 1);
    if unused { map.remove(key) } else { None }
}

/// Ownership of one key's slot; freed on drop.
pub(crate) struct SlotGuard {
    map: Arc<Mutex<Map>>,
    key: String,
    slot: Option<Arc<Slot>>,
    guard: Option<OwnedMutexGuard<()>>,
}

impl SlotGuard {
    /// Marks the slot as held by a cleanup until this guard drops.
    pub(crate) fn cleaning(self) -> Self {
        if let Some(slot) = &self.slot {
            slot.cleaning.store(true, Ordering::Release);
        }
        self
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            slot.cleaning.store(false, Ordering::Release);
        }
        drop(self.guard.take());
        drop(self.slot.take());
        drop(forget_if_unused(&self.map, &self.key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_owner_per_key_and_entries_are_forgotten() {
        let slots = Slots::default();
        let a = slots.lock("k").await;
        assert_eq!(
            slots.try_lock("k").err(),
            Some(Busy::Owned),
            "second owner of the same key"
        );
        let other = slots.try_lock("other").expect("a different key is free");
        drop(other);
        drop(a);
        assert_eq!(slots.len(), 0, "entries must not accumulate");
        let again = slots.try_lock("k").expect("free after release");
        drop(again);
        assert_eq!(slots.len(), 0);
    }

    #[tokio::test]
    async fn waiter_gets_the_slot_after_release() {
        let slots = Arc::new(Slots::default());
        let first = slots.lock("k").await;
        let s2 = Arc::clone(&slots);
        let waiter = tokio::spawn(async move { s2.lock("k").await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        let second = waiter.await.expect("task");
        assert!(slots.try_lock("k").is_err());
        drop(second);
        assert_eq!(slots.len(), 0);
    }

    /// A try sees a cleanup for what it is, and the mark goes with the cleanup's guard.
    #[tokio::test]
    async fn a_slot_held_by_a_cleanup_says_so() {
        let slots = Slots::default();
        let cleanup = slots.lock("k").await.cleaning();
        assert_eq!(slots.try_lock("k").err(), Some(Busy::Cleaning));
        drop(cleanup);
        let owner = slots.try_lock("k").expect("free after the cleanup");
        assert_eq!(slots.try_lock("k").err(), Some(Busy::Owned));
        drop(owner);
        assert_eq!(slots.len(), 0);
    }
}
