//! `RenewBackend` for Redlock: renewal rounds and release, fanned out to every node
//! concurrently.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Background, Counters, RenewBackend, Renewal};
use dlock_core::{Error, LossReason, NodeError};
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;

use super::tally::{Tally, Verdict};
use crate::conn::{Node, millis};
use crate::keys::Keys;
use crate::scripts::{self, scripts};

/// One held Redlock lease.
#[derive(Debug)]
pub(crate) struct RHeld {
    pub(crate) keys: Keys,
    pub(crate) owner: String,
}

/// The nodes and settings shared by the locker and its renewal driver.
pub(crate) struct RedlockBackend {
    pub(crate) nodes: Vec<Node>,
    pub(crate) quorum: usize,
    pub(crate) ttl: Duration,
    pub(crate) node_timeout: Duration,
    pub(crate) counters: Arc<Counters>,
    /// The locker's background work (shared with its renewal driver, whose `close` waits for
    /// it): unlocks of cancelled attempts and lost leases.
    pub(crate) background: Background,
    /// Fence write-backs to the nodes a grant did not raise (see `raise`).
    pub(crate) raiser: super::raise::Raiser,
}

impl RedlockBackend {
    /// Compare-and-delete on EVERY node (also those that did not grant: a reply may have been
    /// lost). Returns how many nodes confirmed (deleted, or the key was not ours there), and
    /// the causes of the others.
    pub(crate) async fn unlock_all(
        &self,
        keys: &Keys,
        owner: &str,
        budget: Duration,
    ) -> (usize, Vec<NodeError>) {
        self.unlock_some(keys, owner, &vec![true; self.nodes.len()], budget)
            .await
    }

    /// Compare-and-delete on the nodes whose flag in `which` is set; as [`Self::unlock_all`]
    /// over those nodes.
    pub(crate) async fn unlock_some(
        &self,
        keys: &Keys,
        owner: &str,
        which: &[bool],
        budget: Duration,
    ) -> (usize, Vec<NodeError>) {
        let chosen: Vec<&Node> = self
            .nodes
            .iter()
            .zip(which)
            .filter_map(|(node, &on)| on.then_some(node))
            .collect();
        if chosen.is_empty() {
            return (0, Vec::new());
        }
        let inv = {
            let mut inv = scripts().release_plain.prepare_invoke();
            inv.key(&keys.lock).arg(owner);
            inv
        };
        let inv = &inv;
        let results = join_all(chosen.iter().map(|node| async move {
            node.invoke::<i64>("release", inv, budget, &self.counters)
                .await
        }))
        .await;
        let mut ok = 0;
        let mut causes = Vec::new();
        for (node, r) in chosen.into_iter().zip(results) {
            match r {
                Ok(_) => ok += 1,
                Err(e) => causes.push(NodeError {
                    node: node.display.to_string(),
                    cause: e.to_string(),
                }),
            }
        }
        (ok, causes)
    }

    /// Unlocks in the background (a lost lease, a cancelled attempt).
    pub(crate) fn unlock_detached(self: &Arc<Self>, keys: Keys, owner: String) {
        let this = Arc::clone(self);
        self.background.spawn(async move {
            let (ok, causes) = this.unlock_all(&keys, &owner, this.node_timeout).await;
            if !causes.is_empty() {
                tracing::debug!(lock = %keys.lock, ok, ?causes, "background unlock incomplete; keys expire on their own");
            }
        });
    }
}

/// The renewal driver's view of the backend.
pub(crate) struct Renewer(pub(crate) Arc<RedlockBackend>);

impl std::ops::Deref for Renewer {
    type Target = Arc<RedlockBackend>;
    fn deref(&self) -> &Arc<RedlockBackend> {
        &self.0
    }
}

#[async_trait]
impl RenewBackend for Renewer {
    type Entry = RHeld;

    async fn renew(&self, entries: &[Arc<RHeld>]) -> Result<Vec<Renewal>, Error> {
        // One script call per node over every held lease, all nodes at once: one round trip.
        // Compare-and-PEXPIRE never re-creates a key that expired or a node that lost it.
        let ttl_ms = millis(self.ttl);
        // The driver bounds the whole call; a node never gets more than that.
        let budget = self.ttl / 3;
        let pipe = scripts::renew_pipeline(
            ttl_ms,
            entries
                .iter()
                .map(|e| (e.keys.lock.as_str(), e.owner.as_str())),
        );
        let pipe = &pipe;
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| async move {
                let r = node
                    .pipeline::<Vec<Vec<i64>>>("renew", pipe, budget, &self.counters)
                    .await
                    .and_then(|chunks| {
                        scripts::flatten_renewals(chunks, entries.len()).ok_or_else(|| {
                            Error::backend(
                                format!(
                                    "unexpected reply to renew from {}: wrong length",
                                    node.display
                                ),
                                None,
                            )
                        })
                    });
                (node, r)
            })
            .collect();
        // Decide as soon as the answers so far settle every lease: a majority extended it, a
        // majority no longer holds it, or it cannot reach a majority in this round. Waiting
        // for the rest (a dead node's reconnects, a hung link) would only let the driver's
        // bound on the round discard a majority that already answered.
        let mut tally = Tally::new(self.nodes.len(), self.quorum, entries.len());
        let mut causes = Vec::new();
        while let Some((node, r)) = pending.next().await {
            match r {
                Ok(replies) => tally.answered(&replies),
                Err(e) => {
                    tally.failed();
                    causes.push(NodeError {
                        node: node.display.to_string(),
                        cause: e.to_string(),
                    });
                }
            }
            if tally.settled() {
                break;
            }
        }
        drop(pending);
        let verdicts: Vec<Verdict> = tally.verdicts().collect();
        let all_open = verdicts
            .iter()
            .map(|v| match v {
                Verdict::Open(count) => Some(*count),
                _ => None,
            })
            .collect::<Option<Vec<usize>>>()
            .filter(|open| !open.is_empty());
        if let Some(open) = all_open {
            // Nothing decided at all (too many nodes failed or stayed silent): the round
            // failed as a whole; the driver backs off and retries within the validity.
            return Err(Error::QuorumNotReached {
                needed: self.quorum,
                granted: open.into_iter().max().unwrap_or(0),
                causes,
            });
        }
        let mut out = Vec::with_capacity(entries.len());
        for (entry, verdict) in entries.iter().zip(verdicts) {
            out.push(match verdict {
                Verdict::Extended => Renewal::Extended,
                Verdict::Gone(count) => {
                    self.unlock_detached(entry.keys.clone(), entry.owner.clone());
                    Renewal::Lost(LossReason::Gone(format!(
                        "the lock is held on only {count} of {} nodes (quorum {})",
                        self.nodes.len(),
                        self.quorum
                    )))
                }
                // Not decided by this round: this lease keeps its deadline and is retried
                // soon; the others are settled on their own.
                Verdict::Open(count) => {
                    tracing::debug!(lock = %entry.keys.lock, extended = count, ?causes, "renewal undecided for this lease");
                    Renewal::Retry
                }
            });
        }
        Ok(out)
    }

    async fn release(&self, entry: &RHeld) -> Result<(), Error> {
        // Not bound by any validity: give slow nodes more time than an acquire would.
        let budget = self.node_timeout.max(self.ttl / 3);
        let (ok, causes) = self.unlock_all(&entry.keys, &entry.owner, budget).await;
        if ok >= self.quorum {
            if !causes.is_empty() {
                tracing::debug!(lock = %entry.keys.lock, ?causes, "release did not reach every node; those keys expire on their own");
            }
            Ok(())
        } else {
            Err(Error::QuorumNotReached {
                needed: self.quorum,
                granted: ok,
                causes,
            })
        }
    }
}
