//! Server-node faults on a PRIVATE cluster of the backend's topology (never the shared one):
//! Redlock minority and majority down, etcd / ZooKeeper follower and leader killed or paused.
//! A contended workload runs throughout; the history checkers judge it afterwards.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, Locker};
use tokio::time::Instant;

use super::private::{Private, blocking, start_on};
use super::util::name;
use super::workload::{Counts, Findings, Plan, Workload};
use super::{Ctx, Verdict, ensure};
use crate::servers::ServerKind;

/// Starts a private cluster of the backend's topology, or skips with the reason it cannot.
async fn private(ctx: &Ctx) -> Result<Private, Verdict> {
    let Some((kind, n)) = ctx.backend().topology() else {
        return Err(Verdict::Skip(
            "the backend declares no server topology (TestBackend::topology): no server nodes to fault".into(),
        ));
    };
    if n < 3 {
        return Err(Verdict::Skip(format!(
            "single-node topology ({kind} × {n}): node faults need a cluster of 3 or more"
        )));
    }
    // The Redis phases are Redlock's (5 independent nodes). Any other Redis topology of 3 or
    // more nodes is a Redis Cluster, where each name lives on one master.
    if kind == ServerKind::Redis && n != 5 {
        return Err(Verdict::Skip(format!(
            "Redis Cluster without replicas ({kind} × {n}): each name lives on one master, so a node fault is an outage of that master's names, not a minority or majority fault (dlock-redis/tests/cluster.rs faults the masters)"
        )));
    }
    start_on(
        ctx,
        kind,
        n,
        false,
        "killed",
        ": node faults would hit the shared servers",
    )
    .await
}

/// The node faults' steps on the private cluster.
impl Private {
    async fn act(&self, what: &'static str, node: usize) -> Result<(), Verdict> {
        // A restart binds the node's old port again; a loopback socket may hold it for a
        // moment: retry a few times.
        let tries = if what == "restart" { 4 } else { 1 };
        for _ in 1..tries {
            match self.act_once(what, node).await {
                Ok(()) => return Ok(()),
                Err(e) => tracing::warn!(?e, node, "restart failed, retrying"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.act_once(what, node).await
    }

    async fn act_once(&self, what: &'static str, node: usize) -> Result<(), Verdict> {
        let c = Arc::clone(&self.cluster);
        blocking(&format!("{what} node {node}"), move || {
            let n = c.node(node);
            match what {
                "kill" => n.kill(),
                "pause" => n.pause(),
                "resume" => n.resume(),
                _ => n.restart(),
            }
        })
        .await
    }

    async fn leader(&self) -> Result<usize, Verdict> {
        let c = Arc::clone(&self.cluster);
        blocking("find the leader", move || {
            c.wait_leader(Duration::from_secs(30))
        })
        .await
    }

    /// Entries left under the namespace, waiting up to `bound` for them to go.
    async fn settle_empty(&self, ctx: &Ctx, bound: Duration) -> Result<(), Verdict> {
        let began = Instant::now();
        loop {
            let left = match self.backend.leftovers(ctx.ns()).await {
                Ok(l) => l,
                Err(e) if began.elapsed() < bound => {
                    tracing::debug!(error = %e, "leak audit retry");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => {
                    return Err(Verdict::Fail(format!(
                        "leak audit cannot read the private cluster: {e}"
                    )));
                }
            };
            if left.is_empty() {
                return Ok(());
            }
            if began.elapsed() >= bound {
                return Err(Verdict::Fail(format!(
                    "leak audit: {} entries left on the private cluster after {bound:?}: {left:?}",
                    left.len()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn plan(ctx: &Ctx, lock: &str) -> Result<Plan, Verdict> {
    Ok(Plan {
        lock: name(lock)?,
        ttl: ctx.ttl(),
        wait: ctx.ttl() * 2,
        hold_max: ctx.ttl() / 4,
        stall_chance: 0.1,
        seed: 7,
    })
}

/// Faults on a minority of the nodes, one phase after another, under a contended workload:
/// Redlock × 5: 1 then 2 nodes paused, resumed, then 1 then 2 killed — grants continue in
/// every phase. etcd / ZooKeeper × 3: a follower killed, the leader killed, the
/// leader paused (each healed before the next) — no checker fires, and grants resume once
/// healed. Leases caught by a fault must be either still held or known lost.
pub(crate) async fn minority_nodes_down(ctx: &Ctx) -> Result<(), Verdict> {
    let p = private(ctx).await?;
    let ttl = ctx.ttl();
    let workers = p.clients(ctx, 3).await?;
    let caps = workers[0].capabilities();
    let load = Workload::start(workers, &plan(ctx, "nodes")?, ctx.fencing());
    let phase = ttl * 2;
    let mut phases: Vec<(String, u64)> = Vec::new();
    let mut mark = |label: &str, load: &Workload, since: u64| {
        let n = load.grants() - since;
        ctx.figure(&format!("grants_{label}"), n);
        phases.push((label.to_string(), n));
        load.grants()
    };
    tokio::time::sleep(phase).await;
    let mut g = mark("healthy", &load, 0);
    match p.cluster.kind() {
        ServerKind::Redis => {
            // Pauses first, kills last: a killed node's port may be taken by the time it
            // would restart (any loopback socket may get it), and Redlock needs no restart.
            p.act("pause", 0).await?;
            tokio::time::sleep(phase).await;
            g = mark("1_paused", &load, g);
            p.act("pause", 1).await?;
            tokio::time::sleep(phase).await;
            g = mark("2_paused", &load, g);
            p.act("resume", 0).await?;
            p.act("resume", 1).await?;
            tokio::time::sleep(phase).await;
            g = mark("resumed", &load, g);
            p.act("kill", 2).await?;
            tokio::time::sleep(phase).await;
            g = mark("1_killed", &load, g);
            p.act("kill", 3).await?;
        }
        ServerKind::Etcd | ServerKind::Zk => {
            let leader = p.leader().await?;
            let follower = (leader + 1) % p.cluster.len();
            p.act("kill", follower).await?;
            tokio::time::sleep(phase).await;
            g = mark("follower_killed", &load, g);
            p.act("restart", follower).await?;
            let leader = p.leader().await?;
            p.act("kill", leader).await?;
            tokio::time::sleep(phase).await;
            g = mark("leader_killed", &load, g);
            p.act("restart", leader).await?;
            let leader = p.leader().await?;
            p.act("pause", leader).await?;
            tokio::time::sleep(phase).await;
            g = mark("leader_paused", &load, g);
            p.act("resume", leader).await?;
        }
    }
    tokio::time::sleep(phase * 2).await;
    mark(
        if p.cluster.kind() == ServerKind::Redis {
            "2_killed"
        } else {
            "healed"
        },
        &load,
        g,
    );
    let counts = Arc::clone(&load.counts);
    let resource = Arc::clone(&load.resource);
    let history = load.stop(ttl * 4).await;
    report_counts(ctx, &counts);
    ensure!(
        resource.value() == Counts::get(&counts.accepted),
        "the fenced counter is {} after {} accepted increments",
        resource.value(),
        Counts::get(&counts.accepted)
    );
    let findings = Findings::of(&history, &caps);
    findings.figures(ctx);
    ctx.figure("violations", findings.violations() as u64);
    findings.verdict("under minority node faults")?;
    if p.cluster.kind() == ServerKind::Redis {
        for (label, n) in &phases {
            ensure!(
                *n > 0,
                "no grant at all while {label}: a minority fault stopped Redlock"
            );
        }
    }
    let healed = phases.last().map_or(0, |p| p.1);
    ensure!(
        healed > 0,
        "no grant in the last phase ({:?})",
        phases.last()
    );
    p.settle_empty(ctx, ttl * 3).await
}

/// A majority of the nodes killed: an acquire fails within its wait (plus slack) and leaves no
/// partial entries on the live nodes (Redlock); etcd / ZooKeeper: after the nodes come back,
/// the lock works again and nothing is left behind.
pub(crate) async fn majority_nodes_down(ctx: &Ctx) -> Result<(), Verdict> {
    let p = private(ctx).await?;
    let ttl = ctx.ttl();
    let lock = name("majority")?;
    let client = p.client(ctx).await?;
    let lease = client
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(10)))
        .await?;
    lease.release().await?;
    let majority = p.cluster.len() / 2 + 1;
    for i in 0..majority {
        p.act("kill", i).await?;
    }
    let wait = ttl;
    let began = Instant::now();
    let got = tokio::time::timeout(
        wait * 3 + Duration::from_secs(5),
        client.acquire(&lock, AcquireOptions::wait(wait)),
    )
    .await;
    let took = began.elapsed();
    ctx.figure_ms("failed_after_ms", took);
    let outcome = match got {
        Err(_) => Err(format!(
            "the acquire had not returned {took:?} into a {wait:?} wait"
        )),
        Ok(Ok(l)) => {
            let t = l.token();
            drop(l);
            Err(format!(
                "the acquire SUCCEEDED with {majority} of {} nodes down (token {t})",
                p.cluster.len()
            ))
        }
        Ok(Err(e)) => {
            ctx.figure("error", e.to_string());
            Ok(())
        }
    };
    if let Err(why) = outcome {
        return Err(Verdict::Fail(why));
    }
    let slack = Duration::from_secs(2);
    ensure!(
        took <= wait + slack,
        "the failing acquire took {took:?}, more than its wait {wait:?} + {slack:?}"
    );
    if p.cluster.kind() == ServerKind::Redis {
        // The live minority: no partial keys once the failed attempt is over.
        let left = p.backend.leftovers(ctx.ns()).await?;
        ensure!(
            left.is_empty(),
            "the failed Redlock acquire left partial keys on the live nodes: {left:?}"
        );
    }
    if p.cluster.kind() == ServerKind::Redis {
        // Redlock nodes restart empty (no persistence): nothing more to learn from a restart.
        return Ok(());
    }
    for i in 0..majority {
        p.act("restart", i).await?;
    }
    p.leader().await?;
    // Works again (a fresh client: the old one may still be reconnecting).
    let again = p.client(ctx).await?;
    let began = Instant::now();
    let lease = again
        .acquire(&lock, AcquireOptions::wait(Duration::from_secs(30)))
        .await
        .map_err(|e| {
            Verdict::Fail(format!(
                "the lock did not work after the nodes came back: {e}"
            ))
        })?;
    ctx.figure_ms("recovered_after_ms", began.elapsed());
    lease.release().await?;
    p.settle_empty(ctx, ttl * 3).await
}

pub(crate) fn report_counts(ctx: &Ctx, c: &Counts) {
    ctx.figure("grants", Counts::get(&c.grants));
    ctx.figure("losses", Counts::get(&c.losses));
    ctx.figure("timeouts", Counts::get(&c.timeouts));
    ctx.figure("errors", Counts::get(&c.errors));
    ctx.figure("ops_accepted", Counts::get(&c.accepted));
    ctx.figure("ops_rejected", Counts::get(&c.rejected));
}
