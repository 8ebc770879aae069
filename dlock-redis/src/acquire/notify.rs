//! One pub/sub connection per locker: the fair scripts publish to the head waiter's locker
//! channel, and this task hands each message to the one local waiter it names. A message is
//! `<entry>` (look again) or `<entry> <token> <owner> <attempt>` (a release granted the lock
//! to that entry's request with this owner value, after the entry's queued attempt numbered
//! `<attempt>` ran and before any later one did: see `pass_on` in `scripts.rs`); the grant is
//! kept for the waiter to [`take`](Notifier::take_grant).
//!
//! The connection is probed with a `PING` every [`PROBE_PERIOD`], answered within the connect
//! timeout: a flow that a NAT or load balancer dropped silently (no FIN, no RST) is noticed,
//! the channel is subscribed again on a new connection, and every waiter is woken to look
//! again (a message may have been lost meanwhile).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{Notify, watch};

use crate::conn::Node;

/// How often the subscribed connection is probed.
pub(crate) const PROBE_PERIOD: Duration = Duration::from_secs(2);

/// Demultiplexes notifications to local waiters.
pub(crate) struct Notifier {
    /// The node whose current master is subscribed to (asked again on every subscription).
    node: Node,
    channel: String,
    connect_timeout: Duration,
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// Grants announced to registered waiters and not taken yet, by entry.
    grants: Mutex<HashMap<String, Grant>>,
    /// Whether the subscription is up right now.
    up: watch::Sender<bool>,
    /// Dropped with the notifier: ends the task.
    _shutdown: watch::Sender<()>,
    shutdown_rx: watch::Receiver<()>,
    /// The subscription task, once started: started again when it is no longer running (its
    /// runtime shut down), as the renewal driver's task is.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Notifier {
    pub(crate) fn new(node: Node, channel: String, connect_timeout: Duration) -> Arc<Self> {
        let (shutdown, shutdown_rx) = watch::channel(());
        Arc::new(Notifier {
            node,
            channel,
            connect_timeout,
            waiters: Mutex::new(HashMap::new()),
            grants: Mutex::new(HashMap::new()),
            up: watch::Sender::new(false),
            _shutdown: shutdown,
            shutdown_rx,
            task: Mutex::new(None),
        })
    }

    fn waiters(&self) -> MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a waiter's queue entry; its `Notify` gets a permit for every message naming
    /// it, and for every (re)subscription (a message may have been missed meanwhile).
    pub(crate) fn register(&self, entry: &str) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        self.waiters().insert(entry.to_owned(), Arc::clone(&notify));
        notify
    }

    pub(crate) fn unregister(&self, entry: &str) {
        self.waiters().remove(entry);
        self.grants().remove(entry);
    }

    fn grants(&self) -> MutexGuard<'_, HashMap<String, Grant>> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The grant a release announced to `entry` since the last call, if any (of several, the
    /// one after the latest attempt; the waiter checks its owner value and its attempt).
    pub(crate) fn take_grant(&self, entry: &str) -> Option<Grant> {
        self.grants().remove(entry)
    }

    /// Starts the subscription task on the current runtime unless it runs: the first time,
    /// and again when it died with the runtime it ran on. Outside a runtime it does nothing
    /// (waiters fall back to their timers).
    pub(crate) fn start(self: &Arc<Self>) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if task.is_some() {
            tracing::warn!(channel = %self.channel, "the notification task had stopped (its runtime shut down); starting it again");
        }
        // Spawning on a runtime that is shutting down drops the task; the next wait tries
        // again.
        *task = Some(handle.spawn(run(Arc::downgrade(self), self.shutdown_rx.clone())));
    }

    fn dispatch(&self, payload: &str) {
        let Some((entry, grant)) = parse(payload) else {
            tracing::warn!(payload, "malformed notification ignored");
            return;
        };
        let notify = self.waiters().get(entry).cloned();
        match notify {
            Some(n) => {
                if let Some(grant) = grant {
                    let mut grants = self.grants();
                    // Announcements may arrive out of order: keep the one after the latest
                    // attempt.
                    if grants.get(entry).is_none_or(|g| g.attempt <= grant.attempt) {
                        grants.insert(entry.to_owned(), grant);
                    }
                }
                n.notify_one();
            }
            None => tracing::trace!(entry, "notification for a waiter that is gone"),
        }
    }

    fn wake_all(&self) {
        for n in self.waiters().values() {
            n.notify_one();
        }
    }
}

/// A grant a release announced to a queue entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) token: u64,
    /// The owner value the key was set to.
    pub(crate) owner: String,
    /// The entry's last queued attempt that ran before the release (the waiter numbers them
    /// from 1): the release ran after it and before any later one.
    pub(crate) attempt: u64,
}

/// A message: the entry, and the announced grant when there is one. `None`: malformed.
fn parse(payload: &str) -> Option<(&str, Option<Grant>)> {
    let mut parts = payload.split(' ');
    let entry = parts.next().filter(|e| !e.is_empty())?;
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (None, ..) => Some((entry, None)),
        // A grant without the attempt it followed (a release of an earlier dlock version)
        // cannot be dated: only a wake-up, and the next attempt finds the key.
        (Some(_), Some(_), None, None) => Some((entry, None)),
        (Some(token), Some(owner), Some(attempt), None) if !owner.is_empty() => {
            let token = token.parse::<u64>().ok().filter(|t| *t > 0)?;
            let attempt = attempt.parse::<u64>().ok()?;
            Some((
                entry,
                Some(Grant {
                    token,
                    owner: owner.to_owned(),
                    attempt,
                }),
            ))
        }
        _ => None,
    }
}

async fn run(weak: Weak<Notifier>, mut shutdown: watch::Receiver<()>) {
    let mut failures: u32 = 0;
    loop {
        let Some(this) = weak.upgrade() else { return };
        let node = this.node.clone();
        let channel = this.channel.clone();
        let connect_timeout = this.connect_timeout;
        drop(this);
        let connect = async {
            let client = node.client(connect_timeout).await.map_err(|e| {
                redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "no master to subscribe to",
                    e.to_string(),
                ))
            })?;
            let pubsub = client.get_async_pubsub().await?;
            let (mut sink, stream) = pubsub.split();
            sink.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>((sink, stream))
        };
        let connected = tokio::select! {
            r = tokio::time::timeout(connect_timeout, connect) => r,
            _ = shutdown.changed() => return,
        };
        match connected {
            Ok(Ok((mut sink, mut stream))) => {
                failures = 0;
                {
                    let Some(this) = weak.upgrade() else { return };
                    this.up.send_replace(true);
                    tracing::debug!(channel = %this.channel, "notification channel subscribed");
                    this.wake_all();
                }
                let mut probe = tokio::time::interval_at(
                    tokio::time::Instant::now() + PROBE_PERIOD,
                    PROBE_PERIOD,
                );
                probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    let msg = tokio::select! {
                        m = stream.next() => m,
                        _ = probe.tick() => {
                            let answered = tokio::time::timeout(
                                connect_timeout,
                                sink.ping::<redis::Value>(),
                            )
                            .await;
                            if matches!(answered, Ok(Ok(_))) {
                                continue;
                            }
                            let Some(this) = weak.upgrade() else { return };
                            this.up.send_replace(false);
                            tracing::warn!(channel = %this.channel, "notification channel did not answer its probe; subscribing again");
                            break;
                        }
                        _ = shutdown.changed() => return,
                    };
                    let Some(this) = weak.upgrade() else { return };
                    match msg {
                        Some(msg) => match msg.get_payload::<String>() {
                            Ok(entry) => this.dispatch(&entry),
                            Err(e) => tracing::warn!(error = %e, "malformed notification ignored"),
                        },
                        None => {
                            this.up.send_replace(false);
                            tracing::warn!(channel = %this.channel, "notification channel lost; waiters fall back to timers");
                            break;
                        }
                    }
                }
            }
            Ok(Err(e)) => {
                failures += 1;
                tracing::warn!(error = %e, failures, "cannot subscribe to the notification channel");
            }
            Err(_) => {
                failures += 1;
                tracing::warn!(
                    failures,
                    "subscribing to the notification channel timed out"
                );
            }
        }
        let backoff = Duration::from_millis(20)
            .saturating_mul(1 << failures.min(6))
            .min(Duration::from_secs(1));
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Grant, parse};

    #[test]
    fn messages_parse() {
        assert_eq!(parse("ab.3"), Some(("ab.3", None)));
        // Without the attempt it followed, a grant cannot be dated: a wake-up only.
        assert_eq!(parse("ab.3 1700000000000001 00ff"), Some(("ab.3", None)));
        assert_eq!(
            parse("ab.3 1700000000000001 00ff 4"),
            Some((
                "ab.3",
                Some(Grant {
                    token: 1_700_000_000_000_001,
                    owner: "00ff".to_owned(),
                    attempt: 4
                })
            ))
        );
        for bad in [
            "",
            "ab.3 12",
            "ab.3 0 00ff 1",
            "ab.3 -1 00ff 1",
            "ab.3 x 00ff 1",
            "ab.3 1 00ff x",
            "ab.3 1 00ff 1 x",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
