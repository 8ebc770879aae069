//! Per-key exclusion inside one locker.
//!
//! Two tasks of the same locker contending for the same name would share one etcd key (the key
//! is derived from the session lease), and etcd's algorithm would hand both the lock. A slot per
//! key serializes them locally: only the slot's owner may create, hold or delete that key. A
//! background cleanup of a key keeps its slot until the key is confirmed gone, so a later
//! acquire never adopts a key whose delete may still land.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Map = HashMap<String, Arc<AsyncMutex<()>>>;

/// The slots of one locker, by etcd key. Clones share the slots.
#[derive(Default, Clone)]
pub(crate) struct Slots {
    map: Arc<Mutex<Map>>,
}

impl Slots {
    fn map(map: &Mutex<Map>) -> MutexGuard<'_, Map> {
        map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, key: &str) -> Arc<AsyncMutex<()>> {
        let mut map = Self::map(&self.map);
        Arc::clone(map.entry(key.to_owned()).or_default())
    }

    /// Waits until the slot of `key` is free and takes it.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped wait takes nothing.
    pub(crate) async fn lock(&self, key: &str) -> SlotGuard {
        let mutex = self.entry(key);
        let guard = mutex.lock_owned().await;
        self.wrap(key, guard)
    }

    /// Takes the slot of `key` if it is free.
    pub(crate) fn try_lock(&self, key: &str) -> Option<SlotGuard> {
        let mutex = self.entry(key);
        match mutex.try_lock_owned() {
            Ok(guard) => Some(self.wrap(key, guard)),
            Err(_) => {
                drop(self.forget_if_unused(key));
                None
            }
        }
    }

    fn wrap(&self, key: &str, guard: OwnedMutexGuard<()>) -> SlotGuard {
        SlotGuard {
            map: Arc::clone(&self.map),
            key: key.to_owned(),
            guard: Some(guard),
        }
    }

    fn forget_if_unused(&self, key: &str) -> Option<Arc<AsyncMutex<()>>> {
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
fn forget_if_unused(map: &Mutex<Map>, key: &str) -> Option<Arc<AsyncMutex<()>>> {
    let mut map = Slots::map(map);
    let unused = map.get(key).is_some_and(|m| Arc::strong_count(m) == 1);
    if unused { map.remove(key) } else { None }
}

/// Ownership of one key's slot; freed on drop.
pub(crate) struct SlotGuard {
    map: Arc<Mutex<Map>>,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
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
        assert!(
            slots.try_lock("k").is_none(),
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
        assert!(slots.try_lock("k").is_none());
        drop(second);
        assert_eq!(slots.len(), 0);
    }
}
