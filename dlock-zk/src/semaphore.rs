//! The ZooKeeper [`Semaphore`](dlock_core::Semaphore), in the layout of Curator's
//! `InterProcessSemaphoreV2`.
//!
//! A semaphore `name` uses two children of the lock's parent `<root>/<encoded name>`:
//!
//! - `locks`: a mutex (`_c_<uuid>-lock-<seq>` nodes, the mutex's own machinery) that guards
//!   acquisition. Waiters queue there FIFO, each watching only its predecessor.
//! - `leases`: one `_c_<uuid>-lease-<seq>` node per permit held or being acquired. Only the
//!   holder of the guard creates one; it holds a permit once fewer than N lease nodes precede
//!   its own, and until then watches the children of `leases` (it alone: herd-free), then
//!   releases the guard. Holders release in any order, so the node N places ahead would not
//!   do: a permit freed nearer to us must wake us.
//!
//! The permit count is recorded in each lease node's data (` permits=<N>` after the usual
//! owner fields, see `payload`). The guard holder compares its count with the earliest lease
//! node ahead of its own that records one (every holder's agrees with it, since each was
//! checked the same way) and fails with [`Error::InvalidOption`] on a mismatch, removing its
//! node. Nodes without a count (Curator's) are not compared.

use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::SemaphoreBackend;
use dlock_core::{AcquireOptions, Error, ErrorKind, Lease, LockName};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::keys::{LOCK_MARKER, SEMAPHORE_LEASES, SEMAPHORE_LOCKS};
use crate::locker::{Queue, ZkLocker};
use crate::rule::Rule;
use crate::session::Session;

/// The field of a lease node's data that records the semaphore's permit count.
const PERMITS_FIELD: &str = "permits=";

/// The data of a lease node: the locker's payload, then the permit count.
fn lease_payload(payload: &[u8], permits: u32) -> Vec<u8> {
    let mut data = payload.to_vec();
    data.extend_from_slice(format!(" {PERMITS_FIELD}{permits}").as_bytes());
    data
}

/// The permit count a lease node's data records, if any (none in a Curator node).
fn recorded_permits(data: &[u8]) -> Option<u32> {
    String::from_utf8_lossy(data)
        .split_ascii_whitespace()
        .find_map(|field| field.strip_prefix(PERMITS_FIELD)?.parse().ok())
}

/// Compares `permits` with the count recorded by the earliest of `ahead` (lease nodes of
/// `parent`, in order) that records one. `Ok(None)` when they agree or none records a count;
/// `Ok(Some(error))` on a mismatch.
///
/// # Errors
/// The server's error when a node cannot be read (a node gone meanwhile is skipped).
pub(crate) async fn check_permits(
    sess: &Session,
    parent: &str,
    ahead: &[String],
    permits: u32,
) -> Result<Option<Error>, zk::Error> {
    for node in ahead {
        sess.counters.add_requests(1);
        let data = match sess.client.get_data(&format!("{parent}/{node}")).await {
            Ok((data, _)) => data,
            Err(zk::Error::NoNode) => continue,
            Err(e) => return Err(e),
        };
        let Some(recorded) = recorded_permits(&data) else {
            continue;
        };
        if recorded == permits {
            return Ok(None);
        }
        return Ok(Some(Error::invalid_option(
            "permits",
            format!("{permits} differs from the {recorded} permits the semaphore is held with"),
        )));
    }
    Ok(None)
}

/// The time left until `deadline`, if any.
fn left(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

/// A counting semaphore on ZooKeeper in the layout of Curator's `InterProcessSemaphoreV2`
/// (`<root>/<encoded name>/locks` guarding acquisition, `…/leases` holding the permits); a
/// permit's fencing token is its lease node's `czxid`. See the README's "Read-write lock and
/// semaphore" section.
#[async_trait]
impl SemaphoreBackend for ZkLocker {
    /// Takes the guard mutex (`locks`, FIFO), checks `permits` against the count the holders
    /// recorded, creates an EPHEMERAL_SEQUENTIAL `lease-` node recording it, waits until fewer
    /// than `permits` lease nodes precede it, and releases the guard. If the guard is lost
    /// while its holder waits for a permit (its session ended), the acquire starts over.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a permit count outside 1..=[`dlock_core::MAX_PERMITS`] or a
    /// bad wait (before any I/O), or for a count that differs from the one the holders recorded
    /// (nothing is left behind); otherwise as [`Locker::acquire`](dlock_core::Locker::acquire).
    ///
    /// # Cancel safety
    /// Dropping the future removes our guard and lease nodes in the background, as for
    /// [`Locker::acquire`](dlock_core::Locker::acquire).
    async fn lock_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        let began = Instant::now();
        let deadline = opts.wait.map(|w| began + w);
        let data: std::sync::Arc<[u8]> = lease_payload(&self.payload(), permits).into();
        loop {
            let guard_queue = Queue {
                rule: Rule::First(LOCK_MARKER),
                payload: self.payload(),
                under: Some(SEMAPHORE_LOCKS),
            };
            let Some(guard) = self
                .contend(name, left(deadline), false, guard_queue)
                .await?
            else {
                return Err(Error::backend(
                    "ZooKeeper semaphore guard ended without a grant",
                    None,
                ));
            };
            let lease_queue = Queue {
                rule: Rule::Lease { permits },
                payload: std::sync::Arc::clone(&data),
                under: Some(SEMAPHORE_LEASES),
            };
            let guard_lost = guard.lease.lost();
            let got = tokio::select! {
                got = self.contend(name, left(deadline), false, lease_queue) => Some(got),
                reason = guard_lost => {
                    tracing::info!(
                        lock = %name,
                        %reason,
                        "semaphore guard lost while waiting for a permit; starting over"
                    );
                    None
                }
            };
            // As Curator: the guard is released whatever the outcome.
            if let Err(e) = guard.lease.release().await {
                tracing::debug!(lock = %name, error = %e, "releasing the semaphore guard");
            }
            match got {
                Some(Ok(Some(grant))) => return Ok(grant.lease),
                Some(Ok(None)) => {
                    return Err(Error::backend(
                        "ZooKeeper semaphore acquire ended without a grant",
                        None,
                    ));
                }
                Some(Err(e)) if e.kind() == ErrorKind::Timeout => {
                    return Err(Error::Timeout {
                        waited: began.elapsed(),
                    });
                }
                Some(Err(e)) => return Err(e),
                None if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Err(Error::Timeout {
                        waited: began.elapsed(),
                    });
                }
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_recorded_after_the_owner_fields() {
        let data = lease_payload(b"host=h pid=1 locker=x", 3);
        assert_eq!(data, b"host=h pid=1 locker=x permits=3");
        assert_eq!(recorded_permits(&data), Some(3));
        assert_eq!(recorded_permits(b"10.0.0.1"), None);
        assert_eq!(recorded_permits(b"permits=x"), None);
        assert_eq!(recorded_permits(b""), None);
    }
}
