//! The session lease and its one keep-alive stream.
//!
//! Every locker holds ONE etcd lease (its session); every lock key it creates is attached to
//! it. The renewal rounds (`renew.rs`) send ONE keep-alive per session on one long-lived
//! keep-alive stream, however many locks it holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::backend::drift;
use dlock_core::{Error, Lease, LossReason};
use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::Instant;

use crate::conn::Etcd;
use crate::error;
use crate::slots::SlotGuard;

/// The keep-alive stream of one session, and the etcd lease the session currently runs on.
///
/// A session starts on one lease and may move to a new one when etcd's raft term changes (see
/// `relocate.rs`): its identity ([`KeepAlive::id`], the first lease id, also the suffix of
/// every key it creates) never changes, its current lease ([`KeepAlive::lease`]) may.
pub(crate) struct KeepAlive {
    /// The session's identity: its first lease id.
    pub(crate) id: i64,
    /// The lease the session's keys are attached to now.
    lease: AtomicI64,
    /// The raft term the current lease was granted in (0: unknown).
    term: AtomicU64,
    /// The TTL the lease is asked with, in seconds.
    pub(crate) ttl_secs: i64,
    /// How many times the session moved to a new lease.
    generation: AtomicU64,
    /// Held for reading by whatever attaches a key to the current lease or grants on a key
    /// (enqueue, grant); held for writing by a move to a new lease.
    pub(crate) moving: tokio::sync::RwLock<()>,
    /// Whether a move to a new lease is running (in a task of its own, see `relocate.rs`).
    pub(crate) relocating: std::sync::atomic::AtomicBool,
    /// Keys a move could not take along, with the generation that lost them.
    lost_keys: Mutex<HashMap<String, u64>>,
    pub(crate) etcd: Etcd,
    /// The open stream and the member it runs on.
    stream: tokio::sync::Mutex<Option<(usize, LeaseKeeper, LeaseKeepAliveStream)>>,
}

impl KeepAlive {
    pub(crate) fn new(id: i64, term: u64, ttl_secs: i64, etcd: Etcd) -> Self {
        KeepAlive {
            id,
            lease: AtomicI64::new(id),
            term: AtomicU64::new(term),
            ttl_secs,
            generation: AtomicU64::new(0),
            moving: tokio::sync::RwLock::new(()),
            relocating: std::sync::atomic::AtomicBool::new(false),
            lost_keys: Mutex::new(HashMap::new()),
            etcd,
            stream: tokio::sync::Mutex::new(None),
        }
    }

    /// The lease the session's keys are attached to now.
    pub(crate) fn lease(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    /// The raft term the current lease was granted in (0: unknown).
    pub(crate) fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    /// How many times the session moved to a new lease.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Records a term seen while the lease was unknown to have one.
    pub(crate) fn learn_term(&self, term: u64) {
        let _ = self
            .term
            .compare_exchange(0, term, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Switches to `lease` (granted in `term`) after a move that lost `lost` keys; the
    /// caller holds [`KeepAlive::moving`] for writing. The keep-alive stream of the old lease
    /// is dropped, so the next round opens one for the new lease.
    pub(crate) async fn switch(&self, lease: i64, term: u64, lost: Vec<String>, live: &[String]) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        {
            let mut map = self.lost_keys.lock().unwrap_or_else(|p| p.into_inner());
            // Forget losses no acquire of this locker can still ask about.
            map.retain(|k, _| live.contains(k));
            for key in lost {
                map.insert(key, generation);
            }
        }
        self.lease.store(lease, Ordering::Release);
        self.term.store(term, Ordering::Release);
        *self.stream.lock().await = None;
    }

    /// Whether `key`, attached while the session was at generation `since`, was lost by a
    /// move since.
    pub(crate) fn lost_since(&self, key: &str, since: u64) -> bool {
        let map = self.lost_keys.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).is_some_and(|&g| g > since)
    }

    /// Sends one keep-alive on member `member`, on `taken` (the open stream to that member)
    /// or on a new stream, and reads its reply: `Ok((true, term, stream))` when the lease was
    /// extended (`term`: the raft term in the reply's header, when the reply was ours to
    /// read), `Ok((false, ..))` when etcd says the lease is gone (TTL ≤ 0 or "lease not
    /// found"). An error comes with whether etcd refused our (expired) auth token.
    async fn try_on(
        &self,
        member: usize,
        taken: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    ) -> Tried {
        let failed = |e: etcd_client::Error| {
            let stale_auth = error::is_stale_auth(&e);
            (error::map(KEEP_ALIVE, e), stale_auth)
        };
        match taken {
            None => {
                // Opening the stream sends the first keep-alive and reads its reply.
                let client = self.etcd.members.client(member).await.map_err(failed)?;
                let mut leases = client.lease_client();
                match leases.keep_alive(self.lease()).await {
                    // etcd-client reads the first reply itself: its term is not known.
                    Ok((keeper, stream)) => Ok((true, None, Some((member, keeper, stream)))),
                    Err(e) if error::is_lease_not_found(&e) => Ok((false, None, None)),
                    Err(e) => Err(failed(e)),
                }
            }
            Some((mut keeper, mut stream)) => {
                keeper.keep_alive().await.map_err(failed)?;
                match stream.message().await {
                    Ok(Some(reply)) if reply.ttl() > 0 => {
                        let term = reply.header().map(|h| h.raft_term());
                        Ok((true, term, Some((member, keeper, stream))))
                    }
                    Ok(Some(_)) => Ok((false, None, None)),
                    Ok(None) => Err((
                        Error::unavailable("lease keep-alive: stream closed by etcd", None),
                        false,
                    )),
                    Err(e) if error::is_lease_not_found(&e) => Ok((false, None, None)),
                    Err(e) => Err(failed(e)),
                }
            }
        }
    }

    /// One keep-alive, within the request timeout: `Ok((true, term))` when the lease was
    /// extended, `Ok((false, _))` when etcd says it is gone.
    ///
    /// The first try goes to the preferred member, on the open stream when it runs there. A
    /// try still unanswered after [`Etcd::attempt_cap`] is not abandoned: that member is
    /// skipped and the next one is tried as well, and the first reply wins — so a member that
    /// hangs costs one cap, while a reply that is merely slow (slower than the cap on every
    /// member) still renews. A try that fails moves on at once. A keep-alive is safe to repeat.
    ///
    /// # Cancel safety
    /// The stream is taken out while tries are in flight and put back only with a reply read
    /// to its end, so a cancelled call can never leave a stale reply for the next one: the
    /// next call opens a fresh stream.
    pub(crate) async fn renew(&self) -> Result<(bool, Option<u64>), Error> {
        use futures::StreamExt;
        use futures::stream::FuturesUnordered;

        let members = &self.etcd.members;
        let count = members.len().max(1);
        let mut slot = self.stream.lock().await;
        let started = Instant::now();
        let until = started + self.etcd.request_timeout;
        let mut taken = slot.take();
        let mut in_flight = FuturesUnordered::new();
        let mut launch = |in_flight: &mut FuturesUnordered<_>| -> usize {
            let member = members.preferred();
            let stream = taken
                .take()
                .filter(|(m, ..)| *m == member)
                .map(|(_, keeper, stream)| (keeper, stream));
            let fut = self.try_on(member, stream);
            in_flight.push(async move { (member, fut.await) });
            member
        };
        let mut newest = launch(&mut in_flight);
        let mut hedge_at = Instant::now() + self.etcd.attempt_cap;
        let mut backoff = Duration::from_millis(5);
        let mut last_err: Option<Error> = None;
        loop {
            let may_hedge = count > 1 && in_flight.len() < count;
            let next = tokio::select! {
                next = in_flight.next(), if !in_flight.is_empty() => next,
                () = tokio::time::sleep_until(hedge_at), if may_hedge && hedge_at < until => {
                    members.skip(newest);
                    tracing::debug!(lease = format_args!("{:x}", self.lease()), "keep-alive slow to answer; trying the next member too");
                    newest = launch(&mut in_flight);
                    hedge_at = Instant::now() + self.etcd.attempt_cap;
                    continue;
                }
                () = tokio::time::sleep_until(until) => {
                    members.skip(newest);
                    return Err(last_err.unwrap_or_else(|| error::no_reply(KEEP_ALIVE, started.elapsed())));
                }
            };
            let Some((member, tried)) = next else {
                continue;
            };
            let (e, stale_auth) = match tried {
                Ok((alive, term, stream)) => {
                    *slot = stream;
                    return Ok((alive, term));
                }
                Err(failure) => failure,
            };
            tracing::debug!(lease = format_args!("{:x}", self.lease()), error = %e, "keep-alive attempt failed");
            if stale_auth {
                // The next try opens a new stream with a new token.
                if let Err(refused) = self.etcd.refresh_auth(member, until).await
                    && !refused.is_retryable()
                {
                    return Err(refused);
                }
            } else if e.kind() != dlock_core::ErrorKind::Unavailable {
                return Err(e);
            } else {
                members.skip(member);
            }
            if in_flight.is_empty() {
                if Instant::now() + backoff >= until {
                    return Err(e);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
                newest = launch(&mut in_flight);
                hedge_at = Instant::now() + self.etcd.attempt_cap;
            }
            last_err = Some(e);
        }
    }
}

/// What one keep-alive try gave: extended or not, the reply's raft term, and the stream to
/// keep; or the error and whether etcd refused our auth token.
type Tried = Result<
    (
        bool,
        Option<u64>,
        Option<(usize, LeaseKeeper, LeaseKeepAliveStream)>,
    ),
    (Error, bool),
>;

/// What keep-alive errors are about.
const KEEP_ALIVE: &str = "lease keep-alive";

/// One session: its lease and the sentinel that keeps it renewed.
pub(crate) struct Session {
    pub(crate) ka: Arc<KeepAlive>,
    sentinel: Lease,
    ttl: Duration,
}

impl Session {
    pub(crate) fn new(ka: Arc<KeepAlive>, sentinel: Lease, ttl: Duration) -> Self {
        Session { ka, sentinel, ttl }
    }

    /// The session's identity (its first lease id, the suffix of its keys).
    pub(crate) fn id(&self) -> i64 {
        self.ka.id
    }

    /// The lease the session's keys are attached to now.
    pub(crate) fn lease(&self) -> i64 {
        self.ka.lease()
    }

    /// Whether the lease is known alive now (not lost, deadline not passed).
    pub(crate) fn is_live(&self) -> bool {
        !self.sentinel.is_lost()
    }

    /// The send time of the last acknowledged keep-alive (or of the grant): every lock of the
    /// session is safe until this + TTL − drift.
    pub(crate) fn last_ack_start(&self) -> Instant {
        let span = self.ttl.saturating_sub(drift(self.ttl));
        let deadline = self.sentinel.deadline();
        deadline.checked_sub(span).unwrap_or(deadline)
    }

    /// Resolves when the session is lost (or released).
    pub(crate) fn ended(&self) -> impl std::future::Future<Output = LossReason> + Send + 'static {
        self.sentinel.lost()
    }
}

/// Deletes `key` (guarded by `rev` when known) in the background, retrying until it is gone
/// or the session ends (the key then expires with the lease). Holds the key's slot meanwhile.
pub(crate) fn spawn_cleanup(
    etcd: Etcd,
    key: String,
    rev: Option<i64>,
    session: Arc<Session>,
    slot: SlotGuard,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(%key, "no runtime to delete the key; it expires with the session lease");
        return;
    };
    let slot = slot.cleaning();
    runtime.spawn(async move {
        let mut backoff = Duration::from_millis(20);
        loop {
            if !session.is_live() {
                tracing::debug!(%key, "session ended; the key expires with its lease");
                break;
            }
            let result = match rev {
                Some(rev) => etcd.delete_guarded(&key, rev, None).await,
                None => etcd.delete_unknown(&key).await,
            };
            match result {
                Ok(_) => {
                    tracing::debug!(%key, "queue key deleted");
                    break;
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, retry_in = ?backoff, "deleting a queue key failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
        drop(slot);
    });
}
