//! The checks one holder (and at most one contender) can make: `round_trip`, `effective_ttl`,
//! `inspect`, `try_acquire_held`, `wait_timeout`, `renewal`.

use std::time::Duration;

use dlock_core::{AcquireOptions, Error, ErrorKind, Lease, LockName, Locker};
use tokio::time::Instant;

use super::ctx::{Ctx, err, grant, release};
use super::report::{Row, ms, signed_ms};

/// `round_trip` stops sampling after this long (once it has [`MIN_SAMPLES`]), so that a slow
/// deployment is reported, not waited out.
const SAMPLING_BUDGET: Duration = Duration::from_secs(5);
/// The fewest samples `round_trip` takes.
const MIN_SAMPLES: usize = 3;
/// `wait_timeout`'s wait.
const SHORT_WAIT: Duration = Duration::from_millis(300);
/// The longest `renewal` holds without `--long`.
pub(crate) const LONG_BOUND: Duration = Duration::from_secs(30);

/// The median and the largest of `samples` (sorted here).
fn p50_max(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    let p50 = samples
        .get(samples.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default();
    (p50, samples.last().copied().unwrap_or_default())
}

/// Why a call failed, with a hint when it failed at the client's request timeout.
fn call_failed(what: &str, e: &Error, took: Duration, ttl: Duration) -> String {
    let mut reason = format!("{what} failed after {} ms: {e}", ms(took));
    // Redis gives each request TTL/3 (at most 2 s): a reply slower than that is no reply.
    if e.kind() == ErrorKind::Unavailable && took * 10 >= ttl * 3 {
        reason.push_str(&format!(
            " — it took ≥ TTL/3 ({} ms): if the server answers at all, its round trip is too \
             long for this TTL (renewals every TTL/3 cannot keep up); use a longer ttl= or a \
             closer server",
            ms(ttl / 3)
        ));
    }
    reason
}

/// `round_trip`: acquire + release of a free name and inspects, [`Ctx::samples`] times (or
/// for [`SAMPLING_BUDGET`]). The round trip is the fastest median of the three calls: each
/// is at least one request and its reply. Fails when a call fails.
pub(crate) async fn round_trip(ctx: &Ctx) -> Result<Row, String> {
    let name = ctx.name("round-trip")?;
    let (mut acq, mut rel, mut insp) = (Vec::new(), Vec::new(), Vec::new());
    let start = Instant::now();
    let mut failure = None;
    while acq.len() < ctx.samples && (acq.len() < MIN_SAMPLES || start.elapsed() < SAMPLING_BUDGET)
    {
        let t = Instant::now();
        let lease = match ctx.main.try_acquire(&name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return Err(format!("{name}, a fresh name, was found held")),
            Err(e) => {
                failure = Some(call_failed("try_acquire", &e, t.elapsed(), ctx.ttl));
                break;
            }
        };
        acq.push(t.elapsed());
        let t = Instant::now();
        if let Err(e) = lease.release().await {
            failure = Some(call_failed("release", &e, t.elapsed(), ctx.ttl));
            break;
        }
        rel.push(t.elapsed());
        let t = Instant::now();
        if let Err(e) = ctx.main.inspect(&name).await {
            failure = Some(call_failed("inspect", &e, t.elapsed(), ctx.ttl));
            break;
        }
        insp.push(t.elapsed());
    }
    let n = insp.len();
    let (a50, amax) = p50_max(&mut acq);
    let (r50, rmax) = p50_max(&mut rel);
    let (i50, imax) = p50_max(&mut insp);
    let mut row = Row::pass("round_trip").figure("samples", n);
    if n > 0 {
        let rtt = a50.min(r50).min(i50);
        ctx.set_rtt(rtt);
        row = row
            .ms("rtt_p50_ms", rtt)
            .ms("acquire_p50_ms", a50)
            .ms("acquire_max_ms", amax)
            .ms("release_p50_ms", r50)
            .ms("release_max_ms", rmax)
            .ms("inspect_p50_ms", i50)
            .ms("inspect_max_ms", imax);
    }
    Ok(match failure {
        Some(f) => row.failed(f),
        None => row,
    })
}

/// `effective_ttl`: right after a grant, how long the server keeps the lock (inspect's
/// `expires_within`) against the TTL and the lease's deadline, and how long the lease is
/// usable. Fails when the server may drop the lock before the deadline, keeps it longer than
/// the TTL, or the lease is unusable (no usable time, or renewals every TTL/3 cannot keep up
/// with the round trip).
pub(crate) async fn effective_ttl(ctx: &Ctx) -> Result<Row, String> {
    let name = ctx.name("effective-ttl")?;
    let t = Instant::now();
    let lease = match ctx.main.try_acquire(&name).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return Err(format!("{name}, a fresh name, was found held")),
        Err(e) => {
            return Ok(Row::fail(
                "effective_ttl",
                call_failed("try_acquire", &e, t.elapsed(), ctx.ttl),
            )
            .ms("ttl_ms", ctx.ttl));
        }
    };
    let granted = Instant::now();
    let sent = Instant::now();
    let state = ctx.main.inspect(&name).await;
    let deadline = lease.deadline();
    release(lease).await?;
    let state = state.map_err(err("inspect"))?;
    let rtt = ctx.rtt();
    let usable = signed_ms(deadline, granted);
    let mut row = Row::pass("effective_ttl")
        .ms("ttl_ms", ctx.ttl)
        .figure("usable_ms", usable)
        .ms("renew_every_ms", ctx.ttl / 3)
        .ms("rtt_p50_ms", rtt);
    let Some(holder) = state.holder else {
        return Ok(row.failed("inspect right after the grant shows nobody holding the lock"));
    };
    let mut failures = Vec::new();
    match holder.expires_within {
        Some(within) => {
            // The server read its remaining TTL after `sent`: it keeps the lock at least
            // until `sent + within`.
            let margin = signed_ms(sent + within, deadline);
            row = row
                .ms("expires_within_ms", within)
                .figure("promise_margin_ms", margin);
            if margin < -ms(ctx.expiry_rounding) {
                failures.push(format!(
                    "the server may drop the lock {:.2} ms before the lease's deadline",
                    -margin
                ));
            }
            if within > ctx.ttl + ctx.expiry_rounding {
                failures.push(format!(
                    "the server keeps the lock {} ms, longer than the TTL",
                    ms(within)
                ));
            }
        }
        None => {
            row = row
                .figure("expires_within_ms", "unknown")
                .note("the server does not say how long it keeps the lock (a session's)");
        }
    }
    if usable <= 0.0 {
        failures.push(format!(
            "the lease is unusable: its deadline passed {:.2} ms before the grant arrived",
            -usable
        ));
    }
    if rtt >= ctx.ttl / 3 {
        failures.push(format!(
            "round trip {} ms ≥ TTL/3 ({} ms): renewals every TTL/3 cannot keep up; use a \
             longer ttl= or a closer server",
            ms(rtt),
            ms(ctx.ttl / 3)
        ));
    }
    if !failures.is_empty() {
        row = row.failed(failures.join("; "));
    }
    Ok(row)
}

/// `inspect`: the holder `inspect` reports carries the lease's token; the name is free after
/// the release.
pub(crate) async fn inspect(ctx: &Ctx) -> Result<Row, String> {
    let name = ctx.name("inspect")?;
    let lease = grant(&*ctx.main, &name).await?;
    let token = lease.token();
    let held = ctx.main.inspect(&name).await;
    release(lease).await?;
    let held = held.map_err(err("inspect"))?;
    let after = ctx.main.inspect(&name).await.map_err(err("inspect"))?;
    let mut row = Row::pass("inspect").figure("token", token.get());
    let Some(holder) = held.holder else {
        return Ok(row.failed("inspect shows nobody holding a held lock"));
    };
    match holder.token {
        Some(t) if t == token => row = row.figure("holder_token", t.get()),
        Some(t) => {
            return Ok(row
                .figure("holder_token", t.get())
                .failed(format!("inspect shows token {t}, the lease has {token}")));
        }
        None => {
            row = row
                .figure("holder_token", "not recorded")
                .note("the server does not record the token beside the holder");
        }
    }
    if let Some(h) = after.holder {
        return Ok(row.failed(format!("still held after the release (entry {})", h.entry)));
    }
    Ok(row.figure("free_after_release", true))
}

/// Holds `name` with `ctx.main` while `f` runs; releases after.
async fn holding<T, F>(ctx: &Ctx, name: &LockName, f: F) -> Result<T, String>
where
    F: std::future::Future<Output = T>,
{
    let lease = grant(&*ctx.main, name).await?;
    let out = f.await;
    release(lease).await?;
    Ok(out)
}

/// A contender was granted a held lock: the lease goes back, the row fails.
async fn granted_while_held(row: Row, lease: Lease) -> Row {
    let _ = lease.release().await;
    row.failed("a contender was granted a held lock")
}

/// `try_acquire_held`: a contender's `try_acquire` of a held name answers `None`, at once.
pub(crate) async fn try_acquire_held(ctx: &Ctx) -> Result<Row, String> {
    let name = ctx.name("try-acquire-held")?;
    let contender = ctx.client(0);
    let (answer, took) = holding(ctx, &name, async {
        let t = Instant::now();
        let r = contender.try_acquire(&name).await;
        (r, t.elapsed())
    })
    .await?;
    let row = Row::pass("try_acquire_held").ms("took_ms", took);
    match answer.map_err(err("try_acquire"))? {
        None => Ok(row),
        Some(lease) => Ok(granted_while_held(row, lease).await),
    }
}

/// `wait_timeout`: a contender's bounded acquire of a held name fails with `Timeout`, not
/// before its wait.
pub(crate) async fn wait_timeout(ctx: &Ctx) -> Result<Row, String> {
    let name = ctx.name("wait-timeout")?;
    let contender = ctx.client(0);
    let (answer, took) = holding(ctx, &name, async {
        let t = Instant::now();
        let r = contender
            .acquire(&name, AcquireOptions::wait(SHORT_WAIT))
            .await;
        (r, t.elapsed())
    })
    .await?;
    let row = Row::pass("wait_timeout")
        .ms("wait_ms", SHORT_WAIT)
        .ms("took_ms", took);
    match answer {
        Err(Error::Timeout { .. }) if took >= SHORT_WAIT => Ok(row),
        Err(Error::Timeout { .. }) => Ok(row.failed("timed out before the wait elapsed")),
        Err(e) => Ok(row.failed(format!("acquire: {e} (expected a timeout)"))),
        Ok(lease) => Ok(granted_while_held(row, lease).await),
    }
}

/// `renewal`: a lease held for 3 × TTL stays valid (renewed in the background) while a
/// contender's `try_acquire` keeps failing. Skipped when that is over [`LONG_BOUND`] without
/// `--long`.
pub(crate) async fn renewal(ctx: &Ctx) -> Result<Row, String> {
    let hold = ctx.ttl * 3;
    if hold > LONG_BOUND && !ctx.long {
        return Ok(Row::skip(
            "renewal",
            format!(
                "holding for 3 × TTL = {} is over {}; run with --long",
                humantime::format_duration(hold),
                humantime::format_duration(LONG_BOUND)
            ),
        )
        .ms("hold_ms", hold));
    }
    let name = ctx.name("renewal")?;
    let lease = grant(&*ctx.main, &name).await?;
    let token = lease.token();
    let contender = ctx.client(0);
    let start = Instant::now();
    let lost = lease.lost();
    tokio::pin!(lost);
    let every = (ctx.ttl / 4).max(Duration::from_millis(50));
    let mut attempts = 0u64;
    let mut row = Row::pass("renewal").ms("hold_ms", hold);
    let mut failure = None;
    while start.elapsed() < hold {
        tokio::select! {
            reason = &mut lost => {
                failure = Some(format!("the lease was lost after {} ms: {reason}", ms(start.elapsed())));
                break;
            }
            () = tokio::time::sleep(every) => {}
        }
        attempts += 1;
        match contender.try_acquire(&name).await {
            Ok(None) => {}
            Ok(Some(stolen)) => {
                let _ = stolen.release().await;
                failure = Some(format!(
                    "a contender was granted the held lock after {} ms",
                    ms(start.elapsed())
                ));
                break;
            }
            Err(e) => {
                failure = Some(format!("contender's try_acquire: {e}"));
                break;
            }
        }
    }
    let valid = lease.check();
    let remaining = lease.remaining();
    let state = ctx.main.inspect(&name).await;
    let released = release(lease).await;
    row = row
        .ms("held_ms", start.elapsed())
        .figure("contender_attempts", attempts)
        .ms("remaining_ms", remaining);
    if let Some(f) = failure {
        return Ok(row.failed(f));
    }
    if let Err(e) = valid {
        return Ok(row.failed(format!("the lease is not valid after {hold:?}: {e}")));
    }
    match state.map_err(err("inspect"))?.holder {
        Some(h) if h.token.is_none_or(|t| t == token) => {}
        Some(h) => {
            return Ok(row.failed(format!(
                "inspect shows token {:?}, the lease has {token}",
                h.token.map(|t| t.get())
            )));
        }
        None => return Ok(row.failed("inspect shows nobody holding the renewed lock")),
    }
    released?;
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_max() {
        let d = Duration::from_millis;
        assert_eq!(p50_max(&mut [d(3), d(1), d(2)]), (d(2), d(3)));
        assert_eq!(p50_max(&mut [d(4), d(1), d(2), d(3)]), (d(2), d(4)));
        assert_eq!(p50_max(&mut []), (d(0), d(0)));
    }
}
