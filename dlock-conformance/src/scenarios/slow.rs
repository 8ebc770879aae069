//! Slow replies (server→client only): the lease's deadline against the server's own expiry of
//! the holder, during a slow grant and over many slow renewals.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, LockName, Locker};
use tokio::time::Instant;

use super::util::{name, proxied, spawn_timed, within};
use super::{Ctx, Verdict, ensure};
use crate::faults::{Direction, Mode, Proxy};
use crate::{ClientOptions, ServerExpiry};

/// The per-request timeout of the slow-grant holder.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);
/// How much the renewal replies are delayed in [`one_way_delay`]: far above the drift
/// allowance (TTL·1% + 2 ms), well below what a renewal round may take.
const RENEWAL_DELAY: Duration = Duration::from_millis(150);

/// The in-process backend's skip reason (shared with the other link-fault scenarios).
pub(crate) const NO_LINK: &str =
    "in-process backend: there is no client↔server connection to fault";

fn upstream_bytes(proxies: &[Proxy]) -> u64 {
    proxies.iter().map(|p| p.bytes(Direction::Upstream)).sum()
}

/// Reads the server's expiry of the holder of `lock` and compares it with `deadline` (the
/// lease's deadline read BEFORE the server, so any renewal it reflects was already at the
/// server). Returns the violation, if any. An unreadable expiry is recorded as a skipped part.
pub(crate) async fn expiry_violation(
    ctx: &Ctx,
    lock: &LockName,
    deadline: Instant,
) -> Result<Option<String>, Verdict> {
    let read = ctx.backend().server_expiry(ctx.ns(), lock).await;
    let returned = Instant::now();
    let expiry = read.map_err(|e| {
        Verdict::Fail(format!(
            "cannot read the holder's expiry at the server: {e}"
        ))
    })?;
    Ok(match expiry {
        ServerExpiry::Remaining {
            remaining,
            resolution,
        } => {
            // The server computed `remaining` before the read returned: the expiry is at the
            // latest `returned + remaining + resolution`.
            let latest = returned + remaining + resolution;
            (latest < deadline).then(|| {
                format!(
                    "the server expires the holder at the latest {:?} BEFORE the lease's deadline (server remaining {remaining:?}, lease remaining {:?})",
                    deadline - latest,
                    deadline.saturating_duration_since(returned)
                )
            })
        }
        ServerExpiry::Never => None,
        ServerExpiry::NoHolder => (returned < deadline).then(|| {
            format!(
                "the server has no holder while the lease's deadline is {:?} ahead",
                deadline - returned
            )
        }),
        ServerExpiry::Unreadable(reason) => {
            ctx.skip_part(format!("server-side expiry not checked: {reason}"));
            None
        }
    })
}

/// Replies delayed past the request timeout while the acquire runs (the grant's reply comes
/// after the client gave up on it), then renewal stopped: no other client is granted before
/// the lease's deadline, and the server never expires the holder before it.
pub(crate) async fn slow_grant(ctx: &Ctx) -> Result<(), Verdict> {
    let ttl = ctx.ttl();
    let opts = ClientOptions::new(ctx.ns(), ttl).request_timeout(REQUEST_TIMEOUT);
    let (holder, proxies) = match proxied(ctx, opts).await? {
        Some((h, p)) => (h, p),
        None => {
            // The deadline-versus-grant checks still run, on an undelayed grant.
            ctx.skip_part(format!("{NO_LINK}: the grant's replies are not delayed"));
            (ctx.client().await?, Vec::new())
        }
    };
    let contender = ctx.client().await?;
    let lock = name("slow-grant")?;
    // Warm the holder up (connections, an etcd session) on another name, so the slow replies
    // hit the grant itself.
    let warm = holder
        .acquire(&name("slow-grant-warm-up")?, AcquireOptions::wait(ttl))
        .await?;
    warm.release().await?;
    // Let the renewal round the warm-up lease scheduled pass first: a round right after the
    // slow grant would re-arm the server's TTL and hide a grant that did not.
    tokio::time::sleep(ttl / 2).await;
    let delay = REQUEST_TIMEOUT * 2;
    let before = upstream_bytes(&proxies);
    proxies
        .iter()
        .for_each(|p| p.set_direction(Direction::Downstream, Mode::Delay(delay)));
    let l = lock.clone();
    let h = Arc::clone(&holder);
    let began = Instant::now();
    let acquire = tokio::spawn(async move { h.acquire(&l, AcquireOptions::wait(ttl * 4)).await });
    if !proxies.is_empty() {
        // Once the first request is out, keep the delay past the request timeout, then heal:
        // the replies already read are still delivered `delay` after they left the server.
        let sent = within(Duration::from_secs(5), async {
            while upstream_bytes(&proxies) == before {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        ensure!(sent.is_some(), "the acquire sent nothing within 5 s");
        // What the server holds while the replies are on their way (a figure for diagnosis).
        tokio::time::sleep(REQUEST_TIMEOUT / 6).await;
        let during = ctx.backend().server_expiry(ctx.ns(), &lock).await;
        ctx.figure("server_expiry_during_delay", format!("{during:?}"));
        tokio::time::sleep(REQUEST_TIMEOUT + REQUEST_TIMEOUT / 2 - REQUEST_TIMEOUT / 6).await;
        proxies.iter().for_each(|p| p.set(Mode::Pass));
    }
    let lease = match within(ttl * 5, acquire).await {
        Some(Ok(Ok(lease))) => lease,
        Some(Ok(Err(e))) => {
            return Err(Verdict::Fail(format!(
                "the acquire with slow replies failed: {e}"
            )));
        }
        Some(Err(e)) => return Err(Verdict::Fail(format!("the acquire task failed: {e}"))),
        None => return Err(Verdict::Fail("the acquire with slow replies hung".into())),
    };
    ctx.figure_ms("acquire_ms", began.elapsed());
    let mut violations = Vec::new();
    ctx.figure_ms(
        "lease_remaining_at_grant_ms",
        lease.deadline().saturating_duration_since(Instant::now()),
    );
    if let Some(v) = expiry_violation(ctx, &lock, lease.deadline()).await? {
        violations.push(format!("right after the grant: {v}"));
    }
    lease.stop_renewal_for_test();
    let deadline = lease.deadline();
    ctx.figure_ms(
        "lease_remaining_after_grant_ms",
        deadline.saturating_duration_since(Instant::now()),
    );
    if let Some(v) = expiry_violation(ctx, &lock, deadline).await? {
        violations.push(format!("with renewal stopped: {v}"));
    }
    // A contender waits for the lock; it must not get it before the deadline.
    let l = lock.clone();
    let c = Arc::clone(&contender);
    let contend = spawn_timed(async move { c.acquire(&l, AcquireOptions::wait(ttl * 6)).await });
    let lost = within(ttl * 2, lease.lost()).await;
    ensure!(
        lost.is_some(),
        "lost() did not fire within 2 × TTL after renewal stopped"
    );
    // Backends whose session outlives the lease (the locker still lives) free the lock only
    // on release: release once the deadline passed, as the lost holder would.
    let finished = within(ttl + Duration::from_millis(500), async {
        while !contend.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if finished.is_none() {
        let _ = lease.releaser().release().await;
    } else {
        drop(lease);
    }
    let Some(Ok((granted, got))) = within(ttl * 7, contend).await else {
        return Err(Verdict::Fail(
            "the contender's acquire never returned".into(),
        ));
    };
    let got = got.map_err(|e| {
        Verdict::Fail(format!(
            "the contender never got the lock after the slow grant: {e}"
        ))
    })?;
    if granted < deadline {
        violations.push(format!(
            "another client was granted the lock {:?} BEFORE the slow-granted lease's deadline",
            deadline - granted
        ));
    }
    ctx.figure_ms(
        "contender_after_deadline_ms",
        granted.saturating_duration_since(deadline),
    );
    got.release().await?;
    ensure!(violations.is_empty(), "{}", violations.join("; "));
    Ok(())
}

/// Renewal replies delayed (requests pass at once) for 4 × TTL: at every sample the server's
/// expiry of the holder is not before the lease's deadline, the lease stays held, and a
/// contender never gets the lock. A backend without a link runs the same checks over as many
/// undelayed renewals (the delay is a skipped part).
pub(crate) async fn one_way_delay(ctx: &Ctx) -> Result<(), Verdict> {
    let ttl = ctx.ttl();
    let (holder, proxies) = match proxied(ctx, ClientOptions::new(ctx.ns(), ttl)).await? {
        Some((h, p)) => (h, p),
        None => {
            ctx.skip_part(format!("{NO_LINK}: the renewal replies are not delayed"));
            (ctx.client().await?, Vec::new())
        }
    };
    let delay = if proxies.is_empty() {
        Duration::ZERO
    } else {
        RENEWAL_DELAY
    };
    let contender = ctx.client().await?;
    let lock = name("one-way")?;
    let lease = holder.acquire(&lock, AcquireOptions::wait(ttl)).await?;
    let renewals = holder.stats().renewals;
    proxies
        .iter()
        .for_each(|p| p.set_direction(Direction::Downstream, Mode::Delay(delay)));
    let began = Instant::now();
    let mut violations = Vec::new();
    let mut samples = 0u32;
    while began.elapsed() < ttl * 4 {
        let deadline = lease.deadline();
        if let Err(e) = lease.check() {
            violations.push(format!(
                "the lease was lost {:?} into a {delay:?} reply delay: {e}",
                began.elapsed()
            ));
            break;
        }
        if let Some(v) = expiry_violation(ctx, &lock, deadline).await? {
            violations.push(format!("{:?} in: {v}", began.elapsed()));
        }
        samples += 1;
        if samples.is_multiple_of(5) {
            let asked = Instant::now();
            if let Some(stolen) = contender.try_acquire(&lock).await? {
                violations.push(format!(
                    "a contender was granted the lock {:?} into the delay while the lease's deadline was {:?} ahead",
                    began.elapsed(),
                    deadline.saturating_duration_since(asked)
                ));
                let _ = stolen.release().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxies.iter().for_each(|p| p.set(Mode::Pass));
    let rounds = holder.stats().renewals - renewals;
    ctx.figure("samples", samples);
    ctx.figure("renewal_rounds", rounds);
    // A defect repeats at every sample: the first and the last say enough.
    if let (Some(first), Some(last)) = (violations.first(), violations.last()) {
        let last = match violations.len() {
            1 => String::new(),
            _ => format!("; last: {last}"),
        };
        return Err(Verdict::Fail(format!(
            "{} violations in {samples} samples; first: {first}{last}",
            violations.len()
        )));
    }
    ensure!(
        rounds >= 6,
        "only {rounds} renewal rounds in 4 × TTL under a {delay:?} reply delay"
    );
    lease.release().await?;
    Ok(())
}
