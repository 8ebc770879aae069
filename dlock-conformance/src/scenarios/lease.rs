//! Lease life: renewal past many TTLs, loss announced before the lock can be stolen.

use std::time::Duration;

use dlock_core::{AcquireOptions, FencingStrength, LossReason};
use tokio::time::Instant;

use super::util::{name, within};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;
use crate::faults::{Mode, Proxy};

/// Scheduling allowance on top of a deadline when checking that `lost()` fired in time.
const SCHED: Duration = Duration::from_millis(250);

/// A lease stays held (same token, not lost) for more than 5 × TTL while a contender's
/// try_acquire keeps failing.
pub(crate) async fn renewal(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let lock = name("renewed")?;
    let ttl = ctx.ttl();
    let la = a.acquire(&lock, AcquireOptions::wait(ttl)).await?;
    let token = la.token();
    let renewals = a.stats().renewals;
    let began = Instant::now();
    let mut attempts = 0;
    while began.elapsed() < ttl * 5 + ttl / 2 {
        tokio::time::sleep(ttl / 4).await;
        attempts += 1;
        let stolen = b.try_acquire(&lock).await?;
        let at = began.elapsed();
        ensure!(
            stolen.is_none(),
            "a contender got the lock {at:?} into a renewed hold (TTL {ttl:?})"
        );
        if let Err(e) = la.check() {
            return Err(Verdict::Fail(format!(
                "the renewed lease was lost {at:?} into the hold: {e}"
            )));
        }
    }
    ctx.figure_ms("held_ms", began.elapsed());
    ctx.figure("contender_attempts", attempts);
    ctx.figure("renewal_rounds", a.stats().renewals - renewals);
    ensure!(la.token() == token, "the token changed during renewal");
    la.release().await?;
    let lb = b.try_acquire(&lock).await?;
    ensure!(
        lb.is_some(),
        "the lock was not free after the renewed lease was released"
    );
    if let Some(lb) = lb {
        lb.release().await?;
    }
    Ok(())
}

/// The holder's connection is cut (blackholed through a proxy; in-process backends stop its
/// renewal instead): its `lost()` fires before a contender's acquire succeeds, and no later
/// than one TTL after the cut.
pub(crate) async fn lost_before_stolen(ctx: &Ctx) -> Result<(), Verdict> {
    let lock = name("cut")?;
    let ttl = ctx.ttl();
    let addrs = ctx.backend().node_addrs();
    let proxies = addrs
        .iter()
        .map(|a| Proxy::start(*a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Verdict::Fail(format!("cannot start a proxy: {e}")))?;
    let holder = if proxies.is_empty() {
        ctx.client().await?
    } else {
        ctx.client_with(
            ClientOptions::new(ctx.ns(), ttl).via(proxies.iter().map(Proxy::addr).collect()),
        )
        .await?
    };
    let contender = ctx.client().await?;
    let slack = contender.capabilities().crash_release_slack;
    let lease = holder.acquire(&lock, AcquireOptions::wait(ttl)).await?;
    // Let one renewal round pass so the cut hits a lease in its steady state.
    tokio::time::sleep(ttl / 2).await;
    ensure!(lease.check().is_ok(), "the lease was lost before the cut");
    let lost = lease.lost();
    let cut = Instant::now();
    if proxies.is_empty() {
        ctx.figure("cut", "renewal stopped in-process");
        lease.stop_renewal_for_test();
    } else {
        ctx.figure("cut", "blackholed proxy");
        for p in &proxies {
            p.set(Mode::Blackhole);
        }
    }
    let lost_at = tokio::spawn(async move {
        let reason = lost.await;
        (Instant::now(), reason)
    });
    let l2 = lock.clone();
    let stolen_at = tokio::spawn(async move {
        let got = contender.acquire(&l2, AcquireOptions::wait(ttl * 4)).await;
        (Instant::now(), got)
    });
    let lost = within(ttl * 5, lost_at).await;
    let stolen = within(ttl * 5, stolen_at).await;
    for p in &proxies {
        p.set(Mode::Pass);
    }
    let (lost_t, reason) = match lost {
        Some(Ok(v)) => v,
        _ => {
            return Err(Verdict::Fail(
                "lost() never fired after the holder was cut off".into(),
            ));
        }
    };
    ensure!(
        reason != LossReason::Released,
        "lost() reported a release, not a loss"
    );
    let detect = lost_t.saturating_duration_since(cut);
    ctx.figure_ms("lost_after_cut_ms", detect);
    ctx.figure("loss_reason", reason.to_string());
    let (stolen_t, got) = match stolen {
        Some(Ok(v)) => v,
        _ => {
            return Err(Verdict::Fail(
                "the contender's acquire never returned".into(),
            ));
        }
    };
    let got = got.map_err(|e| {
        Verdict::Fail(format!(
            "the contender never got the lock after the holder was cut off: {e}"
        ))
    })?;
    ctx.figure_ms(
        "contender_after_cut_ms",
        stolen_t.saturating_duration_since(cut),
    );
    let margin_ms = (stolen_t.saturating_duration_since(lost_t).as_secs_f64()
        - lost_t.saturating_duration_since(stolen_t).as_secs_f64())
        * 1e3;
    ctx.figure("margin_ms", (margin_ms * 1e3).round() / 1e3);
    got.release().await?;
    drop(lease);
    ensure!(
        lost_t <= stolen_t,
        "the contender got the lock {:?} BEFORE the cut-off holder's lost() fired",
        lost_t.saturating_duration_since(stolen_t)
    );
    ensure!(
        detect <= ttl + SCHED,
        "lost() fired {detect:?} after the cut, later than the TTL {ttl:?}"
    );
    ensure!(
        stolen_t.saturating_duration_since(cut) <= ttl * 2 + slack + SCHED,
        "the contender waited {:?} after the cut",
        stolen_t.saturating_duration_since(cut)
    );
    Ok(())
}

/// A test hook breaks the held lease at the server (delete the key / revoke the lease / expire
/// the session): the holder's `lost()` fires within the TTL, and a contender then gets the lock.
pub(crate) async fn lost_after_break(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let lock = name("broken")?;
    let ttl = ctx.ttl();
    let slack = b.capabilities().crash_release_slack;
    let lease = a.acquire(&lock, AcquireOptions::wait(ttl)).await?;
    tokio::time::sleep(ttl / 4).await;
    let lost = lease.lost();
    let broke = Instant::now();
    ctx.backend().break_holder(ctx.ns(), &lock).await?;
    let reason = within(ttl + SCHED, lost).await.ok_or_else(|| {
        Verdict::Fail(format!(
            "lost() did not fire within {:?} after the server-side break",
            ttl + SCHED
        ))
    })?;
    let detect = broke.elapsed();
    ctx.figure_ms("lost_after_break_ms", detect);
    ctx.figure("loss_reason", reason.to_string());
    ensure!(
        reason != LossReason::Released,
        "lost() reported a release, not a loss"
    );
    ensure!(lease.check().is_err(), "check() passes on a lost lease");
    let got = b
        .acquire(&lock, AcquireOptions::wait(ttl + slack + SCHED))
        .await
        .map_err(|e| Verdict::Fail(format!("after the break the lock did not become free: {e}")))?;
    let fenced = b.capabilities().fencing != FencingStrength::None;
    ensure!(
        !fenced || got.token() > lease.token(),
        "the new grant's token {} is not above the broken one's {}",
        got.token(),
        lease.token()
    );
    got.release().await?;
    drop(lease);
    Ok(())
}
