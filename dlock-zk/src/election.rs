//! The ZooKeeper [`Election`]: the mutex's queue with `latch-` nodes whose data is the value
//! (the layout of Curator's `LeaderLatch`), guarded proclamations, linearizable leader reads.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    AcquireOptions, Election, Error, FencingToken, Leader, LeaderChanges, Leadership, Lease,
    LockName, Locker, LossReason, Proclaim, validate_value,
};
use tokio::sync::Mutex;
use zookeeper_client as zk;

use crate::errors::{map, session_ended, transient};
use crate::locker::{Queue, ZkLocker};
use crate::observe::ZkChanges;
use crate::paths::{LATCH_MARKER, parent_of, sorted_contenders};
use crate::record::encode;
use crate::rule::Rule;
use crate::session::Session;

/// How many times [`ZkLocker::leader`] lists the queue again when the leader it read resigned
/// before its value could be read.
const LEADER_READS: usize = 32;

/// Writes the value of one leadership: its node's data and the parent's proclamation record
/// (see `record`), in one multi guarded by the node's data version.
struct ZkProclaim {
    session: Arc<Session>,
    /// Our node's full path.
    path: String,
    /// The election's parent node.
    parent: String,
    /// Our node's czxid (the term).
    czxid: i64,
    /// Our node's data version as of our last write; the lock also orders proclamations.
    version: Mutex<i32>,
}

fn not_leading(lease: &Lease, why: &str) -> Error {
    Error::Lost(LossReason::Gone(format!("{}: {why}", lease.name())))
}

impl ZkProclaim {
    /// Whether the node is still ours (same czxid, owned by our session), with its data and
    /// data version.
    async fn read_ours(&self) -> Result<Option<(Vec<u8>, i32)>, zk::Error> {
        self.session.counters.add_requests(1);
        match self.session.client.get_data(&self.path).await {
            Ok((data, stat))
                if stat.czxid == self.czxid && stat.ephemeral_owner == self.session.id =>
            {
                Ok(Some((data, stat.version)))
            }
            Ok(_) | Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl Proclaim for ZkProclaim {
    /// A multi: `setData(node, value, expected version)` and `setData(parent, record)`. A
    /// deleted node fails the whole multi (nothing is written): [`Error::Lost`]. A version
    /// mismatch is resolved by reading the node: still ours, and holding `value` one version
    /// up after a try whose reply was lost, it succeeded; still ours otherwise (written from
    /// outside), the write is tried again on the version read. Transient failures are retried
    /// while the lease holds.
    async fn proclaim(&self, lease: &Lease, value: &[u8]) -> Result<(), Error> {
        let mut version = self.version.lock().await;
        let client = &self.session.client;
        let mut retried = false;
        loop {
            lease.check()?;
            if self.session.is_ended() {
                return Err(Error::Lost(LossReason::SessionEnded(format!(
                    "ZooKeeper session {:#x} ended",
                    self.session.id
                ))));
            }
            let next = version.saturating_add(1);
            let record = encode(self.czxid, next, value);
            let mut writer = client.new_multi_writer();
            writer
                .add_set_data(&self.path, value, Some(*version))
                .and_then(|()| writer.add_set_data(&self.parent, &record, None))
                .map_err(|e| map("proclaim", e))?;
            self.session.counters.add_requests(1);
            let failure = match writer.commit().await {
                Ok(_) => {
                    *version = next;
                    return Ok(());
                }
                Err(zk::MultiWriteError::OperationFailed { index: 0, source }) => source,
                Err(e) => zk::Error::from(e),
            };
            match failure {
                zk::Error::NoNode => return Err(not_leading(lease, "our node was deleted")),
                zk::Error::BadVersion => match self.read_ours().await {
                    Ok(Some((data, now))) if retried && now == next && data == value => {
                        *version = now;
                        return Ok(());
                    }
                    Ok(Some((_, now))) => {
                        tracing::warn!(node = %self.path, expected = *version, found = now, "the leader's node was written from outside; proclaiming over it");
                        *version = now;
                    }
                    Ok(None) => {
                        return Err(not_leading(lease, "our node was deleted or replaced"));
                    }
                    Err(e) if session_ended(&e) => {
                        return Err(Error::Lost(LossReason::SessionEnded(e.to_string())));
                    }
                    Err(e) if transient(&e) => retried = true,
                    Err(e) => return Err(map("proclaim (reading our node)", e)),
                },
                e if session_ended(&e) => {
                    return Err(Error::Lost(LossReason::SessionEnded(e.to_string())));
                }
                e if transient(&e) => {
                    tracing::debug!(node = %self.path, error = %e, "proclamation interrupted; retrying");
                    retried = true;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                e => return Err(map("proclaim", e)),
            }
        }
    }
}

/// Leader election on ZooKeeper: the mutex's queue, with nodes named as Curator's
/// `LeaderLatch` names them (`<root>/<encoded name>/_c_<uuid>-latch-<seq>`) holding the
/// campaign's value; the lowest leads, the term is its node's czxid. See the README's
/// "Election" section.
#[async_trait]
impl Election for ZkLocker {
    /// Creates an EPHEMERAL_SEQUENTIAL `latch-` node holding `value` and waits for it to be the
    /// lowest, exactly as [`ZkLocker::acquire`] waits (FIFO, each waiter watching only its
    /// predecessor).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a value longer than
    /// [`MAX_VALUE_LEN`](dlock_core::MAX_VALUE_LEN) or a bad wait (before any I/O); otherwise as
    /// [`ZkLocker::acquire`].
    ///
    /// # Cancel safety
    /// Dropping the future removes our node in the background, as for
    /// [`ZkLocker::acquire`].
    async fn campaign(
        &self,
        name: &LockName,
        value: &[u8],
        opts: AcquireOptions,
    ) -> Result<Leadership, Error> {
        validate_value(value)?;
        opts.validate()?;
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
            // A node is created with data version 0; nobody writes a waiting node.
            version: Mutex::new(0),
        };
        Ok(Leadership::new(grant.lease, Arc::new(proclaim)))
    }

    /// A `sync` (routed through the leader) and the listing of the queue, then the data of its
    /// first node: the leader's term (czxid) and value.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the ensemble cannot be reached or the leader keeps changing
    /// between the listing and the read; [`Error::Backend`] when the server refuses.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>, Error> {
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
            let Some(first) = sorted_contenders(children, LATCH_MARKER).into_iter().next() else {
                return Ok(None);
            };
            sess.counters.add_requests(1);
            match client.get_data(&format!("{parent}/{first}")).await {
                Ok((value, stat)) => {
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
    async fn observe(&self, name: &LockName) -> Result<Box<dyn LeaderChanges>, Error> {
        let sess = self.session().await?;
        let changes = ZkChanges::start(sess, self.lock_path(name)).await?;
        Ok(Box::new(changes))
    }

    /// The negotiated session timeout, as [`Locker::ttl`]: a crashed leader's session expires
    /// within it (plus up to a server tick).
    fn ttl(&self) -> Duration {
        Locker::ttl(self)
    }
}
