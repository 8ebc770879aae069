//! Holder processes that crash or freeze: SIGKILL (crash release) and SIGSTOP past the TTL
//! (a GC-pause-like freeze, with a fenced resource).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::drift;
use dlock_core::{AcquireOptions, FenceGuard, FencingStrength, FencingToken};
use tokio::time::Instant;

use super::holder::{HolderProcess, Primitive, field};
use super::util::{mono_ns, name};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;

fn skip_in_process(ctx: &Ctx) -> Result<(), Verdict> {
    if ctx.backend().node_addrs().is_empty() {
        return Err(Verdict::Skip(
            "in-process backend: its server lives in the test process, so a holder in another process cannot share it".into(),
        ));
    }
    Ok(())
}

/// A SIGKILLed holder process's lock becomes free no earlier than TTL − drift after its grant
/// request and no later than TTL + slack after the kill.
pub(crate) async fn crash_release(ctx: &Ctx) -> Result<(), Verdict> {
    skip_in_process(ctx)?;
    let lock = name("crash")?;
    let contender = ctx.client().await?;
    let mut holder = HolderProcess::start(ctx, &lock).await?;
    let wait = AcquireOptions::wait(waiter_budget(ctx).await?);
    let acquire = async move { contender.acquire(&lock, wait).await };
    let lease = killed_while_waiting(
        ctx,
        &mut holder,
        "the lock",
        "crash_release",
        acquire,
        |l| l.token().get(),
    )
    .await?;
    lease.release().await?;
    Ok(())
}

/// [`crash_release`] for each family primitive the backend has: a process holding a
/// leadership, a write lease, or a semaphore's only permit is SIGKILLed while another client
/// waits for it.
pub(crate) async fn family_crash_release(ctx: &Ctx) -> Result<(), Verdict> {
    skip_in_process(ctx)?;
    let opts = ClientOptions::new(ctx.ns(), ctx.ttl());
    let wait = AcquireOptions::wait(waiter_budget(ctx).await?);
    let backend = Arc::clone(ctx.backend());
    let built = |e: dlock_core::Error| Verdict::Fail(format!("cannot build a client: {e}"));
    let mut ran = Vec::new();
    if let Some(e) = backend.election(opts.clone()).await.map_err(built)? {
        let lock = name("crash-election")?;
        let mut holder = HolderProcess::start_holding(ctx, &lock, Primitive::Leader).await?;
        let campaign = async move { e.campaign(&lock, b"next", wait).await };
        let led = killed_while_waiting(
            ctx,
            &mut holder,
            "the leadership",
            "election",
            campaign,
            |l| l.term().get(),
        )
        .await?;
        led.resign().await?;
        ran.push(Primitive::Leader.name());
    }
    if let Some(rw) = backend.rw(opts.clone()).await.map_err(built)? {
        let lock = name("crash-write")?;
        let mut holder = HolderProcess::start_holding(ctx, &lock, Primitive::Write).await?;
        let read = async move { rw.read(&lock, wait).await };
        let lease = killed_while_waiting(
            ctx,
            &mut holder,
            "the write-held name",
            "write",
            read,
            |l| l.token().get(),
        )
        .await?;
        lease.release().await?;
        ran.push(Primitive::Write.name());
    }
    if let Some(s) = backend.semaphore(opts).await.map_err(built)? {
        let lock = name("crash-permit")?;
        let mut holder = HolderProcess::start_holding(ctx, &lock, Primitive::Permit).await?;
        let acquire = async move { s.acquire_permit(&lock, 1, wait).await };
        let permit = killed_while_waiting(
            ctx,
            &mut holder,
            "the only permit",
            "permit",
            acquire,
            |l| l.token().get(),
        )
        .await?;
        permit.release().await?;
        ran.push(Primitive::Permit.name());
    }
    if ran.is_empty() {
        return Err(Verdict::Skip(
            "the backend has no Election, RwLocker or Semaphore".into(),
        ));
    }
    ctx.figure("primitives", ran.join(","));
    Ok(())
}

/// How long a waiter for a crashed holder may wait: far past the bound it is checked against.
async fn waiter_budget(ctx: &Ctx) -> Result<Duration, Verdict> {
    let caps = ctx.capabilities().await?;
    Ok(ctx.ttl() * 3 + ctx.crash_slack(&caps) + Duration::from_secs(5))
}

/// `holder` (a process holding `what`) is SIGKILLed while `waiter` waits for it. Fails unless
/// the waiter is still waiting 100 ms in, then is granted no earlier than TTL − drift after
/// the holder's request and no later than TTL + slack after the kill, with a token above the
/// holder's (`token` reads it from the grant) where the backend fences. Figures:
/// `<key>_ms` (kill to grant) and `<key>_since_holder_request_ms`.
async fn killed_while_waiting<T, W>(
    ctx: &Ctx,
    holder: &mut HolderProcess,
    what: &str,
    key: &str,
    waiter: W,
    token: fn(&T) -> u64,
) -> Result<T, Verdict>
where
    T: Send + 'static,
    W: Future<Output = Result<T, dlock_core::Error>> + Send + 'static,
{
    let caps = ctx.capabilities().await?;
    let ttl = ctx.ttl();
    let waiting = tokio::spawn(async move {
        let got = waiter.await;
        (Instant::now(), mono_ns(), got)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    ensure!(
        !waiting.is_finished(),
        "the contender got {what} while the holder process was alive"
    );
    let killed = Instant::now();
    holder.kill();
    let (got_t, got_ns, got) = waiting
        .await
        .map_err(|e| Verdict::Fail(format!("the contender panicked: {e}")))?;
    let got = got.map_err(|e| {
        Verdict::Fail(format!(
            "{what} was not released after the holder crashed: {e}"
        ))
    })?;
    let after_kill = got_t.saturating_duration_since(killed);
    let after_grant = Duration::from_nanos(got_ns.saturating_sub(holder.start_ns));
    let latest = caps.crash_release_within + ctx.crash_slack(&caps);
    ctx.figure_ms(&format!("{key}_ms"), after_kill);
    ctx.figure_ms(&format!("{key}_since_holder_request_ms"), after_grant);
    ctx.figure_ms("bound_ms", latest);
    let earliest = ttl.saturating_sub(drift(ttl));
    ensure!(
        after_grant >= earliest,
        "{what} was free {after_grant:?} after the crashed holder's request, before TTL − drift ({earliest:?})"
    );
    ensure!(
        after_kill <= latest,
        "{what} became free {after_kill:?} after the crash, later than TTL + slack ({latest:?})"
    );
    if caps.fencing != FencingStrength::None {
        let new = token(&got);
        ensure!(
            new > holder.token,
            "the token for {what} after the crash ({new}) is not above the crashed holder's ({})",
            holder.token
        );
    }
    Ok(got)
}

/// A holder process frozen (SIGSTOP) past its TTL: a contender acquires with a higher token;
/// after SIGCONT the holder knows its lease is lost, its lease's deadline had passed before the
/// contender's grant, and its late write is rejected by the fenced resource.
pub(crate) async fn paused_holder(ctx: &Ctx) -> Result<(), Verdict> {
    skip_in_process(ctx)?;
    let ttl = ctx.ttl();
    let lock = name("paused")?;
    let contender = ctx.client().await?;
    let caps = contender.capabilities();
    let mut holder = HolderProcess::start(ctx, &lock).await?;
    let resource = FenceGuard::new(Vec::<&'static str>::new());
    ensure!(
        resource
            .apply(FencingToken(holder.token), |v| v.push("holder"))
            .is_ok(),
        "the holder's first write was rejected"
    );
    // Let it renew once, then freeze it.
    tokio::time::sleep(ttl / 2).await;
    let paused = Instant::now();
    holder.pause()?;
    let got = contender
        .acquire(
            &lock,
            AcquireOptions::wait(ttl * 3 + ctx.crash_slack(&caps)),
        )
        .await;
    let (granted, granted_ns) = (Instant::now(), mono_ns());
    let lease = match got {
        Ok(l) => l,
        Err(e) => {
            let _ = holder.resume();
            return Err(Verdict::Fail(format!(
                "the contender never got the lock from a frozen holder: {e}"
            )));
        }
    };
    ctx.figure_ms(
        "contender_after_pause_ms",
        granted.saturating_duration_since(paused),
    );
    let write = resource.apply(lease.token(), |v| v.push("contender"));
    holder.resume()?;
    holder.send("check")?;
    let state = holder.expect("state", Duration::from_secs(10)).await;
    let Some(state) = state else {
        return Err(Verdict::Fail(format!(
            "the resumed holder did not answer; its output:\n{}",
            holder.output()
        )));
    };
    let lost = state.contains("lost=true");
    let deadline_ns = field(&state, "deadline_ns").unwrap_or(u64::MAX);
    let margin_ms = (granted_ns as f64 - deadline_ns as f64) / 1e6;
    ctx.figure("deadline_before_grant_ms", (margin_ms * 1e3).round() / 1e3);
    // The holder's late write, fenced with its old token.
    let stale = resource.apply(FencingToken(holder.token), |v| v.push("stale holder"));
    let token = lease.token().get();
    lease.release().await?;
    holder.kill();
    ensure!(write.is_ok(), "the contender's write was rejected");
    ensure!(
        lost,
        "after SIGCONT the frozen holder still believed it held the lock: {state}"
    );
    ensure!(
        deadline_ns <= granted_ns,
        "the contender was granted {:.3} ms before the frozen holder's lease deadline",
        -margin_ms
    );
    if caps.fencing != FencingStrength::None {
        ensure!(
            token > holder.token,
            "the contender's token {token} is not above the frozen holder's {}",
            holder.token
        );
        ensure!(
            stale.is_err(),
            "the frozen holder's late write (token {}) was accepted after token {token}",
            holder.token
        );
    }
    Ok(())
}

/// A waiter PROCESS in the middle of the queue is SIGKILLed: the waiter behind it re-targets,
/// does not jump the holder, and gets the lock right after the holder releases (fair backends).
pub(crate) async fn waiter_crash(ctx: &Ctx) -> Result<(), Verdict> {
    skip_in_process(ctx)?;
    let ttl = ctx.ttl();
    let holder = ctx.client().await?;
    let caps = holder.capabilities();
    if !caps.fair {
        return Err(Verdict::Skip(
            "the backend is not fair (capabilities.fair = false): no queue to crash a waiter in"
                .into(),
        ));
    }
    let lock = name("waiter-crash")?;
    let held = holder
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(10)))
        .await?;
    let base = ctx.leftovers().await?.len();
    // The middle waiter: a process of its own, queued behind the holder.
    let mut middle = super::holder::HolderProcess::spawn(ctx, &lock)?;
    let with_middle = super::util::wait_growth(ctx, base, Duration::from_secs(20)).await?;
    ensure!(
        with_middle > base,
        "the waiter process never showed in the queue ({base} entries before, {with_middle} after 20 s); its output:\n{}",
        middle.output()
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The last waiter, in this process.
    let last = ctx.client().await?;
    let l2 = lock.clone();
    let waiting = tokio::spawn(async move {
        let got = last
            .acquire(&l2, AcquireOptions::wait(Duration::from_secs(60)))
            .await;
        (Instant::now(), got)
    });
    let with_both = super::util::wait_growth(ctx, with_middle, Duration::from_secs(5)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let killed = Instant::now();
    middle.kill();
    // The crashed waiter's entry goes once its session / lease / queue deadline runs out.
    let want = with_both - (with_middle - base);
    let bound = ttl * 2 + ctx.crash_slack(&caps) + Duration::from_secs(2);
    loop {
        let now = ctx.leftovers().await?.len();
        if now <= want {
            ctx.figure_ms("crashed_waiter_gone_ms", killed.elapsed());
            break;
        }
        if killed.elapsed() > bound {
            return Err(Verdict::Fail(format!(
                "the crashed waiter's entry was still queued {bound:?} after the kill ({now} entries, {want} expected)"
            )));
        }
        if waiting.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Give the last waiter time to re-target; it must not jump the live holder.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiting.is_finished(),
        "the waiter behind the crashed one got the lock while the holder still held it"
    );
    ensure!(
        held.check().is_ok(),
        "the holder lost its lease while waiters crashed"
    );
    let released = Instant::now();
    held.release().await?;
    let (at, got) = super::util::within(ttl * 2, waiting)
        .await
        .ok_or_else(|| {
            Verdict::Fail(format!(
                "the waiter behind the crashed one was not granted within {:?} of the release",
                ttl * 2
            ))
        })?
        .map_err(|e| Verdict::Fail(format!("the last waiter panicked: {e}")))?;
    let lease = got.map_err(|e| Verdict::Fail(format!("the last waiter failed: {e}")))?;
    let handoff = at.saturating_duration_since(released);
    ctx.figure_ms("handoff_ms", handoff);
    lease.release().await?;
    ensure!(
        handoff < ttl / 2,
        "the waiter behind the crashed one got the lock {handoff:?} after the release: it did not re-target"
    );
    Ok(())
}
