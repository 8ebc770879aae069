//! Many leases on one locker, one broken at the server.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, Lease, LossReason};
use futures::StreamExt;
use tokio::time::Instant;

use super::util::{name, within};
use super::{Ctx, Verdict, ensure};

/// Leases held at once on one locker.
const LEASES: usize = 1000;
/// Acquires and releases in flight at once.
const PARALLEL: usize = 32;
/// Scheduling allowance on top of TTL + slack.
const SCHED: Duration = Duration::from_millis(250);

/// 1,000 leases on one locker; one is broken at the server (its entry deleted,
/// [`TestBackend::break_entry`](crate::TestBackend::break_entry)): it is lost within TTL + slack,
/// and all the others stay held (not lost, and a contender cannot take a sample of them).
pub(crate) async fn many_leases_break(ctx: &Ctx) -> Result<(), Verdict> {
    let ttl = ctx.ttl();
    let (holder, contender) = (ctx.client().await?, ctx.client().await?);
    let slack = ctx.crash_slack(&contender.capabilities());
    let mut names = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        names.push(name(&format!("many-{i}"))?);
    }
    let began = Instant::now();
    let h = Arc::clone(&holder);
    let acquired: Vec<Result<Lease, dlock_core::Error>> = futures::stream::iter(names.clone())
        .map(|n| {
            let h = Arc::clone(&h);
            async move { h.acquire(&n, AcquireOptions::wait(ttl * 5)).await }
        })
        .buffered(PARALLEL)
        .collect()
        .await;
    let mut leases = Vec::with_capacity(LEASES);
    for (i, r) in acquired.into_iter().enumerate() {
        leases.push(r.map_err(|e| Verdict::Fail(format!("acquire of many-{i} failed: {e}")))?);
    }
    ctx.figure_ms("acquire_all_ms", began.elapsed());
    // Let a renewal round or two pass with every lease in it.
    tokio::time::sleep(ttl / 2).await;
    let early: Vec<usize> = (0..LEASES).filter(|&i| leases[i].is_lost()).collect();
    ensure!(
        early.is_empty(),
        "{} of {LEASES} leases were lost before the break (first: many-{})",
        early.len(),
        early.first().copied().unwrap_or(0)
    );
    let victim = LEASES / 2;
    let lost = leases[victim].lost();
    let broke = Instant::now();
    ensure!(
        ctx.backend().break_entry(ctx.ns(), &names[victim]).await?,
        "the server had no holder of {} to break",
        names[victim]
    );
    let bound = ttl + slack + SCHED;
    let reason = within(bound, lost).await.ok_or_else(|| {
        Verdict::Fail(format!(
            "the broken lease among {LEASES} was not lost within TTL + slack ({bound:?})"
        ))
    })?;
    ctx.figure_ms("lost_after_break_ms", broke.elapsed());
    ensure!(
        reason != LossReason::Released,
        "lost() reported a release, not a loss"
    );
    // The others stay held through another full TTL.
    tokio::time::sleep(ttl + slack).await;
    let gone: Vec<usize> = (0..LEASES)
        .filter(|&i| i != victim && leases[i].is_lost())
        .collect();
    ctx.figure("others_lost", gone.len());
    ensure!(
        gone.is_empty(),
        "{} other leases were lost after one of {LEASES} was broken (first: many-{})",
        gone.len(),
        gone.first().copied().unwrap_or(0)
    );
    for i in (0..LEASES).step_by(LEASES / 20) {
        if i == victim {
            continue;
        }
        if let Some(stolen) = contender.try_acquire(&names[i]).await? {
            let _ = stolen.release().await;
            return Err(Verdict::Fail(format!(
                "a contender took many-{i}, still held on the locker whose other lease was broken"
            )));
        }
    }
    let released: Vec<Result<(), dlock_core::Error>> = futures::stream::iter(leases)
        .enumerate()
        .filter(|(i, _)| std::future::ready(*i != victim))
        .map(|(_, l)| l.release())
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let failed = released.iter().filter(|r| r.is_err()).count();
    ensure!(failed == 0, "{failed} of {} releases failed", LEASES - 1);
    Ok(())
}
