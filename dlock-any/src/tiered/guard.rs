//! The drift guard: one permit, on each guarded tier, of the semaphore [`GUARD_NAME`] whose
//! permit count is the configuration's [`guard_permits`](TieredConfig::guard_permits).
//!
//! Every holder of a semaphore must agree on its permit count (dlock-core's `Semaphore`
//! contract: another count while permits are held or awaited is `InvalidOption`), so while
//! one router holds its permit, a router whose routes or tiers differ is refused at the
//! server, atomically, instead of sending some name to another tier.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{AcquireOptions, Error, ErrorKind, Lease, LockName, Semaphore};

use super::config::GUARD_NAME;

/// How long a router waits for its guard permit. The count is at least 500,001, so a wait
/// means the server is slow, never that the permits ran out.
const GUARD_WAIT: Duration = Duration::from_secs(10);

/// The guard of one tier: the semaphore and the permit held on it (if any).
pub(crate) struct Guard {
    tier: String,
    semaphore: Arc<dyn Semaphore>,
    permits: u32,
    fingerprint: u64,
    held: Mutex<Option<Lease>>,
}

impl Guard {
    pub(crate) fn new(
        tier: &str,
        semaphore: Arc<dyn Semaphore>,
        permits: u32,
        fingerprint: u64,
    ) -> Self {
        Guard {
            tier: tier.to_string(),
            semaphore,
            permits,
            fingerprint,
            held: Mutex::new(None),
        }
    }

    fn holds(&self) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.as_ref().is_some_and(|l| !l.is_lost())
    }

    /// Makes sure this router holds its permit: takes it again when it was lost (a routing
    /// decision is only as safe as the guard behind it).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] (`config.fingerprint`) when another configuration holds the
    /// guard; what the tier's `acquire_permit` fails with otherwise.
    pub(crate) async fn ensure(&self) -> Result<(), Error> {
        if self.holds() {
            return Ok(());
        }
        let name = LockName::new(GUARD_NAME)?;
        let lease = self
            .semaphore
            .acquire_permit(&name, self.permits, AcquireOptions::wait(GUARD_WAIT))
            .await
            .map_err(|e| self.explain(e))?;
        tracing::debug!(tier = %self.tier, permits = self.permits, "tiered: drift guard held");
        let old = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(lease);
        drop(old);
        Ok(())
    }

    fn explain(&self, e: Error) -> Error {
        if e.kind() != ErrorKind::InvalidInput {
            return e;
        }
        tracing::warn!(tier = %self.tier, error = %e, "tiered: configuration drift refused");
        Error::invalid_option(
            "config.fingerprint",
            format!(
                "tier `{}`: another process is routing with a different configuration (its \
                 routes or tier URLs differ from this one's, fingerprint {:016x}, guard \
                 `{GUARD_NAME}` with {} permits); stop those processes or deploy the same \
                 configuration: {e}",
                self.tier, self.fingerprint, self.permits
            ),
        )
    }
}
