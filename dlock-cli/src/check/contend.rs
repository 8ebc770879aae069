//! The checks with several clients on one name: `exclusion`, `fifo`, `cancel`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{AcquireOptions, FencingStrength, Lease, LockName, Locker};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::ctx::{Ctx, err, grant, lock, release};
use super::report::{Row, ms};

/// Sections each client runs in `exclusion`.
const SECTIONS: usize = 3;
/// How long a section (and a `fifo` grant) holds the lock.
const SECTION: Duration = Duration::from_millis(20);
/// How often a check polls `inspect` while it waits for the queue to change.
const POLL: Duration = Duration::from_millis(5);

/// What `exclusion`'s clients saw, shared between them.
#[derive(Default)]
struct Detector {
    /// Clients inside a section now.
    inside: AtomicUsize,
    /// Sections entered while another client was inside.
    overlaps: AtomicUsize,
    /// Leases found lost at the end of their section.
    lost: AtomicUsize,
    /// Fencing tokens in grant order (pushed inside the section).
    tokens: Mutex<Vec<u64>>,
}

/// `exclusion`: every client runs [`SECTIONS`] sections on one name; no two overlap, and
/// (with fencing) tokens strictly increase from grant to grant.
pub(crate) async fn exclusion(ctx: &Ctx) -> Result<Row, String> {
    let name = ctx.name("exclusion")?;
    let seen = Arc::new(Detector::default());
    let mut tasks = JoinSet::new();
    for client in &ctx.clients {
        let (client, name, seen, wait) = (
            Arc::clone(client),
            name.clone(),
            Arc::clone(&seen),
            ctx.wait(),
        );
        tasks.spawn(async move {
            for _ in 0..SECTIONS {
                let lease = acquire_waiting(&*client, &name, wait).await?;
                if seen.inside.fetch_add(1, Ordering::SeqCst) > 0 {
                    seen.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                lock(&seen.tokens).push(lease.token().get());
                tokio::time::sleep(SECTION).await;
                if lease.check().is_err() {
                    seen.lost.fetch_add(1, Ordering::SeqCst);
                }
                seen.inside.fetch_sub(1, Ordering::SeqCst);
                release(lease).await?;
            }
            Ok::<(), String>(())
        });
    }
    join_all(tasks).await?;
    let tokens = lock(&seen.tokens).clone();
    let overlaps = seen.overlaps.load(Ordering::SeqCst);
    let lost = seen.lost.load(Ordering::SeqCst);
    let row = Row::pass("exclusion")
        .figure("clients", ctx.clients.len())
        .figure("sections", tokens.len())
        .figure("overlaps", overlaps)
        .figure("lost", lost);
    if overlaps > 0 {
        return Ok(row.failed(format!("{overlaps} sections overlapped another")));
    }
    if lost > 0 {
        return Ok(row.failed(format!(
            "{lost} leases were lost within a {SECTION:?} section"
        )));
    }
    if ctx.caps.fencing == FencingStrength::None {
        return Ok(row.note("tokens not compared: the backend gives no fencing"));
    }
    if let Some(pair) = tokens.windows(2).find(|w| w[1] <= w[0]) {
        return Ok(row.failed(format!(
            "token {} was granted after {}: tokens do not strictly increase",
            pair[1], pair[0]
        )));
    }
    Ok(row.figure("tokens_increase", true))
}

/// Waits for every task; the first failure (or panic) is the check's.
async fn join_all<T: 'static>(mut tasks: JoinSet<Result<T, String>>) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        out.push(joined.map_err(|e| format!("a client task failed: {e}"))??);
    }
    Ok(out)
}

/// `acquire` waiting at most `wait`, as a failure reason.
async fn acquire_waiting(
    client: &dyn Locker,
    name: &LockName,
    wait: Duration,
) -> Result<Lease, String> {
    client
        .acquire(name, AcquireOptions::wait(wait))
        .await
        .map_err(err("acquire"))
}

/// The queue length `inspect` reports.
async fn waiting(locker: &dyn Locker, name: &LockName) -> Result<Option<usize>, String> {
    Ok(locker.inspect(name).await.map_err(err("inspect"))?.waiting)
}

/// Polls `inspect` until `want` requests wait; `false` if that did not happen `within`.
async fn queued(
    locker: &dyn Locker,
    name: &LockName,
    want: usize,
    within: Duration,
) -> Result<bool, String> {
    let start = Instant::now();
    loop {
        if waiting(locker, name).await? == Some(want) {
            return Ok(true);
        }
        if start.elapsed() >= within {
            return Ok(false);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How long a queued request may take to show in `inspect`: the acquire's own round trips.
fn queue_bound(ctx: &Ctx) -> Duration {
    Duration::from_secs(5) + ctx.rtt() * 4
}

/// `fifo` (fair backends): waiters queued one after another are granted in that order.
pub(crate) async fn fifo(ctx: &Ctx) -> Result<Row, String> {
    if !ctx.caps.fair {
        return Ok(Row::skip(
            "fifo",
            "the backend does not queue fairly (capabilities().fair is false)",
        ));
    }
    let name = ctx.name("fifo")?;
    let holder = grant(&*ctx.main, &name).await?;
    let Some(base) = waiting(&*ctx.main, &name).await? else {
        let _ = holder.release().await;
        return Ok(Row::skip("fifo", "the server does not count waiters"));
    };
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = JoinSet::new();
    let k = ctx.clients.len();
    for i in 0..k {
        let (client, lock_name, order, wait) = (
            Arc::clone(ctx.client(i)),
            name.clone(),
            Arc::clone(&order),
            ctx.wait(),
        );
        tasks.spawn(async move {
            let lease = acquire_waiting(&*client, &lock_name, wait).await?;
            lock(&order).push(i);
            tokio::time::sleep(SECTION).await;
            release(lease).await
        });
        if !queued(&*ctx.main, &name, base + i + 1, queue_bound(ctx)).await? {
            let _ = holder.release().await;
            return Ok(Row::fail(
                "fifo",
                format!("waiter {i} never showed in inspect's queue"),
            ));
        }
    }
    release(holder).await?;
    join_all(tasks).await?;
    let order = lock(&order).clone();
    let shown = order
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let row = Row::pass("fifo")
        .figure("waiters", k)
        .figure("grant_order", shown);
    if order != (0..k).collect::<Vec<_>>() {
        return Ok(row.failed("waiters were not granted in the order they queued"));
    }
    Ok(row)
}

/// `cancel`: a queued acquire that is dropped leaves nothing: the queue shrinks back (where
/// counted) and the next waiter is granted promptly after the holder releases.
pub(crate) async fn cancel(ctx: &Ctx) -> Result<Row, String> {
    let name = ctx.name("cancel")?;
    let holder = grant(&*ctx.main, &name).await?;
    let base = waiting(&*ctx.main, &name).await?;
    let outcome = cancel_while_held(ctx, &name, base).await;
    let released = Instant::now();
    let release_result = release(holder).await;
    let (mut row, next) = outcome?;
    release_result?;
    let Some(mut next) = next else {
        return Ok(row);
    };
    let granted = match next.join_next().await {
        Some(Ok(Ok(at))) => at,
        Some(Ok(Err(e))) => return Err(e),
        Some(Err(e)) => return Err(format!("the next waiter's task failed: {e}")),
        None => return Err("the next waiter's task vanished".into()),
    };
    let handoff = granted.saturating_duration_since(released);
    row = row.ms("handoff_ms", handoff);
    if handoff >= ctx.prompt() {
        return Ok(row.failed(format!(
            "the next waiter was granted {} ms after the release (≥ TTL/2 + 2 round trips): \
             as if the dropped request's entry was waited out",
            ms(handoff)
        )));
    }
    Ok(row)
}

/// `cancel`'s part while the holder holds: queue a request, drop it, see the queue shrink,
/// queue the next waiter. Returns the row so far and, unless it failed already, the next
/// waiter's task (its grant instant).
async fn cancel_while_held(
    ctx: &Ctx,
    name: &LockName,
    base: Option<usize>,
) -> Result<(Row, Option<JoinSet<Result<Instant, String>>>), String> {
    let mut row = Row::pass("cancel");
    let spawn_waiter = |client: &Arc<dyn Locker>| {
        let (client, name, wait) = (Arc::clone(client), name.clone(), ctx.wait());
        let mut set = JoinSet::new();
        set.spawn(async move {
            let lease = acquire_waiting(&*client, &name, wait).await?;
            let at = Instant::now();
            release(lease).await?;
            Ok::<Instant, String>(at)
        });
        set
    };
    // The request to drop.
    let mut dropped = spawn_waiter(ctx.client(0));
    if !in_queue(ctx, name, base).await? {
        return Ok((
            row.failed("the request never showed in inspect's queue"),
            None,
        ));
    }
    let t = Instant::now();
    dropped.abort_all();
    while dropped.join_next().await.is_some() {}
    if let Some(b) = base {
        let gone = queued(&*ctx.main, name, b, ctx.prompt()).await?;
        row = row
            .figure("waiting_before", b)
            .ms("withdrawn_ms", t.elapsed());
        if !gone {
            return Ok((
                row.failed(format!(
                    "the dropped request still waits in the queue {} ms later",
                    ms(t.elapsed())
                )),
                None,
            ));
        }
    } else {
        row = row.note("the server counts no waiters: only the handoff is checked");
    }
    let next = spawn_waiter(ctx.client(1));
    if !in_queue(ctx, name, base).await? {
        return Ok((
            row.failed("the next waiter never showed in inspect's queue"),
            None,
        ));
    }
    Ok((row, Some(next)))
}

/// After a waiter was started: whether it shows in inspect's queue (one more than `base`)
/// within the queue bound. Where the server counts no waiters (`base` is `None`), it is given
/// four round trips (at least 200 ms) to queue, and counts as queued.
async fn in_queue(ctx: &Ctx, name: &LockName, base: Option<usize>) -> Result<bool, String> {
    match base {
        Some(b) => queued(&*ctx.main, name, b + 1, queue_bound(ctx)).await,
        None => {
            tokio::time::sleep((ctx.rtt() * 4).max(Duration::from_millis(200))).await;
            Ok(true)
        }
    }
}
