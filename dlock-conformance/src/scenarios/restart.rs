//! Whole-server faults on a private cluster: every node restarted.

use std::time::Duration;

use dlock_core::{AcquireOptions, FencingStrength, FencingToken, Lease};
use tokio::time::Instant;

use super::private::private;
use super::util::{name, spawn_timed, within};
use super::{Ctx, Verdict, ensure};

/// Scheduling allowance on top of a deadline when checking that `lost()` fired in time.
const SCHED: Duration = Duration::from_millis(250);
/// Locks held across the restart.
const HELD: usize = 3;

/// A lease held across the restart, and when its holder stopped believing in it.
struct Held {
    lease: Lease,
    lost_at: tokio::task::JoinHandle<Instant>,
}

/// Every node of a private cluster is killed and started again (same ports, same data dirs).
/// Every held lease is lost no later than its deadline; on servers that keep their data no
/// one is granted a lock while its holder still believes it holds it (a Redis without
/// persistence loses the locks: that restart is a forced break of every held lease, overlap
/// allowed); and on every name, every token granted after the restart is above every token
/// granted before (tokens fence one lock: they are compared per name).
pub(crate) async fn server_restart(ctx: &Ctx) -> Result<(), Verdict> {
    let p = private(ctx).await?;
    let ttl = ctx.ttl();
    let keeps = p.backend.restart_keeps_locks();
    ctx.figure("restart_keeps_locks", keeps);
    let probe = p.client(ctx).await?;
    let caps = probe.capabilities();
    // (name, token) of every grant, before and after the restart.
    let mut before: Vec<(String, FencingToken)> = Vec::new();
    // A few grants and releases first, so the counters have moved.
    let spare = name("restart-spare")?;
    for _ in 0..3 {
        let l = probe.acquire(&spare, AcquireOptions::wait(ttl)).await?;
        before.push((spare.to_string(), l.token()));
        l.release().await?;
    }
    let holders = p.clients(ctx, HELD).await?;
    let mut names = Vec::with_capacity(HELD);
    let mut held = Vec::with_capacity(HELD);
    for (i, h) in holders.iter().enumerate() {
        let lock = name(&format!("restart-{i}"))?;
        let lease = h.acquire(&lock, AcquireOptions::wait(ttl)).await?;
        before.push((lock.to_string(), lease.token()));
        let lost = lease.lost();
        let lost_at = tokio::spawn(async move {
            lost.await;
            Instant::now()
        });
        names.push(lock);
        held.push(Held { lease, lost_at });
    }
    let began = Instant::now();
    p.restart_all().await?;
    ctx.figure_ms("restart_ms", began.elapsed());
    // Contenders on every held name, and a fresh grant on the spare one.
    let contenders = p.clients(ctx, HELD).await?;
    let mut tasks = Vec::with_capacity(HELD);
    for (c, lock) in contenders.into_iter().zip(&names) {
        let lock = lock.clone();
        tasks.push(spawn_timed(async move {
            c.acquire(&lock, AcquireOptions::wait(ttl * 8)).await
        }));
    }
    let fresh = p.client(ctx).await?;
    let spare_after = fresh
        .acquire(&spare, AcquireOptions::wait(ttl * 4))
        .await
        .map_err(|e| Verdict::Fail(format!("no grant on a free name after the restart: {e}")))?;
    let mut after = vec![(spare.to_string(), spare_after.token())];
    spare_after.release().await?;
    // After 2 × TTL every holder releases, as a user does on loss: leases that survived the
    // restart (the servers kept them) are still believed in until then, and a lost lease whose
    // session survived would otherwise keep its entry until the Lease is dropped.
    tokio::time::sleep(ttl * 2).await;
    let mut survived = 0;
    for h in &held {
        if h.lease.check().is_ok() {
            survived += 1;
        }
        let _ = h.lease.releaser().release().await;
    }
    ctx.figure("leases_survived_restart", survived);
    let mut violations = Vec::new();
    for (i, (task, h)) in tasks.into_iter().zip(held).enumerate() {
        let Some(Ok((granted, got))) = within(ttl * 10, task).await else {
            return Err(Verdict::Fail(format!(
                "the contender for restart-{i} never returned"
            )));
        };
        let got = got.map_err(|e| {
            Verdict::Fail(format!(
                "the contender for restart-{i} never got the lock after the restart: {e}"
            ))
        })?;
        after.push((format!("restart-{i}"), got.token()));
        let deadline = h.lease.deadline();
        // The holder's belief ends at its lost() or its deadline, whichever came first.
        let lost = if h.lost_at.is_finished() {
            h.lost_at.await.ok()
        } else {
            h.lost_at.abort();
            None
        };
        let belief_end = lost.map_or(deadline, |l| l.min(deadline));
        if let Some(l) = lost
            && l > deadline + SCHED
        {
            violations.push(format!(
                "restart-{i}: lost() fired {:?} after the lease's deadline",
                l - deadline
            ));
        }
        if keeps && granted < belief_end {
            violations.push(format!(
                "restart-{i}: the contender was granted {:?} before the holder stopped believing it held the lock",
                belief_end - granted
            ));
        }
        got.release().await?;
    }
    let show = |v: &[(String, FencingToken)]| {
        v.iter()
            .map(|(n, t)| format!("{n}={t}"))
            .collect::<Vec<_>>()
    };
    ctx.figure("tokens_before", show(&before));
    ctx.figure("tokens_after", show(&after));
    match caps.fencing {
        FencingStrength::Linearizable => {
            for (n, a) in &after {
                let b = before.iter().filter(|(m, _)| m == n).map(|(_, t)| *t).max();
                if let Some(b) = b.filter(|b| a <= b) {
                    violations.push(format!(
                        "{n}: a token granted after the restart ({a}) is not above the token granted before it ({b})"
                    ));
                }
            }
        }
        FencingStrength::Assumed => ctx.skip_part(
            "token order across a restart not checked: the tokens are monotonic only while the nodes keep their data (FencingStrength::Assumed)",
        ),
        _ => ctx.skip_part("token order not checked: the backend has no fencing tokens"),
    }
    ensure!(violations.is_empty(), "{}", violations.join("; "));
    drop(p);
    Ok(())
}
