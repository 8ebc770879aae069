//! Acquires dropped while their enqueue is in flight.

use std::time::Duration;

use dlock_core::AcquireOptions;
use tokio::time::Instant;

use super::slow::NO_LINK;
use super::util::{name, proxied, settle, wait_growth, within};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;
use crate::faults::{Direction, Mode};

/// How many acquires are dropped mid-enqueue.
const DROPPED: usize = 3;
/// How long every reply to the dropped acquires' clients is held back: long enough to drop the
/// acquire between its enqueue reaching the server and the reply arriving, shorter than any
/// backend's request timeout (so the first attempt before the enqueue completes).
const REPLY_DELAY: Duration = Duration::from_millis(300);

/// A holder holds the lock and a waiter C is queued. Then, DROPPED times: a client behind a
/// proxy starts an acquire whose replies are delayed, and the acquire future is dropped as soon
/// as its enqueue shows at the server (its reply still on the way). The held replies are then let through (the
/// clients stay alive, so no session end cleans up for them). Afterwards nothing of theirs is
/// on the server, and C is granted promptly when the holder releases.
pub(crate) async fn cancel_mid_enqueue(ctx: &Ctx) -> Result<(), Verdict> {
    if ctx.backend().node_addrs().is_empty() {
        return Err(Verdict::Skip(NO_LINK.into()));
    }
    let ttl = ctx.ttl();
    let lock = name("mid-enqueue")?;
    let (a, c) = (ctx.client().await?, ctx.client().await?);
    let la = a.acquire(&lock, AcquireOptions::wait(ttl)).await?;
    let held = ctx.leftovers().await?;
    let lc = lock.clone();
    let wc = tokio::spawn(async move {
        let lease = c.acquire(&lc, AcquireOptions::wait(ttl * 10)).await?;
        let at = Instant::now();
        lease.release().await?;
        Ok::<_, dlock_core::Error>(at)
    });
    let base = wait_growth(ctx, held.len(), Duration::from_secs(1)).await?;
    tokio::time::sleep(Duration::from_millis(30)).await;
    let with_c = ctx.leftovers().await?;
    let mut keep = Vec::new();
    let mut reached = 0;
    for i in 0..DROPPED {
        let Some((b, proxies)) = proxied(ctx, ClientOptions::new(ctx.ns(), ttl)).await? else {
            return Err(Verdict::Skip(NO_LINK.into()));
        };
        proxies
            .iter()
            .for_each(|p| p.set_direction(Direction::Downstream, Mode::Delay(REPLY_DELAY)));
        let lb = lock.clone();
        let b2 = b.clone();
        let task = tokio::spawn(async move {
            b2.acquire(&lb, AcquireOptions::wait(ttl * 10))
                .await
                .map(|_| ())
        });
        // The enqueue reached the server when its entry shows (backends that keep no entry per
        // waiter never show one: then the request had a second to arrive).
        if wait_growth(ctx, base, Duration::from_secs(1)).await? > base {
            reached += 1;
        }
        task.abort();
        let dropped = task.await;
        ensure!(
            dropped.as_ref().is_err_and(|e| e.is_cancelled()),
            "acquire {i}, dropped mid-enqueue, completed instead: {dropped:?}"
        );
        proxies.iter().for_each(|p| p.set(Mode::Pass));
        keep.push((b, proxies));
    }
    ctx.figure("enqueues_seen_at_server", reached);
    // Nothing of the dropped acquires stays: only the holder's and C's entries. Their clients
    // live on, so no session end would ever remove an entry they forgot; the bound is half a
    // TTL once the last delayed reply is in.
    let bound = ttl / 2 + REPLY_DELAY;
    match settle(ctx, &with_c, bound).await? {
        Ok(took) => ctx.figure_ms("cleanup_ms", took),
        Err(left) => {
            return Err(Verdict::Fail(format!(
                "{DROPPED} acquires dropped mid-enqueue left entries behind {bound:?} later: expected {with_c:?}, found {left:?}"
            )));
        }
    }
    let released = Instant::now();
    la.release().await?;
    let granted = match within(ttl * 2, wc).await {
        Some(Ok(Ok(at))) => at,
        Some(Ok(Err(e))) => return Err(Verdict::Fail(format!("the queued waiter failed: {e}"))),
        Some(Err(e)) => return Err(Verdict::Fail(format!("the queued waiter panicked: {e}"))),
        None => {
            return Err(Verdict::Fail(
                "the queued waiter never got the lock after acquires were dropped mid-enqueue"
                    .into(),
            ));
        }
    };
    let handoff = granted.saturating_duration_since(released);
    ctx.figure_ms("handoff_ms", handoff);
    ensure!(
        handoff < ttl / 2,
        "the queued waiter got the lock {handoff:?} after the release: a dropped acquire's entry stood in its way"
    );
    // No dropped acquire was granted behind the scenes: the lock is free now.
    let d = ctx.client().await?;
    let free = d.try_acquire(&lock).await?;
    let was_free = free.is_some();
    if let Some(l) = free {
        l.release().await?;
    }
    ensure!(
        was_free,
        "after every waiter finished the lock is held: a dropped acquire was granted"
    );
    drop(keep);
    Ok(())
}
