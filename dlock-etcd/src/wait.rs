//! Waiting for our turn: watch only the predecessor's key for deletion, then re-check.

use std::time::Duration;

use dlock_core::{Error, LockName};
use etcd_client::{EventType, WatchFilterType, WatchOptions};
use tokio::time::Instant;

use crate::enqueue::Recheck;
use crate::error;
use crate::locker::EtcdLocker;
use crate::session::Session;
use crate::watch::{Bounds, Opened, RESYNC_PERIOD, Turn};

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
        let mut b = Bounds::new(session, deadline);
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
                        b.transient(e).await?;
                        false
                    }
                }
            };
        }
        loop {
            tracing::trace!(lock = %name, %key, %pred, "waiting for the predecessor's deletion");
            let delete_of_pred = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
            let (mut stream, watch_rev) =
                match self.open_waiting(&mut b, &pred, delete_of_pred).await? {
                    Opened::Watch(stream, watch_rev) => (stream, watch_rev),
                    Opened::Retry => continue,
                    Opened::Over(turn) => return Ok(turn),
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
                        b.cut(tokio::time::timeout_at(at, wait_delete(&mut stream)))
                            .await
                    }
                    _ => b.cut(async { Ok(wait_delete(&mut stream).await) }).await,
                };
                match step {
                    Ok(Ok(Ok(()))) => break Woke::Event,
                    Ok(Ok(Err(e))) => break Woke::Failed(e),
                    Ok(Err(_)) => {
                        poll = poll.map(|p| (p * 2).min(Duration::from_millis(40)));
                        if !on_recheck!(etcd.recheck(range, key, rev, deadline).await, true) {
                            break Woke::Moved;
                        }
                    }
                    Err(turn) => return Ok(turn),
                }
            };
            match woke {
                Woke::Event => {
                    etcd.counters.add_wakeups(1);
                    b.woke();
                }
                // A re-read found a new predecessor: watch it.
                Woke::Moved => continue,
                Woke::Failed(e) => b.transient(e).await?,
            }
            drop(stream);
            let _ = on_recheck!(etcd.recheck(range, key, rev, deadline).await, false);
        }
    }
}

/// How one watch of the predecessor ended.
enum Woke {
    /// A deletion (or a cancellation by etcd): re-check.
    Event,
    /// A re-read found a different predecessor (already handled).
    Moved,
    /// The watch failed.
    Failed(Error),
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
            Err(e) => return Err(error::map("watch", e)),
        }
    }
}
