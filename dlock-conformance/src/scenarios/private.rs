//! A private server (or cluster) of the backend's topology for the scenarios that restart
//! servers or read whole-server counters, so neither disturbs nor is disturbed by other tests.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Locker;

use super::{Ctx, Verdict};
use crate::servers::{Cluster, HarnessError, READY_TIMEOUT, ServerKind};
use crate::{ClientOptions, TestBackend};

/// The private cluster and the backend over it.
pub(crate) struct Private {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) backend: Arc<dyn TestBackend>,
}

/// Runs blocking harness work off the runtime's threads.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> Result<T, HarnessError> + Send + 'static,
) -> Result<T, Verdict> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Verdict::Fail(format!("cannot {what}: {e}"))),
        Err(e) => Err(Verdict::Fail(format!("{what} panicked: {e}"))),
    }
}

/// Starts a private cluster of the backend's topology, or skips with the reason it cannot.
pub(crate) async fn private(ctx: &Ctx) -> Result<Private, Verdict> {
    start(ctx, false).await
}

/// As [`private`], with every peer link behind its own fault proxies
/// ([`Cluster::start_partitionable`]).
pub(crate) async fn private_partitionable(ctx: &Ctx) -> Result<Private, Verdict> {
    start(ctx, true).await
}

async fn start(ctx: &Ctx, partitionable: bool) -> Result<Private, Verdict> {
    let Some((kind, n)) = ctx.backend().topology() else {
        return Err(Verdict::Skip(
            "in-process backend: there are no server nodes (TestBackend::topology)".into(),
        ));
    };
    start_on(ctx, kind, n, partitionable, "restarted", "").await
}

/// Starts a private `kind` × `n` cluster (`partitionable`: with its peer links behind fault
/// proxies) and rebuilds the backend over it, or skips with the reason it cannot: external
/// servers, whose nodes "cannot be `{fault}`", or a backend without
/// [`TestBackend::on_cluster`] (`why_private` follows that reason).
pub(crate) async fn start_on(
    ctx: &Ctx,
    kind: ServerKind,
    n: usize,
    partitionable: bool,
    fault: &str,
    why_private: &str,
) -> Result<Private, Verdict> {
    let started = tokio::task::spawn_blocking(move || {
        if partitionable {
            Cluster::start_partitionable(kind, n)
        } else {
            Cluster::start(kind, n)
        }
    })
    .await;
    let what = if partitionable { "partitionable " } else { "" };
    let cluster = match started {
        Ok(Ok(c)) => Arc::new(c),
        Ok(Err(e)) if e.may_skip() => return Err(Verdict::Skip(e.to_string())),
        Ok(Err(HarnessError::External(_))) if partitionable => {
            return Err(Verdict::Skip(
                "the servers are external (DLOCK_* variables): their peer links cannot be cut"
                    .into(),
            ));
        }
        Ok(Err(e)) => {
            return Err(Verdict::Fail(format!(
                "cannot start a private {what}{kind} × {n} cluster: {e}"
            )));
        }
        Err(e) => return Err(Verdict::Fail(format!("cluster start panicked: {e}"))),
    };
    if cluster.is_external() {
        return Err(Verdict::Skip(format!(
            "the servers are external (DLOCK_* variables): their nodes cannot be {fault}"
        )));
    }
    let Some(backend) = ctx.backend().on_cluster(Arc::clone(&cluster)) else {
        return Err(Verdict::Skip(format!(
            "the backend cannot be rebuilt over a private cluster (TestBackend::on_cluster){why_private}"
        )));
    };
    Ok(Private { cluster, backend })
}

impl Private {
    /// A client of the private cluster in the scenario's namespace.
    pub(crate) async fn client(&self, ctx: &Ctx) -> Result<Arc<dyn Locker>, Verdict> {
        self.client_with(ClientOptions::new(ctx.ns(), ctx.ttl()))
            .await
    }

    /// A client of the private cluster with explicit options.
    pub(crate) async fn client_with(
        &self,
        opts: ClientOptions,
    ) -> Result<Arc<dyn Locker>, Verdict> {
        self.backend.client(opts).await.map_err(|e| {
            Verdict::Fail(format!("cannot build a client on the private cluster: {e}"))
        })
    }

    /// `n` clients of the private cluster.
    pub(crate) async fn clients(
        &self,
        ctx: &Ctx,
        n: usize,
    ) -> Result<Vec<Arc<dyn Locker>>, Verdict> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.client(ctx).await?);
        }
        Ok(out)
    }

    /// Kills every node, starts them all again on their ports with their data dirs, and waits
    /// until the cluster serves. A start that fails (the old port still held for a moment) is
    /// retried a few times.
    pub(crate) async fn restart_all(&self) -> Result<(), Verdict> {
        let c = Arc::clone(&self.cluster);
        blocking("kill every node", move || {
            c.nodes().iter().try_for_each(|n| n.kill())
        })
        .await?;
        for i in 0..self.cluster.len() {
            let mut last = None;
            for _ in 0..4 {
                let c = Arc::clone(&self.cluster);
                match blocking(&format!("start node {i} again"), move || {
                    c.node(i).start_again()
                })
                .await
                {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    Err(e) => last = Some(e),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            if let Some(e) = last {
                return Err(e);
            }
        }
        let c = Arc::clone(&self.cluster);
        blocking("wait until the restarted cluster serves", move || {
            c.wait_ready(READY_TIMEOUT)
        })
        .await
    }
}
