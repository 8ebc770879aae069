//! Single-client semantics: try_acquire, timeouts, release, names, bad input, re-entrancy.

use std::time::Duration;

use dlock_core::{
    AcquireOptions, Error, ErrorKind, LockName, Locker, MAX_TTL, MAX_WAIT, Reentrant,
};
use tokio::time::Instant;

use super::util::{name, settle, within};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;
use crate::faults::{Mode, Proxy};

/// How long cleanup after a failed attempt may take to show at the server.
const CLEANUP_GRACE: Duration = Duration::from_millis(500);

/// `try_acquire` on a held name returns `None` at once and leaves nothing behind.
pub(crate) async fn try_acquire_held(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let lock = name("held")?;
    let la = a.acquire(&lock, AcquireOptions::wait(ctx.ttl())).await?;
    let before = ctx.leftovers().await?;
    ensure!(
        !before.is_empty(),
        "the leak hook shows nothing while a lock is held: it cannot audit"
    );
    let t = Instant::now();
    let got = b.try_acquire(&lock).await?;
    let took = t.elapsed();
    ctx.figure_ms("try_ms", took);
    ensure!(
        got.is_none(),
        "try_acquire was granted a lock that another client holds"
    );
    ensure!(
        took < ctx.ttl() / 2,
        "try_acquire took {took:?}: it must not wait"
    );
    match settle(ctx, &before, CLEANUP_GRACE).await? {
        Ok(_) => {}
        Err(now) => {
            return Err(Verdict::Fail(format!(
                "a failed try_acquire left entries behind: before {before:?}, after {now:?}"
            )));
        }
    }
    la.release().await?;
    let lb = b.try_acquire(&lock).await?;
    ensure!(lb.is_some(), "try_acquire failed on a released lock");
    if let Some(lb) = lb {
        lb.release().await?;
    }
    Ok(())
}

/// A bounded wait on a held lock returns `Timeout`, not early, and leaves nothing behind; the
/// holder keeps the lock.
pub(crate) async fn wait_timeout(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let lock = name("busy")?;
    let la = a.acquire(&lock, AcquireOptions::wait(ctx.ttl())).await?;
    let before = ctx.leftovers().await?;
    let wait = Duration::from_millis(500);
    let t = Instant::now();
    let got = b.acquire(&lock, AcquireOptions::wait(wait)).await;
    let took = t.elapsed();
    ctx.figure_ms("timed_out_after_ms", took);
    match got {
        Err(Error::Timeout { .. }) => {}
        Err(e) => return Err(Verdict::Fail(format!("expected Timeout, got {e}"))),
        Ok(_) => {
            return Err(Verdict::Fail(
                "a held lock was granted to a second client".into(),
            ));
        }
    }
    ensure!(
        took >= wait,
        "Timeout came after {took:?}, before the {wait:?} wait elapsed"
    );
    ensure!(
        took < wait + ctx.ttl(),
        "Timeout came only after {took:?} for a {wait:?} wait"
    );
    match settle(ctx, &before, CLEANUP_GRACE).await? {
        Ok(d) => ctx.figure_ms("cleanup_ms", d),
        Err(now) => {
            return Err(Verdict::Fail(format!(
                "a timed-out acquire left entries behind: before {before:?}, after {now:?}"
            )));
        }
    }
    ensure!(
        la.check().is_ok(),
        "the holder lost its lease while another client timed out"
    );
    ensure!(
        c.try_acquire(&lock).await?.is_none(),
        "the lock became free after a waiter timed out"
    );
    la.release().await?;
    Ok(())
}

/// Release is idempotent, and a retried release after the lock passed on never deletes the new
/// holder's lock.
pub(crate) async fn release_idempotent(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let lock = name("release")?;
    let wait = AcquireOptions::wait(ctx.ttl() * 2);
    let la = a.acquire(&lock, wait).await?;
    let retry = la.releaser();
    la.release().await?;
    retry
        .release()
        .await
        .map_err(|e| Verdict::Fail(format!("a second release of a released lease failed: {e}")))?;
    let lb = b.acquire(&lock, wait).await?;
    retry
        .release()
        .await
        .map_err(|e| Verdict::Fail(format!("a retried release failed: {e}")))?;
    let stolen = c.try_acquire(&lock).await?;
    let deleted = stolen.is_some();
    if let Some(l) = stolen {
        let _ = l.release().await;
    }
    ensure!(
        !deleted,
        "a retried release of an old grant deleted the newer holder's lock"
    );
    // The new holder keeps renewing through at least one renewal period.
    tokio::time::sleep(ctx.ttl() / 2).await;
    ensure!(
        lb.check().is_ok(),
        "the newer holder lost its lease after an old grant's retried release"
    );
    ensure!(
        c.try_acquire(&lock).await?.is_none(),
        "the lock became free while its newer holder held it"
    );
    lb.release().await?;
    retry.release().await.map_err(|e| {
        Verdict::Fail(format!(
            "a release after everything was released failed: {e}"
        ))
    })?;
    Ok(())
}

/// `a`, `a/b` and `ab` never block each other, whichever is held.
pub(crate) async fn name_isolation(ctx: &Ctx) -> Result<(), Verdict> {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let names = [name("a")?, name("a/b")?, name("ab")?];
    for (i, held) in names.iter().enumerate() {
        let lh = a.try_acquire(held).await?;
        let Some(lh) = lh else {
            return Err(Verdict::Fail(format!(
                "{held} was not free at the start of its round"
            )));
        };
        for (j, other) in names.iter().enumerate() {
            if i == j {
                ensure!(
                    b.try_acquire(other).await?.is_none(),
                    "{other} was granted twice"
                );
                continue;
            }
            let lo = b.try_acquire(other).await?;
            let blocked = lo.is_none();
            if let Some(lo) = lo {
                lo.release().await?;
            }
            ensure!(!blocked, "holding {held} blocks {other}");
        }
        lh.release().await?;
    }
    Ok(())
}

/// Bad names, TTLs and waits are rejected with typed errors before any I/O.
pub(crate) async fn bad_input(ctx: &Ctx) -> Result<(), Verdict> {
    let long = "x".repeat(LockName::MAX_LEN + 1);
    for bad in [
        "",
        "/a",
        "a/",
        "a//b",
        "a/../b",
        "a/./b",
        "a b",
        "ä",
        long.as_str(),
    ] {
        match LockName::new(bad) {
            Err(e @ Error::InvalidName { .. }) => ensure!(
                e.kind() == ErrorKind::InvalidInput,
                "{e} is not InvalidInput"
            ),
            Err(e) => {
                return Err(Verdict::Fail(format!(
                    "name {bad:?}: expected InvalidName, got {e}"
                )));
            }
            Ok(_) => {
                return Err(Verdict::Fail(format!(
                    "the invalid name {bad:?} was accepted"
                )));
            }
        }
    }
    // TTLs are checked when the client is built, before it connects: through a blackholed
    // proxy, a client that tried to connect first would hang instead of failing.
    let proxies = ctx
        .backend()
        .node_addrs()
        .into_iter()
        .map(Proxy::start)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Verdict::Fail(format!("cannot start a proxy: {e}")))?;
    for p in &proxies {
        p.set(Mode::Blackhole);
    }
    let via: Vec<_> = proxies.iter().map(Proxy::addr).collect();
    for (what, ttl) in [
        ("zero", Duration::ZERO),
        ("absurd", MAX_TTL + Duration::from_secs(1)),
    ] {
        let mut opts = ClientOptions::new(ctx.ns(), ttl);
        if !via.is_empty() {
            opts = opts.via(via.clone());
        }
        let built = within(Duration::from_secs(3), ctx.backend().client(opts)).await;
        match built {
            None => {
                return Err(Verdict::Fail(format!(
                    "building a client with a {what} TTL hung on the network instead of failing first"
                )));
            }
            Some(Ok(_)) => {
                return Err(Verdict::Fail(format!(
                    "a client with a {what} TTL ({ttl:?}) was built"
                )));
            }
            Some(Err(e)) => ensure!(
                e.kind() == ErrorKind::InvalidInput,
                "a {what} TTL gave {e}, not an invalid-input error"
            ),
        }
    }
    drop(proxies);
    let client = ctx.client().await?;
    let lock = name("input")?;
    let requests = client.stats().requests;
    match client
        .acquire(&lock, AcquireOptions::wait(MAX_WAIT * 2))
        .await
    {
        Err(e) => ensure!(
            e.kind() == ErrorKind::InvalidInput,
            "an absurd wait gave {e}, not an invalid-input error"
        ),
        Ok(_) => {
            return Err(Verdict::Fail(
                "an acquire with an absurd wait was granted".into(),
            ));
        }
    }
    let sent = client.stats().requests - requests;
    ensure!(
        sent == 0,
        "an acquire with an absurd wait sent {sent} requests before failing"
    );
    Ok(())
}

/// Through the core's re-entrancy wrapper: a nested acquire returns at once with the same token,
/// and only the last release frees the lock.
pub(crate) async fn reentrancy(ctx: &Ctx) -> Result<(), Verdict> {
    let r = Reentrant::new(ctx.client().await?);
    let other = ctx.client().await?;
    let lock = name("nested")?;
    let outer = r.acquire(&lock, AcquireOptions::wait(ctx.ttl())).await?;
    let t = Instant::now();
    let inner = within(
        ctx.ttl() / 2,
        r.acquire(&lock, AcquireOptions::wait(ctx.ttl())),
    )
    .await
    .ok_or_else(|| {
        Verdict::Fail("a nested acquire through the re-entrant wrapper waited".into())
    })??;
    ctx.figure_ms("nested_acquire_ms", t.elapsed());
    ensure!(
        inner.token() == outer.token(),
        "nested token {} differs from {}",
        inner.token(),
        outer.token()
    );
    ensure!(
        outer.hold_count() == 2,
        "hold count {} after two acquires",
        outer.hold_count()
    );
    ensure!(
        other.try_acquire(&lock).await?.is_none(),
        "another client got a held re-entrant lock"
    );
    inner.release().await?;
    ensure!(
        outer.hold_count() == 1,
        "hold count {} after one release",
        outer.hold_count()
    );
    ensure!(
        other.try_acquire(&lock).await?.is_none(),
        "the first of two releases freed the lock"
    );
    outer.release().await?;
    let got = other.try_acquire(&lock).await?;
    ensure!(got.is_some(), "the last release did not free the lock");
    if let Some(l) = got {
        l.release().await?;
    }
    Ok(())
}
