//! Guarded deletes sent together. A release, a cancelled acquire's cleanup and a background
//! cleanup each delete one key guarded by its create revision. Deletes asked for while
//! [`MAX_IN_FLIGHT`] transactions of them are out wait, and the next caller to get a turn
//! sends every waiting one (up to [`MAX_BATCH`]) in one transaction of nested guarded
//! transactions (etcd ≥ 3.3). A delete asked for when nothing is out is sent at once, alone,
//! as before: batching never waits for company.
//!
//! Why: etcd 3.4 copies its uncommitted write buffer for every transaction it applies, so many
//! concurrent one-key transactions (1,000 releases at once) cost the server far more than
//! the same deletes in a few transactions. Each nested delete keeps its own guard, so a batch
//! deletes exactly what the single transactions would have, and one whose guard fails (the
//! key is gone, or is a newer incarnation) leaves the others alone.

use std::collections::HashSet;
use std::sync::Mutex;

use dlock_core::Error;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{Semaphore, oneshot};

use super::Etcd;
use crate::error;

/// Deletes per transaction at most (etcd's `--max-txn-ops` is 128 by default; each nested
/// transaction holds one compare and one delete).
const MAX_BATCH: usize = 64;
/// Delete transactions out at once.
const MAX_IN_FLIGHT: usize = 4;

/// One delete waiting for its turn.
struct Queued {
    key: String,
    rev: i64,
    reply: oneshot::Sender<Result<bool, Error>>,
}

/// The deletes waiting and the turns to send them.
pub(crate) struct DeleteQueue {
    waiting: Mutex<Vec<Queued>>,
    turns: Semaphore,
}

impl Default for DeleteQueue {
    fn default() -> Self {
        DeleteQueue {
            waiting: Mutex::new(Vec::new()),
            turns: Semaphore::new(MAX_IN_FLIGHT),
        }
    }
}

impl DeleteQueue {
    /// Takes up to [`MAX_BATCH`] waiting deletes, oldest first, one per key (a transaction
    /// may not delete a key twice; a second delete of a key waits for the next batch).
    fn take(&self) -> Vec<Queued> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let mut keys = HashSet::new();
        let mut batch = Vec::new();
        let mut rest = Vec::new();
        for q in waiting.drain(..) {
            if batch.len() < MAX_BATCH && keys.insert(q.key.clone()) {
                batch.push(q);
            } else {
                rest.push(q);
            }
        }
        *waiting = rest;
        batch
    }
}

/// The single guarded delete: `key` if its create revision is still `rev`.
fn guarded(key: &str, rev: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(key, None)])
}

impl Etcd {
    /// Deletes `key` if its create revision is still `rev`, in a transaction shared with the
    /// other deletes waiting then (see the module docs); whether it deleted something.
    ///
    /// # Errors
    /// As [`Etcd::call`], for the transaction that carried this delete.
    ///
    /// # Cancel safety
    /// A dropped call's delete may still be sent (guarded, so harmless); a dropped call that
    /// was sending a batch leaves the other deletes of that batch with an `Unavailable` error
    /// (outcome unknown), which their callers already handle.
    pub(crate) async fn delete_batched(&self, key: &str, rev: i64) -> Result<bool, Error> {
        let (reply, mut answer) = oneshot::channel();
        self.deletes
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Queued {
                key: key.to_owned(),
                rev,
                reply,
            });
        loop {
            let turn = tokio::select! {
                biased;
                got = &mut answer => return got.unwrap_or_else(|_| Err(unanswered())),
                turn = self.deletes.turns.acquire() => turn,
            };
            let batch = self.deletes.take();
            if batch.is_empty() {
                // Nothing waits, ours neither: another caller's batch carries it, and its
                // answer comes from there (taking turns meanwhile would only spin).
                drop(turn);
                return answer.await.unwrap_or_else(|_| Err(unanswered()));
            }
            self.send_deletes(batch).await;
            drop(turn);
            match answer.try_recv() {
                Ok(got) => return got,
                Err(oneshot::error::TryRecvError::Closed) => return Err(unanswered()),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
        }
    }

    /// Sends `batch` (one transaction) and answers each of its deletes.
    async fn send_deletes(&self, batch: Vec<Queued>) {
        if let [one] = batch.as_slice() {
            let got = self
                .txn("guarded delete", None, guarded(&one.key, one.rev))
                .await
                .map(|resp| resp.succeeded());
            for q in batch {
                let _ = q.reply.send(got.clone());
            }
            return;
        }
        let nested: Vec<TxnOp> = batch
            .iter()
            .map(|q| TxnOp::txn(guarded(&q.key, q.rev)))
            .collect();
        match self
            .txn("guarded deletes", None, Txn::new().and_then(nested))
            .await
        {
            Ok(resp) => {
                let replies = resp.op_responses();
                for (i, q) in batch.into_iter().enumerate() {
                    let got = match replies.get(i) {
                        Some(TxnOpResponse::Txn(t)) => Ok(t.succeeded()),
                        _ => Err(error::unexpected(
                            "guarded deletes",
                            "no nested transaction result",
                        )),
                    };
                    let _ = q.reply.send(got);
                }
            }
            Err(e) if e.kind() == dlock_core::ErrorKind::Unavailable => {
                for q in batch {
                    let _ = q.reply.send(Err(e.clone()));
                }
            }
            // Refused as a whole (a key the user may not write, say): each delete on its own,
            // so each gets its own verdict.
            Err(e) => {
                tracing::debug!(deletes = batch.len(), error = %e, "a batch of deletes was refused; sending them one by one");
                for q in batch {
                    let got = self
                        .txn("guarded delete", None, guarded(&q.key, q.rev))
                        .await
                        .map(|resp| resp.succeeded());
                    let _ = q.reply.send(got);
                }
            }
        }
    }
}

/// The error of a delete whose batch was dropped before its reply.
fn unanswered() -> Error {
    Error::unavailable(
        "guarded delete: the batch carrying it was cancelled before etcd answered",
        None,
    )
}
