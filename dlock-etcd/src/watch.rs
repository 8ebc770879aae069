//! What the predecessor wait (`wait.rs`) and the permit wait (`semaphore/wait.rs`) share: how
//! a wait ends ([`Turn`]), its bounds (the session, the caller's deadline) with the pause
//! after a failed request, and a watch opened from the current revision.

use std::time::Duration;

use dlock_core::Error;
use etcd_client::{WatchOptions, WatchStream};
use tokio::time::Instant;

use crate::error;
use crate::locker::EtcdLocker;
use crate::session::Session;

/// etcd's watch resync period: an unsynced watcher is served within it.
/// (A watcher registered just after a resync tick waits a whole period, plus the sync itself.)
pub(crate) const RESYNC_PERIOD: Duration = Duration::from_millis(120);

/// The first pause after a failed request while waiting.
const FIRST_PAUSE: Duration = Duration::from_millis(20);
/// The longest such pause.
const MAX_PAUSE: Duration = Duration::from_millis(500);

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
enum Cut<T> {
    Done(T),
    SessionEnded,
    Deadline,
}

async fn bounded<T>(
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

/// One wait's bounds: the session its key lives on, the caller's deadline, and the pause
/// after a failed request (doubling from 20 ms up to 500 ms).
pub(crate) struct Bounds<'a> {
    session: &'a Session,
    deadline: Option<Instant>,
    backoff: Duration,
}

impl<'a> Bounds<'a> {
    pub(crate) fn new(session: &'a Session, deadline: Option<Instant>) -> Self {
        Bounds {
            session,
            deadline,
            backoff: FIRST_PAUSE,
        }
    }

    /// Runs `fut` unless the session ends first ([`Turn::Requeue`]) or the deadline comes
    /// ([`Turn::Timeout`]).
    pub(crate) async fn cut<T>(
        &self,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T, Turn> {
        match bounded(fut, self.session, self.deadline).await {
            Cut::Done(v) => Ok(v),
            Cut::SessionEnded => Err(Turn::Requeue),
            Cut::Deadline => Err(Turn::Timeout),
        }
    }

    /// After a failed request while waiting: pause (backoff), or end the wait when the session
    /// ended (`Requeue` is signalled as `Ok` by the caller's next step) or the deadline came
    /// (the error is returned: etcd did not answer within the wait).
    pub(crate) async fn transient(&mut self, e: Error) -> Result<(), Error> {
        tracing::debug!(error = %e, retry_in = ?self.backoff, "etcd failed while waiting; retrying");
        match bounded(
            tokio::time::sleep(self.backoff),
            self.session,
            self.deadline,
        )
        .await
        {
            Cut::Done(()) => {
                self.backoff = (self.backoff * 2).min(MAX_PAUSE);
                Ok(())
            }
            // The next step sees the ended session (its key is gone) and re-queues.
            Cut::SessionEnded => Ok(()),
            Cut::Deadline => Err(e),
        }
    }

    /// After a wake-up by a watch event: the next failure pauses briefly again.
    pub(crate) fn woke(&mut self) {
        self.backoff = FIRST_PAUSE;
    }
}

/// What opening a wait's watch gave.
// Returned once per watch and taken apart at once: boxing the stream would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Opened {
    /// The stream and the revision the watch starts after.
    Watch(WatchStream, i64),
    /// Opening failed and the pause after it passed: try again.
    Retry,
    /// The wait ended meanwhile.
    Over(Turn),
}

impl EtcdLocker {
    /// Opens a wait's watch on `key` (with `opts`) from the current revision, within the
    /// wait's bounds; a failure pauses (see [`Bounds::transient`]).
    ///
    /// # Errors
    /// The last error of etcd when it failed until the deadline.
    pub(crate) async fn open_waiting(
        &self,
        b: &mut Bounds<'_>,
        key: &str,
        opts: WatchOptions,
    ) -> Result<Opened, Error> {
        match b.cut(self.open_watch(key, opts)).await {
            Ok(Ok((stream, watch_rev))) => Ok(Opened::Watch(stream, watch_rev)),
            Ok(Err(e)) => {
                b.transient(e).await?;
                Ok(Opened::Retry)
            }
            Err(turn) => Ok(Opened::Over(turn)),
        }
    }

    /// Opens a watch on `key` (with `opts`: deletions only, a prefix...) from the current
    /// revision; returns the stream and the revision the watch starts after.
    pub(crate) async fn open_watch(
        &self,
        key: &str,
        opts: WatchOptions,
    ) -> Result<(WatchStream, i64), Error> {
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
                    Err(e) => return Err(error::map("watch", e)),
                }
            }
        };
        let started = Instant::now();
        match tokio::time::timeout(etcd.request_timeout, open).await {
            Ok(r) => r,
            Err(_) => Err(error::no_reply("watch", started.elapsed())),
        }
    }
}
