//! Redlock over N independent Redis nodes.

mod acquire;
mod backend;
mod inspect;
mod quorum;
mod raise;
mod tally;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Background, Counters, LockBackend, RenewalDriver, validate_ttl};
use dlock_core::{
    AcquireOptions, Capabilities, Error, FencingStrength, Lease, LockName, Primitives, Stats,
};

use crate::conn;
use crate::keys::{namespace_prefix, validate_prefix};
use backend::{RedlockBackend, Renewer};

/// The most nodes a Redlock locker accepts.
pub const MAX_NODES: usize = 63;

/// A lock over N independent Redis masters (the Redlock algorithm).
///
/// - **Acquire**: `SET NX PX` with a random 128-bit owner value and, only when that granted,
///   the node's next token (one small script), sent to every node at once, each bounded by a small per-node timeout. The lock
///   is granted when a quorum (N/2+1) agreed and the validity `TTL − elapsed − (TTL·1% + 2 ms)`
///   (saturating) is still positive. Otherwise every node is unlocked (also those that seemed
///   to refuse: a reply may have been lost) and, when waiting, the attempt is retried after a
///   random delay. One node's error never aborts an attempt; it is counted as a refusal and
///   reported in [`Error::QuorumNotReached`] when it matters. When so many nodes are down
///   (refused, reset) that no quorum is possible, acquire returns that error at once; slow
///   nodes are retried until the wait ends.
/// - **Fencing**: the token is the maximum of the counters of the granting nodes; before the
///   lease is handed out, every granting node whose counter is lower is raised to it, so that
///   a majority holds a counter ≥ the token and the next grant's majority (which intersects
///   it) can only produce a larger one. Every other node (it refused, was slow or down) is
///   raised to the token in the background, retried until it answers while the locker lives,
///   so that one node restarted empty and one that missed grants cannot form a quorum that
///   repeats a token (the uncontended grant, where every node granted at the same counter,
///   needs neither).
/// - **Renewal**: compare-and-`PEXPIRE` of every held lease on every node in one round trip;
///   a lease is extended when a majority confirmed it within its validity. A round ends as
///   soon as the answers so far settle every lease, so a dead or hung node never holds up a
///   majority that already answered. Each lease gets its own verdict: one that this round
///   cannot decide keeps its deadline and is retried soon, without failing the others. A key
///   that expired or vanished on a node (restart) is never re-created there.
/// - **Release**: compare-and-delete on every node.
///
/// # Assumptions
/// Redlock's safety, and the monotonicity of its fencing tokens, hold only when:
/// - clocks of clients and servers advance at nearly the same RATE (the 1 % + 2 ms drift
///   allowance); no absolute synchronisation is needed;
/// - a node that restarts either keeps its data (AOF with `appendfsync always`) or stays down
///   for longer than the TTL before it rejoins; a node that forgets its keys AND its fence
///   counters while a majority still agrees cannot grant on its own, but repeated amnesia of
///   a majority can break both mutual exclusion and token order;
/// - a holder finishes its work within the lease's deadline (watch [`Lease::lost`]) and the
///   protected resource checks the fencing token.
///
/// # Cancel safety
/// Dropping a pending `acquire` or `try_acquire` unlocks every node in the background; a
/// failed attempt unlocks every node before it returns.
///
/// Redlock is not fair: waiters retry after random delays, so it reports neither `fair` nor
/// `herd_free`, and its fencing strength is [`FencingStrength::Assumed`].
///
/// ```no_run
/// use std::time::Duration;
/// use dlock_core::{AcquireOptions, LockName, Locker};
/// use dlock_redis::RedlockLocker;
/// # async fn demo() -> Result<(), dlock_core::Error> {
/// let locker = RedlockLocker::builder()
///     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .ttl(Duration::from_secs(10))
///     .build()?;
/// let lease = locker.acquire(&LockName::new("report")?, AcquireOptions::wait(Duration::from_secs(5))).await?;
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockLocker {
    inner: Arc<RInner>,
}

struct RInner {
    backend: Arc<RedlockBackend>,
    driver: RenewalDriver<Renewer>,
    counters: Arc<Counters>,
    prefix: String,
    ttl: Duration,
    retry_delay: Duration,
}

impl std::fmt::Debug for RedlockLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockLocker")
            .field("nodes", &self.inner.backend.nodes)
            .field("quorum", &self.inner.backend.quorum)
            .field("prefix", &self.inner.prefix)
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedlockLocker`]; see [`RedlockLocker::builder`].
///
/// Its `Debug` output masks the passwords in the node URLs.
#[derive(Clone)]
#[must_use]
pub struct RedlockLockerBuilder {
    nodes: Vec<String>,
    ttl: Duration,
    prefix: Result<String, Error>,
    node_timeout: Option<Duration>,
    retry_delay: Duration,
    root_pem: Option<Vec<u8>>,
    identity: Option<crate::conn::Identity>,
}

impl std::fmt::Debug for RedlockLockerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|u| crate::conn::redact_url(u))
            .collect();
        f.debug_struct("RedlockLockerBuilder")
            .field("nodes", &nodes)
            .field("ttl", &self.ttl)
            .field("prefix", &self.prefix)
            .field("node_timeout", &self.node_timeout)
            .field("retry_delay", &self.retry_delay)
            .field("root_pem", &self.root_pem.as_ref().map(Vec::len))
            .field("tls_client_identity", &self.identity.is_some())
            .finish()
    }
}

impl RedlockLocker {
    /// A builder with the defaults: TTL 30 s, no key prefix.
    pub fn builder() -> RedlockLockerBuilder {
        RedlockLockerBuilder {
            nodes: Vec::new(),
            ttl: crate::DEFAULT_TTL,
            prefix: Ok(String::new()),
            node_timeout: None,
            retry_delay: crate::DEFAULT_RETRY_DELAY,
            root_pem: None,
            identity: None,
        }
    }

    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.inner.backend.quorum
    }

    /// How many leases the locker holds and renews now.
    pub fn held(&self) -> usize {
        self.inner.driver.len()
    }
}

impl RedlockLockerBuilder {
    /// The independent Redis masters (URLs as for [`RedisLockerBuilder::url`](crate::RedisLockerBuilder::url)).
    pub fn nodes<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nodes = urls.into_iter().map(Into::into).collect();
        self
    }

    /// The lease TTL (default 30 s; 100 ms ..= 24 h).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// A raw prefix for every key (printable ASCII, no whitespace, no `{` or `}`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.prefix = validate_prefix(&prefix).map(|()| prefix);
        self
    }

    /// A namespace: segments of `[A-Za-z0-9._-]` joined by `/`; keys get the prefix
    /// `<namespace>/`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.prefix = namespace_prefix(namespace);
        self
    }

    /// The bound on one request to one node (default TTL/5, between 50 ms and 1 s). A
    /// slow node then counts as a refusal instead of eating the validity.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// The upper bound of the random delay between attempts (default 50 ms).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// For `rediss://` nodes: trust only these root certificates (PEM, one or more) instead of
    /// the system's, e.g. a private CA. Every node must then use `rediss://`. Checked by
    /// [`build`](Self::build).
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_pem = Some(pem.into());
        self
    }

    /// For `rediss://` nodes: present this client certificate (PEM chain) and private key
    /// (PEM) to every node, for servers that require client certificates. Checked by
    /// [`build`](Self::build); the key never appears in `Debug` output or errors.
    pub fn tls_client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Checks every option the way [`build`](Self::build) does, without building (no I/O, no
    /// runtime needed): for configuration checks at startup.
    ///
    /// # Errors
    /// As [`build`](Self::build), except the tokio runtime check.
    pub fn validate(&self) -> Result<(), Error> {
        self.checked().map(|_| ())
    }

    /// The validated options `build` uses.
    fn checked(&self) -> Result<Checked, Error> {
        let ttl = validate_ttl(self.ttl)?;
        let prefix = self.prefix.clone()?;
        if self.nodes.is_empty() || self.nodes.len() > MAX_NODES {
            return Err(Error::invalid_option(
                "nodes",
                format!(
                    "{} nodes given; Redlock needs 1 ..= {MAX_NODES}",
                    self.nodes.len()
                ),
            ));
        }
        let mut clients = Vec::with_capacity(self.nodes.len());
        let mut seen = HashSet::new();
        for url in &self.nodes {
            let client = conn::parse_url_with_roots(
                "nodes",
                url,
                self.root_pem.as_deref(),
                self.identity.as_ref(),
            )?;
            let addr = client.get_connection_info().addr().to_string();
            if !seen.insert(addr.clone()) {
                return Err(Error::invalid_option(
                    "nodes",
                    format!("{addr} is listed twice; every node must be an independent server"),
                ));
            }
            clients.push(client);
        }
        let node_timeout = match self.node_timeout {
            None => (ttl / 5).clamp(Duration::from_millis(50), Duration::from_secs(1)),
            Some(t) if t.is_zero() || t >= ttl => {
                return Err(Error::invalid_option(
                    "node_timeout",
                    format!("{t:?} must be above zero and below the TTL {ttl:?}"),
                ));
            }
            Some(t) => t,
        };
        if self.retry_delay.is_zero() || self.retry_delay > ttl {
            return Err(Error::invalid_option(
                "retry_delay",
                format!(
                    "{:?} must be above zero and at most the TTL {ttl:?}",
                    self.retry_delay
                ),
            ));
        }
        Ok(Checked {
            ttl,
            prefix,
            clients,
            node_timeout,
        })
    }

    /// Checks every option (before any I/O) and builds the locker. The build never waits for
    /// the network: connections are opened in the background; nodes that are down only make
    /// their requests fail.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for no nodes, more than [`MAX_NODES`], a malformed or duplicate
    /// URL (or `#insecure`), root certificates that are not PEM or come with a `redis://` node,
    /// a TTL out of range, a bad prefix or namespace, a node timeout that is zero or not
    /// below the TTL, a zero or too long retry delay, or when called outside a tokio runtime.
    pub fn build(self) -> Result<RedlockLocker, Error> {
        let Checked {
            ttl,
            prefix,
            clients,
            node_timeout,
        } = self.checked()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid_option(
                "runtime",
                "a RedlockLocker must be built inside a tokio runtime",
            ));
        }
        let nodes = clients
            .into_iter()
            .map(|c| conn::open(c, node_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        for node in &nodes {
            conn::warm_up(node, node_timeout.max(Duration::from_secs(1)));
        }
        let counters = Arc::new(Counters::default());
        let backend = Arc::new(RedlockBackend {
            quorum: quorum::quorum(nodes.len()),
            raiser: raise::Raiser::new(nodes.len()),
            nodes,
            ttl,
            node_timeout,
            counters: Arc::clone(&counters),
            background: Background::new(),
        });
        let driver = RenewalDriver::with_background(
            Arc::new(Renewer(Arc::clone(&backend))),
            ttl,
            Arc::clone(&counters),
            backend.background.clone(),
        );
        Ok(RedlockLocker {
            inner: Arc::new(RInner {
                backend,
                driver,
                counters,
                prefix,
                ttl,
                retry_delay: self.retry_delay,
            }),
        })
    }
}

#[async_trait]
impl LockBackend for RedlockLocker {
    fn closed(&self) -> bool {
        self.inner.driver.is_closed()
    }

    async fn lock(&self, name: &LockName, opts: AcquireOptions) -> Result<Lease, Error> {
        acquire::acquire(&self.inner, name, opts.wait).await
    }

    async fn try_lock(&self, name: &LockName) -> Result<Option<Lease>, Error> {
        acquire::try_acquire(&self.inner, name).await
    }

    /// Reads every node at once (one read-only script each, within the node timeout): the
    /// holder is the owner value a quorum of them hold; see `redlock::inspect`.
    async fn state(&self, name: &LockName) -> Result<dlock_core::LockState, Error> {
        inspect::inspect(&self.inner, name).await
    }

    fn lease_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Ends every lease and deletes its key on every node (guarded deletes, all at once).
    async fn shutdown(&self) -> Result<(), Error> {
        self.inner.driver.close().await
    }

    fn guarantees(&self) -> Capabilities {
        Capabilities::new(self.inner.ttl)
            .with_fair_queue(false, false)
            .with_fencing(FencingStrength::Assumed)
            .with_crash_release_slack(Duration::from_millis(250))
            // One server cannot record a leader, readers or permits for a quorum: see the
            // crate docs.
            .with_primitives(Primitives::MUTEX_ONLY)
    }

    fn counters(&self) -> Stats {
        self.inner.counters.snapshot()
    }
}

/// A [`RedlockLockerBuilder`]'s options, validated.
struct Checked {
    ttl: Duration,
    prefix: String,
    clients: Vec<redis::Client>,
    node_timeout: Duration,
}
