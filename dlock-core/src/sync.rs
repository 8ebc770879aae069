//! Locking the crate's mutexes whatever a panic left behind.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also when a panic poisoned it: the crate's mutexes guard plain data that a panic
/// cannot leave half-updated (a [`FenceGuard`](crate::FenceGuard)'s value stays as a panicking
/// closure left it).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
