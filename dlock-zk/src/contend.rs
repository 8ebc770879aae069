//! One contender in a lock's queue: protected create, predecessor watch, cleanup.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::Error;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::{map, session_ended, transient};
use crate::keys::{ambiguous, create_prefix, is_ours, node_name};
use crate::rule::{Rule, Turn};
use crate::semaphore::check_permits;
use crate::session::{DeleteTarget, Session, delete_target};

/// How an attempt ended when it did not fail.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Our node holds by its rule (for a mutex: it is the lowest). `proof` is when the request
    /// that showed it was sent (the session was alive then).
    Granted {
        path: String,
        czxid: i64,
        proof: Instant,
    },
    /// Someone else holds the lock (only for single attempts).
    Busy,
}

/// Why an attempt has to start over or stop.
#[derive(Debug)]
pub(crate) enum Retry {
    /// The session ended: its nodes are gone; open a new session and start over.
    SessionEnded(#[allow(dead_code, reason = "shown in logs")] String),
    /// Our node vanished while the session lives (deleted from outside): start over.
    NodeVanished,
    /// The grant's answer arrived after the lease's own deadline: remove the node, start over.
    LateGrant,
    /// Give up with this error.
    Fatal(Error),
}

/// One contender: owns its (future) node and removes it unless the node became a lease.
pub(crate) struct Contender {
    sess: Arc<Session>,
    parent: String,
    uuid: String,
    acls: zk::Acls<'static>,
    no_container: Arc<AtomicBool>,
    /// The data written into our node (see `payload`; an election's value).
    payload: Arc<[u8]>,
    /// The primitive: the node-name marker, the order and when the node holds (see `rule`).
    rule: Rule,
    path: Option<String>,
    create_sent: bool,
    armed: bool,
}

impl Contender {
    pub(crate) fn new(
        sess: Arc<Session>,
        parent: String,
        acls: zk::Acls<'static>,
        no_container: Arc<AtomicBool>,
        payload: Arc<[u8]>,
        rule: Rule,
    ) -> Self {
        Contender {
            sess,
            parent,
            uuid: uuid::Uuid::new_v4().to_string(),
            acls,
            no_container,
            payload,
            rule,
            path: None,
            create_sent: false,
            armed: true,
        }
    }

    /// The node now belongs to a lease (or to nobody): nothing to clean up.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    fn target(&self) -> Option<DeleteTarget> {
        if !self.armed || !self.create_sent {
            return None;
        }
        Some(match &self.path {
            Some(p) => DeleteTarget::Path(p.clone()),
            None => DeleteTarget::Uuid {
                parent: self.parent.clone(),
                uuid: self.uuid.clone(),
            },
        })
    }

    /// Removes our node now (bounded wait), handing it to a background retry if that fails.
    pub(crate) async fn remove_now(&mut self) {
        let Some(target) = self.target() else { return };
        // A session this locker retired (see `Retire`) still owns its nodes at the server:
        // only a session that is over has lost them.
        if self.sess.client.state().is_terminated() {
            self.armed = false;
            return;
        }
        let bound =
            (self.sess.timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(2));
        // Stay armed while the delete is in flight: if this future is dropped, `Drop` hands the
        // node to the background retry (deleting twice is harmless).
        let outcome = tokio::time::timeout(
            bound,
            delete_target(&self.sess.client, &self.sess.counters, &target),
        )
        .await;
        self.armed = false;
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) if session_ended(&e) => {}
            Ok(Err(e)) => {
                tracing::debug!(?target, error = %e, "contender delete failed; retrying in the background");
                self.sess.spawn_delete(target);
            }
            Err(_) => self.sess.spawn_delete(target),
        }
    }

    /// Creates our node (protected) and waits for it to hold by the contender's rule. With
    /// `single`, returns [`Outcome::Busy`] instead of waiting. A semaphore permit first checks
    /// its permit count against the earliest holder's (see `semaphore`).
    ///
    /// Cancel safety: dropping the future leaves the contender armed; dropping the contender
    /// removes its node in the background.
    pub(crate) async fn run(&mut self, single: bool) -> Result<Outcome, Retry> {
        let Created {
            czxid,
            forwarded,
            listing,
        } = self.create().await?;
        let mut prefetched = listing;
        // How long the create's proof stands in for a sync after a wake-up (see `reused`).
        let reuse_for = self.sess.driver.ttl() / REUSE_DIVISOR;
        let Some(path) = self.path.clone() else {
            return Err(Retry::Fatal(Error::backend(
                "ZooKeeper create returned no path",
                None,
            )));
        };
        let me = node_name(&path).to_owned();
        let counters = Arc::clone(&self.sess.counters);
        let client = self.sess.client.clone();
        let mut waited = false;
        let mut agreed = !matches!(self.rule, Rule::Lease { .. });
        loop {
            let (proof, children) = match prefetched.take() {
                Some(listing) => listing,
                None => {
                    // The grant's proof that the session lives at the leader: the create's own
                    // while it is recent (see `reused`), else a sync through the leader sent
                    // right before the listing (see `SessionBackend::renew`).
                    let reused = reused(forwarded, reuse_for, Instant::now());
                    let proof = reused.unwrap_or_else(Instant::now);
                    let listed = if reused.is_some() {
                        counters.add_requests(1);
                        client.list_children(&self.parent).await
                    } else {
                        counters.add_requests(2);
                        let synced = client.sync(&self.parent);
                        let listed = client.list_children(&self.parent);
                        let (synced, listed) = tokio::join!(synced, listed);
                        match synced {
                            Ok(()) | Err(zk::Error::NoNode) => listed,
                            Err(e) => Err(e),
                        }
                    };
                    match listed {
                        Ok(c) => (proof, c),
                        Err(zk::Error::NoNode) => return Err(self.vanished()),
                        Err(e) => {
                            self.classify(e)?;
                            pause().await;
                            continue;
                        }
                    }
                }
            };
            let sorted =
                match in_creation_order(&self.sess, &self.parent, self.rule, children).await {
                    Ok(sorted) => sorted,
                    Err(e) => {
                        self.classify(e)?;
                        pause().await;
                        continue;
                    }
                };
            let Some(index) = sorted.iter().position(|n| *n == me) else {
                return Err(self.vanished());
            };
            if !agreed && let Rule::Lease { permits } = self.rule {
                let ahead = sorted.get(..index).unwrap_or_default();
                match check_permits(&self.sess, &self.parent, ahead, permits).await {
                    Ok(None) => agreed = true,
                    Ok(Some(e)) => return Err(Retry::Fatal(e)),
                    Err(e) => {
                        self.classify(e)?;
                        pause().await;
                        continue;
                    }
                }
            }
            let watch = match self.rule.turn(&sorted, index) {
                Turn::Granted => return Ok(Outcome::Granted { path, czxid, proof }),
                _ if single => return Ok(Outcome::Busy),
                Turn::Node(node) => Some(node),
                Turn::Children => None,
            };
            if !waited {
                waited = true;
                counters.add_waits(1);
            }
            counters.add_requests(1);
            let watcher = match watch {
                Some(node) => {
                    let predecessor = format!("{}/{node}", self.parent);
                    tracing::trace!(node = %me, %predecessor, "waiting for the predecessor");
                    // getData rather than exists: a watch is left only when the node exists.
                    match client.get_and_watch_data(&predecessor).await {
                        Ok((_, _, watcher)) => watcher,
                        Err(zk::Error::NoNode) => continue,
                        Err(e) => {
                            self.classify(e)?;
                            pause().await;
                            continue;
                        }
                    }
                }
                None => {
                    tracing::trace!(node = %me, parent = %self.parent, "waiting for a change of the queue");
                    match client.list_and_watch_children(&self.parent).await {
                        Ok((now, watcher)) => match self.holds_in(now, &me).await {
                            // Our turn came before the watch was set: list again.
                            Ok(true) => continue,
                            Ok(false) => watcher,
                            Err(e) => {
                                self.classify(e)?;
                                pause().await;
                                continue;
                            }
                        },
                        Err(zk::Error::NoNode) => return Err(self.vanished()),
                        Err(e) => {
                            self.classify(e)?;
                            pause().await;
                            continue;
                        }
                    }
                }
            };
            let event = watcher.changed().await;
            counters.add_wakeups(1);
            if event.event_type == zk::EventType::Session && event.session_state.is_terminated() {
                return Err(self.ended(&format!("{}", event.session_state)));
            }
        }
    }

    /// Whether our node `me` holds (or is gone) in the listing `children`: either way the
    /// caller lists again (with the grant's proof) rather than waiting.
    async fn holds_in(&self, children: Vec<String>, me: &str) -> Result<bool, zk::Error> {
        let sorted = in_creation_order(&self.sess, &self.parent, self.rule, children).await?;
        Ok(sorted
            .iter()
            .position(|n| n == me)
            .is_none_or(|i| self.rule.turn(&sorted, i) == Turn::Granted))
    }

    /// Our node was not found: because the session ended, or because someone deleted it. The
    /// contender stays armed, so starting over deletes the node by its path should it still
    /// exist (a node left behind would queue ahead of everyone and wedge the lock); deleting a
    /// node that is gone is harmless.
    fn vanished(&mut self) -> Retry {
        if self.sess.is_ended() {
            return self.ended("ended while waiting");
        }
        tracing::warn!(parent = %self.parent, "our contender node vanished; starting over");
        Retry::NodeVanished
    }

    fn ended(&mut self, why: &str) -> Retry {
        self.armed = false;
        self.sess.mark_ended(why);
        Retry::SessionEnded(why.to_owned())
    }

    /// Transient errors are retried (after a short pause); a session end or a hard error stops.
    fn classify(&mut self, e: zk::Error) -> Result<(), Retry> {
        if session_ended(&e) {
            return Err(self.ended(&e.to_string()));
        }
        if transient(&e) {
            return Ok(());
        }
        Err(Retry::Fatal(map("lock request", e)))
    }

    /// Creates `<parent>/_c_<uuid>-<marker><seq>`; on a lost reply finds it by uuid instead of
    /// creating a second one. Returns the node's czxid, the create's send time when its own
    /// answer arrived, and, when it came with the create, the parent's children listed right
    /// after it.
    ///
    /// The getChildren is sent right behind the create without waiting for its reply: ZooKeeper
    /// answers one session's requests in order, so the listing already holds our node and an
    /// uncontended acquire costs one round trip.
    async fn create(&mut self) -> Result<Created, Retry> {
        let prefix = create_prefix(&self.parent, &self.uuid, self.rule.marker());
        let client = self.sess.client.clone();
        let counters = Arc::clone(&self.sess.counters);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls);
        loop {
            self.create_sent = true;
            counters.add_requests(2);
            let proof = Instant::now();
            let created = client.create(&prefix, &self.payload, &options);
            let listed = client.list_children(&self.parent);
            let (created, listed) = tokio::join!(created, listed);
            match created {
                Ok((stat, seq)) => {
                    let path = format!("{prefix}{seq}");
                    self.path = Some(path.clone());
                    let listing = listed.ok().map(|c| (proof, c));
                    let created = |czxid| Created {
                        czxid,
                        forwarded: Some(proof),
                        listing,
                    };
                    if stat.czxid > 0 {
                        return Ok(created(stat.czxid));
                    }
                    // Servers before 3.5 return no stat on create.
                    counters.add_requests(1);
                    match client.check_stat(&path).await {
                        Ok(Some(stat)) => return Ok(created(stat.czxid)),
                        Ok(None) => return Err(self.vanished()),
                        Err(e) => {
                            return Err(self.classify(e).err().unwrap_or(Retry::NodeVanished));
                        }
                    }
                }
                Err(zk::Error::NoNode) => self.ensure_parent().await?,
                Err(e) if transient(&e) => {
                    tracing::debug!(error = %e, "create reply lost; looking for our node by uuid");
                    if let Some(czxid) = self.find_ours().await? {
                        return Ok(Created {
                            czxid,
                            forwarded: None,
                            listing: None,
                        });
                    }
                }
                Err(e) => {
                    self.classify(e)?;
                    pause().await;
                }
            }
        }
    }

    /// Runs the lost-reply recovery for protection uuid `uuid` (test hook): the path and
    /// czxid of the node it adopted, if any. The contender is disarmed either way.
    #[cfg(feature = "testing")]
    pub(crate) async fn recover_for_test(
        &mut self,
        uuid: String,
    ) -> Result<Option<(String, i64)>, Retry> {
        self.uuid = uuid;
        self.armed = false;
        let found = self.find_ours().await?;
        Ok(found.and_then(|czxid| self.path.clone().map(|p| (p, czxid))))
    }

    /// Looks for our node after a create whose reply was lost. A node of ours left by an
    /// OLDER session is deleted, never adopted.
    async fn find_ours(&mut self) -> Result<Option<i64>, Retry> {
        let client = self.sess.client.clone();
        let counters = Arc::clone(&self.sess.counters);
        loop {
            counters.add_requests(2);
            let listed = match client.sync(&self.parent).await {
                Ok(()) | Err(zk::Error::NoNode) => client.list_children(&self.parent).await,
                Err(e) => Err(e),
            };
            let children = match listed {
                Ok(c) => c,
                Err(zk::Error::NoNode) => return Ok(None),
                Err(e) => {
                    self.classify(e)?;
                    pause().await;
                    continue;
                }
            };
            let mut found = None;
            let uuid = self.uuid.clone();
            for child in children.into_iter().filter(|c| is_ours(c, &uuid)) {
                let path = format!("{}/{child}", self.parent);
                counters.add_requests(1);
                match client.check_stat(&path).await {
                    Ok(Some(stat)) if stat.ephemeral_owner == self.sess.id && found.is_none() => {
                        found = Some((path, stat.czxid));
                    }
                    Ok(Some(stat)) => {
                        tracing::warn!(%path, owner = %format_args!("{:#x}", stat.ephemeral_owner), "deleting a node of ours left by another session");
                        counters.add_requests(1);
                        match client.delete(&path, Some(stat.version)).await {
                            Ok(()) | Err(zk::Error::NoNode) => {}
                            Err(e) => self.classify(e)?,
                        }
                    }
                    Ok(None) => {}
                    Err(e) => self.classify(e)?,
                }
            }
            return Ok(found.map(|(path, czxid)| {
                self.path = Some(path);
                czxid
            }));
        }
    }

    /// Creates the lock's parent (and ancestors) as container nodes where the server supports
    /// them, persistent nodes otherwise.
    async fn ensure_parent(&mut self) -> Result<(), Retry> {
        let client = self.sess.client.clone();
        loop {
            let mode = if self.no_container.load(Ordering::Relaxed) {
                zk::CreateMode::Persistent
            } else {
                zk::CreateMode::Container
            };
            self.sess.counters.add_requests(1);
            match client.mkdir(&self.parent, &mode.with_acls(self.acls)).await {
                Ok(()) => return Ok(()),
                Err(zk::Error::Unimplemented | zk::Error::BadArguments(_))
                    if mode == zk::CreateMode::Container =>
                {
                    tracing::info!(
                        "the server has no container nodes; lock parents are persistent"
                    );
                    self.no_container.store(true, Ordering::Relaxed);
                }
                Err(zk::Error::NoNode) => {
                    return Err(Retry::Fatal(Error::backend(
                        "ZooKeeper: the chroot of the connect string does not exist",
                        None,
                    )));
                }
                Err(e) => {
                    self.classify(e)?;
                    pause().await;
                }
            }
        }
    }
}

/// `children` (of `parent`, as listed) in creation order: by their sequence suffixes in
/// `rule`'s order (see `rule`), unless the suffixes cannot tell (see `keys::ambiguous`: the
/// parent's cversion reached 2^31 - 1), then by czxid, read for every child (sent at once; a
/// child gone meanwhile is left out, and one created since the listing is younger than every
/// listed node).
///
/// # Errors
/// The server's error when a child's stat cannot be read.
pub(crate) async fn in_creation_order(
    sess: &Session,
    parent: &str,
    rule: Rule,
    children: Vec<String>,
) -> Result<Vec<String>, zk::Error> {
    if !ambiguous(children.iter().map(|c| rule.key(c))) {
        return Ok(rule.sort(children));
    }
    tracing::debug!(
        %parent,
        children = children.len(),
        "sequence suffixes at the end of the sequence space: ordering the queue by czxid"
    );
    sess.counters
        .add_requests(u64::try_from(children.len()).unwrap_or(u64::MAX));
    let sent: Vec<_> = children
        .iter()
        .map(|c| sess.client.check_stat(&format!("{parent}/{c}")))
        .collect();
    let mut created = Vec::with_capacity(children.len());
    for (child, reply) in children.into_iter().zip(sent) {
        if let Some(stat) = reply.await? {
            created.push((stat.czxid, child));
        }
    }
    created.sort();
    Ok(created.into_iter().map(|(_, child)| child).collect())
}

/// What [`Contender::create`] made.
struct Created {
    /// The node's czxid (the fencing token).
    czxid: i64,
    /// When the create was sent, if its own answer arrived (see [`reused`]).
    forwarded: Option<Instant>,
    /// The parent's children listed right behind the create, and the create's send time.
    listing: Option<(Instant, Vec<String>)>,
}

/// The create's proof stands in for a sync for this part of the driver's TTL after it.
const REUSE_DIVISOR: u32 = 6;

/// The proof a listing after a wake-up grants with: the create's send time `forwarded`, while
/// it is less than `reuse_for` old at `now`; `None`: sync through the leader first.
///
/// A grant needs two facts. (1) Our node is first by the rule for as long as it lives: a
/// listing that holds our node is a view of the servers' one history at least as new as our
/// create; every node created after ours orders after it, so the nodes that can keep ours
/// from holding all existed already then, and a node deleted in that view stays deleted in
/// the leader's newer one. Any member's listing shows it, with or without a sync. (2) The
/// session lives at the leader until the deadline: the create was forwarded to the leader and
/// checked there after it was sent, which proves what a sync sent then proves (the grant of an
/// uncontended acquire, whose listing rides behind the create, counts from it already). The
/// deadline then counts from the create's send time, less this process's stalls since
/// (`Session::proven_from`), so a waiter granted within `reuse_for` loses at most that much of
/// its first TTL and saves the sync's request on the handoff. A longer wait syncs: its lease
/// keeps close to a full TTL.
fn reused(forwarded: Option<Instant>, reuse_for: Duration, now: Instant) -> Option<Instant> {
    forwarded.filter(|sent| now.saturating_duration_since(*sent) < reuse_for)
}

/// A short pause before retrying after a transient error (requests issued while disconnected
/// wait for the reconnect inside the client, so this only spaces out flapping connections).
async fn pause() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

impl Drop for Contender {
    fn drop(&mut self) {
        if let Some(target) = self.target() {
            tracing::debug!(
                ?target,
                "contender dropped; removing its node in the background"
            );
            self.sess.spawn_delete(target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recent_create_is_the_proof_and_an_old_one_or_none_asks_for_a_sync() {
        let sent = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(reused(Some(sent), ms(100), sent + ms(99)), Some(sent));
        assert_eq!(reused(Some(sent), ms(100), sent + ms(100)), None);
        assert_eq!(reused(None, ms(100), sent), None);
    }
}
