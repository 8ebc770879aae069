//! Waiting: cancellation, FIFO order, herd effect.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{AcquireOptions, Locker, Stats};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::util::{name, settle, wait_growth, within};
use super::{Ctx, Verdict, ensure};

/// How long to wait for a new waiter's entry to show at the server before moving on.
const QUEUE_SHOW: Duration = Duration::from_millis(1000);
/// Extra settling after a waiter's entry shows (its watch is being set up).
const QUEUE_SETTLE: Duration = Duration::from_millis(30);

type Waiter = JoinHandle<Result<Instant, dlock_core::Error>>;

/// How long a queued waiter may wait in the queue scenarios.
const WAITER_WAIT: Duration = Duration::from_secs(20);

/// Spawns a waiter that acquires, notes the grant time, holds for `hold`, and releases.
fn spawn_waiter(
    c: Arc<dyn Locker>,
    lock: dlock_core::LockName,
    hold: Duration,
    order: Option<(usize, Arc<Mutex<Vec<usize>>>)>,
) -> Waiter {
    tokio::spawn(async move {
        let lease = c.acquire(&lock, AcquireOptions::wait(WAITER_WAIT)).await?;
        let at = Instant::now();
        if let Some((i, order)) = order {
            order.lock().unwrap_or_else(|p| p.into_inner()).push(i);
        }
        tokio::time::sleep(hold).await;
        lease.release().await?;
        Ok(at)
    })
}

async fn joined(w: Waiter, what: &str) -> Result<Instant, Verdict> {
    match w.await {
        Ok(Ok(at)) => Ok(at),
        Ok(Err(e)) => Err(Verdict::Fail(format!("{what} failed: {e}"))),
        Err(e) => Err(Verdict::Fail(format!(
            "{what} panicked or was cancelled: {e}"
        ))),
    }
}

/// Enqueues a waiter and waits until its entry shows at the server (or a bounded time).
async fn enqueue(ctx: &Ctx, w: impl FnOnce() -> Waiter) -> Result<Waiter, Verdict> {
    let base = ctx.leftovers().await?.len();
    let waiter = w();
    wait_growth(ctx, base, QUEUE_SHOW).await?;
    tokio::time::sleep(QUEUE_SETTLE).await;
    Ok(waiter)
}

/// A pending acquire that is dropped leaves nothing behind, and the waiter queued behind it gets
/// the lock right after the holder releases, not a TTL later.
pub(crate) async fn cancel(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let lock = name("cancel")?;
    let la = a.acquire(&lock, AcquireOptions::wait(ctx.ttl())).await?;
    let held = ctx.leftovers().await?;
    let lb = lock.clone();
    let wb = enqueue(ctx, move || {
        tokio::spawn(async move {
            b.acquire(&lb, AcquireOptions::forever())
                .await
                .map(|_| Instant::now())
        })
    })
    .await?;
    let with_b = ctx.leftovers().await?;
    let wc = enqueue(ctx, || {
        spawn_waiter(c, lock.clone(), Duration::from_millis(5), None)
    })
    .await?;
    let with_both = ctx.leftovers().await?;
    wb.abort();
    let cancelled = wb.await;
    ensure!(
        cancelled.as_ref().is_err_and(|e| e.is_cancelled()),
        "the cancelled acquire completed: {cancelled:?}"
    );
    // B's entry (if the backend keeps one per waiter) must go; C's stays.
    let b_entries = with_b.len().saturating_sub(held.len());
    let want_len = with_both.len().saturating_sub(b_entries);
    let began = Instant::now();
    loop {
        let now = ctx.leftovers().await?;
        if now.len() == want_len {
            ctx.figure_ms("cancel_cleanup_ms", began.elapsed());
            break;
        }
        if began.elapsed() > Duration::from_millis(500) {
            return Err(Verdict::Fail(format!(
                "a cancelled acquire left entries behind: holder only {held:?}, with both waiters {with_both:?}, after cancelling {now:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released = Instant::now();
    la.release().await?;
    let granted = within(
        ctx.ttl() * 2,
        joined(wc, "the waiter behind the cancelled one"),
    )
    .await
    .ok_or_else(|| {
        Verdict::Fail("the waiter behind a cancelled acquire never got the lock".into())
    })??;
    let handoff = granted.saturating_duration_since(released);
    ctx.figure_ms("handoff_ms", handoff);
    ensure!(
        handoff < ctx.ttl() / 2,
        "the next waiter got the lock {handoff:?} after the release: the cancelled waiter's entry blocked it"
    );
    match settle(ctx, &[], ctx.ttl()).await? {
        Ok(_) => Ok(()),
        Err(left) => Err(Verdict::Fail(format!(
            "entries left after every waiter finished: {left:?}"
        ))),
    }
}

/// 16 waiters queued one after another are granted in enqueue order.
pub(crate) async fn fifo(ctx: &Ctx) -> Result<(), Verdict> {
    let holder = ctx.client().await?;
    if !holder.capabilities().fair {
        return Err(Verdict::Skip(
            "the backend is not fair (capabilities.fair = false)".into(),
        ));
    }
    const N: usize = 16;
    let waiters = ctx.clients(N).await?;
    let lock = name("fifo")?;
    let lh = holder
        .acquire(&lock, AcquireOptions::wait(ctx.ttl()))
        .await?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, w) in waiters.into_iter().enumerate() {
        let o = Arc::clone(&order);
        tasks.push(
            enqueue(ctx, || {
                spawn_waiter(w, lock.clone(), Duration::from_millis(5), Some((i, o)))
            })
            .await?,
        );
    }
    lh.release().await?;
    let mut failed = None;
    for (i, t) in tasks.into_iter().enumerate() {
        let done = within(WAITER_WAIT * 2, joined(t, &format!("waiter {i}"))).await;
        if failed.is_none() {
            failed = match done {
                Some(Ok(_)) => None,
                Some(Err(Verdict::Fail(why) | Verdict::Skip(why))) => Some(why),
                None => Some(format!("waiter {i} never got the lock")),
            };
        }
    }
    let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    ctx.figure("grant_order", order.clone());
    let want: Vec<usize> = (0..N).collect();
    ensure!(
        want.starts_with(&order),
        "grants out of enqueue order: {order:?}"
    );
    if let Some(why) = failed {
        return Err(Verdict::Fail(format!(
            "{why} (granted in order so far: {order:?})"
        )));
    }
    ensure!(
        order == want,
        "only {} of {N} waiters were granted: {order:?}",
        order.len()
    );
    Ok(())
}

/// With N = 1, 8, 32 queued waiters (clients with the long
/// [`HERD_TTL`](super::herd::HERD_TTL)), herd at one: each release wakes at most one waiter
/// and each handoff costs at most one request more than with a single waiter
/// ([`herd::judge`](super::herd::judge)).
pub(crate) async fn herd(ctx: &Ctx) -> Result<(), Verdict> {
    use super::herd::{ENQUEUE_SETTLE, HERD_TTL, IDLE, NS, judge, run_between};
    let opts = || crate::ClientOptions::new(ctx.ns(), HERD_TTL);
    let holder = ctx.client_with(opts()).await?;
    if !holder.capabilities().herd_free {
        return Err(Verdict::Skip(
            "the backend is not herd-free (capabilities.herd_free = false)".into(),
        ));
    }
    let mut runs = Vec::new();
    for n in NS {
        let lock = name(&format!("herd-{n}"))?;
        let mut waiters = Vec::with_capacity(n);
        for _ in 0..n {
            waiters.push(ctx.client_with(opts()).await?);
        }
        let lh = holder
            .acquire(&lock, AcquireOptions::wait(ctx.ttl()))
            .await?;
        let mut tasks = Vec::new();
        for w in &waiters {
            tasks.push(
                enqueue(ctx, || {
                    spawn_waiter(Arc::clone(w), lock.clone(), Duration::from_millis(5), None)
                })
                .await?,
            );
        }
        tokio::time::sleep(ENQUEUE_SETTLE).await;
        let idle: Vec<Stats> = waiters.iter().map(|w| w.stats()).collect();
        tokio::time::sleep(IDLE).await;
        let before: Vec<Stats> = waiters.iter().map(|w| w.stats()).collect();
        let server_before = server_requests(ctx).await;
        let released = Instant::now();
        lh.release().await?;
        let mut grants = Vec::with_capacity(n);
        for (i, t) in tasks.into_iter().enumerate() {
            grants.push(
                within(WAITER_WAIT * 2, joined(t, &format!("waiter {i} of {n}")))
                    .await
                    .ok_or_else(|| {
                        Verdict::Fail(format!("waiter {i} of {n} never got the lock"))
                    })??,
            );
        }
        let after: Vec<Stats> = waiters.iter().map(|w| w.stats()).collect();
        if let (Some(s0), Some(s1)) = (server_before, server_requests(ctx).await) {
            // Whole-server counts: other scenarios sharing the server add to them.
            let per = s1.saturating_sub(s0) as f64 / n as f64;
            ctx.figure(
                &format!("server_requests_per_handoff_n{n}"),
                (per * 100.0).round() / 100.0,
            );
        }
        let run = run_between(n, [&idle, &before, &after], released, &grants);
        run.figures(ctx, "");
        runs.push(run);
    }
    judge(&runs)
}

/// The servers' request counter ([`TestBackend::server_requests`](crate::TestBackend::server_requests)),
/// read off the runtime's threads (blocking I/O).
async fn server_requests(ctx: &Ctx) -> Option<u64> {
    let backend = Arc::clone(ctx.backend());
    tokio::task::spawn_blocking(move || backend.server_requests())
        .await
        .ok()
        .flatten()
}
