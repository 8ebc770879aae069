//! `RedisLockerBuilder`: the single-node locker's options, checked before any I/O, and the
//! build that turns them into a `RedisLocker`.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use dlock_core::backend::{Background, Counters, RenewalDriver};
use dlock_core::{CommonOptions, Error};

use crate::acquire::{grant, hints, notify::Notifier};
use crate::conn::{self, Node};
use crate::keys::{self, key_prefix};
use crate::locker::{Inner, RedisLocker};
use crate::renew::SingleBackend;
use crate::tls;

/// The default lease TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The default upper bound of the randomized retry delay in non-fair mode.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// Builds a [`RedisLocker`]; see [`RedisLocker::builder`].
///
/// TLS material (`tls_root_certificates`, `tls_client_identity`) needs a `rediss://` URL or
/// cluster nodes, or [`tls`](Self::tls) with sentinels; a server that refuses the client
/// certificate fails the first request with a non-retryable error.
///
/// Its `Debug` output shows no password: the URL's is masked, the sentinel and master
/// passwords show only whether they are set.
#[derive(Clone)]
#[must_use]
pub struct RedisLockerBuilder {
    url: Option<String>,
    /// A client the application built itself (instead of `url`).
    client: Option<redis::Client>,
    common: CommonOptions,
    /// The raw key prefix (before the namespace).
    prefix: String,
    fair: bool,
    request_timeout: Option<Duration>,
    retry_delay: Duration,
    replicas: Option<(usize, Duration)>,
    /// The sentinels' addresses and the master's name.
    sentinels: Option<(Vec<String>, String)>,
    sentinel_password: Option<String>,
    master_username: Option<String>,
    master_password: Option<String>,
    tls: bool,
    /// A Redis Cluster's seed node URLs.
    cluster: Option<Vec<String>>,
    /// Announced `host:port` → the `host:port` to connect to instead.
    cluster_address_map: Vec<(String, String)>,
}

impl std::fmt::Debug for RedisLockerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLockerBuilder")
            .field("url", &self.url.as_deref().map(crate::conn::redact_url))
            .field("common", &self.common)
            .field("prefix", &self.prefix)
            .field("fair", &self.fair)
            .field("request_timeout", &self.request_timeout)
            .field("retry_delay", &self.retry_delay)
            .field("replicas", &self.replicas)
            .field("sentinels", &self.sentinels)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "<set>"),
            )
            .field("master_username", &self.master_username)
            .field(
                "master_password",
                &self.master_password.as_ref().map(|_| "<set>"),
            )
            .field("tls", &self.tls)
            .field(
                "cluster",
                &self.cluster.as_ref().map(|seeds| {
                    seeds
                        .iter()
                        .map(|u| crate::conn::redact_url(u))
                        .collect::<Vec<_>>()
                }),
            )
            .field("cluster_address_map", &self.cluster_address_map)
            .finish()
    }
}

/// The most sentinels a locker accepts.
pub const MAX_SENTINELS: usize = 16;

/// The most cluster seed nodes (and address map entries) a locker accepts.
pub const MAX_CLUSTER_NODES: usize = 1000;

impl RedisLocker {
    /// A builder with the defaults: TTL 30 s, no key prefix, fair mode on.
    pub fn builder() -> RedisLockerBuilder {
        RedisLockerBuilder {
            url: None,
            client: None,
            common: CommonOptions::default(),
            prefix: String::new(),
            fair: true,
            request_timeout: None,
            retry_delay: DEFAULT_RETRY_DELAY,
            replicas: None,
            sentinels: None,
            sentinel_password: None,
            master_username: None,
            master_password: None,
            tls: false,
            cluster: None,
            cluster_address_map: Vec::new(),
        }
    }
}

impl RedisLockerBuilder {
    /// The server, as a `redis::Client` the application already built (its connection info,
    /// credentials and TLS settings are used as they are), instead of [`url`](Self::url). The
    /// locker opens its own connections from it: a connection manager for requests and one
    /// for notifications, so the application's connections are never blocked by a lock wait.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let locker = dlock_redis::RedisLocker::builder().client(client.clone()).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn client(mut self, client: redis::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// The server: `redis://[user:password@]host:port[/db]`, `rediss://…` for TLS, or
    /// `unix:///path`. AUTH credentials in the URL are used on every connection.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Find the master through Redis Sentinel instead of a fixed [`url`](Self::url): the
    /// sentinels' addresses (`host:port`, `[v6]:port`) and the name they monitor the master
    /// under (`sentinel monitor <master_name> …`).
    ///
    /// The first request asks each sentinel in turn (`SENTINEL get-master-addr-by-name`, each
    /// within the request timeout) and uses the first address that answers `ROLE` as a
    /// master. Whenever the server stops being a usable master (`READONLY`, `NOREPLICAS`,
    /// `LOADING`, …), becomes unreachable, or times out 3 times in a row, the sentinels are
    /// asked again: the locker follows a failover. Requests made meanwhile fail with
    /// [`Error::Unavailable`] (retried within an acquire's wait). A user with ACL rules also
    /// needs `+role` on the master. The data connection uses
    /// [`master_username`](Self::master_username) / [`master_password`](Self::master_password),
    /// [`tls`](Self::tls) and [`tls_root_certificates`](Self::tls_root_certificates); the
    /// sentinels [`sentinel_password`](Self::sentinel_password) and the same TLS settings.
    ///
    /// Leases survive a failover only if their keys reached the promoted replica, and a holder
    /// may still renew on the old master until the sentinels demote it: give the data servers
    /// `min-replicas-to-write 1` (see the crate README's "Deployments", and
    /// [`wait_for_replicas`](Self::wait_for_replicas)).
    ///
    /// # Errors
    /// [`build`](Self::build) fails with [`Error::InvalidOption`]
    /// ([`ErrorKind::InvalidInput`](dlock_core::ErrorKind::InvalidInput)), before any I/O,
    /// when both or neither of `url` and `sentinels` are given, when there is no sentinel,
    /// more than [`MAX_SENTINELS`], a duplicate or an address that is not `host:port`, or
    /// when the master name is empty or not printable ASCII without whitespace.
    pub fn sentinels<I, S>(mut self, addrs: I, master_name: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sentinels = Some((
            addrs.into_iter().map(Into::into).collect(),
            master_name.into(),
        ));
        self
    }

    /// Use a Redis Cluster instead of a fixed [`url`](Self::url): the URLs of some of its
    /// master nodes (`redis://[user:password@]host:port` or `rediss://…`; the others are
    /// found through them). Every URL must use the same scheme and credentials.
    ///
    /// All keys of one lock name share a hash tag, so each lock lives in one slot and every
    /// request for it goes to that slot's master (redis-rs' cluster connection, following
    /// `MOVED` during a resharding and `ASK` during a slot migration). The leases a locker
    /// holds are renewed with one round trip per master per period (one script call per slot
    /// it holds leases in, pipelined). Wake-ups use plain `PUBLISH`, which a cluster forwards
    /// to every node, so the locker's one subscription may sit on any node (it moves to the
    /// next seed node when its node fails). Fencing tokens are per name (the counter lives in
    /// the name's slot and moves with it), raised to the server clock like on a single server.
    ///
    /// A lease lives only on its slot's master: when that master fails (killed, or failed over
    /// to a replica that had not received the lease), the lease is lost no later than its
    /// deadline, as on a single server. [`wait_for_replicas`](Self::wait_for_replicas) is not
    /// supported with a cluster.
    ///
    /// # Errors
    /// [`build`](Self::build) fails with [`Error::InvalidOption`] before any I/O when more
    /// than one of `url`, `sentinels` and `cluster` is given, when there is no node or more
    /// than [`MAX_CLUSTER_NODES`], a duplicate, a URL that does not parse, a `unix://` URL,
    /// or URLs that differ in scheme or credentials.
    pub fn cluster<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.cluster = Some(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// With [`cluster`](Self::cluster): connect to `reachable` (`host:port`) whenever the
    /// cluster names the node `announced` (`host:port`, as `CLUSTER SLOTS` and `MOVED` replies
    /// give it) — for a cluster behind NAT or port mappings, or whose nodes announce IP
    /// addresses their TLS certificates do not name. May be called once per node.
    ///
    /// # Errors
    /// [`build`](Self::build) fails with [`Error::InvalidOption`] when either address is not
    /// `host:port`, an announced address is mapped twice, or without `cluster`.
    pub fn cluster_address_map(
        mut self,
        announced: impl Into<String>,
        reachable: impl Into<String>,
    ) -> Self {
        self.cluster_address_map
            .push((announced.into(), reachable.into()));
        self
    }

    /// With [`sentinels`](Self::sentinels): the password the sentinels require
    /// (`requirepass` in their configuration; default none).
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_password = Some(password.into());
        self
    }

    /// With [`sentinels`](Self::sentinels): the ACL user of the master's connection (with
    /// [`url`](Self::url), put it in the URL).
    pub fn master_username(mut self, username: impl Into<String>) -> Self {
        self.master_username = Some(username.into());
        self
    }

    /// With [`sentinels`](Self::sentinels): the password of the master's connection (with
    /// [`url`](Self::url), put it in the URL).
    pub fn master_password(mut self, password: impl Into<String>) -> Self {
        self.master_password = Some(password.into());
        self
    }

    /// With [`sentinels`](Self::sentinels): connect to the sentinels and the master over TLS
    /// (default off; with [`url`](Self::url), use `rediss://`). The certificates must name
    /// the addresses the sentinels report (usually IP addresses).
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    dlock_core::common_builder_options!(
        "Default [`DEFAULT_TTL`] (30 s); leases are renewed every TTL/3."
    );

    /// A raw prefix for every key, before the [`namespace`](Self::namespace)'s `<namespace>/`
    /// (default none): printable ASCII, no whitespace, no `{` or `}`, at most 512 bytes with
    /// the namespace. Checked by [`validate`](Self::validate) and [`build`](Self::build).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Fair mode (default on): FIFO grants, only the head waiter is woken on release.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// The bound on one request to the server (default TTL/3, at most 2 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// After every grant, wait until at least `replicas` replicas acknowledged it (`WAIT`),
    /// for at most `timeout` (default: off). A grant fewer replicas acknowledged is given back
    /// and the attempt fails with [`Error::Unavailable`], so a failover to an acknowledging
    /// replica cannot lose a granted lock. It narrows, but does not close, the window of
    /// Redis' asynchronous replication (a replica that acknowledged may still not be the one
    /// promoted; renewals are not acknowledged). `WAIT` runs on connections of its own (a
    /// few idle ones are kept), so the locker's other requests, its renewals among them, never
    /// queue behind it.
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// Non-fair mode: the upper bound of the randomized retry delay (default 50 ms).
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
        let ttl = checked_ttl(&self.common)?;
        self.target()?;
        self.request_timeout_or_default()?;
        key_prefix(&self.prefix, self.common.namespace())?;
        check_retry_delay(self.retry_delay, ttl)?;
        if let Some((replicas, timeout)) = self.replicas
            && (replicas == 0 || timeout.is_zero() || timeout >= ttl / 2)
        {
            return Err(Error::invalid_option(
                "wait_for_replicas",
                format!(
                    "{replicas} replicas within {timeout:?}: needs at least one replica and a timeout above zero and below half the TTL {ttl:?}"
                ),
            ));
        }
        Ok(())
    }

    /// Checks every option (before any I/O) and builds the locker. The build never waits for
    /// the network: the connection is opened in the background, so a server that is down makes
    /// requests fail with [`Error::Unavailable`], not the build.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a missing or malformed URL (or `#insecure`), more than one
    /// or none of a URL, [`sentinels`](Self::sentinels) and [`cluster`](Self::cluster), bad
    /// cluster nodes or address map (see there), bad sentinel addresses or master name
    /// (see there), sentinel-only options with a URL, TLS material that is not PEM (or a key
    /// that does not go with its certificate) or comes without a `rediss://` URL (or TLS), a
    /// TTL out of range, a bad prefix or namespace, a zero or too long request timeout or retry delay, a replica
    /// acknowledgement of no replica or with a timeout not below half the TTL, or when called
    /// outside a tokio runtime.
    pub async fn build(self) -> Result<RedisLocker, Error> {
        self.validate()?;
        let ttl = self.common.ttl_or(DEFAULT_TTL);
        let target = self.target()?;
        let request_timeout = self.request_timeout_or_default()?;
        let prefix = key_prefix(&self.prefix, self.common.namespace())?;
        in_runtime("RedisLocker")?;
        let node: Node = match target {
            Target::Url(client) => conn::open(client, request_timeout)?,
            Target::Sentinels(sentinels) => conn::open_sentinel(sentinels, request_timeout),
            Target::Cluster(cluster, display) => {
                conn::open_cluster(*cluster, display, request_timeout)
            }
        };
        conn::warm_up(&node, request_timeout.max(Duration::from_secs(1)));
        let counters = Arc::new(Counters::labelled("redis", &self.common));
        let locker_id = keys::random_id();
        let channel_prefix = format!("{prefix}dlock:notify:");
        let node_for_notifier = node.clone();
        let backend = Arc::new(SingleBackend {
            node,
            ttl,
            fair: self.fair,
            channel_prefix: channel_prefix.clone(),
            request_timeout,
            counters: Arc::clone(&counters),
            slot_map: std::sync::Mutex::new(None),
            background: Background::new(),
        });
        let driver = RenewalDriver::with_background(
            Arc::clone(&backend),
            ttl,
            Arc::clone(&counters),
            backend.background.clone(),
        );
        let notifier = Notifier::new(
            node_for_notifier,
            format!("{channel_prefix}{locker_id}"),
            request_timeout.max(Duration::from_millis(500)),
        );
        Ok(RedisLocker {
            inner: Arc::new(Inner {
                backend,
                driver,
                counters,
                prefix,
                ttl,
                fair: self.fair,
                request_timeout,
                retry_delay: self.retry_delay,
                replicas: self.replicas,
                wait_conns: grant::WaitConns::default(),
                notifier,
                locker_id,
                seq: AtomicU64::new(0),
                contended: hints::Contended::default(),
            }),
        })
    }
}

/// Checks the common options against [`DEFAULT_TTL`] and returns the TTL they give: the
/// first check of both builders.
pub(crate) fn checked_ttl(common: &CommonOptions) -> Result<Duration, Error> {
    common.validate(DEFAULT_TTL)?;
    Ok(common.ttl_or(DEFAULT_TTL))
}

/// Refuses a retry delay that is zero or longer than the TTL (both builders take one).
pub(crate) fn check_retry_delay(delay: Duration, ttl: Duration) -> Result<(), Error> {
    if delay.is_zero() || delay > ttl {
        return Err(Error::invalid_option(
            "retry_delay",
            format!("{delay:?} must be above zero and at most the TTL {ttl:?}"),
        ));
    }
    Ok(())
}

/// Refuses a build outside a tokio runtime (the locker spawns its background tasks there);
/// `locker` names the type built.
pub(crate) fn in_runtime(locker: &str) -> Result<(), Error> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::invalid_option(
            "runtime",
            format!("a {locker} must be built inside a tokio runtime"),
        ));
    }
    Ok(())
}

/// Where a locker's server is (validated, no I/O yet).
enum Target {
    Url(redis::Client),
    Sentinels(conn::Sentinels),
    /// The cluster and its display name (the seed addresses, never the password).
    Cluster(Box<conn::ClusterTarget>, String),
}

impl RedisLockerBuilder {
    /// The server the options name: a URL, sentinels or a cluster, exactly one of them.
    fn target(&self) -> Result<Target, Error> {
        if let Some(client) = &self.client {
            let conflicting = [
                ("url", self.url.is_some()),
                ("sentinels", self.sentinels.is_some()),
                ("cluster", self.cluster.is_some()),
                (tls::option_given(&self.common), self.common.wants_tls()),
            ];
            if let Some((option, _)) = conflicting.into_iter().find(|(_, set)| *set) {
                return Err(Error::invalid_option(
                    option,
                    "not with `client`: the client already says where the server is and how to reach it",
                ));
            }
            return Ok(Target::Url(client.clone()));
        }
        if self.cluster.is_none() && !self.cluster_address_map.is_empty() {
            return Err(Error::invalid_option(
                "cluster_address_map",
                "only with `cluster`",
            ));
        }
        if let Some(nodes) = &self.cluster {
            if self.url.is_some() || self.sentinels.is_some() {
                return Err(Error::invalid_option(
                    "cluster",
                    "`url`, `sentinels` and `cluster` are mutually exclusive: give one of them",
                ));
            }
            return self
                .cluster_target(nodes, self.request_timeout_or_default()?)
                .map(|(t, d)| Target::Cluster(Box::new(t), d));
        }
        let (addrs, master) = match (&self.url, &self.sentinels) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid_option(
                    "sentinels",
                    "`url` and `sentinels` are mutually exclusive: give one of them",
                ));
            }
            (None, None) => {
                return Err(Error::invalid_option(
                    "url",
                    "a Redis URL (or `client`, `sentinels` or `cluster`) is required",
                ));
            }
            (Some(url), None) => {
                self.no_sentinel_options("with a URL, put credentials in the URL")?;
                return Ok(Target::Url(tls::client("url", url, &self.common)?));
            }
            (None, Some(s)) => s,
        };
        if addrs.is_empty() || addrs.len() > MAX_SENTINELS {
            return Err(Error::invalid_option(
                "sentinels",
                format!(
                    "{} sentinels: give 1 to {MAX_SENTINELS} addresses",
                    addrs.len()
                ),
            ));
        }
        if master.is_empty() || master.len() > 256 || !master.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(Error::invalid_option(
                "sentinels",
                format!(
                    "master name {master:?} must be 1 to 256 printable ASCII characters without whitespace"
                ),
            ));
        }
        if self.common.wants_tls() && !self.tls {
            return Err(Error::invalid_option(
                tls::option_given(&self.common),
                "TLS certificates need TLS: call `.tls(true)` with sentinels",
            ));
        }
        let certs = tls::certificates(&self.common);
        let mut clients = Vec::with_capacity(addrs.len());
        for (i, addr) in addrs.iter().enumerate() {
            if addrs[..i].contains(addr) {
                return Err(Error::invalid_option(
                    "sentinels",
                    format!("duplicate sentinel address {addr:?}"),
                ));
            }
            let (host, port) = conn::parse_host_port(addr).ok_or_else(|| {
                Error::invalid_option(
                    "sentinels",
                    format!("{addr:?} is not a sentinel address `host:port`"),
                )
            })?;
            let client = conn::client_for(
                &host,
                port,
                self.tls,
                certs.as_ref(),
                None,
                self.sentinel_password.as_deref(),
            )
            .map_err(|e| {
                Error::invalid_option(
                    "sentinels",
                    format!(
                        "cannot use {addr:?}: {}",
                        e.detail().unwrap_or("invalid address")
                    ),
                )
            })?;
            clients.push(client);
        }
        Ok(Target::Sentinels(conn::Sentinels {
            sentinels: clients,
            addrs: addrs.clone(),
            master: master.clone(),
            tls: self.tls,
            certs,
            username: self.master_username.clone(),
            password: self.master_password.clone(),
        }))
    }
}

impl RedisLockerBuilder {
    /// Refuses the options only sentinels take; `instead` says what to do with a URL or cluster.
    fn no_sentinel_options(&self, instead: &str) -> Result<(), Error> {
        let sentinel_only = [
            ("sentinel_password", self.sentinel_password.is_some()),
            ("master_username", self.master_username.is_some()),
            ("master_password", self.master_password.is_some()),
            ("tls", self.tls),
        ];
        match sentinel_only.into_iter().find(|(_, set)| *set) {
            Some((option, _)) => Err(Error::invalid_option(
                option,
                format!("only with `sentinels`; {instead} and use rediss:// for TLS"),
            )),
            None => Ok(()),
        }
    }

    /// The request timeout: as set (above zero, at most the TTL), or TTL/3 at most 2 s.
    fn request_timeout_or_default(&self) -> Result<Duration, Error> {
        let ttl = self.common.ttl_or(DEFAULT_TTL);
        match self.request_timeout {
            None => Ok((ttl / 3).min(Duration::from_secs(2))),
            Some(t) if t.is_zero() || t > ttl => Err(Error::invalid_option(
                "request_timeout",
                format!("{t:?} must be above zero and at most the TTL {ttl:?}"),
            )),
            Some(t) => Ok(t),
        }
    }

    /// Checks the cluster options (no I/O) and builds the cluster's client.
    fn cluster_target(
        &self,
        nodes: &[String],
        request_timeout: Duration,
    ) -> Result<(conn::ClusterTarget, String), Error> {
        self.no_sentinel_options("with a cluster, put credentials in the URLs")?;
        if self.replicas.is_some() {
            return Err(Error::invalid_option(
                "wait_for_replicas",
                "not supported with a cluster",
            ));
        }
        if nodes.is_empty() || nodes.len() > MAX_CLUSTER_NODES {
            return Err(Error::invalid_option(
                "cluster",
                format!(
                    "{} nodes: give 1 to {MAX_CLUSTER_NODES} node URLs",
                    nodes.len()
                ),
            ));
        }
        let mut seeds = Vec::with_capacity(nodes.len());
        let mut infos = Vec::with_capacity(nodes.len());
        let mut addrs = Vec::with_capacity(nodes.len());
        for (i, url) in nodes.iter().enumerate() {
            if nodes[..i].contains(url) {
                return Err(Error::invalid_option(
                    "cluster",
                    format!("node {i} is a duplicate"),
                ));
            }
            let client = tls::client("cluster", url, &self.common)?;
            let info = client.get_connection_info().clone();
            if matches!(info.addr(), redis::ConnectionAddr::Unix(_)) {
                return Err(Error::invalid_option(
                    "cluster",
                    "a cluster node needs a redis:// or rediss:// URL, not unix://",
                ));
            }
            if let Some(first) = infos.first() {
                let first: &redis::ConnectionInfo = first;
                let same = std::mem::discriminant(first.addr())
                    == std::mem::discriminant(info.addr())
                    && first.redis_settings().username() == info.redis_settings().username()
                    && first.redis_settings().password() == info.redis_settings().password();
                if !same {
                    return Err(Error::invalid_option(
                        "cluster",
                        format!("node {i}'s URL differs from the first in scheme or credentials"),
                    ));
                }
            }
            addrs.push(info.addr().to_string());
            infos.push(info);
            seeds.push(client);
        }
        let mut map = std::collections::HashMap::new();
        for (announced, reachable) in &self.cluster_address_map {
            let parse = |a: &str| {
                conn::parse_host_port(a).ok_or_else(|| {
                    Error::invalid_option(
                        "cluster_address_map",
                        format!("{a:?} is not an address `host:port`"),
                    )
                })
            };
            let (ah, ap) = parse(announced)?;
            let (rh, rp) = parse(reachable)?;
            let from = redis::cluster::NodeAddress::new(ah, ap);
            if map
                .insert(from, redis::cluster::NodeAddress::new(rh, rp))
                .is_some()
            {
                return Err(Error::invalid_option(
                    "cluster_address_map",
                    format!("{announced:?} is mapped twice"),
                ));
            }
        }
        if map.len() > MAX_CLUSTER_NODES {
            return Err(Error::invalid_option(
                "cluster_address_map",
                format!("more than {MAX_CLUSTER_NODES} entries"),
            ));
        }
        let mut builder = redis::cluster::ClusterClientBuilder::new(infos)
            // A redirect (MOVED / ASK) is retried at once; TRYAGAIN (a multi-key request while
            // its slot migrates) and a lost node after short sleeps. dlock bounds every request
            // by its own budget.
            .retries(4)
            .min_retry_wait(5)
            .max_retry_wait(100)
            .retry_wait_formula(5, 2)
            .connection_timeout(request_timeout);
        if !map.is_empty() {
            builder = builder.node_address_map(map);
        }
        if let Some(certs) = tls::certificates(&self.common) {
            builder = builder.certs(certs);
        }
        let client = builder.build().map_err(|e| {
            Error::invalid_option(
                "cluster",
                format!(
                    "cannot use the node URLs: {}",
                    e.detail().unwrap_or("invalid configuration")
                ),
            )
        })?;
        let display = format!("cluster ({})", addrs.join(","));
        Ok((
            conn::ClusterTarget {
                client,
                seeds,
                next_seed: std::sync::atomic::AtomicUsize::new(0),
            },
            display,
        ))
    }
}
