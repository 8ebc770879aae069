//! The holder's server cut from the leader of a private cluster.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, LossReason};
use tokio::time::Instant;

use super::private::{Private, blocking, private_partitionable};
use super::util::{name, spawn_timed, within};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;
use crate::faults::Proxy;
use crate::history::{Event, History, Kind};
use crate::servers::{READY_TIMEOUT, ServerKind, local};

/// Scheduling allowance on top of a deadline when checking that `lost()` fired in time.
const SCHED: Duration = Duration::from_millis(250);

/// How many attempts [`leader_partition`] makes when elections void them.
const ATTEMPTS: u32 = 3;

/// How an attempt ended when it did not fail.
enum Attempt {
    /// Every check ran and passed.
    Passed,
    /// An election moved the cluster, before the cut or while it lasted: the attempt no longer
    /// tests a server cut from a working leader. Its safety checks ran and passed; its liveness
    /// checks say nothing.
    Void(String),
}

/// Who leads, and how many leader changes the members have seen (etcd only).
#[derive(Clone, Copy, Debug)]
struct Leadership {
    leader: Option<usize>,
    changes: Option<u64>,
}

impl Leadership {
    async fn read(p: &Private) -> Result<Self, Verdict> {
        let c = Arc::clone(&p.cluster);
        blocking("read the leadership", move || {
            Ok(Leadership {
                leader: c.leader(),
                changes: c.leader_changes(),
            })
        })
        .await
    }

    /// Evidence of an election between `self` and `later`, if any: the leader moved, or (etcd)
    /// a member saw a new leader, or a member's count could not be read (an election is then
    /// possible). ZooKeeper shows the leader's index only.
    fn election_before(&self, later: &Leadership, kind: ServerKind) -> Option<String> {
        if later.leader != self.leader {
            return Some(format!(
                "the leader moved from {:?} to {:?}",
                self.leader, later.leader
            ));
        }
        if kind != ServerKind::Etcd {
            return None;
        }
        match (self.changes, later.changes) {
            (Some(a), Some(b)) if b > a => {
                Some(format!("the members saw {} leader changes", b - a))
            }
            (Some(_), Some(_)) => None,
            _ => Some("a member's count of leader changes could not be read".into()),
        }
    }
}

/// The topology of a backend whose servers elect a leader, or the reason to skip.
fn led_cluster(ctx: &Ctx) -> Result<(ServerKind, usize), Verdict> {
    let Some((kind, n)) = ctx.backend().topology() else {
        return Err(Verdict::Skip(
            "in-process backend: there are no server nodes to partition".into(),
        ));
    };
    ensure!(n > 0, "the backend declares a topology of zero nodes");
    if n < 3 {
        return Err(Verdict::Skip(
            "single-node topology: there is no leader to cut the holder's server from".into(),
        ));
    }
    if kind == ServerKind::Redis && n != 5 {
        return Err(Verdict::Skip(
            "Redis Cluster without replicas: no failover and no leader; each master serves its own slots alone".into(),
        ));
    }
    if kind == ServerKind::Redis {
        return Err(Verdict::Skip(
            "Redlock has no leader: its nodes are independent (node faults are minority_nodes_down)".into(),
        ));
    }
    Ok((kind, n))
}

/// How many TTLs [`follower_hold`] holds its lease.
pub(crate) const HOLD_TTLS: u32 = 10;

/// The control of [`leader_partition`]: the same private cluster with its peer links behind
/// fault proxies, the holder's client on a follower through a watching proxy, and NO cut. The
/// lease is held for [`HOLD_TTLS`] TTLs and every loss fails, whatever the elections (their
/// evidence is put in the failure), and so do fewer renewals than TTLs held. The least time
/// the deadline was ahead of the clock at a check (every 50 ms) is reported.
pub(crate) async fn follower_hold(ctx: &Ctx) -> Result<(), Verdict> {
    let (kind, n) = led_cluster(ctx)?;
    let p = private_partitionable(ctx).await?;
    let ttl = ctx.ttl();
    let c = Arc::clone(&p.cluster);
    let leader = blocking("find the leader", move || c.wait_leader(READY_TIMEOUT)).await?;
    let before = Leadership {
        leader: Some(leader),
        ..Leadership::read(&p).await?
    };
    let follower = (leader + 1) % n;
    let link = Proxy::start(p.cluster.addrs()[follower])
        .map_err(|e| Verdict::Fail(format!("cannot start the holder's proxy: {e}")))?;
    let holder = p
        .client_with(ClientOptions::new(ctx.ns(), ttl).via(vec![link.addr()]))
        .await?;
    let lock = name("follower-hold")?;
    let lease = holder.acquire(&lock, AcquireOptions::wait(ttl * 2)).await?;
    let began = Instant::now();
    let mut least_ahead = ttl;
    let mut renewals = 0u32;
    let mut last = lease.deadline();
    let lost = loop {
        let now = Instant::now();
        if now.duration_since(began) >= ttl * HOLD_TTLS {
            break None;
        }
        if let Err(e) = lease.check() {
            break Some(format!("lost {:?} into the hold: {e}", now - began));
        }
        let deadline = lease.deadline();
        if deadline != last {
            renewals += 1;
            last = deadline;
        }
        least_ahead = least_ahead.min(deadline.saturating_duration_since(now));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = Leadership::read(&p).await?;
    let election = before
        .election_before(&after, kind)
        .unwrap_or_else(|| "no election seen".into());
    let silence = bursts(&link.upstream_log())
        .iter()
        .map(|&(_, gap)| gap)
        .max()
        .unwrap_or_default();
    ctx.figure("renewals", renewals);
    ctx.figure_ms("least_time_ahead_ms", least_ahead);
    ctx.figure_ms("longest_client_silence_ms", silence);
    if let Some(why) = lost {
        return Err(Verdict::Fail(format!(
            "a lease held through a follower with no fault was {why} (leader {leader}, holder's server {follower}; {election}; {renewals} renewals, least time ahead {least_ahead:?})"
        )));
    }
    ensure!(
        renewals >= HOLD_TTLS,
        "{renewals} renewals in {HOLD_TTLS} TTLs"
    );
    lease
        .release()
        .await
        .map_err(|e| Verdict::Fail(format!("release after the hold: {e}")))?;
    Ok(())
}

/// On a cluster, the holder's server cut from the leader: the holder's `lost()` fires before
/// anyone else is granted.
///
/// A private cluster whose peer links go through fault proxies
/// ([`Cluster::start_partitionable`](crate::servers::Cluster::start_partitionable)). The
/// holder's client reaches one follower only; after a few renewals every peer link between
/// that follower and the leader is cut (the follower keeps its other peer and its clients; a
/// ZooKeeper follower keeps answering reads for 10 s). A contender on the leader then acquires
/// the same name. Judged against the promise: the contender's grant must not arrive before the
/// holder's latest promised `deadline()`, and the holder's `lost()` must fire, no later than
/// that deadline (plus scheduling slack).
///
/// On a loaded machine an election may come first (a fresh cluster still settling) or during
/// the cut (a leader whose heartbeats stalled past the election timeout lets the cut member win
/// its other peer's vote; the holder then renews through its new leader, legitimately, and the
/// contender's member has no leader). Such an attempt is void, on evidence only (the leader
/// moved, or etcd's members counted a leader change), and is made again, at most `ATTEMPTS`
/// times; so is an attempt whose lease was lost before the cut (a loss the holder was told
/// of, judged by the `renewal` row, not here). Safety is judged on every attempt, void or not,
/// and `ATTEMPTS` void attempts fail the row.
pub(crate) async fn leader_partition(ctx: &Ctx) -> Result<(), Verdict> {
    let (kind, n) = led_cluster(ctx)?;
    let p = private_partitionable(ctx).await?;
    let mut voids = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let outcome = attempt_cut(ctx, &p, kind, n, attempt).await;
        p.cluster
            .heal_all()
            .map_err(|e| Verdict::Fail(format!("cannot heal the peer links: {e}")))?;
        match outcome? {
            Attempt::Passed => {
                ctx.figure("attempts", attempt);
                ctx.figure("void_attempts", voids);
                return Ok(());
            }
            Attempt::Void(why) => {
                tracing::warn!(attempt, %why, "leader_partition: attempt void");
                voids.push(format!("attempt {attempt}: {why}"));
            }
        }
    }
    Err(Verdict::Fail(format!(
        "{ATTEMPTS} attempts were each void (an election, or a lease lost before the cut): {}",
        voids.join("; ")
    )))
}

/// One attempt: a lease in its steady state, the cut, the contender, the verdict.
async fn attempt_cut(
    ctx: &Ctx,
    p: &Private,
    kind: ServerKind,
    n: usize,
    attempt: u32,
) -> Result<Attempt, Verdict> {
    let ttl = ctx.ttl();
    let c = Arc::clone(&p.cluster);
    let leader = blocking("find the leader", move || c.wait_leader(READY_TIMEOUT)).await?;
    let before = Leadership::read(p).await?;
    let follower = (leader + 1) % n;
    let addrs = p.cluster.addrs();
    // Through a proxy that only watches: it shows when the holder's client talked to its
    // server, so the cut can come after the client's longest silence.
    let link = Proxy::start(addrs[follower])
        .map_err(|e| Verdict::Fail(format!("cannot start the holder's proxy: {e}")))?;
    let holder = p
        .client_with(ClientOptions::new(ctx.ns(), ttl).via(vec![link.addr()]))
        .await?;
    let contender = p
        .client_with(ClientOptions::new(ctx.ns(), ttl).via(vec![addrs[leader]]))
        .await?;
    let lock = name(&format!("partitioned-{attempt}"))?;
    let lease = holder.acquire(&lock, AcquireOptions::wait(ttl * 2)).await?;
    // A few renewals on a healthy cluster, so the cut hits a lease in its steady state.
    tokio::time::sleep(ttl).await;
    let at_cut = Leadership::read(p).await?;
    let settled = Leadership {
        leader: Some(leader),
        ..before
    };
    if let Some(why) = settled.election_before(&at_cut, kind) {
        let _ = lease.release().await;
        return Ok(Attempt::Void(format!("before the cut, {why}")));
    }
    if let Err(e) = lease.check() {
        // Not what this scenario is about, and not unsafe: the holder was told. A loss with
        // no fault on this same setup fails `follower_hold` (10 TTLs, any loss). Void, so
        // that three in a row still fail this row.
        return Ok(Attempt::Void(format!(
            "before the cut, the lease was lost with no election seen (leader {leader}, {:?} leader changes): {e}",
            at_cut.changes
        )));
    }
    ctx.figure("leader", leader);
    ctx.figure("holder_server", follower);
    let slack = ctx.crash_slack(&contender.capabilities());
    // The cut comes right after a renewal that ended one of the client's longest silences:
    // the hardest moment for the promise. The renewal's reply moved the deadline, but the
    // holder's server may not have told the leader of anything the client sent since its last
    // report (a ZooKeeper follower reports its clients' packets only when the leader pings
    // it, every half tick), and before the renewal the client sent nothing for that long.
    let (silence, longest) = after_long_silence(&lease, &link, ttl).await?;
    ctx.figure_ms("silence_before_cut_renewal_ms", silence);
    ctx.figure_ms("longest_client_silence_ms", longest);
    let history = History::new();
    history.grant_until(0, lease.token(), lease.deadline().into_std());
    history.promise(0, lease.token(), lease.deadline().into_std());
    let lost = lease.lost();
    let cut = Instant::now();
    p.cluster
        .cut(follower, leader)
        .map_err(|e| Verdict::Fail(format!("cannot cut the holder's server: {e}")))?;
    let lost_at = spawn_timed(lost);
    let l2 = lock.clone();
    let stolen_at =
        spawn_timed(async move { contender.acquire(&l2, AcquireOptions::wait(ttl * 6)).await });
    let stolen = within(ttl * 8, stolen_at).await;
    // Whether the holder's server still took itself for a member of the leader's cluster when
    // the contender's acquire returned (ZooKeeper: `Mode: follower`; a stale follower is the
    // hard case).
    if kind == ServerKind::Zk {
        let at = addrs[follower];
        let mode = blocking("read the holder's server mode", move || {
            Ok(local::zk_mode(at))
        })
        .await?;
        ctx.figure(
            "holder_server_mode_at_grant",
            mode.unwrap_or_else(|| "not serving".into()),
        );
    }
    let lost = within(ttl * 2, lost_at).await;
    // Read before the links heal: a healed member that finds its leader again counts a change.
    let during = Leadership::read(p).await?;
    let election = at_cut
        .election_before(&during, kind)
        .map(|why| format!("during the cut, {why}"));
    // The latest promise: a lost lease keeps the last deadline it had.
    let promised = lease.deadline();
    history.promise(0, lease.token(), promised.into_std());
    let granted = match stolen {
        Some(Ok((t, Ok(got)))) => {
            history.push(Event {
                client: 1,
                kind: Kind::Grant,
                token: got.token(),
                at: t.into_std(),
                until: Some(got.deadline().into_std()),
            });
            // Released on the leader's side BEFORE the links heal: a request sent while a
            // healed member forces an election can go unanswered for a whole request timeout.
            got.release().await?;
            Ok(t)
        }
        Some(Ok((_, Err(e)))) => Err(format!(
            "the contender on the leader never got the lock after the holder's server was cut from the leader: {e}"
        )),
        _ => Err("the contender's acquire on the leader never returned".to_string()),
    };
    // Safety, whatever the elections: no grant before the holder's promised deadline, and no
    // lost() after it.
    if let Err(v) = history.promise_violations() {
        return Err(Verdict::Fail(format!(
            "promise violation: the contender on the leader was granted BEFORE the deadline the holder (on a server cut from the leader) had been promised: {}",
            v.first
        )));
    }
    if let Some(Ok((lost_t, _))) = &lost {
        ensure!(
            *lost_t <= promised + SCHED,
            "lost() fired {:?} after the lease's deadline",
            *lost_t - promised
        );
    }
    // Liveness: the contender is granted and the holder told, unless an election let the
    // holder's server find a leader again.
    if let Some(why) = election {
        return Ok(Attempt::Void(why));
    }
    let stolen_t = granted.map_err(Verdict::Fail)?;
    let promise_margin_ms = (stolen_t.saturating_duration_since(promised).as_secs_f64()
        - promised.saturating_duration_since(stolen_t).as_secs_f64())
        * 1e3;
    ctx.figure_ms(
        "contender_after_cut_ms",
        stolen_t.saturating_duration_since(cut),
    );
    ctx.figure("promise_margin_ms", (promise_margin_ms * 1e3).round() / 1e3);
    ctx.figure_ms(
        "deadline_after_cut_ms",
        promised.saturating_duration_since(cut),
    );
    let Some(Ok((lost_t, reason))) = lost else {
        return Err(Verdict::Fail(format!(
            "the holder's lost() never fired after its server was cut from the leader (its deadline is {:?} after the cut)",
            promised.saturating_duration_since(cut)
        )));
    };
    ctx.figure_ms("lost_after_cut_ms", lost_t.saturating_duration_since(cut));
    ctx.figure("loss_reason", reason.to_string());
    ensure!(
        reason != LossReason::Released,
        "lost() reported a release, not a loss"
    );
    ensure!(
        stolen_t.saturating_duration_since(cut) <= ttl * 2 + slack + SCHED,
        "the contender on the leader waited {:?} after the cut (TTL {ttl:?}, slack {slack:?})",
        stolen_t.saturating_duration_since(cut)
    );
    drop(lease);
    Ok(Attempt::Passed)
}

/// Upstream forwards closer together than this are one request (a pipelined burst).
const BURST: Duration = Duration::from_millis(20);

/// The bursts of an upstream log: (when each began, the silence before it).
fn bursts(log: &[Instant]) -> Vec<(Instant, Duration)> {
    let mut out: Vec<(Instant, Duration)> = Vec::new();
    let mut last: Option<Instant> = None;
    for &t in log {
        match last {
            Some(prev) if t.saturating_duration_since(prev) < BURST => {}
            Some(prev) => out.push((t, t.saturating_duration_since(prev))),
            None => {}
        }
        last = Some(t);
    }
    out
}

/// Waits for a renewal that ended a silence of the client at least 4/5 of the longest it kept
/// so far (its steady state since the grant), at most 2 TTLs, and returns at once after it with
/// (the silence before that renewal, the longest silence). A renewal is a moved `deadline()`;
/// its request is the last burst the client sent before the move was seen.
///
/// # Errors
/// A failed verdict when no renewal moves the deadline within a TTL (a healthy cluster).
async fn after_long_silence(
    lease: &dlock_core::Lease,
    link: &Proxy,
    ttl: Duration,
) -> Result<(Duration, Duration), Verdict> {
    let longest = bursts(&link.upstream_log())
        .iter()
        .map(|&(_, gap)| gap)
        .max()
        .unwrap_or_default();
    let goal = longest * 4 / 5;
    let began = Instant::now();
    loop {
        let before = lease.deadline();
        let waited = Instant::now();
        while lease.deadline() == before {
            if waited.elapsed() >= ttl {
                return Err(Verdict::Fail(format!(
                    "no renewal moved the holder's deadline within a TTL ({ttl:?}) on a healthy cluster"
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let seen = Instant::now();
        let silence = bursts(&link.upstream_log())
            .iter()
            .rev()
            .find(|&&(start, _)| start <= seen)
            .map_or(Duration::ZERO, |&(_, gap)| gap);
        if silence >= goal || began.elapsed() >= ttl * 2 {
            return Ok((silence, longest));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(leader: Option<usize>, changes: Option<u64>) -> Leadership {
        Leadership { leader, changes }
    }

    #[test]
    fn bursts_split_an_upstream_log_at_silences() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let log = [
            t0,
            t0 + ms(5),
            t0 + ms(10),
            t0 + ms(1000),
            t0 + ms(1001),
            t0 + ms(1500),
        ];
        assert_eq!(
            bursts(&log),
            vec![(t0 + ms(1000), ms(990)), (t0 + ms(1500), ms(499))]
        );
        assert!(bursts(&[]).is_empty());
    }

    #[test]
    fn only_evidence_of_an_election_voids_an_attempt() {
        let etcd = ServerKind::Etcd;
        let steady = at(Some(2), Some(3));
        assert_eq!(steady.election_before(&at(Some(2), Some(3)), etcd), None);
        assert!(
            steady
                .election_before(&at(Some(0), Some(3)), etcd)
                .is_some()
        );
        assert!(steady.election_before(&at(None, Some(3)), etcd).is_some());
        assert!(
            steady
                .election_before(&at(Some(2), Some(4)), etcd)
                .is_some()
        );
        assert!(steady.election_before(&at(Some(2), None), etcd).is_some());
        // ZooKeeper shows no count: the leader's index decides.
        let zk = at(Some(1), None);
        assert_eq!(zk.election_before(&at(Some(1), None), ServerKind::Zk), None);
        assert!(
            zk.election_before(&at(Some(2), None), ServerKind::Zk)
                .is_some()
        );
    }
}
