//! The memory backend's [`Election`]: the fair lock with a value per holder, and an
//! unbounded channel per observer that the server feeds on every grant and proclamation.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::time::Instant;

use super::{Backend, MemoryLocker};
use crate::{
    AcquireOptions, ElectionBackend, Error, Leader, LeaderChanges, Leadership, Lease, LockName,
    LossReason, Proclaim, leadership,
};

/// Writes the value of one leadership at the memory server.
struct MemoryProclaim {
    backend: Arc<Backend>,
    name: String,
    owner: u64,
}

#[async_trait]
impl Proclaim for MemoryProclaim {
    async fn proclaim(&self, lease: &Lease, value: &[u8]) -> Result<(), Error> {
        self.backend.counters.add_requests(1);
        let now = Instant::now();
        let mut names = self.backend.server.names();
        let st = names.get_mut(&self.name);
        let Some(st) = st else {
            return Err(not_leading(lease));
        };
        let unguarded = self.backend.defect == Some(super::Defect::UnguardedProclaim);
        if unguarded && st.holder.as_ref().is_none_or(|h| h.owner != self.owner) {
            return Ok(());
        }
        let leader = match st.holder.as_mut() {
            Some(h) if h.owner == self.owner && h.expires > now => {
                h.value = value.to_vec();
                Leader {
                    term: h.token,
                    value: value.to_vec(),
                }
            }
            _ => return Err(not_leading(lease)),
        };
        self.backend.announce(st, &leader);
        Ok(())
    }
}

fn not_leading(lease: &Lease) -> Error {
    Error::Lost(LossReason::Gone(format!(
        "{}: the server records another leader or none",
        lease.name()
    )))
}

/// An observer's end of the server's channel.
struct MemoryChanges {
    rx: UnboundedReceiver<Leader>,
}

#[async_trait]
impl LeaderChanges for MemoryChanges {
    async fn next(&mut self) -> Result<Leader, Error> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| Error::unavailable("memory election: the server is gone", None))
    }
}

#[async_trait]
impl ElectionBackend for MemoryLocker {
    async fn run_campaign(
        &self,
        name: &LockName,
        value: &[u8],
        opts: AcquireOptions,
    ) -> Result<Leadership, Error> {
        let (lease, owner) = self
            .acquire_with(name, opts, value, super::Mode::Exclusive)
            .await?;
        let proclaim = MemoryProclaim {
            backend: Arc::clone(&self.backend),
            name: name.as_str().to_owned(),
            owner,
        };
        Ok(leadership(lease, Arc::new(proclaim)))
    }

    async fn read_leader(&self, name: &LockName) -> Result<Option<Leader>, Error> {
        self.counters.add_requests(1);
        let now = Instant::now();
        let names = self.backend.server.names();
        Ok(names
            .get(name.as_str())
            .and_then(|st| st.holder.as_ref())
            .filter(|h| h.expires > now)
            .map(|h| Leader {
                term: h.token,
                value: h.value.clone(),
            }))
    }

    async fn follow(&self, name: &LockName) -> Result<Box<dyn LeaderChanges>, Error> {
        self.counters.add_requests(1);
        let now = Instant::now();
        let (tx, rx) = unbounded_channel();
        let mut names = self.backend.server.names();
        let st = names.entry(name.as_str().to_owned()).or_default();
        if let Some(h) = st.holder.as_ref().filter(|h| h.expires > now) {
            let _ = tx.send(Leader {
                term: h.token,
                value: h.value.clone(),
            });
        }
        st.observers.push(tx);
        Ok(Box::new(MemoryChanges { rx }))
    }
}
