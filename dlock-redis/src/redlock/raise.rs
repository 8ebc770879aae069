//! Background fence write-backs to the nodes a grant did not raise.
//!
//! A grant raises the granting nodes below its token before the lease is handed out (see
//! `acquire`), so a majority holds a counter ≥ the token. The other nodes (they refused, were
//! slow or down) are raised here, in the background: otherwise one node that lags behind and
//! one node restarted empty could form the next quorum and both answer counters below a token
//! already issued. The raise is retried (with a capped back-off) until the node answers, as
//! long as the locker lives; wanted counters are kept per node and per fence key (only the
//! largest), so a node that is down for long costs one entry per lock name, not one per grant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::renew::RedlockBackend;
use crate::scripts::{RENEW_CHUNK, scripts};

/// The most fence keys waiting to be raised on one node; beyond it new ones are dropped (and
/// logged): a bound on memory while a node stays unreachable.
const MAX_PENDING: usize = 100_000;

/// The longest pause between two tries at an unreachable node.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// What is still to be raised on one node.
#[derive(Default)]
struct NodeQueue {
    /// Fence key → the least counter it must hold.
    wanted: HashMap<String, u64>,
    /// Whether a task is raising this node now (cleared by the task, under the lock, when it
    /// finds nothing left).
    running: bool,
    /// That task: started again when it died without clearing `running` (its runtime shut
    /// down).
    task: Option<tokio::task::JoinHandle<()>>,
}

/// The pending raises of every node of a locker.
pub(crate) struct Raiser {
    queues: Vec<Mutex<NodeQueue>>,
}

impl Raiser {
    /// Nothing pending on `nodes` nodes.
    pub(crate) fn new(nodes: usize) -> Self {
        Raiser {
            queues: (0..nodes).map(|_| Mutex::default()).collect(),
        }
    }

    fn queue(&self, node: usize) -> Option<std::sync::MutexGuard<'_, NodeQueue>> {
        self.queues
            .get(node)
            .map(|q| q.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Raises `fence` to at least `token` on each of `nodes`, in the background.
pub(crate) fn raise_detached(
    backend: &Arc<RedlockBackend>,
    nodes: &[usize],
    fence: &str,
    token: u64,
) {
    for &i in nodes {
        let Some(mut q) = backend.raiser.queue(i) else {
            continue;
        };
        if let Some(cur) = q.wanted.get_mut(fence) {
            *cur = (*cur).max(token);
        } else if q.wanted.len() < MAX_PENDING {
            q.wanted.insert(fence.to_owned(), token);
        } else {
            tracing::warn!(node = %backend.nodes[i].display, fence, token, "too many fence raises pending; this one is dropped");
        }
        if q.running && q.task.as_ref().is_some_and(|t| !t.is_finished()) {
            continue;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            continue;
        };
        // Not a tracked background task: `close` does not wait for a node that may stay
        // down; the task ends when the queue is empty or the locker is gone.
        q.running = true;
        q.task = Some(runtime.spawn(run(Arc::downgrade(backend), i)));
    }
}

/// Raises everything queued for node `i` until nothing is left or the backend is gone.
async fn run(weak: Weak<RedlockBackend>, i: usize) {
    let mut backoff = Duration::ZERO;
    loop {
        if !backoff.is_zero() {
            tokio::time::sleep(backoff).await;
        }
        let Some(b) = weak.upgrade() else { return };
        let batch: Vec<(String, u64)> = {
            let Some(mut q) = b.raiser.queue(i) else {
                return;
            };
            if q.wanted.is_empty() {
                q.running = false;
                return;
            }
            q.wanted
                .iter()
                .take(RENEW_CHUNK)
                .map(|(k, v)| (k.clone(), *v))
                .collect()
        };
        let node = &b.nodes[i];
        let mut pipe = redis::pipe();
        let script = &scripts().raise_fence;
        pipe.load_script(script).ignore();
        for (fence, token) in &batch {
            let mut inv = script.prepare_invoke();
            inv.key(fence).arg(*token);
            pipe.invoke_script(&inv);
        }
        let budget = b.node_timeout.max(b.ttl / 3);
        match node
            .pipeline::<Vec<i64>>("fence raise", &pipe, budget, &b.counters)
            .await
        {
            Ok(_) => {
                backoff = Duration::ZERO;
                if let Some(mut q) = b.raiser.queue(i) {
                    for (fence, token) in batch {
                        // A larger token queued meanwhile stays for the next batch.
                        if q.wanted.get(&fence) == Some(&token) {
                            q.wanted.remove(&fence);
                        }
                    }
                }
            }
            Err(e) => {
                backoff = (backoff * 2)
                    .max(b.node_timeout)
                    .min(MAX_BACKOFF.max(b.node_timeout));
                tracing::debug!(node = %node.display, error = %e, pending = batch.len(), ?backoff, "fence raise failed; retrying");
            }
        }
    }
}
