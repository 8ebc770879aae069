//! What every check shares: the lockers, the name prefix, the TTL, the measured round trip.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dlock_core::{Capabilities, Error, Lease, LockName, Locker};

/// The lockers and settings of one `dlock check` run.
pub(crate) struct Ctx {
    /// The locker that holds and inspects.
    pub(crate) main: Arc<dyn Locker>,
    /// Separate lockers (own connections, own sessions) that contend with `main` and with each
    /// other; at least two.
    pub(crate) clients: Vec<Arc<dyn Locker>>,
    /// `dlock-check/<pid>-<millis>`: every name used lies under it.
    pub(crate) prefix: String,
    /// The locker's TTL.
    pub(crate) ttl: Duration,
    /// The locker's capabilities.
    pub(crate) caps: Capabilities,
    /// How much earlier than the truth the server's remaining TTL may read: etcd leases count
    /// whole seconds, the others milliseconds.
    pub(crate) expiry_rounding: Duration,
    /// Whether the long checks run (`--long`).
    pub(crate) long: bool,
    /// How many samples `round_trip` takes at most.
    pub(crate) samples: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    rtt: Option<Duration>,
    names: Vec<LockName>,
}

impl Ctx {
    /// A context; `clients` must not be empty (the caller connects at least two).
    pub(crate) fn new(
        main: Arc<dyn Locker>,
        clients: Vec<Arc<dyn Locker>>,
        prefix: String,
        expiry_rounding: Duration,
        long: bool,
        samples: usize,
    ) -> Self {
        Ctx {
            ttl: main.ttl(),
            caps: main.capabilities(),
            main,
            clients,
            prefix,
            expiry_rounding,
            long,
            samples,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The name `<prefix>/<suffix>`, remembered for the final audit.
    pub(crate) fn name(&self, suffix: &str) -> Result<LockName, String> {
        let name = LockName::new(format!("{}/{suffix}", self.prefix))
            .map_err(|e| format!("lock name: {e}"))?;
        self.state().names.push(name.clone());
        Ok(name)
    }

    /// Every name the checks used so far.
    pub(crate) fn names(&self) -> Vec<LockName> {
        self.state().names.clone()
    }

    /// Client `i` (cycling through the clients; `main` if there are none).
    pub(crate) fn client(&self, i: usize) -> &Arc<dyn Locker> {
        match self.clients.len() {
            0 => &self.main,
            n => &self.clients[i % n],
        }
    }

    /// The round trip `round_trip` measured (zero before it ran).
    pub(crate) fn rtt(&self) -> Duration {
        self.state().rtt.unwrap_or_default()
    }

    /// Records the measured round trip.
    pub(crate) fn set_rtt(&self, rtt: Duration) {
        self.state().rtt = Some(rtt);
    }

    /// The longest any acquire of the checks waits (past it the check fails rather than
    /// hangs): 10 s plus two TTLs.
    pub(crate) fn wait(&self) -> Duration {
        Duration::from_secs(10) + self.ttl * 2
    }

    /// How long after a grant's cause (a release, a withdrawal) it counts as prompt: half a
    /// TTL plus two round trips. An entry left behind would instead be waited out for up to
    /// a whole TTL.
    pub(crate) fn prompt(&self) -> Duration {
        self.ttl / 2 + self.rtt() * 2
    }
}

/// Locks `m`, also when a panic poisoned it: the checks' mutexes guard plain data that a panic
/// cannot leave half-updated.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Maps a library error to a check's failure reason: `what: error`.
pub(crate) fn err(what: &'static str) -> impl Fn(Error) -> String {
    move |e| format!("{what}: {e}")
}

/// One grant on a name nobody else uses: `Err` when the server says it is held.
pub(crate) async fn grant(locker: &dyn Locker, name: &LockName) -> Result<Lease, String> {
    locker
        .try_acquire(name)
        .await
        .map_err(err("try_acquire"))?
        .ok_or_else(|| format!("{name}, a fresh name, was found held"))
}

/// Releases, as a failure reason.
pub(crate) async fn release(lease: Lease) -> Result<(), String> {
    lease.release().await.map_err(err("release"))
}
