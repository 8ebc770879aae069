//! Waiting for our turn: watch only the predecessor's key for deletion, then re-check.

use std::time::Duration;

use dlock_core::{Error, LockName};
use etcd_client::{EventType, WatchFilterType, WatchOptions};
use tokio::time::Instant;

use crate::errors;
use crate::locker::EtcdLocker;
use crate::ops::Recheck;
use crate::session::Session;

impl EtcdLocker {
    /// Waits until our key is the first of its range: watch only `pred` (the key just below
    /// ours) for deletion, then re-check; `read_rev` is the revision our last read was made at.
    ///
    /// The watch starts at the CURRENT revision (never an old one: etcd serves watchers that
    /// start in the past from a resync loop that runs every 100 ms). Once it exists we read
    /// again (the deletion may predate the watch) and keep the watch while `pred` is still our
    /// predecessor. One wake-up per release, and a constant number of requests per wait.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn wait_turn(
        &self,
        name: &LockName,
        range: &str,
        key: &str,
        rev: i64,
        mut pred: String,
        mut read_rev: i64,
        session: &Session,
        deadline: Option<Instant>,
    ) -> Result<Turn, Error> {
        let etcd = &self.inner.etcd;
        let mut backoff = Duration::from_millis(20);
        // The outcome of a re-read: true to keep watching `pred`, false to watch the (new)
        // `pred` afresh, or a final turn.
        macro_rules! on_recheck {
            ($result:expr, $keep:expr) => {
                match $result {
                    Ok(Recheck::Owner) => return Ok(Turn::Owner),
                    Ok(Recheck::KeyGone) => {
                        tracing::debug!(lock = %name, %key, "our queue key is gone; queueing again");
                        return Ok(Turn::Requeue);
                    }
                    Ok(Recheck::Behind {
                        predecessor,
                        header_rev,
                    }) => {
                        read_rev = header_rev;
                        if predecessor == pred && $keep {
                            true
                        } else {
                            pred = predecessor;
                            false
                        }
                    }
                    Err(e) => {
                        self.transient(e, &mut backoff, session, deadline).await?;
                        false
                    }
                }
            };
        }
        loop {
            tracing::trace!(lock = %name, %key, %pred, "waiting for the predecessor's deletion");
            let delete_of_pred = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
            let opened =
                match bounded(self.open_watch(&pred, delete_of_pred), session, deadline).await {
                    Cut::Done(r) => r,
                    Cut::SessionEnded => return Ok(Turn::Requeue),
                    Cut::Deadline => return Ok(Turn::Timeout),
                };
            let (mut stream, watch_rev) = match opened {
                Ok(v) => v,
                Err(e) => {
                    self.transient(e, &mut backoff, session, deadline).await?;
                    continue;
                }
            };
            let opened_at = Instant::now();
            // Re-read once the watch exists: the deletion may predate the watch. etcd registers
            // a watch "from now" at the revision `watch_rev` it read just before; a write that
            // lands in between leaves the watch unsynced, served only by etcd's 100 ms resync
            // loop. If our read shows no write since `watch_rev`, that cannot have happened;
            // otherwise we cannot tell, and re-read a few times during the first resync period
            // (after 5, 15, 35, 75 and 115 ms, until the watch fires): at most five more reads.
            if !on_recheck!(etcd.recheck(range, key, rev, deadline).await, true) {
                continue;
            }
            let mut poll = (read_rev > watch_rev).then_some(Duration::from_millis(5));
            let woke = loop {
                let step = match poll {
                    Some(p) if opened_at.elapsed() + p <= RESYNC_PERIOD => {
                        let at = Instant::now() + p;
                        bounded(
                            tokio::time::timeout_at(at, wait_delete(&mut stream)),
                            session,
                            deadline,
                        )
                        .await
                    }
                    _ => {
                        bounded(
                            async { Ok(wait_delete(&mut stream).await) },
                            session,
                            deadline,
                        )
                        .await
                    }
                };
                match step {
                    Cut::Done(Ok(Ok(()))) => break Woke::Event,
                    Cut::Done(Ok(Err(e))) => break Woke::Failed(e),
                    Cut::Done(Err(_)) => {
                        poll = poll.map(|p| (p * 2).min(Duration::from_millis(40)));
                        if !on_recheck!(etcd.recheck(range, key, rev, deadline).await, true) {
                            break Woke::Moved;
                        }
                    }
                    Cut::SessionEnded => return Ok(Turn::Requeue),
                    Cut::Deadline => return Ok(Turn::Timeout),
                }
            };
            match woke {
                Woke::Event => {
                    etcd.counters.add_wakeups(1);
                    backoff = Duration::from_millis(20);
                }
                // A re-read found a new predecessor: watch it.
                Woke::Moved => continue,
                Woke::Failed(e) => self.transient(e, &mut backoff, session, deadline).await?,
            }
            drop(stream);
            let _ = on_recheck!(etcd.recheck(range, key, rev, deadline).await, false);
        }
    }

    /// After a failed request while waiting: pause (backoff), or end the wait when the session
    /// ended (`Requeue` is signalled as `Ok` by the caller's next step) or the deadline came
    /// (the error is returned: etcd did not answer within the wait).
    pub(crate) async fn transient(
        &self,
        e: Error,
        backoff: &mut Duration,
        session: &Session,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        tracing::debug!(error = %e, retry_in = ?*backoff, "etcd failed while waiting; retrying");
        match bounded(tokio::time::sleep(*backoff), session, deadline).await {
            Cut::Done(()) => {
                *backoff = (*backoff * 2).min(Duration::from_millis(500));
                Ok(())
            }
            // The next step sees the ended session (its key is gone) and re-queues.
            Cut::SessionEnded => Ok(()),
            Cut::Deadline => Err(e),
        }
    }

    /// Opens a watch on `key` (with `opts`: deletions only, a prefix...) from the current
    /// revision; returns the stream and the revision the watch starts after.
    pub(crate) async fn open_watch(
        &self,
        key: &str,
        opts: WatchOptions,
    ) -> Result<(etcd_client::WatchStream, i64), Error> {
        let etcd = &self.inner.etcd;
        let open = async {
            let mut stream = etcd
                .call("watch", None, |c| {
                    let (mut watcher, opts) = (c.watch_client(), opts.clone());
                    async move { watcher.watch(key, Some(opts)).await }
                })
                .await?;
            loop {
                match stream.message().await {
                    Ok(Some(resp)) if resp.created() => {
                        let rev = resp.header().map_or(i64::MAX, |h| h.revision());
                        return Ok((stream, rev));
                    }
                    Ok(Some(resp)) if resp.canceled() => {
                        return Err(Error::backend(
                            format!("watch refused by etcd: {}", resp.cancel_reason()),
                            None,
                        ));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        return Err(Error::unavailable("watch: stream closed by etcd", None));
                    }
                    Err(e) => return Err(errors::map("watch", e)),
                }
            }
        };
        let started = Instant::now();
        match tokio::time::timeout(etcd.request_timeout, open).await {
            Ok(r) => r,
            Err(_) => Err(errors::no_reply("watch", started.elapsed())),
        }
    }
}

/// etcd's watch resync period: an unsynced watcher is served within it.
/// (A watcher registered just after a resync tick waits a whole period, plus the sync itself.)
pub(crate) const RESYNC_PERIOD: Duration = Duration::from_millis(120);

/// How one watch of the predecessor ended.
enum Woke {
    /// A deletion (or a cancellation by etcd): re-check.
    Event,
    /// A re-read found a different predecessor (already handled).
    Moved,
    /// The watch failed.
    Failed(Error),
}

/// How waiting for our turn ended.
pub(crate) enum Turn {
    /// Our key is the first: we own the lock.
    Owner,
    /// Our key or session is gone: queue again.
    Requeue,
    /// The caller's wait elapsed.
    Timeout,
    /// The queue refuses our key (a semaphore's permit count that differs from the one it is
    /// held with): delete it and fail with this reason.
    Refused(String),
}

/// A future cut short by the end of the session or the caller's deadline.
pub(crate) enum Cut<T> {
    Done(T),
    SessionEnded,
    Deadline,
}

pub(crate) async fn bounded<T>(
    fut: impl std::future::Future<Output = T>,
    session: &Session,
    deadline: Option<Instant>,
) -> Cut<T> {
    let until = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        v = fut => Cut::Done(v),
        _ = session.ended() => Cut::SessionEnded,
        () = until => Cut::Deadline,
    }
}

/// Waits on an open watch for a deletion (or a cancellation by etcd, e.g. a compaction: the
/// caller re-checks either way).
async fn wait_delete(stream: &mut etcd_client::WatchStream) -> Result<(), Error> {
    loop {
        match stream.message().await {
            Ok(Some(resp)) => {
                if resp.canceled() {
                    tracing::debug!(
                        reason = resp.cancel_reason(),
                        compact = resp.compact_revision(),
                        "watch cancelled by etcd"
                    );
                    return Ok(());
                }
                if resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(());
                }
            }
            Ok(None) => return Err(Error::unavailable("watch: stream closed by etcd", None)),
            Err(e) => return Err(errors::map("watch", e)),
        }
    }
}
