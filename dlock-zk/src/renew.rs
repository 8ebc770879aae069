//! The renewal rounds of a session (its `RenewBackend`): one `sync` through the leader and
//! a read of every held node per round, and how long such a proof counts (`proof_ttl`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Counters, RenewBackend, Renewal};
use dlock_core::{Error, LossReason};
use zookeeper_client as zk;

use crate::error::{map, session_ended, transient};
use crate::reads::SessionReads;
use crate::session::{DeleteTarget, connection_timeout, delete_path, spawn_delete};
use crate::stall::StallClock;

/// One held lock node, as the renewal driver keeps it.
#[derive(Debug)]
pub(crate) struct NodeEntry {
    /// Full path of our EPHEMERAL_SEQUENTIAL node.
    pub(crate) path: String,
    /// Its creation zxid (the fencing token).
    pub(crate) czxid: i64,
}

/// ZooKeeper's default `tickTime`: the server tick assumed unless the user declared one.
const DEFAULT_TICK: Duration = Duration::from_secs(2);

/// The client library's tick (zookeeper-client 0.11, `Session::calc_tick_timeout`): an eighth
/// of the connection timeout the locker configures, or a twentieth of the negotiated session
/// timeout when the connection timeout exceeds 3/5 of it. Every tick it checks the
/// connection and, after [`client_ping_after`] of sending nothing, sends a ping.
fn client_tick(negotiated: Duration, connection_timeout: Duration) -> Duration {
    let tick = if connection_timeout.is_zero() || connection_timeout > negotiated * 3 / 5 {
        negotiated / 20
    } else {
        connection_timeout / 8
    };
    tick.max(Duration::from_millis(1))
}

/// How long the client library stays silent before it pings (zookeeper-client 0.11,
/// `Session::reset_timeout`): three of its ticks, at most 10 s.
fn client_ping_after(tick: Duration) -> Duration {
    (tick * 3).min(Duration::from_secs(10))
}

/// How long a proof (grant or renewal) may count on after its send time: the negotiated
/// timeout less what the leader may not have seen.
///
/// # Derivation (ZooKeeper 3.5–3.9 server; zookeeper-client 0.11 client)
///
/// - Only the leader expires sessions. Its `SessionTrackerImpl` files a touched session under
///   `ExpiryQueue.roundToNextInterval(now + timeout)`, rounded UP to the next tick, so a touch
///   at leader time `T` keeps the session until at least `T + timeout`.
/// - A member touches a session for every packet its client sends, pings included
///   (`ZooKeeperServer.submitRequestNow` calls `touch(cnxn)`). On a follower that touch only
///   goes into the follower's touch table (`LearnerSessionTracker.touchSession`).
/// - The leader pings every follower every `tickTime / 2` (`Leader.lead`); the follower
///   answers with its touch table, emptied as it is read (`Learner.ping`,
///   `LearnerSessionTracker.snapshot`), and only then does the leader touch those sessions
///   (`LearnerHandler`, case `PING`). Requests a follower forwards to the leader, our `sync`
///   among them, do NOT touch the session there (`LeaderZooKeeperServer.submitLearnerRequest`
///   skips `submitRequest`); they only check it (`PrepRequestProcessor`, `checkSession`).
///
/// So the renewal's own `sync`, sent at `t`, proves only that the session was alive at the
/// leader; what keeps it alive is the touch of an EARLIER packet. A follower forwards the
/// `sync` on the same connection as its ping answers, so when the `sync` reached the leader
/// (it did: it was answered), so did the answer to the leader's ping of up to
/// `tickTime / 2` + latency before it, and that answer carried every packet the follower had
/// received by then. If the follower is cut from the leader right after the `sync`, the
/// leader's last touch is therefore that of the client's last packet received before
/// `t − tickTime / 2 − latency`; and the client sends a packet (a request, or else a ping)
/// at least every `client_ping_after + client_tick`. The leader thus keeps the session until at
/// least `t + timeout − tickTime / 2 − (client_ping_after + client_tick) − latency`. The
/// latency allowance is one more client tick (the leader's ping to the follower, the
/// follower's queue, our scheduling). A client connected to the leader itself is touched at
/// once; the bound covers it too.
///
/// The tick is not visible to clients: it is the one the user declared
/// ([`ZkLockerBuilder::server_tick_time`](crate::ZkLockerBuilder::server_tick_time)), else
/// ZooKeeper's default 2 s, but no more than half the negotiated timeout (the default
/// `minSessionTimeout` of 2 × `tickTime` keeps negotiated timeouts at least two ticks long).
///
/// At the default 2 s tick and a 10 s TTL: 10 − 1 − (1.5 + 0.5) − 0.5 = 6.5 s (then less the
/// core's drift); at 30 s: 30 − 1 − (4.5 + 1.5) − 1.5 = 21.5 s. Measured from outside before
/// this bound (3 nodes, tick 2 s, holder on a follower cut right after a renewal): the
/// leader expired a 30 s session about 24 s after the renewal's send time.
pub(crate) fn proof_ttl(
    negotiated: Duration,
    requested: Duration,
    server_tick: Option<Duration>,
) -> Duration {
    let tick = server_tick.unwrap_or_else(|| DEFAULT_TICK.min(negotiated / 2));
    let client = client_tick(negotiated, connection_timeout(requested));
    let silence = client_ping_after(client) + client;
    let latency = client;
    negotiated.saturating_sub(tick / 2 + silence + latency)
}

/// Renews every lease of one session with one round trip per period.
pub(crate) struct SessionBackend {
    client: zk::Client,
    session_id: i64,
    counters: Arc<Counters>,
    /// The renewal reads (see [`SessionReads`]).
    reads: SessionReads,
    ended: Arc<AtomicBool>,
    /// The negotiated session timeout: how long a release retries.
    timeout: Duration,
    /// The driver's TTL ([`proof_ttl`]), and this process's stalls, which shorten it.
    proof: (Duration, Arc<StallClock>),
}

impl SessionBackend {
    /// The renewal rounds of `client`'s session; `chroot_bound` bounds the chroot the client
    /// prepends to every path (see [`SessionReads`]).
    pub(crate) fn new(
        client: &zk::Client,
        counters: &Arc<Counters>,
        ended: &Arc<AtomicBool>,
        chroot_bound: usize,
        proof: (Duration, Arc<StallClock>),
    ) -> Self {
        SessionBackend {
            client: client.clone(),
            session_id: client.session_id().0,
            counters: Arc::clone(counters),
            reads: SessionReads::new(client.clone(), Arc::clone(counters), chroot_bound),
            ended: Arc::clone(ended),
            timeout: client.session_timeout(),
            proof,
        }
    }

    /// What a proof sent at `sent` renews: the full [`proof_ttl`], or after a stall of this
    /// process only up to `sent + proof_ttl − stall` (nothing at all when the stall was longer
    /// than that; the lease then keeps the deadline of its last proof).
    fn extension(&self, sent: tokio::time::Instant) -> Renewal {
        let (proof, stalls) = &self.proof;
        let stalled = stalls.stalled_before(sent);
        if stalled.is_zero() {
            return Renewal::Extended;
        }
        tracing::warn!(session = %format_args!("{:#x}", self.session_id), ?stalled, "this process stalled before a renewal; its deadline is shortened by the stall");
        match proof.checked_sub(stalled) {
            Some(left) => Renewal::ExtendedUntil(sent + left),
            None => Renewal::Retry,
        }
    }
}

#[async_trait]
impl RenewBackend for SessionBackend {
    type Entry = NodeEntry;

    /// A `sync` (answered by the leader) followed by reads of EVERY held node: multi-reads of
    /// at most [`REQUEST_BUDGET`](crate::batches::REQUEST_BUDGET) bytes and
    /// [`REQUEST_OPS`](crate::batches::REQUEST_OPS) reads each (one plain read per node on
    /// servers before 3.6), all sent right behind the sync, so one round trip whatever the number of leases. Their
    /// success proves the session was alive at the leader when the sync was sent, so no other
    /// session can be granted these locks before send time + the driver's TTL
    /// ([`proof_ttl`]). Nodes read back missing or owned by another session are lost in this
    /// very round; a session that ended loses everything.
    async fn renew(&self, entries: &[Arc<NodeEntry>]) -> Result<Vec<Renewal>, Error> {
        let n = entries.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let single = self.reads.single.load(Ordering::Relaxed);
        let sent = tokio::time::Instant::now();
        // The connection state this round starts from (see `reconnected_since`).
        let mut states = self.client.state_watcher();
        let connected_at_start = states.state() == zk::SessionState::SyncConnected;
        // Route the proof through the leader: a follower cut from its leader keeps answering
        // reads (until syncLimit × tickTime) while the leader expires the session. The sync is
        // sent first and the reads right behind it (ZooKeeper answers a session's requests in
        // order, and a follower holds the reads until the sync is done): one round trip.
        let (synced, read) = self.reads.read(entries).await;
        let read = match synced {
            Ok(()) | Err(zk::Error::NoNode) => read,
            Err(e) => Err(e),
        };
        let stats = match read {
            Ok(stats) => stats,
            Err(e) if session_ended(&e) => {
                self.ended.store(true, Ordering::Release);
                let reason = LossReason::SessionEnded(format!(
                    "ZooKeeper session {:#x}: {e}",
                    self.session_id
                ));
                return Ok(vec![Renewal::Lost(reason); n]);
            }
            Err(e @ (zk::Error::Unimplemented | zk::Error::MarshallingError)) if !single => {
                // Servers before 3.6 have no multi-read: renew with plain reads from now on.
                tracing::info!(error = %e, "the server has no multi-read; renewing with single reads");
                self.reads.single.store(true, Ordering::Relaxed);
                return Err(map("renewal (multi-read unsupported)", e));
            }
            Err(e)
                if transient(&e) && connected_at_start && reconnected_since(&mut states).await =>
            {
                // The connection this round went out on died, and the client reconnected the
                // session: a proof sent after this round started (see `reconnected_since`).
                // The nodes are read again by the next regular round.
                tracing::debug!(session = %format_args!("{:#x}", self.session_id), leases = n, error = %e, "renewal proven by the reconnect that followed its lost connection");
                return Ok(vec![self.extension(sent); n]);
            }
            Err(e) => return Err(map("renewal", e)),
        };
        if stats.len() != n {
            return Err(Error::backend(
                format!("ZooKeeper renewal: {} results for {n} reads", stats.len()),
                None,
            ));
        }
        let extended = self.extension(sent);
        Ok(entries
            .iter()
            .zip(stats)
            .map(|(entry, stat)| match stat {
                Ok(stat)
                    if stat.ephemeral_owner == self.session_id && stat.czxid == entry.czxid =>
                {
                    extended.clone()
                }
                Ok(_) => Renewal::Lost(LossReason::Gone(format!(
                    "lock node {} now belongs to another session",
                    entry.path
                ))),
                Err(zk::Error::NoNode) => Renewal::Lost(LossReason::Gone(format!(
                    "lock node {} was deleted",
                    entry.path
                ))),
                // The session answered, which is what the deadline rests on.
                Err(_) => extended.clone(),
            })
            .collect())
    }

    /// `false`: the session answers its requests in order, so a retry would only queue behind
    /// the slow round; a lost connection fails the round at once (the client fails the
    /// requests in flight). Never abandoning a round early also keeps abandoned full reads
    /// from piling up at the server (see [`SessionReads`]).
    fn abandon_slow_rounds(&self) -> bool {
        false
    }

    /// Deletes the lease's node (by its unique path, so a retry never deletes anyone else's).
    /// A transient failure (connection lost, reply lost) is retried on the same session for
    /// up to the session timeout — the delete is idempotent. If it still cannot be confirmed, it
    /// goes on in the background until it succeeds or the session ends, so a failed release
    /// never wedges the lock, and the error is reported.
    async fn release(&self, entry: &NodeEntry) -> Result<(), Error> {
        let began = tokio::time::Instant::now();
        loop {
            match delete_path(&self.client, &self.counters, &entry.path).await {
                Ok(()) => return Ok(()),
                // The session is over: its ephemeral node is gone with it.
                Err(e) if session_ended(&e) => return Ok(()),
                Err(e) if transient(&e) && began.elapsed() < self.timeout => {
                    tracing::debug!(node = %entry.path, error = %e, "release interrupted; retrying");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => {
                    if transient(&e) {
                        spawn_delete(
                            self.client.clone(),
                            Arc::clone(&self.counters),
                            DeleteTarget::Path(entry.path.clone()),
                        );
                    }
                    return Err(map("release", e));
                }
            }
        }
    }
}

/// Whether the session reconnected after `states` was last read connected: waits for it when
/// the connection is down right now, and answers `false` at once when no state change is
/// pending (the connection never went down: the error was not its death) or the session
/// ended, went read-only or was closed.
///
/// A reconnect proves the session alive at the leader after the round started, as the round's
/// own `sync` would have: the client publishes `Disconnected` before it writes each connect
/// request, so any `SyncConnected` seen after a connected state was read comes from a connect
/// request written after that read; and a member re-validates a reconnecting session at the
/// leader (a follower forwards it), which touches it there. A read-only member does not, so
/// `ConnectedReadOnly` proves nothing. Without this, the lease of a holder whose client gave up
/// on a connection just as a short blip ended had to wait for a reconnect and then for a whole
/// new round (a second leader round trip) inside what was left of its validity: CI rehearsal
/// r36 lost `zk-cluster::short_blip` that way, 383 ms not being enough on a loaded machine.
async fn reconnected_since(states: &mut zk::StateWatcher) -> bool {
    // The client publishes the state change before it fails the requests in flight, so a
    // connection's death is already visible here.
    let Ok(mut state) = tokio::time::timeout(Duration::ZERO, states.changed()).await else {
        return false;
    };
    loop {
        match state {
            zk::SessionState::SyncConnected => return true,
            zk::SessionState::Disconnected => state = states.changed().await,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leader's earliest expiry of a session whose renewal was sent at 0 ms, answered,
    /// and whose follower was cut from the leader right after, by brute force over the phases
    /// of the leader's pings (every half tick), of its expiry grid (tick-aligned, rounded up as
    /// `ExpiryQueue.roundToNextInterval` does) and of the client's tick; the client sends its
    /// renewals every `period` ms and pings after `ping_after` ms of sending nothing (checked
    /// every `client_tick` ms), as zookeeper-client does. A follower reports the packets it
    /// received since its last report when the leader pings it, and the leader touches the
    /// session then; the renewal's own sync touches nothing there. All in ms; zero latency.
    fn earliest_leader_expiry(
        timeout: i64,
        tick: i64,
        client: i64,
        ping_after: i64,
        period: i64,
    ) -> i64 {
        let step = 50;
        let window = 4 * period.max(ping_after + client) + 2 * tick;
        let mut earliest = i64::MAX;
        for psi in (0..client).step_by(step as usize) {
            // The client's sends in [-window, 0): renewals every period, pings between.
            let mut sends = Vec::new();
            let mut last = -window;
            let mut next_renewal = -window + period;
            let mut t = -window + psi;
            while t < 0 {
                while next_renewal <= t && next_renewal < 0 {
                    sends.push(next_renewal);
                    last = next_renewal;
                    next_renewal += period;
                }
                if t >= last + ping_after {
                    sends.push(t);
                    last = t;
                }
                t += client;
            }
            while next_renewal < 0 {
                sends.push(next_renewal);
                next_renewal += period;
            }
            sends.sort_unstable();
            for phi in (0..tick / 2).step_by(step as usize) {
                // The last leader ping before the cut that reported a packet.
                let mut touch = None;
                let mut prev = -window - tick;
                let mut ping = -window + phi;
                while ping < 0 {
                    if sends.iter().any(|&s| s > prev && s <= ping) {
                        touch = Some(ping);
                    }
                    prev = ping;
                    ping += tick / 2;
                }
                let Some(touch) = touch else { continue };
                for theta in (0..tick).step_by(step as usize) {
                    let at = touch + timeout - theta;
                    let expiry = theta + (at.div_euclid(tick) + 1) * tick;
                    earliest = earliest.min(expiry);
                }
            }
        }
        earliest
    }

    /// Every deadline a renewal can set is no later than the leader's earliest expiry in the
    /// model, at ZooKeeper's default tick and at the lab's. Red on the bound before this one:
    /// at a 30 s TTL it promised 27.22 s after the renewal where the model's leader may expire
    /// the session after 26.05 s.
    #[test]
    fn deadlines_end_before_the_leaders_earliest_expiry_in_a_model_of_the_servers() {
        let ms = Duration::from_millis;
        let as_ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        for (ttl, tick, declared) in [
            (10_000, 2000, None),
            (30_000, 2000, None),
            (4000, 2000, None),
            (2000, 100, Some(ms(100))),
            (10_000, 100, Some(ms(100))),
        ] {
            let proof = proof_ttl(ms(ttl), ms(ttl), declared);
            let deadline = proof - dlock_core::backend::drift(proof);
            let client = client_tick(ms(ttl), connection_timeout(ms(ttl)));
            let earliest = earliest_leader_expiry(
                ttl as i64,
                tick,
                as_ms(client),
                as_ms(client_ping_after(client)),
                // The renewal driver's period: a third of its TTL.
                as_ms(proof / 3),
            );
            assert!(
                as_ms(deadline) <= earliest,
                "TTL {ttl} ms, tick {tick} ms: deadline {deadline:?} after the renewal, the \
                 leader may expire the session {earliest} ms after it"
            );
        }
    }

    /// The margin: half a server tick, the client's longest silence (its ping delay plus one
    /// of its ticks) and one client tick of latency.
    #[test]
    fn proofs_keep_what_the_leader_may_not_have_seen() {
        let ms = Duration::from_millis;
        // The client library's numbers at dlock's connection timeout (2/5 of the TTL).
        assert_eq!(
            client_tick(ms(10_000), connection_timeout(ms(10_000))),
            ms(500)
        );
        assert_eq!(client_ping_after(ms(500)), ms(1500));
        // 10 s at ZooKeeper's default 2 s tick: 1 s + (1.5 s + 0.5 s) + 0.5 s.
        assert_eq!(proof_ttl(ms(10_000), ms(10_000), None), ms(6500));
        // 30 s: client tick 1.5 s, ping after 4.5 s.
        assert_eq!(proof_ttl(ms(30_000), ms(30_000), None), ms(21_500));
        // The measurement: the leader expired a 30 s session 24 s after the renewal
        // was sent; a 10 s one was computed to expire 8.0 s after it. Both beyond the proof.
        assert!(proof_ttl(ms(30_000), ms(30_000), None) < ms(24_000));
        assert!(proof_ttl(ms(10_000), ms(10_000), None) < ms(8_000));
        // 2 s: the tick is at most 1 s (half the timeout); client tick 100 ms, ping 300 ms.
        assert_eq!(
            proof_ttl(ms(2000), ms(2000), None),
            ms(2000 - 500 - 400 - 100)
        );
        // A declared 100 ms tick (the test servers) keeps only 50 ms for it.
        assert_eq!(
            proof_ttl(ms(2000), ms(2000), Some(ms(100))),
            ms(2000 - 50 - 400 - 100)
        );
        // A server that clamped a 2 s request up to 4 s: the client's tick follows the
        // connection timeout of the request (800 ms / 8).
        assert_eq!(
            proof_ttl(ms(4000), ms(2000), None),
            ms(4000 - 1000 - 400 - 100)
        );
        // Never more than the timeout, never negative.
        for t in [0, 1, 200, 4000, 40_000] {
            assert!(proof_ttl(ms(t), ms(t), None) <= ms(t));
        }
    }
}
