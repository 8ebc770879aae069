//! The backend-author traits, and the user API implemented once over them.
//!
//! A backend implements [`LockBackend`] (and [`ElectionBackend`], [`RwBackend`],
//! [`SemaphoreBackend`] for the primitives it offers). The user traits — [`Locker`],
//! [`Election`], [`RwLocker`], [`Semaphore`] — are implemented here, once, for every such
//! backend: each call first fails with [`Error::Closed`] after `close`, and checks the
//! acquire options, the permit count and the value, all before the backend is asked. So a
//! backend never repeats those checks, and a check changed here changes for every backend.
//! Every acquire is also measured here (`metrics` feature): its wait, a timeout, the waiters.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::election::Leader;
use crate::election::validate_value;
use crate::metrics::Wait;
use crate::semaphore::validate_permits;
use crate::{
    AcquireOptions, Capabilities, Counters, Election, Error, LeaderChanges, Leadership, Lease,
    LockName, LockState, Locker, RwLocker, Semaphore, Stats,
};

/// A backend's mutex, for backend authors: [`Locker`] is implemented over it.
///
/// Every method is called only while [`LockBackend::closed`] is false and with input already
/// checked (see the module documentation); each keeps the meaning and the cancel safety of
/// the [`Locker`] method it serves.
#[async_trait]
pub trait LockBackend: Send + Sync + 'static {
    /// Whether the backend was closed ([`LockBackend::shutdown`] was called).
    fn closed(&self) -> bool;

    /// Serves [`Locker::acquire`], with `opts` already checked.
    ///
    /// # Errors
    /// As [`Locker::acquire`].
    async fn lock(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error>;

    /// Serves [`Locker::try_acquire`].
    ///
    /// # Errors
    /// As [`Locker::try_acquire`].
    async fn try_lock(&self, name: &LockName) -> Result<Option<Lease>, Error>;

    /// Serves [`Locker::inspect`].
    ///
    /// # Errors
    /// As [`Locker::inspect`].
    async fn state(&self, name: &LockName) -> Result<LockState, Error>;

    /// Serves [`Locker::close`]; called again after the first close, it does nothing more.
    ///
    /// # Errors
    /// As [`Locker::close`].
    async fn shutdown(&self) -> Result<(), Error>;

    /// Serves [`Locker::ttl`].
    fn lease_ttl(&self) -> Duration;

    /// Serves [`Locker::capabilities`].
    fn guarantees(&self) -> Capabilities;

    /// Serves [`Locker::stats`].
    fn counters(&self) -> Stats;

    /// The live counters behind [`LockBackend::counters`] (built with
    /// [`Counters::labelled`]), whose labels the contract's own metrics carry: acquire waits,
    /// timeouts, waiters (`metrics` feature). The default, `None`, labels those
    /// `backend="unknown"`.
    fn live_counters(&self) -> Option<&Counters> {
        None
    }

    /// Serves [`Locker::into_election`]: `Some(self)` for a backend that implements
    /// [`ElectionBackend`].
    fn election(self: Arc<Self>) -> Option<Arc<dyn Election>> {
        None
    }

    /// Serves [`Locker::into_rw_locker`]: `Some(self)` for a backend that implements
    /// [`RwBackend`].
    fn rw(self: Arc<Self>) -> Option<Arc<dyn RwLocker>> {
        None
    }

    /// Serves [`Locker::into_semaphore`]: `Some(self)` for a backend that implements
    /// [`SemaphoreBackend`].
    fn semaphore(self: Arc<Self>) -> Option<Arc<dyn Semaphore>> {
        None
    }
}

/// A backend's leader election, for backend authors: [`Election`] is implemented over it.
#[async_trait]
pub trait ElectionBackend: LockBackend {
    /// Serves [`Election::campaign`], with `value` and `opts` already checked.
    ///
    /// # Errors
    /// As [`Election::campaign`].
    async fn run_campaign(
        &self,
        name: &LockName,
        value: &[u8],
        opts: AcquireOptions,
    ) -> Result<Leadership, Error>;

    /// Serves [`Election::leader`].
    ///
    /// # Errors
    /// As [`Election::leader`].
    async fn read_leader(&self, name: &LockName) -> Result<Option<Leader>, Error>;

    /// Serves [`Election::observe`].
    ///
    /// # Errors
    /// As [`Election::observe`].
    async fn follow(&self, name: &LockName) -> Result<Box<dyn LeaderChanges>, Error>;
}

/// A backend's read-write lock, for backend authors: [`RwLocker`] is implemented over it.
#[async_trait]
pub trait RwBackend: LockBackend {
    /// Serves [`RwLocker::read`], with `opts` already checked.
    ///
    /// # Errors
    /// As [`RwLocker::read`].
    async fn lock_read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error>;

    /// Serves [`RwLocker::write`], with `opts` already checked.
    ///
    /// # Errors
    /// As [`RwLocker::write`].
    async fn lock_write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error>;
}

/// A backend's counting semaphore, for backend authors: [`Semaphore`] is implemented over it.
#[async_trait]
pub trait SemaphoreBackend: LockBackend {
    /// Serves [`Semaphore::acquire_permit`], with `permits` and `opts` already checked.
    ///
    /// # Errors
    /// As [`Semaphore::acquire_permit`].
    async fn lock_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error>;
}

/// The closed check every call starts with.
fn open(backend: &(impl LockBackend + ?Sized)) -> Result<(), Error> {
    if backend.closed() {
        Err(Error::Closed)
    } else {
        Ok(())
    }
}

#[async_trait]
impl<B: LockBackend> Locker for B {
    async fn acquire(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        opts.validate()?;
        open(self)?;
        let wait = Wait::start(self.live_counters(), name);
        let granted = self.lock(name, opts).await;
        wait.done(&granted);
        granted
    }

    async fn try_acquire(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        open(self)?;
        self.try_lock(name).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState, Error> {
        open(self)?;
        self.state(name).await
    }

    fn ttl(&self) -> Duration {
        self.lease_ttl()
    }

    fn capabilities(&self) -> Capabilities {
        self.guarantees()
    }

    fn stats(&self) -> Stats {
        self.counters()
    }

    async fn close(&self) -> Result<(), Error> {
        self.shutdown().await
    }

    fn into_election(self: Arc<Self>) -> Option<Arc<dyn Election>> {
        self.election()
    }

    fn into_rw_locker(self: Arc<Self>) -> Option<Arc<dyn RwLocker>> {
        self.rw()
    }

    fn into_semaphore(self: Arc<Self>) -> Option<Arc<dyn Semaphore>> {
        self.semaphore()
    }
}

#[async_trait]
impl<B: ElectionBackend> Election for B {
    async fn campaign(
        &self,
        name: &LockName,
        value: &[u8],
        opts: AcquireOptions,
    ) -> Result<Leadership, Error> {
        validate_value(value)?;
        opts.validate()?;
        open(self)?;
        let wait = Wait::start(self.live_counters(), name);
        let elected = self.run_campaign(name, value, opts).await;
        wait.done(&elected);
        elected
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>, Error> {
        open(self)?;
        self.read_leader(name).await
    }

    async fn observe(&self, name: &LockName) -> Result<Box<dyn LeaderChanges>, Error> {
        open(self)?;
        self.follow(name).await
    }
}

#[async_trait]
impl<B: RwBackend> RwLocker for B {
    async fn read(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        opts.validate()?;
        open(self)?;
        let wait = Wait::start(self.live_counters(), name);
        let granted = self.lock_read(name, opts).await;
        wait.done(&granted);
        granted
    }

    async fn write(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        opts.validate()?;
        open(self)?;
        let wait = Wait::start(self.live_counters(), name);
        let granted = self.lock_write(name, opts).await;
        wait.done(&granted);
        granted
    }
}

#[async_trait]
impl<B: SemaphoreBackend> Semaphore for B {
    async fn acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        validate_permits(permits)?;
        opts.validate()?;
        open(self)?;
        let wait = Wait::start(self.live_counters(), name);
        let granted = self.lock_permit(name, permits, opts).await;
        wait.done(&granted);
        granted
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::{ErrorKind, MAX_VALUE_LEN, MAX_WAIT};

    /// A backend that counts every time it is asked: the checks must answer first.
    #[derive(Default)]
    struct Counting {
        closed: AtomicBool,
        asked: AtomicUsize,
    }

    impl Counting {
        fn ask<T>(&self) -> Result<T, Error> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            Err(Error::unavailable("asked", None))
        }
    }

    #[async_trait]
    impl LockBackend for Counting {
        fn closed(&self) -> bool {
            self.closed.load(Ordering::SeqCst)
        }
        async fn lock(&self, _: &LockName, _: AcquireOptions) -> Result<Lease, Error> {
            self.ask()
        }
        async fn try_lock(&self, _: &LockName) -> Result<Option<Lease>, Error> {
            self.ask()
        }
        async fn state(&self, _: &LockName) -> Result<LockState, Error> {
            self.ask()
        }
        async fn shutdown(&self) -> Result<(), Error> {
            self.closed.store(true, Ordering::SeqCst);
            Ok(())
        }
        fn lease_ttl(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn guarantees(&self) -> Capabilities {
            Capabilities::new(Duration::from_secs(1))
        }
        fn counters(&self) -> Stats {
            Stats::default()
        }
        fn election(self: Arc<Self>) -> Option<Arc<dyn Election>> {
            Some(self)
        }
        fn semaphore(self: Arc<Self>) -> Option<Arc<dyn Semaphore>> {
            Some(self)
        }
    }

    #[async_trait]
    impl ElectionBackend for Counting {
        async fn run_campaign(
            &self,
            _: &LockName,
            _: &[u8],
            _: AcquireOptions,
        ) -> Result<Leadership, Error> {
            self.ask()
        }
        async fn read_leader(&self, _: &LockName) -> Result<Option<Leader>, Error> {
            self.ask()
        }
        async fn follow(&self, _: &LockName) -> Result<Box<dyn LeaderChanges>, Error> {
            self.ask()
        }
    }

    #[async_trait]
    impl SemaphoreBackend for Counting {
        async fn lock_permit(
            &self,
            _: &LockName,
            _: u32,
            _: AcquireOptions,
        ) -> Result<Lease, Error> {
            self.ask()
        }
    }

    #[tokio::test]
    async fn bad_input_and_a_closed_locker_are_refused_before_the_backend_is_asked() {
        let b = Arc::new(Counting::default());
        let n = LockName::new("n").expect("a valid name");
        let too_long = AcquireOptions::wait(MAX_WAIT * 2);
        let kind = |r: Result<_, Error>| r.map(|_: ()| ()).expect_err("refused").kind();
        assert_eq!(
            kind(b.acquire(&n, too_long).await.map(drop)),
            ErrorKind::InvalidInput
        );
        let sem = Arc::clone(&b).into_semaphore().expect("offered");
        let permits = sem.acquire_permit(&n, 0, AcquireOptions::forever()).await;
        assert_eq!(kind(permits.map(drop)), ErrorKind::InvalidInput);
        let value = vec![0; MAX_VALUE_LEN + 1];
        let election = Arc::clone(&b).into_election().expect("offered");
        let campaign = election
            .campaign(&n, &value, AcquireOptions::forever())
            .await;
        assert_eq!(kind(campaign.map(drop)), ErrorKind::InvalidInput);
        assert!(Arc::clone(&b).into_rw_locker().is_none());
        assert_eq!(b.asked.load(Ordering::SeqCst), 0);

        // Good input reaches the backend.
        assert!(b.acquire(&n, AcquireOptions::forever()).await.is_err());
        assert_eq!(b.asked.load(Ordering::SeqCst), 1);

        b.close().await.expect("closed");
        assert_eq!(
            kind(b.acquire(&n, AcquireOptions::forever()).await.map(drop)),
            ErrorKind::Closed
        );
        assert_eq!(kind(b.try_acquire(&n).await.map(drop)), ErrorKind::Closed);
        assert_eq!(kind(b.inspect(&n).await.map(drop)), ErrorKind::Closed);
        assert_eq!(kind(election.leader(&n).await.map(drop)), ErrorKind::Closed);
        assert_eq!(
            kind(election.observe(&n).await.map(drop)),
            ErrorKind::Closed
        );
        let permit = sem.acquire_permit(&n, 1, AcquireOptions::forever()).await;
        assert_eq!(kind(permit.map(drop)), ErrorKind::Closed);
        assert_eq!(b.asked.load(Ordering::SeqCst), 1);
    }
}
