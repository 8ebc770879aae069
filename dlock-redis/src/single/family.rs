//! [`RwLocker`] and [`Semaphore`] on one Redis server: holders of one name in a sorted set
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
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    AcquireOptions, Error, FencingToken, Lease, LockName, RwLocker, Semaphore, validate_permits,
};
use tokio::time::Instant;

use super::acquire::{CLEANUP_GRACE, entry_lifetime, refresh_period};
use super::backend::{Held, SingleBackend, Slot};
use super::notify::Notifier;
use super::{Inner, RedisLocker};
use crate::conn::{is_slow, millis, token_of, unexpected};
use crate::family_scripts::family_scripts;
use crate::keys::{FamilyKeys, Keys, random_id};
use crate::scripts::fence_lifetime_ms;

/// How a request holds a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
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

/// A request: its queue entry and member, withdrawn at the server when the acquire ends
/// without a lease, including when its future is dropped.
struct Request {
    backend: Arc<SingleBackend>,
    notifier: Arc<Notifier>,
    keys: Keys,
    family: FamilyKeys,
    member: String,
    entry: String,
    /// Something may be left at the server (a queue entry, a grant whose reply we did not see).
    dirty: bool,
}

impl Request {
    fn withdraw_task(&mut self) -> impl Future<Output = ()> + Send + 'static {
        self.dirty = false;
        let backend = Arc::clone(&self.backend);
        let family = self.family.clone();
        let member = std::mem::take(&mut self.member);
        let entry = self.entry.clone();
        async move {
            if let Err(e) = backend.withdraw_member(&family, &member, &entry).await {
                tracing::warn!(lock = %family.holders, error = %e, "withdrawing a request failed; its entry expires on its own");
            }
        }
    }

    /// Gives up waiting: withdraws (waiting for it at most [`CLEANUP_GRACE`]; it then finishes
    /// in the background), then reports the timeout.
    async fn timeout(mut self, began: Instant) -> Error {
        if self.dirty {
            let task = tokio::spawn(self.withdraw_task());
            let _ = tokio::time::timeout(CLEANUP_GRACE, task).await;
        }
        Error::Timeout {
            waited: began.elapsed(),
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        self.notifier.unregister(&self.entry);
        if !self.dirty {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(lock = %self.family.holders, "acquire dropped outside a runtime; its entry expires on its own");
            return;
        };
        handle.spawn(self.withdraw_task());
    }
}

/// One attempt (one script call).
async fn attempt(inner: &Inner, r: &Request, budget: Duration) -> Result<Reply, Error> {
    let mut inv = family_scripts().acquire.prepare_invoke();
    inv.key(&r.family.holders)
        .key(&r.family.fence)
        .key(&r.family.queue)
        .key(&r.family.deadlines)
        .arg(&r.member)
        .arg(millis(inner.ttl))
        .arg(&r.entry)
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
async fn acknowledged(inner: &Inner, r: &mut Request) -> Result<(), Error> {
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
    let failed = match acked {
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
    // Still dirty: if this fails too, dropping the request withdraws in the background.
    inner
        .backend
        .withdraw_member(&r.family, &r.member, &r.entry)
        .await?;
    r.dirty = false;
    Err(failed)
}

/// Waits for `name` in `mode`.
async fn acquire(
    inner: &Arc<Inner>,
    name: &LockName,
    mode: Mode,
    wait: Option<Duration>,
) -> Result<Lease, Error> {
    let began = Instant::now();
    let deadline = wait.map(|w| began + w);
    let keys = Keys::new(&inner.prefix, name);
    let tag = mode.tag();
    // The entry is registered for notifications BEFORE the attempt that can enqueue it.
    let entry = format!(
        "{}.{}.{tag}",
        inner.locker_id,
        inner.seq.fetch_add(1, Ordering::Relaxed)
    );
    let notify = inner.notifier.register(&entry);
    let mut r = Request {
        backend: Arc::clone(&inner.backend),
        notifier: Arc::clone(&inner.notifier),
        family: FamilyKeys::of(&keys),
        keys,
        member: format!("{tag}:{}", random_id()),
        entry,
        dirty: false,
    };
    let mut first = true;
    let mut waited = false;
    // Whether an earlier attempt may have left something (a queue entry, an unseen grant).
    let mut left_behind = false;
    loop {
        let budget = match deadline {
            // The first attempt is made even with a zero wait.
            Some(_) if first => inner.request_timeout,
            Some(d) => inner
                .request_timeout
                .min(d.saturating_duration_since(Instant::now())),
            None => inner.request_timeout,
        };
        first = false;
        if budget.is_zero() {
            return Err(r.timeout(began).await);
        }
        let start = Instant::now();
        r.dirty = true;
        let reply = match attempt(inner, &r, budget).await {
            Ok(reply) => reply,
            Err(e) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(r.timeout(began).await);
                }
                if !is_slow(&e) {
                    // Down or refusing: report it. Dropping `r` withdraws in the background.
                    return Err(e);
                }
                // Slow: the attempt may or may not have been applied; the script recognises
                // our own grant by its member.
                tracing::debug!(lock = %name, error = %e, "slow reply; trying again within the wait");
                left_behind = true;
                let mut wake_at = Instant::now() + Duration::from_millis(10);
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
                    // The reply came after the grant's validity: give it back and queue again
                    // with a new member.
                    tracing::warn!(lock = %name, "grant arrived after its validity; giving it back");
                    inner
                        .backend
                        .withdraw_member(&r.family, &r.member, &r.entry)
                        .await?;
                    r.member = format!("{tag}:{}", random_id());
                    continue;
                }
                acknowledged(inner, &mut r).await?;
                r.dirty = false;
                let held = Held {
                    keys: r.keys.clone(),
                    owner: std::mem::take(&mut r.member),
                    slot: Slot::Holder,
                };
                drop(r);
                tracing::debug!(lock = %name, token, waited, mode = %tag, "granted");
                return Ok(inner
                    .driver
                    .register(name.clone(), FencingToken(token), start, held));
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
        let mut wake_at = Instant::now() + sleep;
        if let Some(d) = deadline {
            wake_at = wake_at.min(d);
        }
        tokio::select! {
            () = notify.notified() => {}
            () = tokio::time::sleep_until(wake_at) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(r.timeout(began).await);
                }
            }
        }
        inner.counters.add_wakeups(1);
    }
}

/// Readers and writers of one name on one Redis server: FIFO across modes (a reader that
/// arrives while a writer waits queues behind it), readers at the head granted together.
/// In fair and spin mode alike (the queue is what keeps writers from starving).
#[async_trait]
impl RwLocker for RedisLocker {
    /// # Errors
    /// As [`Locker::acquire`](dlock_core::Locker::acquire).
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the request in the background (its queue entry, and a
    /// grant whose reply was not seen); nothing is left behind.
    async fn read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        opts.validate()?;
        acquire(&self.inner, name, Mode::Read, opts.wait).await
    }

    /// # Errors
    /// As [`Locker::acquire`](dlock_core::Locker::acquire).
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    async fn write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        opts.validate()?;
        acquire(&self.inner, name, Mode::Write, opts.wait).await
    }

    fn ttl(&self) -> Duration {
        self.inner.ttl
    }
}

/// A counting semaphore of one name on one Redis server: at most N live holders, FIFO.
/// N is recorded with the holders (`p<N>` in their members and queue entries).
#[async_trait]
impl Semaphore for RedisLocker {
    /// # Errors
    /// [`Error::InvalidOption`] for a permit count outside 1..=[`MAX_PERMITS`](dlock_core::MAX_PERMITS)
    /// (before any I/O), or one that differs from the count of the permits held or awaited;
    /// otherwise as [`Locker::acquire`](dlock_core::Locker::acquire).
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the request in the background; nothing is left behind.
    async fn acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        validate_permits(permits)?;
        opts.validate()?;
        acquire(&self.inner, name, Mode::Permit(permits), opts.wait).await
    }

    fn ttl(&self) -> Duration {
        self.inner.ttl
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
