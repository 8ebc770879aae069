//! A grant's last steps, for the mutex and the read-write lock and semaphore alike: the
//! replicas' acknowledgement, then the lease.

use std::sync::Mutex;

use dlock_core::{Error, FencingToken, Lease, LockName};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::pending::Pending;
use crate::conn::{bounded, millis};
use crate::locker::Inner;

/// The most idle `WAIT` connections a locker keeps.
const MAX_IDLE: usize = 8;

/// Connections of the locker's own for `WAIT`, which blocks the connection it is sent on until
/// it returns: on the shared connection, k grants waiting for a stalled replica would hold up
/// every other request of the locker (its renewals too) for k × the timeout. Each `WAIT` takes
/// an idle connection (or opens one) and gives it back only when its reply came in time.
#[derive(Default)]
pub(crate) struct WaitConns {
    /// Idle connections and the server address each one goes to.
    idle: Mutex<Vec<(String, MultiplexedConnection)>>,
}

impl WaitConns {
    fn take(&self, addr: &str) -> Option<MultiplexedConnection> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let i = idle.iter().rposition(|(a, _)| a == addr)?;
        Some(idle.swap_remove(i).1)
    }

    fn give_back(&self, addr: String, conn: MultiplexedConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((addr, conn));
        }
    }
}

/// With [`wait_for_replicas`](crate::RedisLockerBuilder::wait_for_replicas): waits until enough
/// replicas acknowledged the grant. The error says why not (too few replicas in time, or the
/// `WAIT` failed); the caller gives the grant back before it returns it.
///
/// `WAIT` runs on a connection of its own ([`WaitConns`]). It waits for the writes of the
/// connection it is sent on, so it is preceded there by a `PUBLISH` (replicated, like every
/// `PUBLISH` outside a cluster, and heard by nobody: no locker id is empty): the connection's
/// replication offset is then at least the grant's, which the server applied before it
/// answered, and the `WAIT` covers the grant. Both go in one pipeline: one round trip, as
/// before.
pub(super) async fn replicas_acknowledged(inner: &Inner) -> Result<(), Error> {
    let Some((replicas, timeout)) = inner.replicas else {
        return Ok(());
    };
    let node = &inner.backend.node;
    let budget = timeout + inner.request_timeout;
    let start = Instant::now();
    let client = node.client(budget).await?;
    let addr = client.get_connection_info().addr().to_string();
    let mut conn = match inner.wait_conns.take(&addr) {
        Some(conn) => conn,
        None => {
            let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
            let left = budget.saturating_sub(start.elapsed());
            bounded(&node.display, "connecting for WAIT", left, async move {
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            })
            .await?
        }
    };
    let mut pipe = redis::pipe();
    pipe.cmd("PUBLISH")
        .arg(&inner.backend.channel_prefix)
        .arg("")
        .ignore()
        .cmd("WAIT")
        .arg(replicas)
        .arg(millis(timeout));
    inner.counters.add_requests(1);
    let left = budget.saturating_sub(start.elapsed());
    let acked: (i64,) = bounded(
        &node.display,
        "replica acknowledgement",
        left,
        pipe.query_async(&mut conn),
    )
    .await?;
    // Answered in time: nothing is left in flight on it.
    inner.wait_conns.give_back(addr, conn);
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

/// Hands out the lease of a grant a release made to us directly, counted from `start` (see
/// [`direct::start_of`](super::direct::start_of)), with the owner value it holds. Its first
/// renewal is due a third of TTL after `start` or a third of the validity left after now,
/// whichever is later: a grant capped at the queue entry's lifetime would otherwise be due at
/// once, and renewed however short the hold.
pub(super) fn handed_over(
    inner: &Inner,
    name: &LockName,
    p: Pending,
    token: u64,
    start: Instant,
) -> (Lease, String) {
    let now = Instant::now();
    let left = inner
        .driver
        .deadline_from(start)
        .saturating_duration_since(now);
    let due = (start + inner.ttl / 3).max(now + left / 3);
    registered(inner, name, p, token, start, Some(due))
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
    registered(inner, name, p, token, start, None)
}

/// Registers the grant with the renewal driver: its first renewal due at `due`, or TTL/3
/// after `start` (`None`). Returns the lease and the owner value (or member) it holds.
fn registered(
    inner: &Inner,
    name: &LockName,
    p: Pending,
    token: u64,
    start: Instant,
    due: Option<Instant>,
) -> (Lease, String) {
    let held = p.into_held();
    let owner = held.owner.clone();
    let (name, token) = (name.clone(), FencingToken(token));
    let lease = match due {
        Some(due) => inner
            .driver
            .register_renewing_at(name, token, start, due, held),
        None => inner.driver.register(name, token, start, held),
    };
    (lease, owner)
}
