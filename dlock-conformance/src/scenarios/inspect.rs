//! `Locker::inspect`: what it shows matches the leases and the queue, and it leaves nothing.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, Lease, LockName, LockState, Locker};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::util::{name, settle, wait_growth};
use super::{Ctx, Verdict, ensure};

/// How long a change (a waiter queued, a grant, a release) may take to show in `inspect`.
const SHOW: Duration = Duration::from_secs(5);
/// How much the server's remaining TTL may be rounded (etcd reports whole seconds).
const TTL_ROUNDING: Duration = Duration::from_secs(1);

/// A free name shows no holder; a held one shows the lease's token and a remaining TTL no
/// shorter than the lease's promise and no longer than the TTL; queued waiters are counted
/// exactly (where the backend queues); each grant and release shows; and inspecting creates no
/// entry at the server.
pub(crate) async fn inspect(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b, c, eye) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let queues = a.capabilities().fair;
    let lock = name("inspect")?;
    let free = look(ctx, &eye, &lock).await?;
    ensure!(
        free.holder.is_none(),
        "a name nobody holds shows a holder: {:?}",
        free.holder
    );
    let la = a.acquire(&lock, AcquireOptions::wait(ctx.ttl())).await?;
    let before = ctx.leftovers().await?;
    let held = look(ctx, &eye, &lock).await?;
    matches_lease(ctx, &held, &la, "the first holder")?;
    if queues {
        ensure!(
            held.waiting == Some(0),
            "a held name nobody waits for shows {:?} waiting",
            held.waiting
        );
    }
    for _ in 0..3 {
        look(ctx, &eye, &lock).await?;
    }
    if let Err(now) = settle(ctx, &before, Duration::ZERO).await? {
        return Err(Verdict::Fail(format!(
            "inspect changed the server's entries: before {before:?}, after {now:?}"
        )));
    }

    let wb = waiter(ctx, &b, &lock);
    if queues {
        until(ctx, &eye, &lock, "one waiter counted", |s| {
            s.waiting == Some(1)
        })
        .await?;
    } else {
        wait_growth(ctx, before.len(), Duration::from_millis(500)).await?;
    }
    let wc = waiter(ctx, &c, &lock);
    if queues {
        until(ctx, &eye, &lock, "two waiters counted", |s| {
            s.waiting == Some(2)
        })
        .await?;
    }
    let still = look(ctx, &eye, &lock).await?;
    matches_lease(ctx, &still, &la, "the holder with two waiters")?;

    la.release().await?;
    // The head waiter goes next where the backend queues; without a queue either may win.
    let (next, other) = first_of(wb, wc).await?;
    let token = next.token();
    let shown = until(ctx, &eye, &lock, "the next holder shown", |s| {
        s.holder
            .as_ref()
            .is_some_and(|h| h.token.is_none_or(|t| t == token))
            && (!queues || s.waiting == Some(1))
    })
    .await?;
    matches_lease(ctx, &shown, &next, "the second holder")?;
    next.release().await?;
    let last = match tokio::time::timeout(SHOW, other).await {
        Ok(got) => joined(got)?,
        Err(_) => {
            return Err(Verdict::Fail(
                "the last waiter was not granted within 5 s of the release".into(),
            ));
        }
    };
    last.release().await?;
    until(ctx, &eye, &lock, "the name shown free", |s| {
        s.holder.is_none() && (!queues || s.waiting == Some(0))
    })
    .await?;
    Ok(())
}

/// The first of two waiters granted (within [`SHOW`]), and the other's task.
async fn first_of(
    mut wb: JoinHandle<Result<Lease, dlock_core::Error>>,
    mut wc: JoinHandle<Result<Lease, dlock_core::Error>>,
) -> Result<(Lease, JoinHandle<Result<Lease, dlock_core::Error>>), Verdict> {
    let raced = tokio::time::timeout(SHOW, async {
        tokio::select! {
            got = &mut wb => (got, true),
            got = &mut wc => (got, false),
        }
    })
    .await;
    match raced {
        Ok((got, true)) => Ok((joined(got)?, wc)),
        Ok((got, false)) => Ok((joined(got)?, wb)),
        Err(_) => Err(Verdict::Fail(
            "no waiter was granted within 5 s of the release".into(),
        )),
    }
}

/// One `inspect`, timed. A retryable error (a node slow to answer on a loaded machine) is
/// tried again for up to [`SHOW`]: the scenario judges what inspect shows, and a read that
/// keeps failing still fails it.
async fn look(ctx: &Ctx, eye: &Arc<dyn Locker>, lock: &LockName) -> Result<LockState, Verdict> {
    let began = Instant::now();
    loop {
        let t = Instant::now();
        match eye.inspect(lock).await {
            Ok(got) => {
                ctx.figure_ms("inspect_ms", t.elapsed());
                return Ok(got);
            }
            Err(e) if e.is_retryable() && began.elapsed() < SHOW => {
                ctx.figure("inspect_retried", e.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Inspects until `done` holds, for at most [`SHOW`]; fails with the last state seen.
async fn until(
    ctx: &Ctx,
    eye: &Arc<dyn Locker>,
    lock: &LockName,
    what: &str,
    done: impl Fn(&LockState) -> bool,
) -> Result<LockState, Verdict> {
    let began = Instant::now();
    loop {
        let got = look(ctx, eye, lock).await?;
        if done(&got) {
            return Ok(got);
        }
        if began.elapsed() >= SHOW {
            return Err(Verdict::Fail(format!(
                "{what}: not within {SHOW:?}; inspect shows {got:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks that `state` shows `lease` as the holder: its token (where the server records one),
/// and a remaining TTL that covers the lease's deadline and stays within the TTL.
fn matches_lease(ctx: &Ctx, state: &LockState, lease: &Lease, who: &str) -> Result<(), Verdict> {
    let seen = Instant::now();
    let Some(h) = &state.holder else {
        return Err(Verdict::Fail(format!(
            "{who}: inspect shows nobody holding"
        )));
    };
    if let Some(t) = h.token {
        ensure!(
            t == lease.token(),
            "{who}: inspect shows token {t}, the lease has {}",
            lease.token()
        );
    }
    ensure!(!h.entry.is_empty(), "{who}: inspect names no server entry");
    if let Some(left) = h.expires_within {
        ensure!(
            left <= ctx.ttl() + TTL_ROUNDING,
            "{who}: the server keeps the lock {left:?} more, beyond the TTL {:?}",
            ctx.ttl()
        );
        ensure!(
            seen + left + TTL_ROUNDING >= lease.deadline(),
            "{who}: the server keeps the lock {left:?} more, but the lease promises {:?} more",
            lease.deadline().saturating_duration_since(seen)
        );
    }
    Ok(())
}

/// An acquire of `lock` by `client` in the background.
fn waiter(
    ctx: &Ctx,
    client: &Arc<dyn Locker>,
    lock: &LockName,
) -> JoinHandle<Result<Lease, dlock_core::Error>> {
    let (client, lock, wait) = (Arc::clone(client), lock.clone(), ctx.ttl() * 4 + SHOW);
    tokio::spawn(async move { client.acquire(&lock, AcquireOptions::wait(wait)).await })
}

fn joined(
    got: Result<Result<Lease, dlock_core::Error>, tokio::task::JoinError>,
) -> Result<Lease, Verdict> {
    got.map_err(|e| Verdict::Fail(format!("a waiter task failed: {e}")))?
        .map_err(Verdict::from)
}
