//! Small helpers shared by the scenarios.

use std::time::Duration;

use std::net::SocketAddr;
use std::sync::Arc;

use dlock_core::{FencingToken, LockName, Locker};
use tokio::time::Instant;

use super::{Ctx, Verdict};
use crate::ClientOptions;
use crate::faults::Proxy;

/// One proxy per node of `addrs`, and `opts` routed through them (`opts` unchanged and no
/// proxy for an in-process backend, which has no nodes).
pub(crate) fn via_proxies(
    addrs: &[SocketAddr],
    opts: ClientOptions,
) -> Result<(Vec<Proxy>, ClientOptions), Verdict> {
    let proxies = addrs
        .iter()
        .map(|a| Proxy::start(*a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Verdict::Fail(format!("cannot start a proxy: {e}")))?;
    if proxies.is_empty() {
        return Ok((proxies, opts));
    }
    let via = proxies.iter().map(Proxy::addr).collect();
    Ok((proxies, opts.via(via)))
}

/// Spawns `fut` and returns, with its output, the instant it finished as its own task saw it
/// (that task's scheduling delay counts, as a user's task would see it).
pub(crate) fn spawn_timed<F>(fut: F) -> tokio::task::JoinHandle<(Instant, F::Output)>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(async move {
        let out = fut.await;
        (Instant::now(), out)
    })
}

/// Awaits every one of `tasks`: a panic fails as `<who> panicked` (`who`: "a client"), and
/// the first task's error fails the scenario.
pub(crate) async fn join_all(
    tasks: Vec<tokio::task::JoinHandle<Result<(), dlock_core::Error>>>,
    who: &str,
) -> Result<(), Verdict> {
    for t in tasks {
        t.await
            .map_err(|e| Verdict::Fail(format!("{who} panicked: {e}")))??;
    }
    Ok(())
}

/// A client whose every node link goes through its own proxy; `None` for an in-process
/// backend.
pub(crate) async fn proxied(
    ctx: &Ctx,
    opts: ClientOptions,
) -> Result<Option<(Arc<dyn Locker>, Vec<Proxy>)>, Verdict> {
    let addrs = ctx.backend().node_addrs();
    if addrs.is_empty() {
        return Ok(None);
    }
    let (proxies, opts) = via_proxies(&addrs, opts)?;
    Ok(Some((ctx.client_with(opts).await?, proxies)))
}

/// A valid lock name (the scenarios only use literal, valid names).
/// Breaks the holder of `lock` from the server side: the tokens it broke (see
/// [`TestBackend::break_holder`](crate::TestBackend::break_holder)), or a failure when nobody
/// held the lock the scenario holds.
pub(crate) async fn break_holder(ctx: &Ctx, lock: &LockName) -> Result<Vec<FencingToken>, Verdict> {
    ctx.backend()
        .break_holder(ctx.ns(), lock)
        .await?
        .ok_or_else(|| Verdict::Fail(format!("the server had no holder of {lock} to break")))
}

pub(crate) fn name(s: &str) -> Result<LockName, Verdict> {
    LockName::new(s)
        .map_err(|e| Verdict::Fail(format!("the suite's own lock name {s:?} was rejected: {e}")))
}

/// Waits until the namespace holds more than `base` entries (a waiter has queued), up to
/// `bound`. Backends whose waiters leave no server entry never grow: then it waits `bound`.
/// Returns the count seen last.
pub(crate) async fn wait_growth(ctx: &Ctx, base: usize, bound: Duration) -> Result<usize, Verdict> {
    let until = Instant::now() + bound;
    loop {
        let n = ctx.leftovers().await?.len();
        if n > base || Instant::now() >= until {
            return Ok(n);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the namespace's entries equal `expected` (as multisets), up to `bound`.
/// Returns how long it took, or the entries seen last.
pub(crate) async fn settle(
    ctx: &Ctx,
    expected: &[String],
    bound: Duration,
) -> Result<Result<Duration, Vec<String>>, Verdict> {
    let began = Instant::now();
    let mut want = expected.to_vec();
    want.sort();
    loop {
        let mut got = ctx.leftovers().await?;
        got.sort();
        if got == want {
            return Ok(Ok(began.elapsed()));
        }
        if began.elapsed() >= bound {
            return Ok(Err(got));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The system-wide monotonic clock (CLOCK_MONOTONIC) in nanoseconds: comparable across
/// processes on one host, unlike `Instant`.
#[allow(unsafe_code)]
pub(crate) fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `std::time::Instant` of a CLOCK_MONOTONIC reading `ns` (e.g. one reported by another
/// process), so it can be recorded in a history next to this process's events.
pub(crate) fn instant_of_mono(ns: u64) -> std::time::Instant {
    let (now, now_ns) = (std::time::Instant::now(), mono_ns());
    if ns >= now_ns {
        now + Duration::from_nanos(ns - now_ns)
    } else {
        now.checked_sub(Duration::from_nanos(now_ns - ns))
            .unwrap_or(now)
    }
}

/// Awaits `fut` for at most `bound`; `None` when it did not finish.
pub(crate) async fn within<T>(
    bound: Duration,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::time::timeout(bound, fut).await.ok()
}
