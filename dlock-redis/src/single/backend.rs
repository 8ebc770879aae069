//! The single-node renewal backend: batched compare-and-PEXPIRE and guarded release.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{Counters, Error, LossReason, RenewBackend, Renewal};

use crate::conn::{Node, millis};
use crate::keys::Keys;
use crate::scripts::{self, scripts};

/// One held lock: its keys and our owner value.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) keys: Keys,
    pub(crate) owner: String,
}

/// Renews and releases the leases of one [`RedisLocker`](crate::RedisLocker).
pub(crate) struct SingleBackend {
    pub(crate) node: Node,
    pub(crate) ttl: Duration,
    pub(crate) fair: bool,
    pub(crate) channel_prefix: String,
    pub(crate) request_timeout: Duration,
    pub(crate) counters: Arc<Counters>,
}

impl SingleBackend {
    /// Compare-and-delete; in fair mode also notifies the head waiter.
    pub(crate) async fn release_keys(&self, keys: &Keys, owner: &str) -> Result<bool, Error> {
        let s = scripts();
        let deleted: i64 = if self.fair {
            let mut inv = s.release_fair.prepare_invoke();
            inv.key(&keys.lock)
                .key(&keys.queue)
                .key(&keys.deadlines)
                .arg(owner)
                .arg(&self.channel_prefix)
                .arg(millis(self.ttl));
            self.node
                .invoke("release", &inv, self.request_timeout, &self.counters)
                .await?
        } else {
            let mut inv = s.release_plain.prepare_invoke();
            inv.key(&keys.lock).arg(owner);
            self.node
                .invoke("release", &inv, self.request_timeout, &self.counters)
                .await?
        };
        Ok(deleted == 1)
    }
}

#[async_trait]
impl RenewBackend for SingleBackend {
    type Entry = Held;

    async fn renew(&self, entries: &[Arc<Held>]) -> Result<Vec<Renewal>, Error> {
        // ONE round trip over every held lease (chunked script calls in one pipeline).
        let pipe = scripts::renew_pipeline(
            millis(self.ttl),
            entries
                .iter()
                .map(|e| (e.keys.lock.as_str(), e.owner.as_str())),
        );
        // The driver bounds the call by the leases' remaining validity.
        let chunks: Vec<Vec<i64>> = self
            .node
            .pipeline("renew", &pipe, self.ttl, &self.counters)
            .await?;
        let replies = scripts::flatten_renewals(chunks, entries.len()).ok_or_else(|| {
            Error::backend(
                format!(
                    "unexpected reply to renew from {}: wrong length",
                    self.node.display
                ),
                None,
            )
        })?;
        Ok(replies
            .into_iter()
            .map(|r| {
                if r == 1 {
                    Renewal::Extended
                } else {
                    Renewal::Lost(LossReason::Gone(
                        "the lock key is gone or holds another owner".into(),
                    ))
                }
            })
            .collect())
    }

    async fn release(&self, entry: &Held) -> Result<(), Error> {
        self.release_keys(&entry.keys, &entry.owner)
            .await
            .map(|_| ())
    }
}
