//! `RedlockLockerBuilder`: the Redlock locker's options, checked before any I/O, and the build
//! that turns them into a `RedlockLocker`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Background, Counters, RenewalDriver};
use dlock_core::{CommonOptions, Error};

use super::renew::{RedlockBackend, Renewer};
use super::{MAX_NODES, RInner, RedlockLocker, quorum, raise};
use crate::DEFAULT_RETRY_DELAY;
use crate::builder::{check_retry_delay, checked_ttl, in_runtime};
use crate::conn;
use crate::keys::key_prefix;

/// Builds a [`RedlockLocker`]; see [`RedlockLocker::builder`].
///
/// TLS material (`tls_root_certificates`, `tls_client_identity`) needs `rediss://` nodes and
/// goes to every node. Its `Debug` output masks the passwords in the node URLs.
#[derive(Clone)]
#[must_use]
pub struct RedlockLockerBuilder {
    nodes: Vec<String>,
    common: CommonOptions,
    /// The raw key prefix (before the namespace).
    prefix: String,
    node_timeout: Option<Duration>,
    retry_delay: Duration,
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
            .field("common", &self.common)
            .field("prefix", &self.prefix)
            .field("node_timeout", &self.node_timeout)
            .field("retry_delay", &self.retry_delay)
            .finish()
    }
}

impl RedlockLocker {
    /// A builder with the defaults: TTL 30 s, no key prefix.
    pub fn builder() -> RedlockLockerBuilder {
        RedlockLockerBuilder {
            nodes: Vec::new(),
            common: CommonOptions::default(),
            prefix: String::new(),
            node_timeout: None,
            retry_delay: DEFAULT_RETRY_DELAY,
        }
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

    dlock_core::common_builder_options!(
        "Default [`DEFAULT_TTL`](crate::DEFAULT_TTL) (30 s); leases are renewed every TTL/3."
    );

    /// A raw prefix for every key, as [`RedisLockerBuilder::prefix`](crate::RedisLockerBuilder::prefix).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
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
        let ttl = checked_ttl(&self.common)?;
        let prefix = key_prefix(&self.prefix, self.common.namespace())?;
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
            let client = crate::tls::client("nodes", url, &self.common)?;
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
        check_retry_delay(self.retry_delay, ttl)?;
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
    /// URL (or `#insecure`), TLS material that is not PEM (or a key that does not go with its
    /// certificate) or comes with a `redis://` node,
    /// a TTL out of range, a bad prefix or namespace, a node timeout that is zero or not
    /// below the TTL, a zero or too long retry delay, or when called outside a tokio runtime.
    pub async fn build(self) -> Result<RedlockLocker, Error> {
        let Checked {
            ttl,
            prefix,
            clients,
            node_timeout,
        } = self.checked()?;
        in_runtime("RedlockLocker")?;
        let nodes = clients
            .into_iter()
            .map(|c| conn::open(c, node_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        for node in &nodes {
            conn::warm_up(node, node_timeout.max(Duration::from_secs(1)));
        }
        let counters = Arc::new(Counters::labelled("redlock", &self.common));
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

/// A [`RedlockLockerBuilder`]'s options, validated.
struct Checked {
    ttl: Duration,
    prefix: String,
    clients: Vec<redis::Client>,
    node_timeout: Duration,
}
