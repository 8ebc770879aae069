//! `close()`: what a locker leaves at the server once it is closed.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, Error, ErrorKind, LockName, Locker};
use tokio::time::Instant;

use super::util::name;
use super::{Ctx, Verdict, ensure};
use crate::{ClientOptions, TestBackend};

/// How long the waiter may take to show in the queue.
const QUEUED_WITHIN: Duration = Duration::from_secs(5);

/// `close()`: both held leases end at once with `Closed` (a loss signal a task awaits resolves
/// too; no loss is counted), their locks are free at the server when `close` returns (a
/// contender's `try_acquire` gets both at once, not after a TTL), the closed locker refuses to
/// grant or inspect with `Error::Closed`, and closing again is harmless. Where the backend
/// queues waiters, a wait cancelled just before `close` has left no queue entry when `close`
/// returns, even if the runtime ends right after (see [`cancelled_wait`]).
pub(crate) async fn close(ctx: &Ctx) -> Result<(), Verdict> {
    let (holder, contender) = (ctx.client().await?, ctx.client().await?);
    let (first, second) = (name("close-a")?, name("close-b")?);
    let wait = AcquireOptions::wait(ctx.ttl() * 2);
    let la = holder.acquire(&first, wait).await?;
    let lb = holder.acquire(&second, wait).await?;
    let watching = tokio::spawn(la.lost());
    let losses = holder.stats().losses;
    holder
        .close()
        .await
        .map_err(|e| Verdict::Fail(format!("close failed: {e}")))?;
    for (which, lease) in [("first", &la), ("second", &lb)] {
        match lease.check() {
            Err(Error::Lost(dlock_core::LossReason::Closed)) => {}
            other => {
                return Err(Verdict::Fail(format!(
                    "the {which} lease after close: {other:?}, not lost with Closed"
                )));
            }
        }
    }
    let seen = tokio::time::timeout(Duration::from_secs(1), watching).await;
    ensure!(
        matches!(seen, Ok(Ok(dlock_core::LossReason::Closed))),
        "a task awaiting lost() did not see Closed within 1 s of close: {seen:?}"
    );
    ensure!(
        holder.stats().losses == losses,
        "close counted {} losses",
        holder.stats().losses - losses
    );
    for lock in [&first, &second] {
        match contender.try_acquire(lock).await? {
            Some(l) => l.release().await?,
            None => {
                return Err(Verdict::Fail(format!(
                    "{lock} was still held at the server after close returned"
                )));
            }
        }
    }
    for (call, got) in [
        ("acquire", holder.acquire(&first, wait).await.map(|_| ())),
        ("try_acquire", holder.try_acquire(&first).await.map(|_| ())),
        ("inspect", holder.inspect(&first).await.map(|_| ())),
    ] {
        ensure!(
            got.as_ref().is_err_and(|e| e.kind() == ErrorKind::Closed),
            "{call} on a closed locker: {got:?}, not Error::Closed"
        );
    }
    holder
        .close()
        .await
        .map_err(|e| Verdict::Fail(format!("closing again failed: {e}")))?;
    cancelled_wait(ctx, &contender).await?;
    closed_election(ctx).await
}

/// An election handle closes as its locker does: its leadership ends with `Closed`, and
/// `campaign`, `leader` and `observe` then fail with `Error::Closed`.
async fn closed_election(ctx: &Ctx) -> Result<(), Verdict> {
    let opts = ClientOptions::new(ctx.ns(), ctx.ttl());
    let Some(election) = ctx.backend().election(opts).await? else {
        return Ok(());
    };
    let seat = name("close-election")?;
    let wait = AcquireOptions::wait(ctx.ttl() * 2);
    let leading = election.campaign(&seat, b"closing", wait).await?;
    election
        .close()
        .await
        .map_err(|e| Verdict::Fail(format!("closing the election failed: {e}")))?;
    ensure!(
        matches!(
            leading.lease().check(),
            Err(Error::Lost(dlock_core::LossReason::Closed))
        ),
        "the leadership after its election closed: {:?}, not lost with Closed",
        leading.lease().check()
    );
    for (call, got) in [
        (
            "campaign",
            election.campaign(&seat, b"again", wait).await.map(|_| ()),
        ),
        ("leader", election.leader(&seat).await.map(|_| ())),
        ("observe", election.observe(&seat).await.map(|_| ())),
    ] {
        ensure!(
            got.as_ref().is_err_and(|e| e.kind() == ErrorKind::Closed),
            "{call} on a closed election: {got:?}, not Error::Closed"
        );
    }
    Ok(())
}

/// A waiter whose wait is cancelled (its acquire future dropped) and whose locker is closed at
/// once, on a runtime that ends right after `close` returns, as a command-line tool's does
/// when it exits on a signal: `close` must have withdrawn the queue entry by the time it
/// returns. Judged by [`Locker::inspect`] from another client, at once, with no grace; where
/// the backend keeps no queue (`waiting` is `None`) there is nothing to judge.
async fn cancelled_wait(ctx: &Ctx, contender: &Arc<dyn Locker>) -> Result<(), Verdict> {
    let lock = name("close-queue")?;
    let held = contender
        .acquire(&lock, AcquireOptions::wait(ctx.ttl() * 2))
        .await?;
    if contender.inspect(&lock).await?.waiting.is_none() {
        held.release().await?;
        return Ok(());
    }
    let backend = Arc::clone(ctx.backend());
    let opts = ClientOptions::new(ctx.ns(), ctx.ttl());
    let (ttl, l2) = (ctx.ttl(), lock.clone());
    let waiter = tokio::task::spawn_blocking(move || wait_cancel_close(backend, opts, ttl, l2));
    let outcome = waiter
        .await
        .map_err(|e| Verdict::Fail(format!("the waiter's thread panicked: {e}")))?;
    let left = contender.inspect(&lock).await;
    held.release().await?;
    outcome?;
    let waiting = left?.waiting;
    ensure!(
        waiting == Some(0),
        "close returned with the cancelled waiter still queued: {waiting:?} waiting"
    );
    Ok(())
}

/// On a runtime of its own: a client queues on `lock`, its acquire is dropped, the client is
/// closed, and the runtime ends as soon as `close` returns.
fn wait_cancel_close(
    backend: Arc<dyn TestBackend>,
    opts: ClientOptions,
    ttl: Duration,
    lock: LockName,
) -> Result<(), Verdict> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Verdict::Fail(format!("cannot build the waiter's runtime: {e}")))?;
    runtime.block_on(async move {
        let waiter = backend.client(opts).await?;
        let mut wait = Box::pin(waiter.acquire(&lock, AcquireOptions::wait(ttl * 10)));
        let until = Instant::now() + QUEUED_WITHIN;
        loop {
            tokio::select! {
                got = &mut wait => {
                    return Err(Verdict::Fail(format!(
                        "the waiter's acquire ended while the lock was held: {:?}",
                        got.map(|l| l.token())
                    )));
                }
                // The acquire is polled all along: the look waits first, then reads.
                seen = async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    waiter.inspect(&lock).await
                } => {
                    if seen?.waiting == Some(1) {
                        break;
                    }
                }
            }
            ensure!(
                Instant::now() < until,
                "the waiter did not show in the queue within {QUEUED_WITHIN:?}"
            );
        }
        drop(wait);
        waiter
            .close()
            .await
            .map_err(|e| Verdict::Fail(format!("close after a cancelled wait failed: {e}")))
    })
    // The runtime is dropped here: whatever `close` left running ends unfinished.
}
