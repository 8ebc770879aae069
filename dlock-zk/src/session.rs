//! One ZooKeeper session of a locker: connecting it (credentials, TLS), its state watcher,
//! the session-timeout probes after a reconnect, and the background deletes of its nodes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_core::backend::tls::ensure_provider;
use dlock_core::backend::{Counters, RenewalDriver};
use dlock_core::{Error, LossReason};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::builder::{Access, Config};
use crate::error::{map, session_ended, transient};
use crate::keys::{connect_hosts, is_ours};
use crate::renew::{SessionBackend, proof_ttl};
use crate::stall::StallClock;

/// A live ZooKeeper session with its own renewal driver (the driver's TTL is the timeout the
/// server negotiated for this session).
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    pub(crate) id: i64,
    pub(crate) timeout: Duration,
    pub(crate) driver: RenewalDriver<SessionBackend>,
    /// This process's stalls, which a grant's proof is discounted by.
    stalls: Arc<StallClock>,
    pub(crate) ended: Arc<AtomicBool>,
    pub(crate) counters: Arc<Counters>,
    /// Since when the client has been disconnected (`None` while connected).
    down_since: Arc<Mutex<Option<Instant>>>,
}

impl Session {
    /// Opens a session with the requested timeout and starts watching its state.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no server answers within the client library's connect window
    /// (about the requested session timeout).
    pub(crate) async fn open(cfg: &Config, counters: Arc<Counters>) -> Result<Arc<Session>, Error> {
        // Notice a dead connection (and give up on a hung reconnect attempt) after 2/5 of the
        // TTL of silence, at least 500 ms (see `connection_timeout`). Idle sessions ping every
        // 3/8 of that to keep the connection provably alive.
        let connector = cfg.access.connector(cfg.ttl, connection_timeout(cfg.ttl));
        counters.add_requests(1);
        let client = cfg.access.connect(connector, &cfg.connect, cfg.ttl).await?;
        let id = client.session_id().0;
        let timeout = client.session_timeout();
        let ended = Arc::new(AtomicBool::new(false));
        let proof = proof_ttl(timeout, cfg.ttl, cfg.server_tick);
        let stalls = StallClock::start(timeout.saturating_sub(proof));
        // The client prepends the chroot to every path; the connect string bounds it.
        let backend = Arc::new(SessionBackend::new(
            &client,
            &counters,
            &ended,
            cfg.connect.len(),
            (proof, Arc::clone(&stalls)),
        ));
        let driver = RenewalDriver::new(backend, proof, Arc::clone(&counters));
        let watcher = client.state_watcher();
        let down_since = Arc::new(Mutex::new(None));
        let session = Arc::new(Session {
            client,
            id,
            timeout,
            driver: driver.clone(),
            stalls,
            ended: Arc::clone(&ended),
            counters,
            down_since: Arc::clone(&down_since),
        });
        tracing::info!(session = %format_args!("{id:#x}"), requested = ?cfg.ttl, negotiated = ?timeout, "ZooKeeper session opened");
        tokio::spawn(watch_state(
            Arc::downgrade(&session),
            driver,
            watcher,
            down_since,
            Retire {
                hosts: connect_hosts(&cfg.connect),
                access: cfg.access.clone(),
                client: session.client.clone(),
                counters: Arc::clone(&session.counters),
                ended,
                id,
                timeout,
            },
        ));
        Ok(session)
    }

    /// The instant a proof sent at `sent` counts from: `sent`, less every stall of this
    /// process in the session timeout before it (see [`StallClock`]).
    pub(crate) fn proven_from(&self, sent: Instant) -> Instant {
        let stalled = self.stalls.stalled_before(sent);
        if !stalled.is_zero() {
            tracing::warn!(session = %format_args!("{:#x}", self.id), ?stalled, "this process stalled before a grant; its deadline is shortened by the stall");
        }
        // Never before the clock's start, which is after the process started.
        sent.checked_sub(stalled).unwrap_or(sent)
    }

    /// Whether the session is over (expired, closed or failed authentication).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire) || self.client.state().is_terminated()
    }

    /// Records that an operation saw the session end; its leases are lost at once.
    pub(crate) fn mark_ended(&self, why: &str) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            self.driver.lose_all(&LossReason::SessionEnded(format!(
                "ZooKeeper session {:#x}: {why}",
                self.id
            )));
        }
    }

    /// How long the client has been disconnected (zero while connected).
    pub(crate) fn down_for(&self) -> Duration {
        self.down_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// Whether the client is connected to a server right now.
    pub(crate) fn is_connected(&self) -> bool {
        matches!(
            self.client.state(),
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
        )
    }

    /// Spawns the guarded, retried delete of one of our nodes (a cancelled contender's) as
    /// background work of the session's driver, which the locker's `close` waits for.
    pub(crate) fn spawn_delete(&self, target: DeleteTarget) {
        let work = delete_until_gone(
            self.client.clone(),
            Arc::clone(&self.counters),
            target.clone(),
        );
        if !self.driver.background().spawn(work) {
            tracing::warn!(
                ?target,
                "no runtime to delete a contender node on; it goes when the session ends"
            );
        }
    }
}

impl Access {
    /// The connector for one session (the locker's, or a probe's): the session and connection
    /// timeouts, the digest credentials and the TLS settings. Every session of the locker is
    /// opened through here.
    pub(crate) fn connector(
        &self,
        session_timeout: Duration,
        connection_timeout: Duration,
    ) -> zk::Connector {
        let mut connector = zk::Client::connector()
            .with_session_timeout(session_timeout)
            .with_connection_timeout(connection_timeout);
        if let Some((user, password)) = &self.digest {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        if let Some(tls) = &self.tls {
            // The client crate builds its rustls configuration with the process-wide default
            // provider, and panics when there is none to pick.
            ensure_provider();
            connector = connector.with_tls(tls.options.clone());
        }
        connector
    }

    /// Opens a session on `connect` with `connector` (made by [`Access::connector`]).
    ///
    /// With TLS, the client crate retries a failed handshake until the session timeout and then
    /// reports only a timeout. So the first attempt tries each member once (the client's
    /// `fail_eagerly`); when every member failed, a handshake of our own with each tells
    /// whether they failed over certificates (an untrusted or misnamed server certificate, or
    /// a client certificate the server refuses): then the connect ends at once with that
    /// reason, a non-retryable error. Otherwise (members down or slow) the client's usual
    /// connect follows. A connect that succeeds at once costs nothing more.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no member accepts a session within about the session
    /// timeout; [`Error::Backend`] when every member's certificate fails verification;
    /// [`Error::AccessDenied`] when every member refuses our client certificate.
    pub(crate) async fn connect(
        &self,
        connector: zk::Connector,
        connect: &str,
        session_timeout: Duration,
    ) -> Result<zk::Client, Error> {
        let Some(tls) = &self.tls else {
            return connector
                .connect(connect)
                .await
                .map_err(|e| map("connect", e));
        };
        match connector.clone().with_fail_eagerly().connect(connect).await {
            Ok(client) => return Ok(client),
            Err(zk::Error::NoHosts | zk::Error::Timeout | zk::Error::ConnectionLoss) => {}
            Err(e) => return Err(map("connect", e)),
        }
        if let Some(refused) = tls.explain(connect, session_timeout).await {
            return Err(refused);
        }
        connector
            .connect(connect)
            .await
            .map_err(|e| map("connect", e))
    }
}

/// How long the client waits on a silent connection before it reconnects: 2/5 of the TTL (the
/// client library's own default), at least 500 ms.
///
/// Shorter timeouts declared healthy connections dead on a loaded machine. TTL/8 (300 ms) fell
/// to a 150 ms reply delay, whose ping round trip routinely took that long. TTL/4 (500 ms at a
/// 2 s TTL) fell to a loaded server: CI runs r16 and r18 logged "no response from connection
/// in 500ms" while one ZooKeeper served the conformance suite on 2 CPUs, with JVMs of private
/// clusters starting beside it. That lost all 999 held leases of `zk::many_leases_break`: the
/// reconnect failed the round in flight, and its retry came too late. At 2/5 a server that
/// really went silent is left after 800 ms (at a 2 s TTL). The reconnect and a renewal through
/// another member then have about 600 ms of the proof's validity.
pub(crate) fn connection_timeout(ttl: Duration) -> Duration {
    (ttl * 2 / 5).max(Duration::from_millis(500))
}

/// Follows the session's state: Expired / Closed / AuthFailed loses every lease at once;
/// Disconnected suspends them (renewals then fail and the driver declares them lost at their
/// deadline unless the client reconnects in time); a reconnect is checked for a lowered
/// session timeout ([`Retire::check_after_reconnect`]).
///
/// Holds the driver (so it can declare losses even after the locker is dropped) but no strong
/// reference to the session: it ends once the session is over, or once the locker dropped the
/// session and no lease is left.
async fn watch_state(
    session: Weak<Session>,
    driver: RenewalDriver<SessionBackend>,
    mut watcher: zk::StateWatcher,
    down_since: Arc<Mutex<Option<Instant>>>,
    retire: Retire,
) {
    let id = retire.id;
    let set_down = |v: Option<Instant>| *down_since.lock().unwrap_or_else(|p| p.into_inner()) = v;
    let check = (retire.timeout / 3).max(Duration::from_millis(50));
    let retire = Arc::new(retire);
    loop {
        let state = match tokio::time::timeout(check, watcher.changed()).await {
            Ok(state) => state,
            Err(_) => {
                if session.strong_count() == 0 && driver.is_empty() {
                    return;
                }
                continue;
            }
        };
        match state {
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed => {
                tracing::warn!(session = %format_args!("{id:#x}"), %state, leases = driver.len(), "ZooKeeper session ended; its leases are lost");
                retire.ended.store(true, Ordering::Release);
                driver.lose_all(&LossReason::SessionEnded(format!(
                    "ZooKeeper session {id:#x} {state}"
                )));
                return;
            }
            zk::SessionState::Disconnected => {
                set_down(Some(Instant::now()));
                tracing::warn!(session = %format_args!("{id:#x}"), leases = driver.len(), "ZooKeeper connection lost; leases suspended until reconnect or deadline");
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                set_down(None);
                tracing::info!(session = %format_args!("{id:#x}"), %state, "ZooKeeper connection re-established");
                // The watcher only reports the latest state: a quick Disconnected/SyncConnected
                // pair may show as SyncConnected alone. Any connected state seen here is a
                // reconnect (the first connection happened before the watcher existed).
                tokio::spawn(Arc::clone(&retire).check_after_reconnect(driver.clone()));
            }
        }
    }
}

/// What the session-timeout probes after a reconnect showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probed {
    /// A member grants less than the session's timeout.
    Lowered(Duration),
    /// Every member that answered grants the session's timeout (at least one answered).
    Kept,
    /// No member answered: nothing shows the timeout was kept.
    Unknown,
}

/// How many rounds of probes [`Retire::check_after_reconnect`] makes before it takes an
/// unanswered check for a lowered timeout.
const PROBE_ROUNDS: u32 = 3;

/// Probes the session timeout each member of `hosts` grants when asked for `timeout` (what the
/// client asks for when it reconnects). Returns the first grant below `timeout` as soon as it
/// arrives.
async fn probe_timeout(hosts: &[String], access: &Access, timeout: Duration) -> Probed {
    let mut probes = tokio::task::JoinSet::new();
    for host in hosts {
        let host = host.clone();
        let connector = access.connector(timeout, connection_timeout(timeout));
        probes.spawn(async move {
            // A member that does not answer within a connection timeout or two is not the one
            // the client just reconnected to. Dropping the client closes the probe session.
            let bound = connection_timeout(timeout) * 2;
            match tokio::time::timeout(bound, connector.connect(&host)).await {
                Ok(Ok(client)) => Some(client.session_timeout()),
                Ok(Err(e)) => {
                    tracing::debug!(%host, error = %e, "session-timeout probe failed");
                    None
                }
                Err(_) => None,
            }
        });
    }
    let mut answered = false;
    while let Some(done) = probes.join_next().await {
        let granted = done.ok().flatten();
        answered |= granted.is_some();
        if let verdict @ Probed::Lowered(_) = judge_probes([granted], timeout, false) {
            // Dropping the set aborts the other probes.
            return verdict;
        }
    }
    judge_probes([], timeout, answered)
}

/// The verdict on probe answers (`None`: a probe that failed); `answered_before` says an
/// earlier answer granted the full timeout. Fails closed: no answer at all is
/// [`Probed::Unknown`], never [`Probed::Kept`].
fn judge_probes(
    answers: impl IntoIterator<Item = Option<Duration>>,
    timeout: Duration,
    answered_before: bool,
) -> Probed {
    let mut answered = answered_before;
    for granted in answers.into_iter().flatten() {
        if granted < timeout {
            return Probed::Lowered(granted);
        }
        answered = true;
    }
    if answered {
        Probed::Kept
    } else {
        Probed::Unknown
    }
}

/// What a session needs to retire itself when the server lowered its timeout.
struct Retire {
    /// The members of the connect string.
    hosts: Vec<String>,
    /// The session's credentials and TLS settings, for the probe sessions.
    access: Access,
    client: zk::Client,
    counters: Arc<Counters>,
    ended: Arc<AtomicBool>,
    id: i64,
    /// The timeout the session was opened with (its driver's leases rest on it).
    timeout: Duration,
}

impl Retire {
    /// After a reconnect: the member may have clamped the session timeout lower (each member
    /// clamps again on every reconnect, e.g. during a rolling change of `maxSessionTimeout`),
    /// and the client library does not report the value. Probe what the members grant for the
    /// timeout the client asks for; if any grants less, the leases' deadlines (counted with the
    /// larger timeout) are no longer safe: they are lost at once, their nodes deleted, and the
    /// session is retired (the next acquire opens a new one with the smaller timeout).
    async fn check_after_reconnect(self: Arc<Self>, driver: RenewalDriver<SessionBackend>) {
        let mut round = 0;
        let why = loop {
            round += 1;
            self.counters
                .add_requests(u64::try_from(self.hosts.len()).unwrap_or(u64::MAX));
            match probe_timeout(&self.hosts, &self.access, self.timeout).await {
                Probed::Kept => return,
                Probed::Lowered(granted) => {
                    break format!(
                        "ZooKeeper session {:#x}: a member lowered its timeout from {:?} to {granted:?}",
                        self.id, self.timeout
                    );
                }
                // Fail closed: leases whose deadlines rest on a timeout nobody confirmed are
                // not kept on the hope that it was not lowered.
                Probed::Unknown if round >= PROBE_ROUNDS => {
                    break format!(
                        "ZooKeeper session {:#x}: no member answered {PROBE_ROUNDS} rounds of session-timeout probes after a reconnect",
                        self.id
                    );
                }
                Probed::Unknown => {
                    tracing::debug!(session = %format_args!("{:#x}", self.id), round, "no member answered the session-timeout probes; probing again");
                    tokio::time::sleep(connection_timeout(self.timeout) / 4).await;
                }
            }
        };
        tracing::warn!(session = %format_args!("{:#x}", self.id), leases = driver.len(), %why, "the session's timeout is not confirmed; its leases are lost");
        self.ended.store(true, Ordering::Release);
        self.lose_and_delete(&driver, &why);
    }

    /// Loses every lease of the driver and deletes their nodes (the session itself lives on at
    /// the server until the client is dropped).
    fn lose_and_delete(&self, driver: &RenewalDriver<SessionBackend>, why: &str) {
        let mut paths = Vec::new();
        driver.lose_where(&LossReason::SessionEnded(why.to_owned()), |e| {
            paths.push(e.path.clone());
            true
        });
        for path in paths {
            spawn_delete(
                self.client.clone(),
                Arc::clone(&self.counters),
                DeleteTarget::Path(path),
            );
        }
    }
}

/// What a background delete removes.
#[derive(Debug, Clone)]
pub(crate) enum DeleteTarget {
    /// A node whose path we know.
    Path(String),
    /// A node whose create reply we never saw: find it by its protection uuid.
    Uuid { parent: String, uuid: String },
}

/// Deletes the target until it is gone or the session ends (at the server: a session this
/// locker retired still owns its nodes). Never deletes anyone else's node: paths and uuids are
/// unique to one contender.
pub(crate) fn spawn_delete(client: zk::Client, counters: Arc<Counters>, target: DeleteTarget) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            ?target,
            "no runtime to delete a contender node on; it goes when the session ends"
        );
        return;
    };
    handle.spawn(delete_until_gone(client, counters, target));
}

/// Deletes the target until it is gone or the session ends.
async fn delete_until_gone(client: zk::Client, counters: Arc<Counters>, target: DeleteTarget) {
    let mut backoff = Duration::from_millis(20);
    loop {
        if client.state().is_terminated() {
            return;
        }
        match delete_target(&client, &counters, &target).await {
            Ok(()) => {
                tracing::debug!(?target, "contender node removed");
                return;
            }
            Err(e) if session_ended(&e) => return,
            Err(e) if transient(&e) => {
                tracing::debug!(?target, error = %e, "deleting a contender node failed; retrying");
            }
            Err(e) => {
                tracing::warn!(?target, error = %e, "cannot delete a contender node; it goes when the session ends");
                return;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// One attempt at deleting the target. A node already gone is success.
pub(crate) async fn delete_target(
    client: &zk::Client,
    counters: &Counters,
    target: &DeleteTarget,
) -> Result<(), zk::Error> {
    match target {
        DeleteTarget::Path(path) => delete_path(client, counters, path).await,
        DeleteTarget::Uuid { parent, uuid } => {
            // Catch up with the leader first: the lost create may have been applied by another
            // server than the one we are connected to now.
            counters.add_requests(2);
            match client.sync(parent).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => return Err(e),
            }
            let children = match client.list_children(parent).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => return Ok(()),
                Err(e) => return Err(e),
            };
            for child in children.iter().filter(|c| is_ours(c, uuid)) {
                delete_path(client, counters, &format!("{parent}/{child}")).await?;
            }
            Ok(())
        }
    }
}

/// Deletes one node by path; one already gone is success.
pub(crate) async fn delete_path(
    client: &zk::Client,
    counters: &Counters,
    path: &str,
) -> Result<(), zk::Error> {
    counters.add_requests(1);
    match client.delete(path, None).await {
        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply delayed 150 ms one way makes a ping's round trip, seen from the last reply, up
    /// to about 300 ms on a loaded machine: the connection must not be declared dead for it
    /// (`zk-cluster::one_way_delay` lost its 2 s lease at 300 ms; red before the fix).
    #[test]
    fn a_150ms_reply_delay_is_not_a_dead_connection() {
        let ms = Duration::from_millis;
        for ttl in [ms(1000), ms(2000), ms(3000)] {
            assert!(connection_timeout(ttl) >= ms(500), "{ttl:?}");
        }
        assert_eq!(connection_timeout(ms(2000)), ms(800));
        assert_eq!(connection_timeout(ms(10_000)), ms(4000));
    }

    /// A reconnect whose probes all failed does not count as a kept timeout (it did before:
    /// every failed probe read as "not lowered").
    #[test]
    fn unanswered_probes_fail_closed() {
        let ms = Duration::from_millis;
        let t = ms(10_000);
        assert_eq!(judge_probes([None, None, None], t, false), Probed::Unknown);
        assert_eq!(judge_probes([], t, false), Probed::Unknown);
        assert_eq!(judge_probes([None, Some(t), None], t, false), Probed::Kept);
        assert_eq!(judge_probes([], t, true), Probed::Kept);
        assert_eq!(
            judge_probes([Some(t), Some(ms(6000))], t, false),
            Probed::Lowered(ms(6000))
        );
        // A member granting MORE than asked does not endanger the deadlines.
        assert_eq!(judge_probes([Some(ms(20_000))], t, false), Probed::Kept);
    }
}
