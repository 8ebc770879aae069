//! Configuration of an [`EtcdLocker`](crate::EtcdLocker), validated before any I/O.

use std::time::Duration;

use dlock_core::{CommonOptions, Error};

use crate::EtcdLocker;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "dlock";
/// The default lease TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The default timeout of one request to etcd.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The default timeout of opening a connection to one endpoint.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

const MAX_PREFIX_LEN: usize = 512;
/// The HTTP/2 keep-alive ping interval: twice etcd's default `--grpc-keepalive-min-time`.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const MIN_REQUEST_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// Builds an [`EtcdLocker`].
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock_core::Error> {
/// use std::time::Duration;
/// use dlock_etcd::EtcdLocker;
///
/// let locker = EtcdLocker::builder()
///     .endpoints(["http://127.0.0.1:2379"])
///     .ttl(Duration::from_secs(5))
///     .prefix("myapp/locks")
///     .build()
///     .await?;
/// # let _ = locker; Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdLockerBuilder {
    endpoints: Vec<String>,
    /// The TTL, the namespace (a sub-tree under the prefix) and the PEM TLS options.
    common: CommonOptions,
    prefix: String,
    raw_names: bool,
    user: Option<(String, String)>,
    request_timeout: Duration,
    connect_timeout: Duration,
    #[cfg(feature = "tls")]
    tls: Option<etcd_client::TlsOptions>,
    /// The application's own client ([`EtcdLockerBuilder::client`]).
    client: Option<etcd_client::Client>,
}

impl std::fmt::Debug for EtcdLockerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLockerBuilder")
            .field("endpoints", &self.endpoints)
            .field("common", &self.common)
            .field("prefix", &self.prefix)
            .field("raw_names", &self.raw_names)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("client", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for EtcdLockerBuilder {
    fn default() -> Self {
        EtcdLockerBuilder {
            endpoints: Vec::new(),
            common: CommonOptions::default(),
            prefix: DEFAULT_PREFIX.to_owned(),
            raw_names: false,
            user: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            #[cfg(feature = "tls")]
            tls: None,
            client: None,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) endpoints: Vec<String>,
    /// The effective TTL: the requested TTL rounded up to whole seconds.
    pub(crate) ttl: Duration,
    pub(crate) ttl_secs: i64,
    pub(crate) prefix: String,
    /// Lock names go into keys as they are (`/` kept) instead of encoded.
    pub(crate) raw_names: bool,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// The options the locker's metrics labels come from (`metrics_tier`, …).
    pub(crate) common: CommonOptions,
}

impl EtcdLockerBuilder {
    /// The etcd endpoints (`http://host:port`, `https://host:port` with the `tls` feature, or
    /// `host:port`). At least one is required.
    pub fn endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }

    /// Use the application's own etcd client instead of connecting: its endpoints,
    /// credentials and TLS as they are. Then give no [`endpoints`](Self::endpoints),
    /// [`user`](Self::user) or TLS option ([`build`](Self::build) refuses them).
    ///
    /// Every request of the locker goes through this client, where its own balancing sends it:
    /// the locker cannot skip a hung member and hedge onto another, as it does over its own
    /// per-member connections (built from endpoints), so a member that hangs without closing
    /// its connection costs a request its timeout. A stale auth token is refreshed with the
    /// client's credentials.
    pub fn client(mut self, client: etcd_client::Client) -> Self {
        self.client = Some(client);
        self
    }

    dlock_core::common_builder_options!(
        "Default 10 s. etcd lease TTLs are whole seconds, so the TTL is **rounded up** to the \
         next whole second (1.2 s becomes 2 s), and deadlines are computed from the rounded \
         value. The server may keep a lease longer than asked (its minimum TTL is 1.5 × the \
         election timeout, and a leader change restarts every lease's TTL), never shorter; \
         [`Locker::ttl`](dlock_core::Locker::ttl) reports the TTL the server granted once the \
         first session lease exists."
    );

    /// The key prefix (default `dlock`), the raw root of the locker's keys: every key it writes
    /// lies under `<prefix>/`, and under `<prefix>/<namespace>/` with a
    /// [`namespace`](Self::namespace). Segments of `[A-Za-z0-9._:-]` separated by `/`, optionally with a leading `/` (the
    /// common etcd convention, `/locks`), no trailing `/`. Prefixes of different lockers
    /// should not nest (`a` and `a/b`), or a lock named `b` under `a` would share keys with the
    /// whole namespace `a/b`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Use lock names in keys as they are, `/` included (default `false`: `/` is encoded as
    /// `%2F`). With the prefix `/locks`, the lock `orders/42` is then the range
    /// `/locks/orders/42/`, exactly what `etcdctl lock /locks/orders/42` and Go's
    /// `concurrency.NewMutex(s, "/locks/orders/42")` use.
    ///
    /// As with etcd's own `Mutex`, a lock's range then contains the ranges of the names below
    /// it: a contender for `orders` also waits for holders of `orders/42` (never the other way
    /// round). That costs waiting, never exclusion; avoid nesting lock names if it matters.
    pub fn raw_names(mut self, raw: bool) -> Self {
        self.raw_names = raw;
        self
    }

    /// Authenticate with etcd's user/password authentication.
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// Timeout of one request to etcd (default 5 s). A request without a reply in time fails
    /// with [`Error::Unavailable`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Timeout of opening a TCP connection to one endpoint (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// TLS settings (CA, client identity, domain), passed through to etcd-client. Use
    /// `https://` endpoints with it.
    ///
    /// [`tls_root_certificates`](Self::tls_root_certificates) and
    /// [`tls_client_identity`](Self::tls_client_identity) are the same settings in the shape
    /// every dlock backend takes, checked by [`build`](Self::build); given together with
    /// these options, their certificates are added to them (and their identity replaces
    /// theirs), so `tls` can still set what they do not (e.g. the expected server name).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: etcd_client::TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Checks every option without connecting.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the bad option: no endpoints (and no
    /// [`client`](Self::client)), endpoints, a user or TLS given beside a client, a malformed
    /// endpoint, a TTL outside [`MIN_TTL`](dlock_core::MIN_TTL)..=[`MAX_TTL`](dlock_core::MAX_TTL),
    /// a bad prefix or namespace, an empty user name, a zero or absurd timeout, an `https://`
    /// endpoint without the `tls` feature, root certificates or a client identity that cannot
    /// be parsed or do not go together (or given without the `tls` feature).
    pub fn validate(&self) -> Result<(), Error> {
        self.config().map(|_| ())
    }

    pub(crate) fn config(&self) -> Result<Config, Error> {
        if self.client.is_some() {
            #[cfg(feature = "tls")]
            let tls = self.tls.is_some();
            #[cfg(not(feature = "tls"))]
            let tls = false;
            let c = &self.common;
            for (option, given) in [
                ("endpoints", !self.endpoints.is_empty()),
                ("user", self.user.is_some()),
                ("tls", tls),
                ("tls_root_certificates", c.root_certificates().is_some()),
                ("tls_client_identity", c.client_identity().is_some()),
            ] {
                if given {
                    return Err(Error::invalid_option(
                        option,
                        "the locker uses the given client: its endpoints, credentials and TLS are the client's",
                    ));
                }
            }
        } else if self.endpoints.is_empty() {
            return Err(Error::invalid_option(
                "endpoints",
                "at least one etcd endpoint is required",
            ));
        }
        for e in &self.endpoints {
            check_endpoint(e, cfg!(feature = "tls"))?;
        }
        // Core refuses TLS options without its own `tls` feature, which another crate of the
        // build may turn on: they would then be ignored here.
        #[cfg(not(feature = "tls"))]
        if self.common.wants_tls() {
            let option = match self.common.root_certificates() {
                Some(_) => "tls_root_certificates",
                None => "tls_client_identity",
            };
            return Err(Error::invalid_option(
                option,
                "TLS needs dlock-etcd's `tls` feature",
            ));
        }
        self.common.validate(DEFAULT_TTL)?;
        let ttl = self.common.ttl_or(DEFAULT_TTL);
        let whole = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let ttl_secs = i64::try_from(whole)
            .map_err(|_| Error::invalid_option("ttl", "too long for an etcd lease"))?;
        let effective = Duration::from_secs(whole);
        if effective != ttl {
            tracing::info!(requested = ?ttl, effective = ?effective, "etcd lease TTLs are whole seconds; TTL rounded up");
        }
        check_prefix(&self.prefix)?;
        let prefix = match self.common.namespace() {
            Some(ns) => {
                let joined = format!("{}/{ns}", self.prefix);
                check_prefix(&joined)?;
                joined
            }
            None => self.prefix.clone(),
        };
        if let Some((user, _)) = &self.user
            && user.is_empty()
        {
            return Err(Error::invalid_option("user", "the user name is empty"));
        }
        for (option, t) in [
            ("request_timeout", self.request_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if !(MIN_REQUEST_TIMEOUT..=MAX_REQUEST_TIMEOUT).contains(&t) {
                return Err(Error::invalid_option(
                    option,
                    format!("{t:?} is outside {MIN_REQUEST_TIMEOUT:?}..={MAX_REQUEST_TIMEOUT:?}"),
                ));
            }
        }
        Ok(Config {
            endpoints: self.endpoints.clone(),
            ttl: effective,
            ttl_secs,
            prefix,
            raw_names: self.raw_names,
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
            common: self.common.clone(),
        })
    }

    pub(crate) fn connect_options(&self, cfg: &Config) -> etcd_client::ConnectOptions {
        // HTTP/2 pings only while a stream is open, and never closer together than etcd's
        // `--grpc-keepalive-min-time` (5 s by default) allows: etcd answers pings it deems too
        // frequent (or any ping on a connection without streams) with GOAWAY `too_many_pings`
        // at the third. Requests have their own timeouts; the pings only find dead
        // connections under long-lived watch and keep-alive streams.
        #[allow(unused_mut)]
        let mut opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(cfg.connect_timeout)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, cfg.request_timeout)
            .with_keep_alive_while_idle(false)
            .with_require_leader(true);
        if let Some((user, password)) = &self.user {
            opts = opts.with_user(user.clone(), password.clone());
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = crate::tls::options(&self.common, self.tls.as_ref()) {
            opts = opts.with_tls(tls);
        }
        opts
    }

    /// Validates the options, then connects.
    ///
    /// Connecting is lazy for plain endpoints (the first request opens the connection); with
    /// [`EtcdLockerBuilder::user`] it authenticates at once. With a
    /// [`client`](Self::client) there is no I/O.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] (see [`EtcdLockerBuilder::validate`]) before any I/O;
    /// [`Error::Unavailable`] when etcd cannot be reached to authenticate;
    /// [`Error::Backend`] when etcd rejects the credentials.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is created at the server before the locker's first acquire.
    pub async fn build(self) -> Result<EtcdLocker, Error> {
        let cfg = self.config()?;
        if let Some(client) = self.client.clone() {
            return Ok(EtcdLocker::with_client(cfg, client));
        }
        let opts = self.connect_options(&cfg);
        EtcdLocker::connect(cfg, opts, self.user.is_some()).await
    }
}

fn check_endpoint(e: &str, tls: bool) -> Result<(), Error> {
    let bad = |why: &str| Error::invalid_option("endpoints", format!("{e:?}: {why}"));
    let rest = if let Some(rest) = e.strip_prefix("http://") {
        rest
    } else if let Some(rest) = e.strip_prefix("https://") {
        if !tls {
            return Err(bad("https endpoints need dlock-etcd's `tls` feature"));
        }
        rest
    } else if e.contains("://") {
        return Err(bad("only http:// and https:// endpoints are supported"));
    } else {
        e
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    if authority.contains('/')
        || authority
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(bad("expected host:port"));
    }
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Err(bad("expected host:port (the port is required)"));
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(bad("the port must be a number in 1..=65535")),
    }
}

fn check_prefix(p: &str) -> Result<(), Error> {
    let bad = |why: &str| Error::invalid_option("prefix", format!("{p:?}: {why}"));
    if p.is_empty() {
        return Err(bad("must not be empty"));
    }
    if p.len() > MAX_PREFIX_LEN {
        return Err(bad("longer than 512 bytes"));
    }
    if p.ends_with('/') {
        return Err(bad("must not end with '/'"));
    }
    // One leading '/' is the usual etcd layout (`/locks`).
    let rest = p.strip_prefix('/').unwrap_or(p);
    for seg in rest.split('/') {
        if seg.is_empty() {
            return Err(bad("empty segment ('//')"));
        }
        if seg == "." || seg == ".." {
            return Err(bad("'.' or '..' segment"));
        }
        if !seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        {
            return Err(bad("segments may hold only [A-Za-z0-9._:-]"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::ErrorKind;

    fn base() -> EtcdLockerBuilder {
        EtcdLockerBuilder::default().endpoints(["http://127.0.0.1:2379"])
    }

    fn option_of(b: &EtcdLockerBuilder) -> Option<&'static str> {
        match b.config() {
            Ok(_) => None,
            Err(Error::InvalidOption { option, .. }) => Some(option),
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }

    /// `namespace` is a sub-tree under the prefix (the default one or a raw override), as on
    /// the other backends; it no longer replaces the prefix.
    #[test]
    fn the_namespace_is_a_sub_tree_of_the_prefix() {
        let prefix = |b: EtcdLockerBuilder| b.config().expect("valid").prefix;
        assert_eq!(prefix(base()), DEFAULT_PREFIX);
        assert_eq!(prefix(base().namespace("app/eu")), "dlock/app/eu");
        assert_eq!(
            prefix(base().prefix("/locks").namespace("app")),
            "/locks/app"
        );
    }

    #[test]
    fn table() {
        let cases: Vec<(EtcdLockerBuilder, Option<&str>)> = vec![
            (base(), None),
            (
                base().endpoints(["127.0.0.1:2379", "http://[::1]:2379/"]),
                None,
            ),
            (EtcdLockerBuilder::default(), Some("endpoints")),
            (base().endpoints(["http://127.0.0.1"]), Some("endpoints")),
            (base().endpoints(["http://:2379"]), Some("endpoints")),
            (base().endpoints(["http://h:0"]), Some("endpoints")),
            (base().endpoints(["http://h:99999"]), Some("endpoints")),
            (base().endpoints(["tcp://h:1"]), Some("endpoints")),
            (base().endpoints(["http://h:1/path"]), Some("endpoints")),
            (base().endpoints(["h 1:2"]), Some("endpoints")),
            (base().ttl(Duration::ZERO), Some("ttl")),
            (base().ttl(Duration::from_millis(50)), Some("ttl")),
            (
                base().ttl(Duration::from_secs(365 * 24 * 3600)),
                Some("ttl"),
            ),
            (base().prefix(""), Some("prefix")),
            (base().prefix("/a"), None),
            (base().prefix("/locks/orders"), None),
            (base().prefix("/"), Some("prefix")),
            (base().prefix("//a"), Some("prefix")),
            (base().prefix("a/"), Some("prefix")),
            (base().prefix("a//b"), Some("prefix")),
            (base().prefix("a/../b"), Some("prefix")),
            (base().prefix("a b"), Some("prefix")),
            (base().prefix("a%2Fb"), Some("prefix")),
            (base().namespace("tests/a"), None),
            // Empty means none, as on every backend.
            (base().namespace(""), None),
            (base().namespace("/a"), Some("namespace")),
            (base().namespace("a/"), Some("namespace")),
            (base().namespace("a/../b"), Some("namespace")),
            (base().namespace("a:b"), Some("namespace")),
            (base().prefix("dlock-test/run_1/mutual-exclusion"), None),
            (base().user("", "pw"), Some("user")),
            (
                base().tls_root_certificates(b"not PEM".to_vec()),
                Some("tls_root_certificates"),
            ),
            (
                base().tls_client_identity(b"not PEM".to_vec(), b"no key".to_vec()),
                Some("tls_client_identity"),
            ),
            (base().user("root", ""), None),
            (
                base().request_timeout(Duration::ZERO),
                Some("request_timeout"),
            ),
            (
                base().connect_timeout(Duration::from_secs(3600)),
                Some("connect_timeout"),
            ),
        ];
        for (b, want) in &cases {
            assert_eq!(option_of(b), *want, "{b:?}");
        }
    }

    #[test]
    fn https_needs_the_tls_feature() {
        let b = base().endpoints(["https://127.0.0.1:2379"]);
        assert_eq!(option_of(&b).is_some(), !cfg!(feature = "tls"));
    }

    #[test]
    fn ttl_is_rounded_up_to_whole_seconds() {
        let cfg = base()
            .ttl(Duration::from_millis(1200))
            .config()
            .expect("valid");
        assert_eq!((cfg.ttl, cfg.ttl_secs), (Duration::from_secs(2), 2));
        let cfg = base()
            .ttl(Duration::from_millis(100))
            .config()
            .expect("valid");
        assert_eq!((cfg.ttl, cfg.ttl_secs), (Duration::from_secs(1), 1));
        let cfg = base().ttl(Duration::from_secs(3)).config().expect("valid");
        assert_eq!((cfg.ttl, cfg.ttl_secs), (Duration::from_secs(3), 3));
    }

    #[tokio::test]
    async fn build_rejects_before_any_io() {
        // No server listens on port 1; an invalid TTL must be reported, not a connection error.
        let err = EtcdLockerBuilder::default()
            .endpoints(["http://127.0.0.1:1"])
            .ttl(Duration::ZERO)
            .build()
            .await
            .expect_err("invalid ttl");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
}
