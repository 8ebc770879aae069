//! Acquiring a read, write or permit hold on one Redis server (for `rw.rs` and
//! `semaphore.rs`): holders of one name in a sorted set
//! (member `<mode>:<owner>`, score = expiry), a FIFO queue across modes, tokens from the
//! name's fence counter; see `family_scripts` for the layout and the grant rule.
//!
//! Every request joins the queue before its first attempt (its entry is registered for
//! notifications first, so none can be missed) and attempts with one script call; a refused
//! request waits until notified (a release, a withdrawal, or a grant to a reader or permit
//! ahead tells exactly the queued requests that may go then), or until its fallback timer (the
//! first holder's expiry, at most the refresh period, which keeps its entry live). The queue
//! is used in fair and spin mode alike: without it readers could starve a writer.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, Lease, LockName};
use tokio::time::Instant;

use super::grant::{self, replicas_acknowledged};
use super::pending::Pending;
use super::queue::{doze, entry_lifetime, join_queue, refresh_period};
use crate::conn::millis;
use crate::error::{token_of, unexpected};
use crate::family_scripts::family_scripts;
use crate::keys::{FamilyKeys, Keys, random_id};
use crate::locker::Inner;
use crate::renew::Slot;
use crate::scripts::fence_lifetime_ms;
use crate::wait::Wait;

/// How a request holds a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
    Permit(u32),
}

impl Mode {
    /// The mode as the scripts spell it: `r`, `w` or `p<N>`.
    fn tag(self) -> String {
        match self {
            Mode::Read => "r".into(),
            Mode::Write => "w".into(),
            Mode::Permit(n) => format!("p{n}"),
        }
    }
}

/// What one attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Granted(u64),
    /// The name's permits are this many, not the request's.
    Permits(u64),
    /// Queued; the first holder expires in this much (None: nobody holds).
    Queued(Option<Duration>),
}

fn parse(node: &str, reply: &[i64]) -> Result<Reply, Error> {
    match reply {
        [1, token] => Ok(Reply::Granted(token_of(node, *token)?)),
        [-1, n] if *n > 0 => Ok(Reply::Permits(n.unsigned_abs())),
        [0, left] => Ok(Reply::Queued(
            u64::try_from(*left).ok().map(Duration::from_millis),
        )),
        _ => Err(unexpected(node, "acquire", reply)),
    }
}

/// One attempt (one script call).
async fn attempt(
    inner: &Inner,
    r: &Pending,
    family: &FamilyKeys,
    budget: Duration,
) -> Result<Reply, Error> {
    let mut inv = family_scripts().acquire.prepare_invoke();
    inv.key(&family.holders)
        .key(&family.fence)
        .key(&family.queue)
        .key(&family.deadlines)
        .arg(&r.owner)
        .arg(millis(inner.ttl))
        .arg(r.entry.as_deref().unwrap_or_default())
        .arg(millis(entry_lifetime(inner.ttl)))
        .arg(fence_lifetime_ms())
        .arg(&inner.backend.channel_prefix);
    let node = &inner.backend.node;
    let reply: Vec<i64> = node
        .invoke("acquire", &inv, budget, &inner.counters)
        .await?;
    parse(&node.display, &reply)
}

/// With [`wait_for_replicas`](crate::RedisLockerBuilder::wait_for_replicas): waits until
/// enough replicas acknowledged the grant; otherwise gives it back and fails.
async fn acknowledged(inner: &Inner, r: &mut Pending) -> Result<(), Error> {
    let Err(failed) = replicas_acknowledged(inner).await else {
        return Ok(());
    };
    // Still dirty: if this fails too, dropping the request withdraws in the background.
    r.give_back().await?;
    r.dirty = false;
    Err(failed)
}

/// Waits for `name` in `mode`.
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    name: &LockName,
    mode: Mode,
    wait: Option<Duration>,
) -> Result<Lease, Error> {
    let wait = Wait::start(wait);
    let keys = Keys::new(&inner.prefix, name);
    let family = FamilyKeys::of(&keys);
    let tag = mode.tag();
    let member = format!("{tag}:{}", random_id());
    let mut r = Pending::new(&inner.backend, &inner.notifier, keys, Slot::Holder, member);
    // The entry is registered for notifications BEFORE the attempt that can enqueue it.
    let notify = join_queue(inner, &mut r, Some(&tag));
    let mut first = true;
    let mut waited = false;
    // Whether an earlier attempt may have left something (a queue entry, an unseen grant).
    let mut left_behind = false;
    loop {
        let budget = if first {
            // The first attempt is made even with a zero wait.
            inner.request_timeout
        } else {
            wait.budget(inner.request_timeout)
        };
        first = false;
        if budget.is_zero() {
            return Err(r.timeout(&wait).await);
        }
        let start = Instant::now();
        r.dirty = true;
        let reply = match attempt(inner, &r, &family, budget).await {
            Ok(reply) => reply,
            Err(e) => {
                r.after_failure(e, &wait, name).await?;
                // Slow: the script recognises our own grant by its member.
                left_behind = true;
                tokio::time::sleep_until(wait.wake_at(Duration::from_millis(10))).await;
                continue;
            }
        };
        let sleep = match reply {
            Reply::Granted(token) => {
                if Instant::now() >= inner.driver.deadline_from(start) {
                    // The reply came after the grant's validity: give it back and queue again
                    // with a new member.
                    tracing::warn!(lock = %name, "grant arrived after its validity; giving it back");
                    r.give_back().await?;
                    r.owner = format!("{tag}:{}", random_id());
                    continue;
                }
                acknowledged(inner, &mut r).await?;
                let (lease, _) = grant::lease(inner, name, r, token, start);
                tracing::debug!(lock = %name, token, waited, mode = %tag, "granted");
                return Ok(lease);
            }
            Reply::Permits(n) => {
                let Mode::Permit(asked) = mode else {
                    return Err(unexpected(&inner.backend.node.display, "acquire", &[-1]));
                };
                // Dropping `r` withdraws what an earlier attempt may have left.
                r.dirty = left_behind;
                return Err(Error::invalid_option(
                    "permits",
                    format!("semaphore {name} has {n} permits; this acquire asked for {asked}"),
                ));
            }
            Reply::Queued(left) => {
                left_behind = true;
                let refresh = refresh_period(inner.ttl);
                left.map_or(refresh, |t| {
                    t.saturating_add(Duration::from_millis(1)).min(refresh)
                })
            }
        };
        if !waited {
            waited = true;
            inner.counters.add_waits(1);
            inner.notifier.start();
            tracing::debug!(lock = %name, mode = %tag, "waiting");
        }
        if !doze(inner, &wait, Some(&notify), sleep).await {
            return Err(r.timeout(&wait).await);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse() {
        assert_eq!(parse("n", &[1, 7]).ok(), Some(Reply::Granted(7)));
        assert_eq!(parse("n", &[-1, 3]).ok(), Some(Reply::Permits(3)));
        assert_eq!(
            parse("n", &[0, 250]).ok(),
            Some(Reply::Queued(Some(Duration::from_millis(250))))
        );
        assert_eq!(parse("n", &[0, -1]).ok(), Some(Reply::Queued(None)));
        assert!(parse("n", &[1, 0]).is_err(), "token 0 is never issued");
        assert!(parse("n", &[-1, 0]).is_err());
        assert!(parse("n", &[]).is_err());
        assert!(parse("n", &[2, 1]).is_err());
    }

    #[test]
    fn modes_are_spelled_as_the_scripts_read_them() {
        assert_eq!(Mode::Read.tag(), "r");
        assert_eq!(Mode::Write.tag(), "w");
        assert_eq!(Mode::Permit(12).tag(), "p12");
    }
}
