//! Acquiring on one Redis server: one script call per attempt; fair waiters sleep until
//! notified or until their fallback timer, non-fair waiters retry after a randomized delay.
//! The queue, notification and grant machinery the mutex, the read-write lock and the
//! semaphore share lives beside it.

mod direct;
pub(crate) mod grant;
pub(crate) mod hints;
pub(crate) mod holders;
pub(crate) mod notify;
mod pending;
mod queue;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, Lease, LockName};
use rand::Rng;
use tokio::time::Instant;

use crate::conn::millis;
use crate::error::{token_of, unexpected};
use crate::keys::{Keys, random_id};
use crate::locker::Inner;
use crate::renew::Slot;
use crate::scripts::{self, scripts};
use crate::wait::{Wait, at_once};
use grant::replicas_acknowledged;
use pending::Pending;
use queue::{doze, entry_lifetime, join_queue, refresh_period};

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

/// One attempt: the [`fast_acquire`](scripts::fast_acquire) script first (and always in
/// non-fair mode), the queue script once a fair waiter is queued: `queued` is then the
/// attempt's number (the acquire's queued attempts count from 1).
async fn attempt(
    inner: &Inner,
    p: &Pending,
    budget: Duration,
    queued: Option<u64>,
) -> Result<Reply, Error> {
    let node = &inner.backend.node;
    let inv = if let Some(number) = queued {
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
            .arg(&inner.backend.channel_prefix)
            .arg(number);
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

/// With [`wait_for_replicas`](crate::RedisLockerBuilder::wait_for_replicas): waits until enough
/// replicas acknowledged the grant; otherwise gives the key back and fails.
async fn acknowledged(inner: &Inner, p: &Pending) -> Result<(), Error> {
    let Err(failed) = replicas_acknowledged(inner).await else {
        return Ok(());
    };
    p.give_back().await?;
    Err(failed)
}

fn pending(inner: &Inner, keys: Keys) -> Pending {
    Pending::new(
        &inner.backend,
        &inner.notifier,
        keys,
        Slot::Lock,
        random_id(),
    )
}

/// One attempt: the lease and its owner value, or `None` when someone else holds the lock.
pub(crate) async fn try_acquire(
    inner: &Arc<Inner>,
    name: &LockName,
) -> Result<Option<(Lease, String)>, Error> {
    let mut p = pending(inner, Keys::new(&inner.prefix, name));
    let start = Instant::now();
    p.dirty = true;
    match attempt(inner, &p, inner.request_timeout, None).await? {
        Reply::Granted(token) => {
            if Instant::now() >= inner.driver.deadline_from(start) {
                // Too late to be useful: dropping `p` (still dirty) gives the key back.
                return Ok(None);
            }
            acknowledged(inner, &p).await?;
            Ok(Some(grant::lease(inner, name, p, token, start)))
        }
        Reply::Held { .. } | Reply::Turn { .. } => {
            p.dirty = false;
            Ok(None)
        }
    }
}

/// Waits for the lock: the lease and its owner value.
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    name: &LockName,
    wait: Option<Duration>,
) -> Result<(Lease, String), Error> {
    if wait == Some(Duration::ZERO) {
        return at_once(try_acquire(inner, name).await?);
    }
    let wait = Wait::start(wait);
    let mut p = pending(inner, Keys::new(&inner.prefix, name));
    let mut notify = None;
    let mut waited = false;
    // An attempt with this owner value got no reply in time: the lock may hold our owner
    // value, so `p.dirty` stays set until a grant (or a cleanup) settles it.
    let mut unseen = false;
    // The last queued attempt answered "not granted" (so it ran), with this owner value: its
    // number and when it was sent. A release that announces a direct grant after THIS attempt
    // ran after it (see `direct`); one after an earlier attempt may have expired before it.
    let mut queued_at: Option<(u64, Instant)> = None;
    // The number of the last queued attempt sent.
    let mut attempts: u64 = 0;
    // A fair waiter first tries the script-free fast path, then queues with the script; for a
    // name it recently had to queue for, it queues at once.
    let mut queued = inner.fair && inner.contended.recently(&p.keys.lock, inner.ttl);
    if queued {
        notify = Some(join_queue(inner, &mut p, None));
    }
    loop {
        let budget = wait.budget(inner.request_timeout);
        if budget.is_zero() {
            return Err(p.timeout(&wait).await);
        }
        let start = Instant::now();
        p.dirty = true;
        let number = queued.then(|| {
            attempts += 1;
            attempts
        });
        let reply = match attempt(inner, &p, budget, number).await {
            Ok(r) => r,
            Err(e) => {
                p.after_failure(e, &wait, name).await?;
                // Slow: try again within the wait. The fair scripts recognise our own grant
                // by its owner value; in non-fair mode our own key would block us, so it is
                // given back and a new owner value is used.
                if inner.fair {
                    unseen = true;
                } else {
                    let stale = std::mem::replace(&mut p.owner, random_id());
                    let backend = Arc::clone(&inner.backend);
                    let keys = p.keys.clone();
                    inner.backend.background.spawn(async move {
                        let _ = backend.release_keys(&keys, &stale).await;
                    });
                }
                tokio::time::sleep_until(wait.wake_at(jitter(None, inner.retry_delay))).await;
                continue;
            }
        };
        if let Some(number) = number
            && matches!(reply, Reply::Held { .. } | Reply::Turn { .. })
        {
            queued_at = Some((number, start));
        }
        let sleep = match reply {
            Reply::Granted(token) => {
                if Instant::now() >= inner.driver.deadline_from(start) {
                    // The reply came after the grant's validity: give the key back and try
                    // again with a new owner value (we rejoin the queue at its tail).
                    tracing::warn!(lock = %name, "grant arrived after its validity; giving it back");
                    p.give_back().await?;
                    p.owner = random_id();
                    unseen = false;
                    queued_at = None;
                    continue;
                }
                acknowledged(inner, &p).await?;
                let granted = grant::lease(inner, name, p, token, start);
                tracing::debug!(lock = %name, token, waited, "granted");
                return Ok(granted);
            }
            Reply::Held { .. } if inner.fair && !queued => {
                // This attempt left nothing behind (an earlier one without a reply may have);
                // join the queue at once.
                p.dirty = unseen;
                queued = true;
                notify = Some(join_queue(inner, &mut p, None));
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
        if !doze(inner, &wait, notify.as_ref(), sleep).await {
            return Err(p.timeout(&wait).await);
        }
        if let Some(granted) = granted_directly(inner, &p, queued_at) {
            let (token, start) = granted;
            acknowledged(inner, &p).await?;
            tracing::debug!(lock = %name, token, "granted by the release");
            return Ok(grant::handed_over(inner, name, p, token, start));
        }
    }
}

/// A grant a release announced to our queue entry, for our current owner value, after our
/// last queued attempt answered `queued_at` (its number, its send time): its token and the
/// send time to count its deadline from ([`direct::start_of`]). `None` otherwise, also when it
/// would leave too little validity: the next attempt then finds the key holding our owner
/// value and re-arms it.
///
/// An announcement after an earlier attempt is not taken: the announcement may have been late,
/// and the later attempt may have found the grant expired and the lock taken by someone else.
/// (Counted from the later attempt's send, such a lease's deadline would fall after the
/// expiry of the key the release set.)
fn granted_directly(
    inner: &Inner,
    p: &Pending,
    queued_at: Option<(u64, Instant)>,
) -> Option<(u64, Instant)> {
    let grant = inner.notifier.take_grant(p.entry.as_deref()?)?;
    if grant.owner != p.owner {
        tracing::debug!("a direct grant for an earlier owner value ignored");
        return None;
    }
    let (number, sent) = queued_at?;
    if grant.attempt != number {
        tracing::debug!(
            announced_after = grant.attempt,
            last_answered = number,
            "a direct grant announced after another attempt than the last one answered ignored"
        );
        return None;
    }
    Some((grant.token, direct::start_of(inner, sent)?))
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
