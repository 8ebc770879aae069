//! Renewal reads of one session: a `sync` routed through the leader, then reads of the held
//! nodes, sent as soon as the round starts.
//!
//! Rounds are not queued behind each other at the client. ZooKeeper answers a session's
//! requests in order, so a round sent while another is in flight is answered right after it:
//! about one queue's wait at the server. Holding a round until the previous one's replies were
//! in (as the session did before) made it wait for two, and rounds of leases granted at
//! different times queued on each other for 100–500 ms each under load (a burst of acquires
//! filling the session with writes), ran out of budget, and lost leases while the session was
//! alive (`zk-cluster::many_leases_break`). The pile-up that queueing once prevented (rounds
//! abandoned at their budget and retried at once, each adding a full read) cannot happen now:
//! the session's rounds are never abandoned before their leases' deadline
//! (`abandon_slow_rounds` is `false`), and a lease is in one round at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use dlock_core::backend::Counters;
use zookeeper_client as zk;

use crate::batches::{REQUEST_BUDGET, split};
use crate::error::{session_ended, transient};
use crate::keys::parent_of;
use crate::renew::NodeEntry;

/// One node's read back: its stat, or why it could not be read.
pub(crate) type NodeRead = Result<zk::Stat, zk::Error>;

/// The outcome of one request for proofs: the sync's, and the reads' (one per node, in order).
pub(crate) type Proofs = (Result<(), zk::Error>, Result<Vec<NodeRead>, zk::Error>);

/// What one renewal round sends: a `sync` on `parent`, then reads of every entry.
struct Reads {
    client: zk::Client,
    counters: Arc<Counters>,
    chroot_len: usize,
    single: bool,
    parent: String,
    entries: Vec<Arc<NodeEntry>>,
}

impl Reads {
    /// Sends the sync and the reads (the sync first: ZooKeeper answers a session's requests in
    /// order) and waits for every reply: the sync's outcome and the reads'.
    async fn run(self) -> Proofs {
        self.counters.add_requests(1);
        let synced = self.client.sync(&self.parent);
        let read = async {
            if self.single {
                self.read_each().await
            } else {
                self.read_all()?.await
            }
        };
        tokio::join!(synced, read)
    }

    /// Sends the multi-reads of every entry's stat at once (requests sized by [`split`]),
    /// then waits for all of them.
    fn read_all(
        &self,
    ) -> Result<impl std::future::Future<Output = Result<Vec<NodeRead>, zk::Error>> + '_, zk::Error>
    {
        let entries = &self.entries;
        let ranges = split(
            entries.iter().map(|e| e.path.as_str()),
            self.chroot_len,
            REQUEST_BUDGET,
        );
        self.counters
            .add_requests(u64::try_from(ranges.len()).unwrap_or(u64::MAX));
        let mut sent = Vec::with_capacity(ranges.len());
        for range in ranges {
            let mut reader = self.client.new_multi_reader();
            for entry in &entries[range.clone()] {
                reader.add_get_data(&entry.path)?;
            }
            // `commit` writes the request now; its future only waits for the reply.
            sent.push((range.len(), reader.commit()));
        }
        Ok(async move {
            let mut out = Vec::with_capacity(entries.len());
            for (expected, reply) in sent {
                let results = reply.await?;
                if results.len() != expected {
                    return Err(zk::Error::UnexpectedError(format!(
                        "{} multi-read results for {expected} reads",
                        results.len()
                    )));
                }
                out.extend(results.into_iter().map(|r| match r {
                    zk::MultiReadResult::Data { stat, .. } => Ok(stat),
                    zk::MultiReadResult::Error { err } => Err(err),
                    _ => Err(zk::Error::UnexpectedError(
                        "unexpected multi-read result".into(),
                    )),
                }));
            }
            Ok(out)
        })
    }

    /// Sends one plain read of each entry's stat at once (servers without multi-read), then
    /// waits for all of them.
    fn read_each(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<NodeRead>, zk::Error>> + '_ {
        self.counters
            .add_requests(u64::try_from(self.entries.len()).unwrap_or(u64::MAX));
        // `check_stat` writes its request when called; the loop only collects the replies.
        let sent: Vec<_> = self
            .entries
            .iter()
            .map(|e| self.client.check_stat(&e.path))
            .collect();
        async move {
            let mut out = Vec::with_capacity(sent.len());
            for reply in sent {
                out.push(match reply.await {
                    Ok(Some(stat)) => Ok(stat),
                    Ok(None) => Err(zk::Error::NoNode),
                    // A failure of the session itself fails the whole round.
                    Err(e) if session_ended(&e) || transient(&e) => return Err(e),
                    Err(e) => Err(e),
                });
            }
            Ok(out)
        }
    }
}

/// The session's renewal reads: each round sends its own request right away.
pub(crate) struct SessionReads {
    client: zk::Client,
    counters: Arc<Counters>,
    /// An upper bound on the chroot the client prepends to every path (request sizing).
    chroot_len: usize,
    /// The server has no multi-read (before 3.6): one plain read per node.
    pub(crate) single: AtomicBool,
}

impl SessionReads {
    pub(crate) fn new(client: zk::Client, counters: Arc<Counters>, chroot_len: usize) -> Self {
        SessionReads {
            client,
            counters,
            chroot_len,
            single: AtomicBool::new(false),
        }
    }

    /// Sends a sync and the reads of `entries` now, and returns the sync's outcome and the
    /// reads (in order).
    ///
    /// # Cancel safety
    /// Dropping the future leaves the requests to the server, which answers them anyway; the
    /// answers are dropped.
    pub(crate) async fn read(&self, entries: &[Arc<NodeEntry>]) -> Proofs {
        let Some(first) = entries.first() else {
            return (Ok(()), Ok(Vec::new()));
        };
        let sent = tokio::time::Instant::now();
        let reads = Reads {
            client: self.client.clone(),
            counters: Arc::clone(&self.counters),
            chroot_len: self.chroot_len,
            single: self.single.load(Ordering::Relaxed),
            parent: parent_of(&first.path).to_owned(),
            entries: entries.to_vec(),
        };
        let (synced, read) = reads.run().await;
        tracing::debug!(
            nodes = entries.len(),
            took = ?sent.elapsed(),
            ok = synced.is_ok() && read.is_ok(),
            "renewal reads answered"
        );
        (synced, read)
    }
}
