//! One Redlock attempt, and the retry loop around it.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, FencingToken, Lease, LockName, NodeError};
use futures::future::join_all;
use rand::Rng;
use tokio::time::Instant;

use super::RInner;
use super::quorum::{token_plan, validity};
use super::raise;
use super::renew::{RHeld, RedlockBackend};
use crate::conn::millis;
use crate::error::{is_slow, token_of, unexpected};
use crate::keys::{Keys, random_id};
use crate::scripts::{self, scripts};
use crate::wait::{Wait, at_once};

/// How one attempt ended.
enum Outcome {
    Granted(Lease),
    /// Other owners hold the lock on enough nodes (or the nodes split): try again later.
    Busy,
    /// No quorum for another reason (slow nodes, validity used up, fence write-back failed).
    Failed(Error),
    /// So many nodes are down (refused, reset) that no quorum is possible: retrying now cannot
    /// help.
    Unreachable(Error),
}

/// The least time a failed attempt spends unlocking before it returns.
const CLEANUP_GRACE: Duration = Duration::from_millis(50);

/// Unlocks every node in the background if an attempt is dropped half-way.
struct Attempt {
    backend: Arc<RedlockBackend>,
    keys: Keys,
    owner: String,
    dirty: bool,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.dirty {
            self.backend
                .unlock_detached(self.keys.clone(), std::mem::take(&mut self.owner));
        }
    }
}

fn cause(node: &str, what: impl ToString) -> NodeError {
    NodeError {
        node: node.to_owned(),
        cause: what.to_string(),
    }
}

async fn attempt(inner: &RInner, name: &LockName, keys: &Keys, budget: Duration) -> Outcome {
    let b = &inner.backend;
    let n = b.nodes.len();
    let mut guard = Attempt {
        backend: Arc::clone(b),
        keys: keys.clone(),
        owner: random_id(),
        dirty: true,
    };
    let owner = guard.owner.clone();
    let ttl_ms = millis(inner.ttl);
    let start = Instant::now();
    // Per node, one round trip: the `fast_acquire` script (`SET NX PX`, and only when that
    // granted, the next token of the node's fence). A refused attempt writes nothing.
    let inv = scripts::fast_acquire(&keys.lock, &keys.fence, &owner, ttl_ms, false);
    let inv = &inv;
    let replies = join_all(b.nodes.iter().map(|node| async move {
        node.invoke::<Vec<i64>>("acquire", inv, budget, &b.counters)
            .await
    }))
    .await;

    let mut granted: Vec<(usize, u64)> = Vec::with_capacity(n);
    // The nodes that may hold our owner value: every node but those that answered "held by
    // another owner" (a refused `SET NX` wrote nothing, and the owner value is this attempt's
    // own, so no earlier write of ours can be there either).
    let mut maybe_ours = vec![true; n];
    let mut busy = 0usize;
    let mut errors = 0usize;
    let mut slow = 0usize;
    let mut causes = Vec::new();
    for (i, (node, reply)) in b.nodes.iter().zip(replies).enumerate() {
        match reply.as_deref() {
            Ok([1, counter]) => match token_of(&node.display, *counter) {
                Ok(c) => granted.push((i, c)),
                Err(e) => causes.push(cause(&node.display, e)),
            },
            Ok([0, _]) => {
                busy += 1;
                maybe_ours[i] = false;
                causes.push(cause(&node.display, "held by another owner"));
            }
            Ok(other) => causes.push(cause(
                &node.display,
                unexpected(&node.display, "acquire", other),
            )),
            Err(e) => {
                errors += 1;
                if is_slow(e) {
                    slow += 1;
                }
                causes.push(cause(&node.display, e));
            }
        }
    }

    if granted.len() >= b.quorum
        && let Some((token, laggards)) = token_plan(&granted)
    {
        let at_max = granted.len() - laggards.len();
        // Which nodes hold a counter >= the token now.
        let mut at_token = vec![false; n];
        for &(i, c) in &granted {
            at_token[i] = c >= token;
        }
        let mut raised = 0;
        if at_max < b.quorum {
            // Write the token back, so that a majority holds a counter >= token.
            if let Some(left) = validity(inner.ttl, start.elapsed()) {
                let budget = budget.min(left);
                let results = join_all(laggards.iter().map(|&i| {
                    let node = &b.nodes[i];
                    async move {
                        let mut inv = scripts().raise_fence.prepare_invoke();
                        inv.key(&keys.fence).arg(token);
                        node.invoke::<i64>("fence write-back", &inv, budget, &b.counters)
                            .await
                    }
                }))
                .await;
                for (&i, r) in laggards.iter().zip(results) {
                    match r {
                        Ok(_) => {
                            raised += 1;
                            at_token[i] = true;
                        }
                        Err(e) => causes.push(cause(&b.nodes[i].display, e)),
                    }
                }
            }
        }
        if at_max + raised >= b.quorum && validity(inner.ttl, start.elapsed()).is_some() {
            // Every node not known to hold a counter >= the token is raised in the
            // background: off the grant's path, and nothing at all when every node granted
            // at the same counter.
            let below: Vec<usize> = (0..n).filter(|&i| !at_token[i]).collect();
            if !below.is_empty() {
                raise::raise_detached(b, &below, &keys.fence, token);
            }
            guard.dirty = false;
            let held = RHeld {
                keys: keys.clone(),
                owner: std::mem::take(&mut guard.owner),
            };
            return Outcome::Granted(inner.driver.register(
                name.clone(),
                FencingToken(token),
                start,
                held,
            ));
        }
        causes.push(NodeError {
            node: "(all)".into(),
            cause: "the validity ran out or the fence write-back missed a majority".into(),
        });
    }

    // No lock: unlock every node that may hold our key: those that granted, and those whose
    // reply was lost or unreadable (they may have granted). A node that answered "held by
    // another owner" wrote nothing: unlocking it would only double a refused poll's cost.
    // Bounded like the attempt (plus a small grace), so a hung node cannot hold the caller
    // long past its wait; if a node does not confirm, the guard unlocks every node again in
    // the background.
    let unlock_budget = budget.max(CLEANUP_GRACE.min(b.node_timeout));
    let (_, unlock_causes) = b
        .unlock_some(keys, &owner, &maybe_ours, unlock_budget)
        .await;
    if unlock_causes.is_empty() {
        guard.dirty = false;
    }
    let err = Error::QuorumNotReached {
        needed: b.quorum,
        granted: granted.len(),
        causes,
    };
    if errors - slow > n - b.quorum {
        Outcome::Unreachable(err)
    } else if busy > 0 {
        // Someone else holds the lock on some nodes: contention, not a failure.
        Outcome::Busy
    } else {
        // Slow nodes may answer next time (a loaded host, a connection being set up), and a
        // split or an expired validity is worth another try.
        Outcome::Failed(err)
    }
}

pub(super) async fn try_acquire(
    inner: &Arc<RInner>,
    name: &LockName,
) -> Result<Option<Lease>, Error> {
    let keys = Keys::new(&inner.prefix, name);
    match attempt(inner, name, &keys, inner.backend.node_timeout).await {
        Outcome::Granted(lease) => Ok(Some(lease)),
        Outcome::Busy => Ok(None),
        Outcome::Failed(e) | Outcome::Unreachable(e) => Err(e),
    }
}

pub(super) async fn acquire(
    inner: &Arc<RInner>,
    name: &LockName,
    wait: Option<Duration>,
) -> Result<Lease, Error> {
    if wait == Some(Duration::ZERO) {
        return at_once(try_acquire(inner, name).await?);
    }
    let wait = Wait::start(wait);
    let keys = Keys::new(&inner.prefix, name);
    let mut waited = false;
    loop {
        let budget = wait.budget(inner.backend.node_timeout);
        if budget.is_zero() {
            return Err(wait.timeout());
        }
        let last = match attempt(inner, name, &keys, budget).await {
            Outcome::Granted(lease) => return Ok(lease),
            Outcome::Unreachable(e) => return Err(e),
            Outcome::Busy => None,
            // An attempt whose budget the wait's end cut short proves nothing about the nodes.
            Outcome::Failed(_) if budget < inner.backend.node_timeout => None,
            Outcome::Failed(e) => Some(e),
        };
        if !waited {
            waited = true;
            inner.counters.add_waits(1);
        }
        let delay = random_delay(inner.retry_delay);
        tokio::time::sleep_until(wait.wake_at(delay)).await;
        if wait.is_over() {
            return Err(last.unwrap_or_else(|| wait.timeout()));
        }
        inner.counters.add_wakeups(1);
    }
}

/// A random delay in `[bound/2, bound]`.
fn random_delay(bound: Duration) -> Duration {
    let lo = bound / 2;
    let span = u64::try_from((bound - lo).as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    lo + Duration::from_micros(rand::rng().random_range(0..=span))
}
