//! Following an election's leader changes: a persistent recursive watch on the election's
//! parent, a snapshot of the queue aligned with the watch's event stream, and a model of the
//! queue that the events then keep up to date.
//!
//! Every event delivered before the snapshot's listing is sent reports a change the server made
//! before the listing, so the snapshot drops those events (the listing reflects them). An event
//! delivered after the listing was sent cannot be placed: the listing's reply is answered on
//! the client's own task, which may already have delivered events of later changes by the time
//! this task sees the reply. So the snapshot also reads every queued node's data (a waiter's
//! value is needed the moment it leads, when it may already have resigned) and the parent's
//! (the leader's latest proclamation), and any event delivered between sending the listing and
//! the last of those replies means the queue moved meanwhile: the snapshot is taken again.
//! Every event after a snapshot that was kept is a change after it.
//!
//! From then on the model applies every event in order: node created (its value is read at
//! once), node deleted, the parent's proclamation record written (see `record`; a proclamation
//! never writes the leader's node; the parent's data keeps the last few records, so a read that
//! arrives after later proclamations still finds the one its event announced). The leader is always the first node of the model. A change
//! is reported only when it is known exactly; whenever the model cannot be sure it saw every
//! change — a lost connection or session (events during a reconnect are not replayed), a
//! leader whose value could not be read before it changed or vanished, a gap in the parent's
//! data versions (more proclamations between one event and its read than the parent's history
//! keeps, or a write from outside between them), a leader's node written
//! (from outside) — the observation fails with [`Error::Unavailable`] for good.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use async_trait::async_trait;
use dlock_core::{Error, Leader, LeaderChanges};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use zookeeper_client as zk;

use crate::error::map;
use crate::keys::{node_name, parent_of};
use crate::model::{Model, Parent, Read, key};
use crate::record::decode;
use crate::session::Session;

/// How many times a snapshot is taken again while the queue keeps moving.
const SNAPSHOT_TRIES: usize = 16;

/// A test hook run once, right after the first snapshot's listing is answered, with the
/// observer's client (see `ZkLocker::observe_with_hook_for_test`).
#[cfg(feature = "testing")]
pub(crate) type AfterListing =
    Box<dyn FnOnce(zk::Client) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// What applying an event needs read first.
enum Need {
    Nothing,
    Read(String),
}

/// The next event already delivered to `watcher`, without waiting.
fn delivered(watcher: &mut zk::PersistentWatcher) -> Option<zk::WatchedEvent> {
    let mut changed = std::pin::pin!(watcher.changed());
    match changed
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(event) => Some(event),
        Poll::Pending => None,
    }
}

/// Why a session event ends an observation, if it does.
fn session_break(event: &zk::WatchedEvent) -> Option<String> {
    if event.event_type != zk::EventType::Session {
        return None;
    }
    match event.session_state {
        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => None,
        state => Some(format!(
            "the ZooKeeper connection or session was lost ({state}): changes may have been missed"
        )),
    }
}

/// What the follower task sends: a change, or why the observation ended.
type Sent = Result<Leader, String>;

/// The task that follows the watch: applies every event as it arrives (reading what it needs
/// at once, not when the observer asks for the next change) and sends the changes.
struct Follower {
    sess: Arc<Session>,
    parent: String,
    watcher: zk::PersistentWatcher,
    model: Model,
    tx: UnboundedSender<Sent>,
}

impl Follower {
    /// Runs until the observation fails or its [`ZkChanges`] is dropped (the watch goes with
    /// the task).
    async fn run(mut self) {
        let client = self.sess.client.clone();
        loop {
            let first = tokio::select! {
                () = self.tx.closed() => return,
                event = self.watcher.changed() => event,
            };
            // Every event delivered by now, up to a session event (after a terminal one the
            // watcher must never be polled again).
            let mut batch = vec![first];
            while batch
                .last()
                .is_some_and(|e| e.event_type != zk::EventType::Session)
            {
                match delivered(&mut self.watcher) {
                    Some(event) => batch.push(event),
                    None => break,
                }
            }
            // The reads the batch needs, all sent now (the server answers them in order, each
            // after the change its event reports); applied in order as they are answered. A
            // node that leads stays the leader until its own deletion, so what `need` decides
            // on the model before the batch holds when each event is applied.
            let needs: Vec<Option<String>> = batch
                .iter()
                .map(|e| match self.need(e) {
                    Need::Nothing => None,
                    Need::Read(path) => Some(path),
                })
                .collect();
            let sent: Vec<_> = needs
                .iter()
                .map(|path| {
                    path.as_deref().map(|p| {
                        self.sess.counters.add_requests(1);
                        client.get_data(p)
                    })
                })
                .collect();
            for (event, reply) in batch.iter().zip(sent) {
                let read = match reply {
                    Some(reply) => Some(reply.await),
                    None => None,
                };
                let mut out = VecDeque::new();
                let applied = self.apply(event, read, &mut out);
                for change in out {
                    let _ = self.tx.send(Ok(change));
                }
                if let Err(why) = applied {
                    tracing::info!(parent = %self.parent, %why, "election observation failed");
                    let _ = self.tx.send(Err(why));
                    return;
                }
            }
        }
    }

    /// What `event` needs read before it can be applied.
    fn need(&self, event: &zk::WatchedEvent) -> Need {
        let path = event.path.as_str();
        match event.event_type {
            zk::EventType::NodeDataChanged if path == self.parent => Need::Read(path.to_owned()),
            zk::EventType::NodeCreated if self.is_child(path) => Need::Read(path.to_owned()),
            zk::EventType::NodeDataChanged if self.is_child(path) => {
                let leads = self
                    .model
                    .leader
                    .as_ref()
                    .is_some_and(|l| l.name == node_name(path));
                if leads {
                    Need::Nothing
                } else {
                    Need::Read(path.to_owned())
                }
            }
            _ => Need::Nothing,
        }
    }

    fn is_child(&self, path: &str) -> bool {
        path.len() > self.parent.len() && parent_of(path) == self.parent
    }

    /// Applies one event (and what was read for it) to the model; changes go to `out`.
    fn apply(
        &mut self,
        event: &zk::WatchedEvent,
        read: Option<Read>,
        out: &mut VecDeque<Leader>,
    ) -> Result<(), String> {
        if let Some(why) = session_break(event) {
            return Err(why);
        }
        let path = event.path.as_str();
        let is_child = self.is_child(path);
        let m = &mut self.model;
        if path == self.parent {
            match event.event_type {
                zk::EventType::NodeCreated => {
                    m.parent = Some(Parent {
                        czxid: None,
                        version: 0,
                    });
                }
                zk::EventType::NodeDeleted => m.parent = None,
                zk::EventType::NodeDataChanged => {
                    let read = read.ok_or("a proclamation was not read")?;
                    m.proclaimed(read, out)?;
                }
                _ => {}
            }
            return Ok(());
        }
        if !is_child {
            return Ok(());
        }
        let name = node_name(path);
        match event.event_type {
            zk::EventType::NodeCreated => {
                let read = read.ok_or("a new node was not read")?;
                let known = Model::known(read, 0)?;
                m.nodes.insert(key(name), known);
            }
            zk::EventType::NodeDeleted => {
                m.nodes.remove(&key(name));
            }
            zk::EventType::NodeDataChanged => {
                if m.leader.as_ref().is_some_and(|l| l.name == name) {
                    return Err(
                        "the leader's node was written from outside (a proclamation writes only the parent)"
                            .into(),
                    );
                } else if let Some(entry) = m.nodes.get_mut(&key(name)) {
                    let accounted = entry.as_ref().map_or(0, |k| k.accounted.saturating_add(1));
                    let read = read.ok_or("a written node was not read")?;
                    *entry = Model::known(read, accounted)?;
                }
            }
            _ => {}
        }
        m.settle(out)
    }
}

/// An observation of one election (see the module documentation): the receiving end of its
/// follower task.
pub(crate) struct ZkChanges {
    parent: String,
    rx: UnboundedReceiver<Sent>,
    failed: Option<String>,
}

impl ZkChanges {
    /// Starts observing the election whose parent is `parent`: adds the watch, takes the
    /// snapshot (its leader, if any, is the first change) and spawns the follower task.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the server cannot be reached or the queue keeps moving for
    /// [`SNAPSHOT_TRIES`] snapshots; [`Error::Backend`] when it refuses the watch.
    ///
    /// # Cancel safety
    /// Dropping the future drops the watch.
    pub(crate) async fn start(sess: Arc<Session>, parent: String) -> Result<Self, Error> {
        Self::start_hooked(
            sess,
            parent,
            #[cfg(feature = "testing")]
            None,
        )
        .await
    }

    /// As [`ZkChanges::start`], running `after_listing` once after a snapshot's listing.
    #[cfg(feature = "testing")]
    pub(crate) async fn start_with_hook(
        sess: Arc<Session>,
        parent: String,
        after_listing: AfterListing,
    ) -> Result<Self, Error> {
        Self::start_hooked(sess, parent, Some(after_listing)).await
    }

    async fn start_hooked(
        sess: Arc<Session>,
        parent: String,
        #[cfg(feature = "testing")] mut after_listing: Option<AfterListing>,
    ) -> Result<Self, Error> {
        let client = sess.client.clone();
        sess.counters.add_requests(1);
        let mut watcher = client
            .watch(&parent, zk::AddWatchMode::PersistentRecursive)
            .await
            .map_err(|e| map("observe (adding the watch)", e))?;
        for _ in 0..SNAPSHOT_TRIES {
            let Some(model) = snapshot(
                &sess,
                &parent,
                &mut watcher,
                #[cfg(feature = "testing")]
                &mut after_listing,
            )
            .await?
            else {
                tracing::debug!(%parent, "the queue moved while it was read; taking the snapshot again");
                continue;
            };
            let (tx, rx) = unbounded_channel();
            let mut model = model;
            let mut out = VecDeque::new();
            model
                .settle(&mut out)
                .map_err(|e| Error::backend(e, None))?;
            for change in out {
                let _ = tx.send(Ok(change));
            }
            tokio::spawn(
                Follower {
                    sess,
                    parent: parent.clone(),
                    watcher,
                    model,
                    tx,
                }
                .run(),
            );
            return Ok(ZkChanges {
                parent,
                rx,
                failed: None,
            });
        }
        Err(Error::unavailable(
            format!("{parent}: the queue kept changing while the observer read it"),
            None,
        ))
    }
}

/// One snapshot of the queue aligned with the watch: `None` when an event arrived while the
/// nodes' data was read (the queue moved: take it again).
async fn snapshot(
    sess: &Session,
    parent: &str,
    watcher: &mut zk::PersistentWatcher,
    #[cfg(feature = "testing")] after_listing: &mut Option<AfterListing>,
) -> Result<Option<Model>, Error> {
    let client = &sess.client;
    // Every event delivered before the listing is sent reports a change the server made before
    // it received the listing: the listing reflects it. An event delivered later may report a
    // change made after the listing (its reply and the event can reach us in either order as
    // far as this task can tell), so any such event means the queue moved: take it again.
    while let Some(event) = delivered(watcher) {
        if let Some(why) = session_break(&event) {
            return Err(Error::unavailable(why, None));
        }
    }
    sess.counters.add_requests(2);
    let synced = client.sync(parent);
    let listed = client.get_children(parent);
    let (synced, listed) = tokio::join!(synced, listed);
    let listed = match synced {
        Ok(()) | Err(zk::Error::NoNode) => listed,
        Err(e) => Err(e),
    };
    let (children, parent_stat) = match listed {
        Ok((c, stat)) => (c, Some(stat)),
        Err(zk::Error::NoNode) => (Vec::new(), None),
        Err(e) => return Err(map("observe (listing the queue)", e)),
    };
    #[cfg(feature = "testing")]
    if let Some(hook) = after_listing.take() {
        hook(client.clone()).await;
    }
    sess.counters
        .add_requests(u64::try_from(children.len()).unwrap_or(u64::MAX));
    let sent: Vec<_> = children
        .iter()
        .map(|c| client.get_data(&format!("{parent}/{c}")))
        .collect();
    let record = parent_stat.map(|_| {
        sess.counters.add_requests(1);
        client.get_data(parent)
    });
    let mut reads = Vec::with_capacity(sent.len());
    for reply in sent {
        reads.push(reply.await);
    }
    let record = match record {
        Some(reply) => match reply.await {
            Ok((data, stat)) => decode(&data, stat.version).and_then(|h| h.into_iter().next()),
            // Deleted after the listing: an event says so, and the snapshot is taken again.
            Err(zk::Error::NoNode) => None,
            Err(e) => return Err(map("observe (reading the parent)", e)),
        },
        None => None,
    };
    // An event since the listing was sent: the queue or the parent may have changed after the
    // listing (or between it and the reads).
    if let Some(event) = delivered(watcher) {
        if let Some(why) = session_break(&event) {
            return Err(Error::unavailable(why, None));
        }
        return Ok(None);
    }
    // No event arrived since the listing was sent: the parent's data is as the listing found
    // it.
    let mut model = Model {
        parent: parent_stat.map(|s| Parent {
            czxid: Some(s.czxid),
            version: s.version,
        }),
        record,
        ..Model::default()
    };
    for (child, read) in children.into_iter().zip(reads) {
        // No event arrived: every child was still there when read, and its version is all
        // the events so far account for.
        let accounted = read.as_ref().map_or(0, |(_, stat)| stat.version);
        if let Some(known) =
            Model::known(read, accounted).map_err(|e| Error::unavailable(e, None))?
        {
            model.nodes.insert(key(&child), Some(known));
        }
    }
    Ok(Some(model))
}

#[async_trait]
impl LeaderChanges for ZkChanges {
    async fn next(&mut self) -> Result<Leader, Error> {
        if self.failed.is_none() {
            match self.rx.recv().await {
                Some(Ok(change)) => return Ok(change),
                Some(Err(why)) => self.failed = Some(why),
                None => self.failed = Some("the observation ended".into()),
            }
        }
        let why = self.failed.as_deref().unwrap_or("the observation ended");
        Err(Error::unavailable(
            format!("election {}: {why}", self.parent),
            None,
        ))
    }
}
