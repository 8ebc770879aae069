//! Client↔server link faults through the proxy: a short blip, a lost release reply.

use std::time::Duration;

use dlock_core::{AcquireOptions, Locker};
use tokio::time::Instant;

use super::util::{name, proxied, within};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;
use crate::faults::{Direction, Mode};

fn no_link() -> Verdict {
    Verdict::Skip("in-process backend: there is no client↔server connection to fault".into())
}

/// The holder's links go silent for 0.3 × TTL: the lease survives with the same token, no
/// contender gets in, and renewal carries on afterwards.
pub(crate) async fn short_blip(ctx: &Ctx) -> Result<(), Verdict> {
    let Some((holder, proxies)) = proxied(ctx, ClientOptions::new(ctx.ns(), ctx.ttl())).await?
    else {
        return Err(no_link());
    };
    let contender = ctx.client().await?;
    let lock = name("blip")?;
    let ttl = ctx.ttl();
    let lease = holder.acquire(&lock, AcquireOptions::wait(ttl)).await?;
    let token = lease.token();
    tokio::time::sleep(ttl / 3).await;
    let blip = ttl * 3 / 10;
    let began = Instant::now();
    proxies.iter().for_each(|p| p.set(Mode::Blackhole));
    let mut stolen = false;
    while began.elapsed() < blip {
        stolen |= contender.try_acquire(&lock).await?.is_some();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxies.iter().for_each(|p| p.set(Mode::Pass));
    // Held through at least one more full TTL after the blip.
    let after = Instant::now();
    while after.elapsed() < ttl + ttl / 4 {
        stolen |= contender.try_acquire(&lock).await?.is_some();
        if lease.check().is_err() {
            break;
        }
        tokio::time::sleep(ttl / 8).await;
    }
    ctx.figure_ms("blip_ms", blip);
    let still = lease.check();
    ensure!(
        !stolen,
        "a contender got the lock during or after a {blip:?} blip of the holder's link"
    );
    ensure!(
        still.is_ok(),
        "the lease did not survive a {blip:?} blip (TTL {ttl:?}): {}",
        still.err().map(|e| e.to_string()).unwrap_or_default()
    );
    ensure!(lease.token() == token, "the token changed across the blip");
    lease.release().await?;
    Ok(())
}

/// The release request reaches the server but its reply is lost (downstream blackhole, then
/// the connections are reset); the release reports an error or completes, within a bound. The
/// lock passes on, and the retried release of the old grant never deletes the new holder's lock.
pub(crate) async fn release_reply_lost(ctx: &Ctx) -> Result<(), Verdict> {
    let Some((holder, proxies)) = proxied(ctx, ClientOptions::new(ctx.ns(), ctx.ttl())).await?
    else {
        return Err(no_link());
    };
    let (b, c) = (ctx.client().await?, ctx.client().await?);
    let lock = name("reply-lost")?;
    let ttl = ctx.ttl();
    let lease = holder.acquire(&lock, AcquireOptions::wait(ttl)).await?;
    let retry = lease.releaser();
    proxies
        .iter()
        .for_each(|p| p.set_direction(Direction::Downstream, Mode::Blackhole));
    let began = Instant::now();
    let released = within(ttl * 2, lease.release()).await;
    ctx.figure_ms("release_returned_ms", began.elapsed());
    ctx.figure(
        "release_result",
        match &released {
            None => "hung".to_string(),
            Some(Ok(())) => "ok".to_string(),
            Some(Err(e)) => format!("error: {e}"),
        },
    );
    ensure!(
        released.is_some(),
        "a release whose reply was lost did not return within {:?}",
        ttl * 2
    );
    // The held reply is lost for good: reset the connections (the client must reconnect).
    proxies.iter().for_each(|p| p.set(Mode::Reset));
    // The request arrived, so the lock is free now (or at the latest when the TTL runs out).
    let lb = b
        .acquire(&lock, AcquireOptions::wait(ttl * 2))
        .await
        .map_err(|e| {
            Verdict::Fail(format!(
                "the lock never passed on after a release with a lost reply: {e}"
            ))
        })?;
    proxies.iter().for_each(|p| p.set(Mode::Pass));
    let retried = within(ttl * 2, retry.release()).await;
    ensure!(
        retried.is_some(),
        "the retried release hung after the link recovered"
    );
    let stolen = c.try_acquire(&lock).await?;
    let deleted = stolen.is_some();
    if let Some(s) = stolen {
        let _ = s.release().await;
    }
    ensure!(
        !deleted,
        "the retried release of the old grant deleted the new holder's lock"
    );
    ensure!(
        lb.check().is_ok(),
        "the new holder lost its lease after the old grant's retried release"
    );
    lb.release().await?;
    Ok(())
}
