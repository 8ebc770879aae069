//! What one queue key waits for: the rule that sets a mutex, a reader, a writer and a permit
//! apart on the same enqueue / wait / grant machinery.
//!
//! Every contender puts ONE key on its session lease (`<key range><session lease hex>` for
//! the mutex, `<key range><request number>/<session lease hex>` for the others) and waits
//! until its rule holds for the keys created before it (lower create revision) in the `ahead`
//! range; its fencing token is its key's create revision.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::keys;

/// The next request number of this process (read, write and permit keys).
fn next_request() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// When a queued key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Once no key of `ahead` was created before ours: we wait for the newest such key (the
    /// mutex and a writer wait on their whole range, a reader on the writers' range).
    Last,
    /// Once fewer than this many keys of `ahead` were created before ours (a semaphore).
    Permits(u32),
}

/// Where a contender puts its key and what it waits on.
#[derive(Clone, Debug)]
pub(crate) struct Queue {
    /// The range our key goes in.
    pub(crate) key_range: String,
    /// The range whose earlier keys we wait for.
    pub(crate) ahead: String,
    pub(crate) rule: Rule,
    /// The request number in our key (`None`: the mutex's key, one per locker and name).
    request: Option<u64>,
}

impl Queue {
    /// Our key when our session's lease id is `session_id`.
    pub(crate) fn key(&self, session_id: i64) -> String {
        match self.request {
            None => keys::contender_key(&self.key_range, session_id),
            Some(n) => keys::request_key(&self.key_range, n, session_id),
        }
    }

    /// The mutex (and election) of the lock range `range`: etcd's `concurrency.Mutex`.
    pub(crate) fn mutex(range: String) -> Self {
        Queue {
            key_range: range.clone(),
            ahead: range,
            rule: Rule::Last,
            request: None,
        }
    }

    /// A reader of the lock range `range`: its key in `read/`, waiting for the last writer
    /// created before it (etcd's recipes `RWMutex.RLock`).
    pub(crate) fn read(range: &str) -> Self {
        Queue {
            key_range: keys::read_range(range),
            ahead: keys::write_range(range),
            rule: Rule::Last,
            request: Some(next_request()),
        }
    }

    /// A writer of the lock range `range`: its key in `write/`, waiting for the last key of
    /// the whole range created before it, read or write (etcd's recipes `RWMutex.Lock`).
    pub(crate) fn write(range: &str) -> Self {
        Queue {
            key_range: keys::write_range(range),
            ahead: range.to_owned(),
            rule: Rule::Last,
            request: Some(next_request()),
        }
    }

    /// A semaphore of `permits` on the lock range `range`: its key in `permit/`, holding once
    /// fewer than `permits` permit keys were created before it.
    pub(crate) fn permits(range: &str, permits: u32) -> Self {
        let sub = keys::permit_range(range);
        Queue {
            key_range: sub.clone(),
            ahead: sub,
            rule: Rule::Permits(permits),
            request: Some(next_request()),
        }
    }
}
