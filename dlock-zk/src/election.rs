//! The ZooKeeper [`Election`](dlock_core::Election): the mutex's queue with `latch-` nodes whose
//! data is the value campaigned with (the layout of Curator's `LeaderLatch`), guarded proclamations
//! recorded in the parent's data, linearizable leader reads.
//!
//! A proclamation never writes the leader's node. Curator's `LeaderLatch` waits on its
//! predecessor with a one-shot `getData` watch and acts only on `NodeDeleted`: a data change
//! of that node would consume the watch, and a Curator follower would never notice the leader
//! resign.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{ElectionBackend, Proclaim, leadership};
use dlock_core::{
    AcquireOptions, Error, FencingToken, Leader, LeaderChanges, Leadership, Lease, LockName,
    LossReason,
};
use tokio::sync::Mutex;
use zookeeper_client as zk;

use crate::contend::in_creation_order;
use crate::error::{map, session_ended, transient};
use crate::keys::{LATCH_MARKER, parent_of};
use crate::locker::{Queue, ZkLocker};
use crate::observe::ZkChanges;
use crate::record::{Record, decode, encode};
use crate::rule::Rule;
use crate::session::Session;

/// How many times [`Election::leader`](dlock_core::Election::leader) lists the queue again when the leader it read resigned
/// before its value could be read.
const LEADER_READS: usize = 32;

/// Writes the value of one leadership: the parent's proclamation record (see `record`), in one
/// multi with a check that our node is still there.
struct ZkProclaim {
    session: Arc<Session>,
    /// Our node's full path.
    path: String,
    /// The election's parent node.
    parent: String,
    /// Our node's czxid (the term).
    czxid: i64,
    /// What our proclamations so far left behind; the lock also orders proclamations.
    state: Mutex<Proclaimed>,
}

/// A leadership's proclamations so far.
struct Proclaimed {
    /// How many were made: the record's version of the last one (0: none).
    count: i32,
    /// Our node's data version as last known (0: nobody wrote it; we never do).
    node_version: i32,
    /// The parent's data version after our last write, or as last read (`None`: not read yet).
    parent_version: Option<i32>,
    /// The parent's proclamation history at `parent_version`, newest first (empty when its
    /// data holds none).
    history: Vec<Record>,
}

fn not_leading(lease: &Lease, why: &str) -> Error {
    Error::Lost(LossReason::Gone(format!("{}: {why}", lease.name())))
}

impl ZkProclaim {
    /// Whether the node is still ours (same czxid, owned by our session), with its data
    /// version.
    async fn read_ours(&self) -> Result<Option<i32>, zk::Error> {
        self.session.counters.add_requests(1);
        match self.session.client.get_data(&self.path).await {
            Ok((_, stat))
                if stat.czxid == self.czxid && stat.ephemeral_owner == self.session.id =>
            {
                Ok(Some(stat.version))
            }
            Ok(_) | Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The parent's proclamation history and data version (`None`: the parent is gone).
    async fn read_parent(&self) -> Result<Option<(Vec<Record>, i32)>, zk::Error> {
        self.session.counters.add_requests(1);
        match self.session.client.get_data(&self.parent).await {
            Ok((data, stat)) => Ok(Some((
                decode(&data, stat.version).unwrap_or_default(),
                stat.version,
            ))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// What a failed read or write of a proclamation means: the leadership's end, a retry, or an
/// error to report.
fn proclaim_failure(e: zk::Error, what: &str) -> Result<(), Error> {
    if session_ended(&e) {
        return Err(Error::Lost(LossReason::SessionEnded(e.to_string())));
    }
    if transient(&e) {
        tracing::debug!(error = %e, "proclamation interrupted; retrying");
        return Ok(());
    }
    Err(map(what, e))
}

#[async_trait]
impl Proclaim for ZkProclaim {
    /// A multi: `check(node, known data version)` and `setData(parent, history with our record
    /// first, expected parent version)`; the node itself is never written (see the module documentation). A deleted
    /// node fails the whole multi (nothing is written): [`Error::Lost`]. A version mismatch on
    /// the node (written from outside) is resolved by reading it: still ours, the write is
    /// tried again on the version read. A version mismatch on the parent is resolved by reading
    /// it: holding this very record (term, next version, value) after a try whose reply was
    /// lost, it succeeded; otherwise (written from outside) the write is tried again on the
    /// version read. The parent's version is read before the first proclamation. Transient
    /// failures are retried while the lease holds.
    async fn proclaim(&self, lease: &Lease, value: &[u8]) -> Result<(), Error> {
        let mut st = self.state.lock().await;
        let client = &self.session.client;
        loop {
            lease.check()?;
            if self.session.is_ended() {
                return Err(Error::Lost(LossReason::SessionEnded(format!(
                    "ZooKeeper session {:#x} ended",
                    self.session.id
                ))));
            }
            let Some(parent_version) = st.parent_version else {
                match self.read_parent().await {
                    Ok(Some((history, version))) => {
                        st.parent_version = Some(version);
                        st.history = history;
                    }
                    Ok(None) => return Err(not_leading(lease, "the election's parent is gone")),
                    Err(e) => {
                        proclaim_failure(e, "proclaim (reading the parent)")?;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                continue;
            };
            let next = st.count.saturating_add(1);
            let ours = Record {
                czxid: self.czxid,
                version: next,
                at: parent_version.saturating_add(1),
                value: value.to_vec(),
            };
            let record = encode(&ours, &st.history);
            let mut writer = client.new_multi_writer();
            writer
                .add_check_version(&self.path, st.node_version)
                .and_then(|()| writer.add_set_data(&self.parent, &record, Some(parent_version)))
                .map_err(|e| map("proclaim", e))?;
            self.session.counters.add_requests(1);
            let (index, failure) = match writer.commit().await {
                Ok(_) => {
                    st.count = next;
                    st.parent_version = Some(ours.at);
                    st.history = decode(&record, ours.at).unwrap_or_default();
                    return Ok(());
                }
                Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                    (Some(index), source)
                }
                Err(e) => (None, zk::Error::from(e)),
            };
            match (index, failure) {
                (Some(0), zk::Error::NoNode) => {
                    return Err(not_leading(lease, "our node was deleted"));
                }
                (Some(0), zk::Error::BadVersion) => match self.read_ours().await {
                    Ok(Some(now)) => {
                        tracing::warn!(node = %self.path, expected = st.node_version, found = now, "the leader's node was written from outside; proclaiming all the same");
                        st.node_version = now;
                    }
                    Ok(None) => {
                        return Err(not_leading(lease, "our node was deleted or replaced"));
                    }
                    Err(e) => proclaim_failure(e, "proclaim (reading our node)")?,
                },
                (Some(1), zk::Error::BadVersion) => match self.read_parent().await {
                    Ok(Some((history, now))) => {
                        st.parent_version = Some(now);
                        let written = history.first() == Some(&ours);
                        st.history = history;
                        if written {
                            // A try whose reply was lost wrote it.
                            st.count = next;
                            return Ok(());
                        }
                        tracing::warn!(parent = %self.parent, expected = parent_version, found = now, "the election's parent was written from outside; proclaiming over it");
                    }
                    Ok(None) => return Err(not_leading(lease, "the election's parent is gone")),
                    Err(e) => proclaim_failure(e, "proclaim (reading the parent)")?,
                },
                (_, e) => {
                    proclaim_failure(e, "proclaim")?;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// Leader election on ZooKeeper: the mutex's queue, with nodes named as Curator's
/// `LeaderLatch` names them (`<root>/<encoded name>/_c_<uuid>-latch-<seq>`) holding the
/// campaign's value; the lowest leads, the term is its node's czxid. See the README's
/// "Election" section.
#[async_trait]
impl ElectionBackend for ZkLocker {
    /// Creates an EPHEMERAL_SEQUENTIAL `latch-` node holding `value` and waits for it to be the
    /// lowest, exactly as [`Locker::acquire`](dlock_core::Locker::acquire) waits (FIFO, each waiter watching only its
    /// predecessor).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a value longer than
    /// [`MAX_VALUE_LEN`](dlock_core::MAX_VALUE_LEN) or a bad wait (before any I/O); otherwise as
    /// [`Locker::acquire`](dlock_core::Locker::acquire).
    ///
    /// # Cancel safety
    /// Dropping the future removes our node in the background, as for
    /// [`Locker::acquire`](dlock_core::Locker::acquire).
    async fn run_campaign(
        &self,
        name: &LockName,
        value: &[u8],
        opts: AcquireOptions,
    ) -> Result<Leadership, Error> {
        let queue = Queue {
            rule: Rule::First(LATCH_MARKER),
            payload: Arc::from(value),
            under: None,
        };
        let Some(grant) = self.contend(name, opts.wait, false, queue).await? else {
            return Err(Error::backend(
                "ZooKeeper campaign ended without a grant",
                None,
            ));
        };
        let proclaim = ZkProclaim {
            parent: parent_of(&grant.path).to_owned(),
            path: grant.path,
            czxid: grant.czxid,
            session: grant.session,
            state: Mutex::new(Proclaimed {
                count: 0,
                // A node is created with data version 0, and nobody writes it.
                node_version: 0,
                parent_version: None,
                history: Vec::new(),
            }),
        };
        Ok(leadership(grant.lease, Arc::new(proclaim)))
    }

    /// A `sync` (routed through the leader) and the listing of the queue, then the data of its
    /// first node and of the parent: the leader's term (its node's czxid) and value (the
    /// parent's proclamation record when it names that term, else the node's data).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the ensemble cannot be reached or the leader keeps changing
    /// between the listing and the read; [`Error::Backend`] when the server refuses.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    async fn read_leader(&self, name: &LockName) -> Result<Option<Leader>, Error> {
        let sess = self.session().await?;
        let parent = self.lock_path(name);
        let client = &sess.client;
        for _ in 0..LEADER_READS {
            sess.counters.add_requests(2);
            let synced = client.sync(&parent);
            let listed = client.list_children(&parent);
            let (synced, listed) = tokio::join!(synced, listed);
            let children = match synced.and(listed) {
                Ok(c) => c,
                Err(zk::Error::NoNode) => return Ok(None),
                Err(e) => return Err(map("leader (listing the queue)", e)),
            };
            let sorted = in_creation_order(&sess, &parent, Rule::First(LATCH_MARKER), children)
                .await
                .map_err(|e| map("leader (ordering the queue)", e))?;
            let Some(first) = sorted.into_iter().next() else {
                return Ok(None);
            };
            // The node (its czxid, the value it campaigned with), then the parent's record
            // (its latest proclamation, when the record names it), answered in this order.
            sess.counters.add_requests(2);
            let node = client.get_data(&format!("{parent}/{first}"));
            let record = client.get_data(&parent);
            let (node, record) = tokio::join!(node, record);
            match node {
                Ok((value, stat)) => {
                    let value = match record {
                        Ok((data, parent)) => decode(&data, parent.version)
                            .and_then(|h| h.into_iter().next())
                            .filter(|r| r.czxid == stat.czxid)
                            .map_or(value, |r| r.value),
                        Err(zk::Error::NoNode) => value,
                        Err(e) => return Err(map("leader (reading the parent)", e)),
                    };
                    return Ok(Some(Leader {
                        term: FencingToken(u64::try_from(stat.czxid).unwrap_or_default()),
                        value,
                    }));
                }
                // It resigned between the listing and the read: list again.
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map("leader (reading the leader's node)", e)),
            }
        }
        Err(Error::unavailable(
            format!("{name}: the leader changed {LEADER_READS} times while it was being read"),
            None,
        ))
    }

    /// A persistent recursive watch on the election's parent, then a consistent snapshot of the
    /// queue and a task that applies every event as it arrives (see the README's "Election"
    /// section).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the ensemble cannot be reached or the queue keeps changing
    /// while the snapshot is taken; [`Error::Backend`] when the server refuses (a server
    /// before 3.6 has no persistent watches).
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future drops the watch.
    async fn follow(&self, name: &LockName) -> Result<Box<dyn LeaderChanges>, Error> {
        let sess = self.session().await?;
        let changes = ZkChanges::start(sess, self.lock_path(name)).await?;
        Ok(Box::new(changes))
    }
}

#[cfg(feature = "testing")]
impl ZkLocker {
    /// Observes `name` as [`Election::observe`](dlock_core::Election::observe) does, running `after_listing` with the
    /// observer's client once, right after the first snapshot's listing of the queue is
    /// answered (to make a change land between the listing and what follows it). Only with the
    /// `testing` feature; not a stable API.
    ///
    /// # Errors
    /// As [`Election::observe`](dlock_core::Election::observe).
    #[cfg(feature = "testing")]
    pub async fn observe_with_hook_for_test<F, Fut>(
        &self,
        name: &LockName,
        after_listing: F,
    ) -> Result<Box<dyn LeaderChanges>, Error>
    where
        F: FnOnce(zk::Client) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let sess = self.session().await?;
        let hook: crate::observe::AfterListing =
            Box::new(move |client| Box::pin(after_listing(client)));
        let changes = ZkChanges::start_with_hook(sess, self.lock_path(name), hook).await?;
        Ok(Box::new(changes))
    }
}
