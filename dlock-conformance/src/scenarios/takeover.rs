//! A holder cut off while another client waits for what it holds: the one check behind
//! `election_failover`, `semaphore_crash_release` and `rw_lost_before_stolen`. The waiter must
//! get it within TTL + slack of the cut, never before the holder's `lost()` fired, with a
//! higher token.

use std::future::Future;
use std::time::Duration;

use dlock_core::{Error, Lease};
use tokio::time::Instant;

use super::util::{spawn_timed, via_proxies};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;
use crate::faults::{Mode, Proxy};

/// The holder's link to the servers: one proxy per node (none for an in-process backend,
/// where the cut stops the lease's renewal instead).
pub(crate) struct Link {
    proxies: Vec<Proxy>,
}

impl Link {
    /// Proxies for every node, and `opts` routed through them.
    pub(crate) fn start(ctx: &Ctx, opts: ClientOptions) -> Result<(Link, ClientOptions), Verdict> {
        let (proxies, opts) = via_proxies(&ctx.backend().node_addrs(), opts)?;
        Ok((Link { proxies }, opts))
    }

    fn cut(&self, held: &Lease) {
        if self.proxies.is_empty() {
            held.stop_renewal_for_test();
        } else {
            self.proxies.iter().for_each(|p| p.set(Mode::Blackhole));
        }
    }

    fn heal(&self) {
        self.proxies.iter().for_each(|p| p.set(Mode::Pass));
    }
}

/// `held` (reached through `link`) is cut off while `waiter` waits for it (the waiter's own
/// client does not go through `link`). Fails unless the waiter is still waiting 100 ms in,
/// then is granted within TTL + slack of the cut, after `held`'s `lost()` fired, with a token
/// above `held`'s (`token` reads it from the grant). `what` names the thing held in messages;
/// the figure `<key>_ms` is the time from the cut to the grant. Returns the waiter's grant.
pub(crate) async fn take_over<T, W>(
    ctx: &Ctx,
    link: &Link,
    held: &Lease,
    what: &str,
    key: &str,
    waiter: W,
    token: fn(&T) -> u64,
) -> Result<T, Verdict>
where
    T: Send + 'static,
    W: Future<Output = Result<T, Error>> + Send + 'static,
{
    let caps = ctx.capabilities().await?;
    let old = held.token().get();
    let lost = held.lost();
    let lost_at = spawn_timed(lost);
    let waiting = spawn_timed(waiter);
    tokio::time::sleep(Duration::from_millis(100)).await;
    ensure!(
        !waiting.is_finished(),
        "the waiter got {what} while its holder was alive"
    );
    let cut = Instant::now();
    link.cut(held);
    let (got_at, got) = waiting
        .await
        .map_err(|e| Verdict::Fail(format!("the waiter panicked: {e}")))?;
    link.heal();
    let got = got.map_err(|e| {
        Verdict::Fail(format!(
            "{what} was not freed after its holder was cut off: {e}"
        ))
    })?;
    let (lost_t, reason) = lost_at
        .await
        .map_err(|e| Verdict::Fail(format!("the lost() task panicked: {e}")))?;
    let after = got_at.saturating_duration_since(cut);
    let bound = caps.crash_release_within + ctx.crash_slack(&caps);
    ctx.figure_ms(&format!("{key}_ms"), after);
    ctx.figure_ms("bound_ms", bound);
    ctx.figure_ms(
        &format!("{key}_lost_before_ms"),
        got_at.saturating_duration_since(lost_t),
    );
    ensure!(
        lost_t <= got_at,
        "the cut-off holder learned of its loss ({reason}) {:?} after the waiter got {what}",
        lost_t.saturating_duration_since(got_at)
    );
    ensure!(
        after <= bound,
        "{what} was granted {after:?} after its holder was cut off, later than TTL + slack ({bound:?})"
    );
    let new = token(&got);
    ensure!(
        new > old,
        "the waiter's token for {what} ({new}) is not above the cut-off holder's ({old})"
    );
    Ok(got)
}

/// How long a waiter in a [`take_over`] may wait: far past the bound it is checked against.
pub(crate) async fn waiter_budget(ctx: &Ctx) -> Result<Duration, Verdict> {
    let caps = ctx.capabilities().await?;
    Ok(ctx.ttl() * 3 + ctx.crash_slack(&caps) + Duration::from_secs(5))
}
