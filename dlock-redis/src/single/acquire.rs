//! Acquiring: one script call per attempt; fair waiters sleep until notified or until their
//! fallback timer, non-fair waiters retry after a randomized delay.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dlock_core::{Error, FencingToken, Lease, LockName};
use rand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Inner;
use super::backend::{Held, SingleBackend, Slot};
use super::notify::Notifier;
use crate::conn::{is_slow, millis, token_of, unexpected};
use crate::keys::{Keys, random_id};
use crate::scripts::{self, scripts};

/// What one attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Granted(u64),
    /// Someone holds the lock for `pttl` more (None: no TTL on the key).
    Held {
        pttl: Option<Duration>,
        head: bool,
    },
    /// The lock is free, but another waiter is at the head of the queue for `head_left` more.
    Turn {
        head_left: Duration,
    },
}

fn parse(node: &str, reply: &[i64]) -> Result<Reply, Error> {
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    match reply {
        [1, token, ..] => Ok(Reply::Granted(token_of(node, *token)?)),
        [0, -3, _, left] => Ok(Reply::Turn {
            head_left: ms(*left),
        }),
        [0, pttl, rest @ ..] => Ok(Reply::Held {
            pttl: (*pttl >= 0).then(|| ms(*pttl)),
            head: rest.first() == Some(&1),
        }),
        _ => Err(unexpected(node, "acquire", reply)),
    }
}

/// A request in flight or a queue entry: cleaned up when the acquire ends without a lease,
/// including when its future is dropped.
struct Pending {
    backend: Arc<SingleBackend>,
    notifier: Arc<Notifier>,
    keys: Keys,
    owner: String,
    entry: Option<String>,
    /// Something may be left at the server (a grant whose reply we did not see, a queue entry).
    dirty: bool,
    /// An attempt with this owner value got no reply in time: the lock may hold our owner
    /// value, so `dirty` stays set until a grant (or a cleanup) settles it.
    unseen: bool,
}

impl Pending {
    /// Removes whatever we may have left at the server: our queue entry (passing the baton when
    /// we were the head) and a lock an unseen reply may have granted.
    async fn cleanup(
        backend: &SingleBackend,
        keys: &Keys,
        owner: &str,
        entry: Option<&str>,
    ) -> Result<(), Error> {
        match entry {
            Some(entry) => {
                let mut inv = scripts().withdraw.prepare_invoke();
                inv.key(&keys.lock)
                    .key(&keys.queue)
                    .key(&keys.deadlines)
                    .arg(owner)
                    .arg(entry)
                    .arg(&backend.channel_prefix)
                    .arg(millis(backend.ttl));
                backend
                    .node
                    .invoke::<i64>("withdraw", &inv, backend.request_timeout, &backend.counters)
                    .await
                    .map(|_| ())
            }
            None => backend.release_keys(keys, owner).await.map(|_| ()),
        }
    }

    /// Gives up waiting: withdraws (waiting for it at most [`CLEANUP_GRACE`], so that a hung
    /// server cannot hold the caller long past its wait; the withdrawal then finishes in the
    /// background), then reports the timeout.
    async fn timeout(mut self, began: Instant) -> Error {
        if self.dirty {
            self.dirty = false;
            let backend = Arc::clone(&self.backend);
            let keys = self.keys.clone();
            let owner = std::mem::take(&mut self.owner);
            let entry = self.entry.clone();
            let task = tokio::spawn(async move {
                if let Err(e) = Pending::cleanup(&backend, &keys, &owner, entry.as_deref()).await {
                    tracing::warn!(lock = %keys.lock, error = %e, "withdrawing a timed-out waiter failed; its entry expires on its own");
                }
            });
            let _ = tokio::time::timeout(CLEANUP_GRACE, task).await;
        }
        Error::Timeout {
            waited: began.elapsed(),
        }
    }
}

/// How long a timed-out acquire waits for its withdrawal before returning.
pub(super) const CLEANUP_GRACE: Duration = Duration::from_millis(100);

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(entry) = &self.entry {
            self.notifier.unregister(entry);
        }
        if !self.dirty {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(lock = %self.keys.lock, "acquire dropped outside a runtime; its entry expires on its own");
            return;
        };
        let backend = Arc::clone(&self.backend);
        let keys = self.keys.clone();
        let owner = std::mem::take(&mut self.owner);
        let entry = self.entry.take();
        handle.spawn(async move {
            if let Err(e) = Pending::cleanup(&backend, &keys, &owner, entry.as_deref()).await {
                tracing::warn!(lock = %keys.lock, error = %e, "cleanup of a cancelled acquire failed; it expires on its own");
            }
        });
    }
}

/// One attempt: the [`fast_acquire`](scripts::fast_acquire) script first (and always in
/// non-fair mode), the queue script once a fair waiter is `queued`.
async fn attempt(
    inner: &Inner,
    p: &Pending,
    budget: Duration,
    queued: bool,
) -> Result<Reply, Error> {
    let node = &inner.backend.node;
    let inv = if queued {
        let mut inv = scripts().acquire_fair.prepare_invoke();
        inv.key(&p.keys.lock)
            .key(&p.keys.fence)
            .key(&p.keys.queue)
            .key(&p.keys.deadlines)
            .arg(&p.owner)
            .arg(millis(inner.ttl))
            .arg(p.entry.as_deref().unwrap_or(""))
            .arg(millis(entry_lifetime(inner.ttl)))
            .arg(scripts::fence_lifetime_ms())
            .arg(&inner.backend.channel_prefix);
        inv
    } else {
        scripts::fast_acquire(
            &p.keys.lock,
            &p.keys.fence,
            &p.owner,
            millis(inner.ttl),
            true,
        )
    };
    let reply: Vec<i64> = node
        .invoke("acquire", &inv, budget, &inner.counters)
        .await?;
    parse(&node.display, &reply)
}

/// The longest a fair waiter sleeps without refreshing its queue entry (its fallback timer):
/// the TTL, at most [`MAX_REFRESH`].
pub(super) fn refresh_period(ttl: Duration) -> Duration {
    ttl.min(MAX_REFRESH)
}

/// The refresh period bound: a few seconds whatever the TTL, so a crashed waiter (whose entry
/// lives three refresh periods) or a crashed head (whose reservation lasts no longer than its
/// entry) stalls the queue for at most [`entry_lifetime`] + one refresh period, about 4 s,
/// not one or more TTLs.
const MAX_REFRESH: Duration = Duration::from_secs(1);

/// How long a waiter's queue entry lives without a refresh: three refresh periods, so it only
/// expires when the waiter is gone (or its link to the server is).
pub(super) fn entry_lifetime(ttl: Duration) -> Duration {
    refresh_period(ttl).saturating_mul(3)
}

fn pending(inner: &Inner, keys: Keys, entry: Option<String>) -> Pending {
    Pending {
        backend: Arc::clone(&inner.backend),
        notifier: Arc::clone(&inner.notifier),
        keys,
        owner: random_id(),
        entry,
        dirty: false,
        unseen: false,
    }
}

/// With [`wait_for_replicas`](crate::RedisLockerBuilder::wait_for_replicas): waits until enough
/// replicas acknowledged the grant; otherwise gives the key back and fails.
async fn acknowledged(inner: &Inner, p: &Pending) -> Result<(), Error> {
    let Some((replicas, timeout)) = inner.replicas else {
        return Ok(());
    };
    let node = &inner.backend.node;
    let mut pipe = redis::pipe();
    pipe.cmd("WAIT").arg(replicas).arg(millis(timeout));
    let acked: Result<(i64,), Error> = node
        .pipeline(
            "replica acknowledgement",
            &pipe,
            timeout + inner.request_timeout,
            &inner.counters,
        )
        .await;
    let acked = match acked {
        Ok((n,)) if usize::try_from(n).is_ok_and(|n| n >= replicas) => return Ok(()),
        Ok((n,)) => Error::unavailable(
            format!(
                "only {n} of {replicas} replicas of {} acknowledged the grant within {timeout:?}; it was given back",
                node.display
            ),
            None,
        ),
        Err(e) => e,
    };
    inner.backend.release_keys(&p.keys, &p.owner).await?;
    Err(acked)
}

/// Hands out the lease of a grant whose request was sent at `start`, with the owner value
/// the lock key holds.
fn grant(
    inner: &Inner,
    name: &LockName,
    mut p: Pending,
    token: u64,
    start: Instant,
) -> (Lease, String) {
    p.dirty = false;
    let owner = std::mem::take(&mut p.owner);
    let held = Held {
        keys: p.keys.clone(),
        owner: owner.clone(),
        slot: Slot::Lock,
    };
    drop(p);
    let lease = inner
        .driver
        .register(name.clone(), FencingToken(token), start, held);
    (lease, owner)
}

/// One attempt: the lease and its owner value, or `None` when someone else holds the lock.
pub(super) async fn try_acquire(
    inner: &Arc<Inner>,
    name: &LockName,
) -> Result<Option<(Lease, String)>, Error> {
    let mut p = pending(inner, Keys::new(&inner.prefix, name), None);
    let start = Instant::now();
    p.dirty = true;
    match attempt(inner, &p, inner.request_timeout, false).await? {
        Reply::Granted(token) => {
            if Instant::now() >= inner.driver.deadline_from(start) {
                // Too late to be useful: dropping `p` (still dirty) gives the key back.
                return Ok(None);
            }
            acknowledged(inner, &p).await?;
            Ok(Some(grant(inner, name, p, token, start)))
        }
        Reply::Held { .. } | Reply::Turn { .. } => {
            p.dirty = false;
            Ok(None)
        }
    }
}

/// Gives the waiter its queue entry and registers it for notifications, BEFORE the first
/// attempt that can enqueue it: no notification can be missed.
fn join_queue(inner: &Inner, p: &mut Pending) -> Arc<Notify> {
    let entry = format!(
        "{}.{}",
        inner.locker_id,
        inner.seq.fetch_add(1, Ordering::Relaxed)
    );
    let notify = inner.notifier.register(&entry);
    p.entry = Some(entry);
    notify
}

async fn notified(n: Option<&Arc<Notify>>) {
    match n {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

/// Waits for the lock: the lease and its owner value.
pub(super) async fn acquire(
    inner: &Arc<Inner>,
    name: &LockName,
    wait: Option<Duration>,
) -> Result<(Lease, String), Error> {
    if wait == Some(Duration::ZERO) {
        return try_acquire(inner, name).await?.ok_or(Error::Timeout {
            waited: Duration::ZERO,
        });
    }
    let began = Instant::now();
    let deadline = wait.map(|w| began + w);
    let keys = Keys::new(&inner.prefix, name);
    let mut p = pending(inner, keys, None);
    let mut notify = None;
    let mut waited = false;
    // A fair waiter first tries the script-free fast path, then queues with the script; for a
    // name it recently had to queue for, it queues at once.
    let mut queued = inner.fair && inner.contended.recently(&p.keys.lock, inner.ttl);
    if queued {
        notify = Some(join_queue(inner, &mut p));
    }
    loop {
        let budget = match deadline {
            Some(d) => inner
                .request_timeout
                .min(d.saturating_duration_since(Instant::now())),
            None => inner.request_timeout,
        };
        if budget.is_zero() {
            return Err(p.timeout(began).await);
        }
        let start = Instant::now();
        p.dirty = true;
        let reply = match attempt(inner, &p, budget, queued).await {
            Ok(r) => r,
            Err(e) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(p.timeout(began).await);
                }
                if !is_slow(&e) {
                    // Down or refusing: report it. Dropping `p` withdraws in the background.
                    return Err(e);
                }
                // Slow (a loaded or briefly hung server): the request may or may not have
                // been applied. Try again within the wait. The fair scripts recognise our
                // own grant by its owner value; in non-fair mode our own key would block
                // us, so it is given back and a new owner value is used.
                tracing::debug!(lock = %name, error = %e, "slow reply; trying again within the wait");
                if inner.fair {
                    p.unseen = true;
                } else {
                    let stale = std::mem::replace(&mut p.owner, random_id());
                    let backend = Arc::clone(&inner.backend);
                    let keys = p.keys.clone();
                    tokio::spawn(async move {
                        let _ = backend.release_keys(&keys, &stale).await;
                    });
                }
                let mut wake_at = Instant::now() + jitter(None, inner.retry_delay);
                if let Some(d) = deadline {
                    wake_at = wake_at.min(d);
                }
                tokio::time::sleep_until(wake_at).await;
                continue;
            }
        };
        let sleep = match reply {
            Reply::Granted(token) => {
                if Instant::now() >= inner.driver.deadline_from(start) {
                    // The reply came after the grant's validity: give the key back and try
                    // again with a new owner value (we rejoin the queue at its tail).
                    tracing::warn!(lock = %name, "grant arrived after its validity; giving it back");
                    inner.backend.release_keys(&p.keys, &p.owner).await?;
                    p.owner = random_id();
                    p.unseen = false;
                    continue;
                }
                acknowledged(inner, &p).await?;
                let granted = grant(inner, name, p, token, start);
                tracing::debug!(lock = %name, token, waited, "granted");
                return Ok(granted);
            }
            Reply::Held { .. } if inner.fair && !queued => {
                // This attempt left nothing behind (an earlier one without a reply may have);
                // join the queue at once.
                p.dirty = p.unseen;
                queued = true;
                notify = Some(join_queue(inner, &mut p));
                continue;
            }
            Reply::Held { pttl, head } => {
                if p.entry.is_none() {
                    // Non-fair: a failed attempt leaves nothing behind.
                    p.dirty = false;
                }
                if inner.fair {
                    let refresh = refresh_period(inner.ttl);
                    if head {
                        // The head sleeps until the holder's key expires (a crashed holder),
                        // but never longer than its refresh period (its entry must stay live).
                        pttl.map_or(refresh, |t| {
                            t.saturating_add(Duration::from_millis(1)).min(refresh)
                        })
                    } else {
                        // Others refresh their entry once per refresh period.
                        refresh
                    }
                } else {
                    jitter(pttl, inner.retry_delay)
                }
            }
            Reply::Turn { head_left } => {
                (head_left + Duration::from_millis(1)).min(refresh_period(inner.ttl))
            }
        };
        if !waited {
            waited = true;
            inner.counters.add_waits(1);
            if inner.fair {
                inner.notifier.start();
                inner.contended.note(&p.keys.lock);
            }
            tracing::debug!(lock = %name, "waiting");
        }
        let mut wake_at = Instant::now() + sleep;
        if let Some(d) = deadline {
            wake_at = wake_at.min(d);
        }
        tokio::select! {
            () = notified(notify.as_ref()) => {}
            () = tokio::time::sleep_until(wake_at) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(p.timeout(began).await);
                }
            }
        }
        inner.counters.add_wakeups(1);
    }
}

/// A random delay in `[upper/2, upper]`, where `upper` is the retry bound or the holder's
/// remaining TTL, whichever is shorter (never below 1 ms).
fn jitter(pttl: Option<Duration>, retry_delay: Duration) -> Duration {
    let upper = pttl
        .map_or(retry_delay, |t| t.min(retry_delay))
        .max(Duration::from_millis(1));
    let lo = upper / 2;
    let span = u64::try_from((upper - lo).as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    lo + Duration::from_micros(rand::rng().random_range(0..=span))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse() {
        assert_eq!(parse("n", &[1, 7]).ok(), Some(Reply::Granted(7)));
        assert_eq!(
            parse("n", &[0, 250, 1]).ok(),
            Some(Reply::Held {
                pttl: Some(Duration::from_millis(250)),
                head: true
            })
        );
        assert_eq!(
            parse("n", &[0, -1]).ok(),
            Some(Reply::Held {
                pttl: None,
                head: false
            })
        );
        assert_eq!(
            parse("n", &[0, -3, 0, 40]).ok(),
            Some(Reply::Turn {
                head_left: Duration::from_millis(40)
            })
        );
        assert!(parse("n", &[1, 0]).is_err(), "token 0 is never issued");
        assert!(parse("n", &[1, -5]).is_err());
        assert!(parse("n", &[]).is_err());
        assert!(parse("n", &[2]).is_err());
    }

    #[test]
    fn jitter_stays_in_bounds() {
        for _ in 0..1000 {
            let d = jitter(Some(Duration::from_millis(500)), Duration::from_millis(40));
            assert!(
                d >= Duration::from_millis(20) && d <= Duration::from_millis(40),
                "{d:?}"
            );
            let d = jitter(Some(Duration::ZERO), Duration::from_millis(40));
            assert!(d <= Duration::from_millis(1) && d > Duration::ZERO, "{d:?}");
        }
    }
}
