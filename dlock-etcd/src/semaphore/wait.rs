//! Waiting for a permit: watch the semaphore's range for deletions, count the ones ahead of
//! us locally, and read again only when the count says we may hold.
//!
//! A single key cannot be watched: permits are released in any order, so any of the keys
//! ahead may be the one whose deletion lets us in. Every waiter therefore receives every
//! deletion of the semaphore's range (etcd sends the events; the waiter sends no request
//! for them), and sends one re-read when fewer keys than permits are left ahead.

use dlock_core::{Error, LockName};
use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse};
use tokio::time::Instant;

use super::permits::PermitCheck;
use crate::error;
use crate::locker::EtcdLocker;
use crate::session::Session;
use crate::watch::{Bounds, Opened, RESYNC_PERIOD, Turn};

/// Our key and how it waits.
pub(crate) struct PermitWait<'a> {
    pub(crate) name: &'a LockName,
    /// The semaphore's range.
    pub(crate) range: &'a str,
    pub(crate) key: &'a str,
    /// Our key's create revision.
    pub(crate) rev: i64,
    pub(crate) permits: u32,
}

/// What one watch response told a waiter.
enum Seen {
    /// Nothing that lets us in yet.
    Nothing,
    /// Read again: the count allows it, our key went, or an event could not be placed.
    Recheck,
    /// etcd cancelled the watch (e.g. a compaction): open it again.
    Cancelled,
}

impl EtcdLocker {
    /// Waits until fewer than `w.permits` keys of the semaphore were created before ours.
    /// `ahead` and `read_rev`: the count the enqueue read and the revision it read at.
    ///
    /// # Errors
    /// The last error of etcd when it failed until the deadline.
    ///
    /// # Cancel safety
    /// Holds nothing but a watch: dropping the future drops it (the caller's pending key is
    /// deleted by its owner).
    pub(crate) async fn wait_permits(
        &self,
        w: PermitWait<'_>,
        mut ahead: u64,
        mut read_rev: i64,
        session: &Session,
        deadline: Option<Instant>,
    ) -> Result<Turn, Error> {
        let etcd = &self.inner.etcd;
        let permits = u64::from(w.permits);
        let mut b = Bounds::new(session, deadline);
        // Re-reads; `Some(turn)` ends the wait.
        macro_rules! recheck {
            () => {
                match etcd
                    .recheck_permits(w.range, w.key, w.rev, w.permits, deadline)
                    .await
                {
                    Ok(PermitCheck::KeyGone) => {
                        tracing::debug!(lock = %w.name, key = w.key, "our permit key is gone; queueing again");
                        return Ok(Turn::Requeue);
                    }
                    Ok(PermitCheck::Refused(reason)) => return Ok(Turn::Refused(reason)),
                    Ok(PermitCheck::Ahead { ahead: a, header_rev }) => {
                        if a < permits {
                            return Ok(Turn::Owner);
                        }
                        ahead = a;
                        read_rev = header_rev;
                        true
                    }
                    Err(e) => {
                        b.transient(e).await?;
                        false
                    }
                }
            };
        }
        loop {
            let deletions = WatchOptions::new()
                .with_prefix()
                .with_prev_key()
                .with_filters([WatchFilterType::NoPut]);
            let (mut stream, watch_rev) =
                match self.open_waiting(&mut b, w.range, deletions).await? {
                    Opened::Watch(stream, watch_rev) => (stream, watch_rev),
                    Opened::Retry => continue,
                    Opened::Over(turn) => return Ok(turn),
                };
            let opened_at = Instant::now();
            // Read once the watch exists: deletions before it are counted by the read, those
            // after the read by the watch.
            if !recheck!() {
                continue;
            }
            // A write between the watch's start and its registration leaves it to etcd's
            // resync loop: read once more after one resync period then.
            let mut poll = (read_rev > watch_rev).then_some(opened_at + RESYNC_PERIOD);
            loop {
                let next = async {
                    match poll {
                        Some(at) => tokio::time::timeout_at(at, stream.message()).await,
                        None => Ok(stream.message().await),
                    }
                };
                let seen = match b.cut(next).await {
                    Err(turn) => return Ok(turn),
                    Ok(Err(_)) => {
                        poll = None;
                        Seen::Recheck
                    }
                    Ok(Ok(Ok(Some(resp)))) => {
                        count_deletions(&resp, &w, read_rev, &mut ahead, permits)
                    }
                    Ok(Ok(Ok(None))) => {
                        let e = Error::unavailable("watch: stream closed by etcd", None);
                        b.transient(e).await?;
                        break;
                    }
                    Ok(Ok(Err(e))) => {
                        let e = error::map("watch", e);
                        b.transient(e).await?;
                        break;
                    }
                };
                match seen {
                    Seen::Nothing => {}
                    Seen::Cancelled => {
                        let e = Error::unavailable("permit watch cancelled by etcd", None);
                        b.transient(e).await?;
                        break;
                    }
                    Seen::Recheck => {
                        etcd.counters.add_wakeups(1);
                        if !recheck!() {
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// Applies one watch response to the count of keys ahead of ours.
fn count_deletions(
    resp: &WatchResponse,
    w: &PermitWait<'_>,
    read_rev: i64,
    ahead: &mut u64,
    permits: u64,
) -> Seen {
    if resp.canceled() {
        tracing::debug!(
            reason = resp.cancel_reason(),
            compact = resp.compact_revision(),
            "permit watch cancelled by etcd"
        );
        return Seen::Cancelled;
    }
    let mut recheck = false;
    for ev in resp.events() {
        if ev.event_type() != EventType::Delete {
            continue;
        }
        let Some(kv) = ev.kv() else { continue };
        // Already counted by the last read.
        if kv.mod_revision() <= read_rev {
            continue;
        }
        if kv.key() == w.key.as_bytes() {
            recheck = true;
            continue;
        }
        match ev.prev_kv() {
            Some(prev) if prev.create_revision() < w.rev => *ahead = ahead.saturating_sub(1),
            Some(_) => {}
            // Cannot tell where the key was: read.
            None => recheck = true,
        }
    }
    if recheck || *ahead < permits {
        Seen::Recheck
    } else {
        Seen::Nothing
    }
}
