//! Mutual exclusion and fencing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{AcquireOptions, FenceGuard, FencingStrength};
use tokio::time::Instant;

use super::util::{break_holder, name};
use super::workload::Findings;
use super::{Ctx, Verdict, ensure};
use crate::history::History;

const CLIENTS: usize = 8;
const SECTIONS: usize = 50;

/// 8 clients × 50 critical sections doing a non-atomic read-sleep-write on a shared counter:
/// the final count is exact, no grant arrives before another unreleased lease's promised
/// deadline, no two clients' belief intervals overlap, and tokens increase in grant order.
pub(crate) async fn mutual_exclusion(ctx: &Ctx) -> Result<(), Verdict> {
    let lock = name("counter")?;
    let clients = ctx.clients(CLIENTS).await?;
    let counter = Arc::new(Mutex::new(0u64));
    let history = Arc::new(History::new());
    let began = Instant::now();
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let (lock, counter, history) = (lock.clone(), Arc::clone(&counter), Arc::clone(&history));
        tasks.push(tokio::spawn(async move {
            for _ in 0..SECTIONS {
                let lease = c
                    .acquire(&lock, AcquireOptions::wait(Duration::from_secs(60)))
                    .await?;
                history.grant_until(i, lease.token(), lease.deadline().into_std());
                let seen = *counter.lock().unwrap_or_else(|p| p.into_inner());
                tokio::time::sleep(Duration::from_millis(1)).await;
                *counter.lock().unwrap_or_else(|p| p.into_inner()) = seen + 1;
                if lease.is_lost() {
                    history.lost(i, lease.token());
                }
                history.promise(i, lease.token(), lease.deadline().into_std());
                history.release(i, lease.token());
                lease.release().await?;
            }
            Ok::<(), dlock_core::Error>(())
        }));
    }
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Verdict::Fail(format!("a worker failed: {e}"))),
            Err(e) => return Err(Verdict::Fail(format!("a worker panicked: {e}"))),
        }
    }
    let elapsed = began.elapsed();
    let count = *counter.lock().unwrap_or_else(|p| p.into_inner());
    let sections = history.holds().len();
    let caps = ctx.capabilities().await?;
    let findings = Findings::of(&history, &caps);
    findings.figures(ctx);
    ctx.figure("sections", sections);
    ctx.figure("final_count", count);
    ctx.figure_ms("total_ms", elapsed);
    ctx.figure(
        "sections_per_s",
        ((sections as f64 / elapsed.as_secs_f64()) * 10.0).round() / 10.0,
    );
    findings.verdict("overlapping holds")?;
    let want = (CLIENTS * SECTIONS) as u64;
    ensure!(
        count == want,
        "lost updates: the counter reads {count}, expected {want}"
    );
    Ok(())
}

fn skip_without_fencing(fencing: FencingStrength) -> Result<(), Verdict> {
    if fencing == FencingStrength::None {
        return Err(Verdict::Skip("the backend issues no fencing tokens".into()));
    }
    Ok(())
}

/// Tokens strictly increase across successive grants by different clients, across a forced
/// server-side expiry of the holder.
pub(crate) async fn fencing_monotonic(ctx: &Ctx) -> Result<(), Verdict> {
    let a = ctx.client().await?;
    skip_without_fencing(a.capabilities().fencing)?;
    let b = ctx.client().await?;
    let c = ctx.client().await?;
    let lock = name("fenced")?;
    let wait = AcquireOptions::wait(ctx.ttl() * 3);
    let mut tokens = Vec::new();
    for i in 0..6 {
        let who = if i % 2 == 0 { &a } else { &b };
        let lease = who.acquire(&lock, wait).await?;
        tokens.push(lease.token().get());
        lease.release().await?;
    }
    // A holder expired by force, then taken over, twice.
    let la = a.acquire(&lock, wait).await?;
    tokens.push(la.token().get());
    break_holder(ctx, &lock).await?;
    let lb = b.acquire(&lock, wait).await?;
    tokens.push(lb.token().get());
    break_holder(ctx, &lock).await?;
    let lc = c.acquire(&lock, wait).await?;
    tokens.push(lc.token().get());
    lc.release().await?;
    let _ = lb.release().await;
    let _ = la.release().await;
    ctx.figure("tokens", tokens.clone());
    if let Some(w) = tokens.windows(2).find(|w| w[1] <= w[0]) {
        return Err(Verdict::Fail(format!(
            "token {} was granted after token {}: tokens {tokens:?}",
            w[1], w[0]
        )));
    }
    Ok(())
}

/// A fenced resource accepts the new holder's write and rejects the old holder's write after
/// the old holder's lease was broken and taken over.
pub(crate) async fn fenced_resource(ctx: &Ctx) -> Result<(), Verdict> {
    let a = ctx.client().await?;
    skip_without_fencing(a.capabilities().fencing)?;
    let b = ctx.client().await?;
    let lock = name("resource")?;
    let wait = AcquireOptions::wait(ctx.ttl() * 3);
    let resource = FenceGuard::new(Vec::<&'static str>::new());
    let la = a.acquire(&lock, wait).await?;
    ensure!(
        resource.apply(la.token(), |v| v.push("a1")).is_ok(),
        "the first holder's write was rejected"
    );
    break_holder(ctx, &lock).await?;
    let lb = b.acquire(&lock, wait).await?;
    ensure!(
        resource.apply(lb.token(), |v| v.push("b1")).is_ok(),
        "the new holder's write was rejected"
    );
    let stale = resource.apply(la.token(), |v| v.push("a2"));
    let (ta, tb) = (la.token(), lb.token());
    ctx.figure("stale_token", ta.get());
    ctx.figure("new_token", tb.get());
    lb.release().await?;
    let _ = la.release().await;
    ensure!(
        stale.is_err(),
        "the stale holder's write (token {ta}) was accepted after the new holder's (token {tb})"
    );
    let log = resource.read(Clone::clone);
    ensure!(log == ["a1", "b1"], "the resource holds {log:?}");
    Ok(())
}
