//! A grant's last steps, for the mutex and the read-write lock and semaphore alike: the
//! replicas' acknowledgement, then the lease.

use dlock_core::{Error, FencingToken, Lease, LockName};
use tokio::time::Instant;

use super::Inner;
use super::pending::Pending;
use crate::conn::millis;

/// With [`wait_for_replicas`](crate::RedisLockerBuilder::wait_for_replicas): waits until enough
/// replicas acknowledged the grant. The error says why not (too few replicas in time, or the
/// `WAIT` failed); the caller gives the grant back before it returns it.
pub(super) async fn replicas_acknowledged(inner: &Inner) -> Result<(), Error> {
    let Some((replicas, timeout)) = inner.replicas else {
        return Ok(());
    };
    let node = &inner.backend.node;
    let mut pipe = redis::pipe();
    pipe.cmd("WAIT").arg(replicas).arg(millis(timeout));
    let acked: (i64,) = node
        .pipeline(
            "replica acknowledgement",
            &pipe,
            timeout + inner.request_timeout,
            &inner.counters,
        )
        .await?;
    match acked {
        (n,) if usize::try_from(n).is_ok_and(|n| n >= replicas) => Ok(()),
        (n,) => Err(Error::unavailable(
            format!(
                "only {n} of {replicas} replicas of {} acknowledged the grant within {timeout:?}; it was given back",
                node.display
            ),
            None,
        )),
    }
}

/// Hands out the lease of a grant whose request was sent at `start`, with the owner value
/// (or member) it holds.
pub(super) fn lease(
    inner: &Inner,
    name: &LockName,
    p: Pending,
    token: u64,
    start: Instant,
) -> (Lease, String) {
    let held = p.into_held();
    let owner = held.owner.clone();
    let lease = inner
        .driver
        .register(name.clone(), FencingToken(token), start, held);
    (lease, owner)
}
