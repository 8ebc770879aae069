//! `TieredLocker`: one locker that sends every call to the tier its name is routed to.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    AcquireOptions, Capabilities, Election, Error, FencingStrength, Leader, LeaderChanges,
    Leadership, Lease, LockName, LockState, Locker, Primitives, RwLocker, Semaphore, Stats,
};

use super::config::{Route, Tier, TieredConfig};
use super::guard::Guard;

/// One connected tier.
struct Connected {
    locker: Arc<dyn Locker>,
    election: Option<Arc<dyn Election>>,
    rw: Option<Arc<dyn RwLocker>>,
    semaphore: Option<Arc<dyn Semaphore>>,
    guard: Option<Guard>,
}

/// A locker over the tiers of a [`TieredConfig`]: every call on a name (`acquire`,
/// `try_acquire`, `inspect`, and the family's) goes to the tier of the first route that takes
/// the name; `close` closes every tier. There is no per-call choice of tier.
///
/// Built by [`TieredConfig::connect`]. See the crate docs ("Tiers") for what `ttl`,
/// `capabilities` and `stats` report and how the drift guard works.
pub struct TieredLocker {
    config: TieredConfig,
    /// In the order of `config.tiers()`.
    tiers: Vec<Connected>,
    closed: AtomicBool,
}

impl std::fmt::Debug for TieredLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieredLocker")
            .field("tiers", &self.config.tiers())
            .field("routes", &self.config.routes())
            .finish_non_exhaustive()
    }
}

impl TieredConfig {
    /// Connects every tier (as [`crate::connect`] does its URL) and takes the drift guard on
    /// every guarded tier, then returns the router.
    ///
    /// # Errors
    /// What connecting a tier fails with; [`Error::InvalidOption`] (`config.fingerprint`)
    /// when a process with another configuration holds a tier's drift guard, or
    /// (`config.tier`) when a guarded tier's backend has no semaphore. The tiers already
    /// connected are closed first.
    pub async fn connect(&self) -> Result<Arc<TieredLocker>, Error> {
        let mut tiers: Vec<Connected> = Vec::new();
        let permits = self.guard_permits();
        let fingerprint = self.fingerprint();
        for tier in self.tiers() {
            match connect_tier(tier, permits, fingerprint).await {
                Ok(c) => tiers.push(c),
                Err(e) => {
                    close_all(&tiers).await;
                    return Err(e);
                }
            }
        }
        Ok(Arc::new(TieredLocker {
            config: self.clone(),
            tiers,
            closed: AtomicBool::new(false),
        }))
    }
}

async fn connect_tier(tier: &Tier, permits: u32, fingerprint: u64) -> Result<Connected, Error> {
    // Each tier's metrics carry its name as the `tier` label (dlock-core's `metrics` feature).
    let locker = crate::connect::build(tier.url(), Some(tier.name())).await?;
    let semaphore = Arc::clone(&locker).into_semaphore();
    let guard = match (tier.guarded(), &semaphore) {
        (false, _) => None,
        (true, Some(s)) => Some(Guard::new(tier.name(), Arc::clone(s), permits, fingerprint)),
        (true, None) => {
            let _ = locker.close().await;
            return Err(Error::invalid_option(
                "config.tier",
                format!(
                    "config:{}: tier `{}` has no semaphore for the drift guard; set `guard = false`",
                    tier.line(),
                    tier.name()
                ),
            ));
        }
    };
    let connected = Connected {
        election: Arc::clone(&locker).into_election(),
        rw: Arc::clone(&locker).into_rw_locker(),
        semaphore,
        locker,
        guard,
    };
    if let Some(g) = &connected.guard
        && let Err(e) = g.ensure().await
    {
        let _ = connected.locker.close().await;
        return Err(e);
    }
    Ok(connected)
}

async fn close_all(tiers: &[Connected]) -> Option<Error> {
    let mut first = None;
    for t in tiers {
        if let Err(e) = t.locker.close().await {
            first.get_or_insert(e);
        }
    }
    first
}

impl TieredLocker {
    /// The configuration it routes by.
    pub fn config(&self) -> &TieredConfig {
        &self.config
    }

    /// The route and tier `name` goes to (see [`TieredConfig::route`]).
    ///
    /// # Errors
    /// As [`TieredConfig::route`].
    pub fn route(&self, name: &LockName) -> Result<(&Route, &Tier), Error> {
        self.config.route(name)
    }

    /// The locker of the tier called `tier` (for checks and audits of one tier).
    pub fn tier_locker(&self, tier: &str) -> Option<Arc<dyn Locker>> {
        let i = self.config.tiers().iter().position(|t| t.name() == tier)?;
        Some(Arc::clone(&self.tiers[i].locker))
    }

    /// The connected tier `name` goes to, its drift guard checked (and re-taken if it was
    /// lost) when `guarded`.
    async fn pick(&self, name: &LockName, guarded: bool) -> Result<&Connected, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let (_, tier) = self.config.route(name)?;
        let i = self
            .config
            .tiers()
            .iter()
            .position(|t| t.name() == tier.name())
            .ok_or_else(|| missing("tier"))?;
        let connected = &self.tiers[i];
        if guarded && let Some(g) = &connected.guard {
            g.ensure().await?;
        }
        Ok(connected)
    }

    fn all<T>(&self, f: impl Fn(&Connected) -> Option<T>) -> Option<Vec<T>> {
        self.tiers.iter().map(f).collect()
    }
}

/// An error for a family call whose tier lacks the primitive (never reached through
/// `into_*`, which offer a primitive only when every tier has it).
fn missing(what: &str) -> Error {
    Error::invalid_option("config.tier", format!("the name's tier has no {what}"))
}

#[async_trait]
impl Locker for TieredLocker {
    async fn acquire(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        self.pick(name, true)
            .await?
            .locker
            .acquire(name, opts)
            .await
    }

    async fn try_acquire(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        self.pick(name, true).await?.locker.try_acquire(name).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState, Error> {
        self.pick(name, false).await?.locker.inspect(name).await
    }

    /// The longest of the tiers' TTLs: how long a crashed holder can block others on the
    /// slowest tier.
    fn ttl(&self) -> Duration {
        self.tiers
            .iter()
            .map(|t| t.locker.ttl())
            .max()
            .unwrap_or_default()
    }

    /// The weakest of the tiers': fair and herd-free only if every tier is, the weakest
    /// fencing, the longest crash release and slack, the primitives every tier offers.
    fn capabilities(&self) -> Capabilities {
        let caps: Vec<Capabilities> = self.tiers.iter().map(|t| t.locker.capabilities()).collect();
        let within = caps.iter().map(|c| c.crash_release_within).max();
        let fencing = if caps.iter().any(|c| c.fencing == FencingStrength::None) {
            FencingStrength::None
        } else if caps.iter().any(|c| c.fencing == FencingStrength::Assumed) {
            FencingStrength::Assumed
        } else {
            FencingStrength::Linearizable
        };
        let every = |f: fn(&Capabilities) -> bool| caps.iter().all(f);
        let mut primitives = Primitives::MUTEX_ONLY;
        primitives.election = every(|c| c.primitives.election);
        primitives.read_write = every(|c| c.primitives.read_write);
        primitives.semaphore = every(|c| c.primitives.semaphore);
        Capabilities::new(within.unwrap_or_default())
            .with_fair_queue(every(|c| c.fair), every(|c| c.herd_free))
            .with_fencing(fencing)
            .with_crash_release_slack(
                caps.iter()
                    .map(|c| c.crash_release_slack)
                    .max()
                    .unwrap_or_default(),
            )
            .with_primitives(primitives)
    }

    /// The sum of the tiers' counters (the drift guards' grants included).
    fn stats(&self) -> Stats {
        let mut sum = Stats::default();
        for s in self.tiers.iter().map(|t| t.locker.stats()) {
            sum.grants += s.grants;
            sum.waits += s.waits;
            sum.wakeups += s.wakeups;
            sum.timer_wakeups += s.timer_wakeups;
            sum.renewals += s.renewals;
            sum.renewal_failures += s.renewal_failures;
            sum.losses += s.losses;
            sum.requests += s.requests;
            sum.driver_restarts += s.driver_restarts;
        }
        sum
    }

    /// Closes every tier (each as its `close` does), the drift guards' permits with them.
    ///
    /// # Errors
    /// The first tier's error; every tier is closed all the same.
    async fn close(&self) -> Result<(), Error> {
        self.closed.store(true, Ordering::Release);
        match close_all(&self.tiers).await {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn into_election(self: Arc<Self>) -> Option<Arc<dyn Election>> {
        self.all(|t| t.election.clone())?;
        Some(self)
    }

    fn into_rw_locker(self: Arc<Self>) -> Option<Arc<dyn RwLocker>> {
        self.all(|t| t.rw.clone())?;
        Some(self)
    }

    fn into_semaphore(self: Arc<Self>) -> Option<Arc<dyn Semaphore>> {
        self.all(|t| t.semaphore.clone())?;
        Some(self)
    }
}

#[async_trait]
impl Election for TieredLocker {
    async fn campaign(
        &self,
        name: &LockName,
        value: &[u8],
        opts: AcquireOptions,
    ) -> Result<Leadership, Error> {
        let t = self.pick(name, true).await?;
        let e = t.election.as_ref().ok_or_else(|| missing("election"))?;
        e.campaign(name, value, opts).await
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>, Error> {
        let t = self.pick(name, false).await?;
        let e = t.election.as_ref().ok_or_else(|| missing("election"))?;
        e.leader(name).await
    }

    async fn observe(&self, name: &LockName) -> Result<Box<dyn LeaderChanges>, Error> {
        let t = self.pick(name, false).await?;
        let e = t.election.as_ref().ok_or_else(|| missing("election"))?;
        e.observe(name).await
    }
}

#[async_trait]
impl RwLocker for TieredLocker {
    async fn read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        let t = self.pick(name, true).await?;
        let rw = t.rw.as_ref().ok_or_else(|| missing("read-write lock"))?;
        rw.read(name, opts).await
    }

    async fn write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        let t = self.pick(name, true).await?;
        let rw = t.rw.as_ref().ok_or_else(|| missing("read-write lock"))?;
        rw.write(name, opts).await
    }
}

#[async_trait]
impl Semaphore for TieredLocker {
    async fn acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        let t = self.pick(name, true).await?;
        let s = t.semaphore.as_ref().ok_or_else(|| missing("semaphore"))?;
        s.acquire_permit(name, permits, opts).await
    }
}
