//! [`LockerUrl`]: the parsed, validated form of a locker URL.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{UrlError, UrlPart};

/// Which backend (and which deployment of it) a URL names. Every scheme but `memory:` also
/// comes over TLS, written with `+tls` (`redis+sentinel+tls://`; `rediss://` is
/// `redis+tls://`): see [`LockerUrl::is_tls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// `redis://`: one Redis server.
    Redis,
    /// `redis+sentinel://`: the master that Redis Sentinel names.
    RedisSentinel,
    /// `redis+cluster://`: a Redis Cluster, given by some of its nodes.
    RedisCluster,
    /// `redlock://`: the Redlock algorithm over several independent Redis servers.
    Redlock,
    /// `etcd://`: an etcd cluster.
    Etcd,
    /// `zk://`: a ZooKeeper ensemble.
    Zk,
    /// `memory:`: dlock-core's in-process memory server, for tests and demos.
    Memory,
}

/// The suffix of a scheme over TLS.
const TLS_SUFFIX: &str = "+tls";

impl Scheme {
    const ALL: [Scheme; 7] = [
        Scheme::Redis,
        Scheme::RedisSentinel,
        Scheme::RedisCluster,
        Scheme::Redlock,
        Scheme::Etcd,
        Scheme::Zk,
        Scheme::Memory,
    ];

    /// The scheme as written in a URL without TLS (`redis+sentinel`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Redis => "redis",
            Scheme::RedisSentinel => "redis+sentinel",
            Scheme::RedisCluster => "redis+cluster",
            Scheme::Redlock => "redlock",
            Scheme::Etcd => "etcd",
            Scheme::Zk => "zk",
            Scheme::Memory => "memory",
        }
    }

    /// The cargo feature of dlock-any that provides it (`redis`, `etcd`, `zk`; `memory` is
    /// always built in).
    pub fn feature(self) -> &'static str {
        match self {
            Scheme::Redis | Scheme::RedisSentinel | Scheme::RedisCluster | Scheme::Redlock => {
                "redis"
            }
            Scheme::Etcd => "etcd",
            Scheme::Zk => "zk",
            Scheme::Memory => "memory",
        }
    }

    /// Whether this build of dlock-any has the backend (its cargo feature is on).
    pub fn is_enabled(self) -> bool {
        let built = [
            ("redis", cfg!(feature = "redis")),
            ("etcd", cfg!(feature = "etcd")),
            ("zk", cfg!(feature = "zk")),
        ];
        built
            .iter()
            .find(|(feature, _)| *feature == self.feature())
            .is_none_or(|(_, on)| *on)
    }

    /// The port a host without one gets.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Redis | Scheme::RedisCluster | Scheme::Redlock => 6379,
            Scheme::RedisSentinel => 26379,
            Scheme::Etcd => 2379,
            Scheme::Zk => 2181,
            Scheme::Memory => 0,
        }
    }

    /// The most hosts the scheme takes.
    fn max_hosts(self) -> usize {
        match self {
            Scheme::Redis => 1,
            Scheme::Memory => 0,
            _ => usize::MAX,
        }
    }

    /// The query parameters the scheme takes besides `ttl` and `namespace` (and besides
    /// `ca`, `cert` and `key` over TLS).
    fn extra_params(self) -> &'static [&'static str] {
        match self {
            Scheme::RedisSentinel => &["sentinel_password"],
            _ => &[],
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One host of a URL's authority, with its port (the scheme's default when none was given).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    host: String,
    port: u16,
}

impl HostPort {
    /// The host name or address; an IPv6 address is in brackets (`[::1]`).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// TLS files named by `ca=`, `cert=`, `key=` (read when connecting).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

/// A parsed and validated locker URL: which backend, where, and with which options.
///
/// Parse one with [`str::parse`] ([`FromStr`]); every malformed URL is an [`UrlError`] naming
/// the part at fault, before any I/O. Connect with [`LockerUrl::connect`] (or
/// [`crate::connect`] from a string).
///
/// Its [`Display`](fmt::Display) (and `Debug`) is the URL in a canonical form with every
/// password replaced by `***`: safe to log.
///
/// ```
/// use dlock_any::{LockerUrl, Scheme};
/// let url: LockerUrl = "etcd://app:s3cret@10.0.0.1,10.0.0.2:2390/locks?ttl=15s".parse()?;
/// assert_eq!(url.scheme(), Scheme::Etcd);
/// assert_eq!(url.hosts().len(), 2);
/// assert_eq!(url.ttl(), Some(std::time::Duration::from_secs(15)));
/// assert_eq!(
///     url.to_string(),
///     "etcd://app:***@10.0.0.1:2379,10.0.0.2:2390/locks?ttl=15s"
/// );
/// # Ok::<(), dlock_any::UrlError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LockerUrl {
    scheme: Scheme,
    /// Written with `+tls` (or as `rediss://`).
    over_tls: bool,
    user: Option<String>,
    password: Option<String>,
    hosts: Vec<HostPort>,
    /// The path without its leading separator `/` (`None`: no path or just `/`).
    path: Option<String>,
    ttl: Option<Duration>,
    namespace: Option<String>,
    pub(crate) tls: TlsFiles,
    pub(crate) sentinel_password: Option<String>,
}

impl LockerUrl {
    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Whether the servers are reached over TLS: the scheme was written with `+tls` (or as
    /// `rediss://`).
    pub fn is_tls(&self) -> bool {
        self.over_tls
    }

    /// The hosts of the authority, in the order given (empty for `memory:`).
    pub fn hosts(&self) -> &[HostPort] {
        &self.hosts
    }

    /// The user name of the authority (`user@` or `user:password@`), percent-decoded.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// Whether the authority holds a password (it is never shown).
    pub fn has_password(&self) -> bool {
        self.password.is_some()
    }

    #[cfg_attr(
        not(any(feature = "redis", feature = "etcd", feature = "zk")),
        allow(dead_code)
    )]
    pub(crate) fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The path without its leading `/`, percent-decoded: the Redis database number, the
    /// Sentinel master name, the etcd key prefix (`etcd://h//locks` gives `/locks`), or the
    /// ZooKeeper root without its leading `/`. `None` when the URL has no path.
    pub fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    /// The lease TTL of `ttl=` (`None`: the backend's default).
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The namespace of `namespace=`: a sub-tree of the backend's keys (see the crate docs).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The same URL with another TTL (`None`: the backend's default), e.g. from a command
    /// line option that overrides the URL's.
    ///
    /// # Errors
    /// [`UrlError`] for [`UrlPart::Value`] `ttl` when the TTL is outside
    /// [`MIN_TTL`](dlock_core::MIN_TTL)..=[`MAX_TTL`](dlock_core::MAX_TTL).
    pub fn with_ttl(mut self, ttl: Option<Duration>) -> Result<Self, UrlError> {
        if let Some(ttl) = ttl {
            check_ttl(ttl)?;
        }
        self.ttl = ttl;
        Ok(self)
    }
}

fn check_ttl(ttl: Duration) -> Result<Duration, UrlError> {
    dlock_core::backend::validate_ttl(ttl)
        .map_err(|e| UrlError::new(UrlPart::Value("ttl".into()), core_reason(e)))
}

impl fmt::Debug for LockerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockerUrl({self})")
    }
}

impl fmt::Display for LockerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scheme == Scheme::Memory {
            f.write_str("memory:")?;
        } else {
            let tls = if self.over_tls { TLS_SUFFIX } else { "" };
            write!(f, "{}{tls}://", self.scheme)?;
            if self.user.is_some() || self.password.is_some() {
                if let Some(user) = &self.user {
                    f.write_str(&encode(user))?;
                }
                if self.password.is_some() {
                    f.write_str(":***")?;
                }
                f.write_str("@")?;
            }
            for (i, h) in self.hosts.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{h}")?;
            }
            if let Some(path) = &self.path {
                write!(f, "/{}", encode_path(path))?;
            }
        }
        let mut sep = '?';
        let mut param = |f: &mut fmt::Formatter<'_>, name: &str, value: &str| {
            let r = write!(f, "{sep}{name}={value}");
            sep = '&';
            r
        };
        if let Some(ttl) = self.ttl {
            param(
                f,
                "ttl",
                &humantime::format_duration(ttl).to_string().replace(' ', ""),
            )?;
        }
        if let Some(ns) = &self.namespace {
            param(f, "namespace", &encode(ns))?;
        }
        for (name, value) in [
            ("ca", &self.tls.ca),
            ("cert", &self.tls.cert),
            ("key", &self.tls.key),
        ] {
            if let Some(v) = value {
                param(f, name, &encode_path(&v.to_string_lossy()))?;
            }
        }
        if self.sentinel_password.is_some() {
            param(f, "sentinel_password", "***")?;
        }
        Ok(())
    }
}

impl FromStr for LockerUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, UrlError> {
        parse(s)
    }
}

/// Splits off and checks the scheme, and whether it is over TLS (`+tls`, or `rediss`).
fn parse_scheme(s: &str) -> Result<(Scheme, bool, &str), UrlError> {
    let known = || {
        let mut names: Vec<String> = Scheme::ALL
            .iter()
            .map(|s| match s {
                Scheme::Memory => "memory:".to_string(),
                s => format!("{s}[{TLS_SUFFIX}]://"),
            })
            .collect();
        names.push("rediss://".into());
        names.join(", ")
    };
    let Some((name, rest)) = s.split_once(':') else {
        return Err(UrlError::new(
            UrlPart::Scheme,
            format!("no scheme; a locker URL starts with one of {}", known()),
        ));
    };
    let lower = name.to_ascii_lowercase();
    let (base, over_tls) = match lower.strip_suffix(TLS_SUFFIX) {
        Some(base) => (base, true),
        None if lower == "rediss" => ("redis", true),
        None => (lower.as_str(), false),
    };
    let Some(scheme) = Scheme::ALL.into_iter().find(|s| s.as_str() == base) else {
        return Err(UrlError::new(
            UrlPart::Scheme,
            format!("unknown scheme {name:?}; known: {}", known()),
        ));
    };
    if scheme == Scheme::Memory && over_tls {
        return Err(UrlError::new(
            UrlPart::Scheme,
            "memory: is in-process: it has no TLS",
        ));
    }
    if !scheme.is_enabled() {
        return Err(UrlError::new(
            UrlPart::Scheme,
            format!(
                "{scheme}:// needs dlock-any's cargo feature `{}`, which this build lacks",
                scheme.feature()
            ),
        ));
    }
    Ok((scheme, over_tls, rest))
}

fn parse(s: &str) -> Result<LockerUrl, UrlError> {
    let (scheme, over_tls, rest) = parse_scheme(s.trim())?;
    if let Some(at) = rest.find('#') {
        let part = if rest[..at].contains('?') {
            UrlPart::Value("fragment".into())
        } else {
            UrlPart::Path
        };
        return Err(UrlError::new(
            part,
            "a locker URL has no fragment ('#'); percent-encode it as %23",
        ));
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.strip_prefix("//") {
        Some(after) => match after.find('/') {
            Some(i) => (Some(&after[..i]), &after[i..]),
            None => (Some(after), ""),
        },
        None => (None, before_query),
    };
    let mut url = LockerUrl {
        scheme,
        over_tls,
        user: None,
        password: None,
        hosts: Vec::new(),
        path: None,
        ttl: None,
        namespace: None,
        tls: TlsFiles::default(),
        sentinel_password: None,
    };
    if scheme == Scheme::Memory {
        if authority.is_some_and(|a| !a.is_empty()) {
            return Err(UrlError::new(
                UrlPart::Host,
                "memory: has no hosts (write `memory:` alone)",
            ));
        }
        if !path.is_empty() && path != "/" {
            return Err(UrlError::new(
                UrlPart::Path,
                "memory: has no path; use `?namespace=` to keep tests apart",
            ));
        }
    } else {
        let Some(authority) = authority else {
            return Err(UrlError::new(
                UrlPart::Host,
                format!("{scheme}: needs `//` and at least one host ({scheme}://host:port)"),
            ));
        };
        parse_authority(&mut url, authority)?;
        parse_path(&mut url, path)?;
    }
    if let Some(query) = query {
        parse_query(&mut url, query)?;
    }
    check_credentials(&url)?;
    check_tls(&url)?;
    Ok(url)
}

fn parse_authority(url: &mut LockerUrl, authority: &str) -> Result<(), UrlError> {
    let scheme = url.scheme;
    let hosts = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            let user = decode(user).map_err(|m| UrlError::new(UrlPart::Credentials, m))?;
            if !user.is_empty() {
                url.user = Some(user);
            }
            if let Some(p) = password {
                // The message must not quote the password.
                let p = decode(p).map_err(|_| {
                    UrlError::new(
                        UrlPart::Credentials,
                        "the password holds a malformed percent-escape",
                    )
                })?;
                url.password = Some(p);
            }
            hosts
        }
        None => authority,
    };
    if hosts.is_empty() {
        return Err(UrlError::new(
            UrlPart::Host,
            format!("no host; write {scheme}://host:port"),
        ));
    }
    for item in hosts.split(',') {
        let hp = parse_host_port(item, scheme.default_port())?;
        if url.hosts.contains(&hp) {
            return Err(UrlError::new(UrlPart::Host, format!("{hp} is given twice")));
        }
        url.hosts.push(hp);
    }
    if url.hosts.len() > scheme.max_hosts() {
        return Err(UrlError::new(
            UrlPart::Host,
            format!(
                "{scheme}:// takes one host, got {}; for several Redis servers use \
                 redlock:// (independent masters) or redis+cluster:// (a Redis Cluster)",
                url.hosts.len()
            ),
        ));
    }
    Ok(())
}

fn parse_host_port(item: &str, default_port: u16) -> Result<HostPort, UrlError> {
    if item.is_empty() {
        return Err(UrlError::new(
            UrlPart::Host,
            "empty host (two commas in a row, or a comma at an end)",
        ));
    }
    let (host, port) = if let Some(rest) = item.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return Err(UrlError::new(
                UrlPart::Host,
                format!("{item:?}: an IPv6 address needs its closing ']'"),
            ));
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(UrlError::new(
                UrlPart::Host,
                format!("{v6:?} is not an IPv6 address"),
            ));
        }
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => {
                    return Err(UrlError::new(
                        UrlPart::Host,
                        format!("{item:?}: expected ':port' after ']'"),
                    ));
                }
            },
        };
        (format!("[{v6}]"), port)
    } else {
        let (host, port) = match item.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (item, None),
        };
        if host.is_empty() {
            return Err(UrlError::new(
                UrlPart::Host,
                format!("{item:?} has an empty host name"),
            ));
        }
        if let Some(bad) = first_bad_char(host) {
            return Err(UrlError::new(
                UrlPart::Host,
                format!("{host:?}: character {bad:?} is not allowed in a host name"),
            ));
        }
        (host.to_ascii_lowercase(), port)
    };
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => {
                return Err(UrlError::new(
                    UrlPart::Port,
                    format!("{p:?} (of host {host}) is not a port number in 1..=65535"),
                ));
            }
        },
    };
    Ok(HostPort { host, port })
}

fn parse_path(url: &mut LockerUrl, path: &str) -> Result<(), UrlError> {
    let scheme = url.scheme;
    let raw = path.strip_prefix('/').unwrap_or(path);
    if raw.is_empty() {
        if scheme == Scheme::RedisSentinel {
            return Err(UrlError::new(
                UrlPart::Path,
                "redis+sentinel:// needs the master's name as its path (redis+sentinel://h1,h2/mymaster)",
            ));
        }
        return Ok(());
    }
    let decoded = decode(raw).map_err(|m| UrlError::new(UrlPart::Path, m))?;
    match scheme {
        Scheme::Redis => {
            if !decoded.bytes().all(|b| b.is_ascii_digit()) || decoded.parse::<u32>().is_err() {
                return Err(UrlError::new(
                    UrlPart::Path,
                    format!(
                        "{decoded:?} is not a Redis database number; use `?namespace=` for a key prefix"
                    ),
                ));
            }
        }
        Scheme::RedisSentinel => {
            if decoded.contains('/') || !decoded.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(UrlError::new(
                    UrlPart::Path,
                    format!(
                        "{decoded:?} is not a master name (printable ASCII, no whitespace or '/')"
                    ),
                ));
            }
        }
        Scheme::RedisCluster | Scheme::Redlock => {
            return Err(UrlError::new(
                UrlPart::Path,
                format!(
                    "{scheme}:// takes no path (a cluster has only database 0; use `?namespace=` for a key prefix)"
                ),
            ));
        }
        Scheme::Etcd => check_etcd_prefix(&decoded)?,
        Scheme::Zk => check_zk_root(&decoded)?,
        Scheme::Memory => {}
    }
    url.path = Some(decoded);
    Ok(())
}

#[cfg(feature = "etcd")]
fn check_etcd_prefix(prefix: &str) -> Result<(), UrlError> {
    // The backend's own rule, checked without I/O (a placeholder endpoint).
    dlock_etcd::EtcdLocker::builder()
        .endpoints(["127.0.0.1:2379"])
        .prefix(prefix)
        .validate()
        .map_err(|e| UrlError::new(UrlPart::Path, core_reason(e)))
}

#[cfg(not(feature = "etcd"))]
fn check_etcd_prefix(_: &str) -> Result<(), UrlError> {
    Ok(())
}

/// The ZooKeeper root (without its leading `/`), checked by the backend's own rule without I/O
/// (a placeholder connect string).
#[cfg(feature = "zk")]
fn check_zk_root(root: &str) -> Result<(), UrlError> {
    dlock_zk::ZkLocker::builder()
        .connect_string("127.0.0.1:2181")
        .prefix(format!("/{root}"))
        .validate()
        .map_err(|e| UrlError::new(UrlPart::Path, core_reason(e)))
}

#[cfg(not(feature = "zk"))]
fn check_zk_root(_: &str) -> Result<(), UrlError> {
    Ok(())
}

/// The reason of dlock-core's or a backend's `InvalidOption` (without the option's name, which
/// the URL part replaces).
fn core_reason(e: dlock_core::Error) -> String {
    match e {
        dlock_core::Error::InvalidOption { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// The first character of `s` outside `[A-Za-z0-9._-]`, the characters host names and
/// namespace segments are made of.
fn first_bad_char(s: &str) -> Option<char> {
    s.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
}

/// The rule of `namespace=`: segments of `[A-Za-z0-9._-]` joined by `/`, no `.`/`..` segment
/// (the rule every backend accepts).
fn check_namespace(ns: &str) -> Result<(), UrlError> {
    let err = |m: String| UrlError::new(UrlPart::Value("namespace".into()), m);
    if ns.len() > 256 {
        return Err(err(format!("{} bytes is longer than 256", ns.len())));
    }
    for seg in ns.split('/') {
        if seg.is_empty() {
            return Err(err(format!(
                "{ns:?} holds an empty segment (a leading, trailing or doubled '/')"
            )));
        }
        if seg == "." || seg == ".." {
            return Err(err(format!("{ns:?}: segment {seg:?} is not allowed")));
        }
        if let Some(bad) = first_bad_char(seg) {
            return Err(err(format!(
                "{ns:?}: character {bad:?} is not allowed (segments of [A-Za-z0-9._-] joined by '/')"
            )));
        }
    }
    Ok(())
}

fn parse_query(url: &mut LockerUrl, query: &str) -> Result<(), UrlError> {
    let scheme = url.scheme;
    let mut seen: Vec<String> = Vec::new();
    for pair in query.split('&') {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = match pair.split_once('=') {
            Some((n, v)) => (n, v),
            None => (pair, ""),
        };
        let name = decode(name).map_err(|m| UrlError::new(UrlPart::Parameter(name.into()), m))?;
        let tls_params: &[&str] = if url.over_tls {
            &["ca", "cert", "key"]
        } else {
            &[]
        };
        let known = ["ttl", "namespace"].contains(&name.as_str())
            || scheme.extra_params().contains(&name.as_str())
            || tls_params.contains(&name.as_str());
        if !known {
            let mut takes = vec!["ttl", "namespace"];
            takes.extend_from_slice(scheme.extra_params());
            takes.extend_from_slice(tls_params);
            return Err(UrlError::new(
                UrlPart::Parameter(name.clone()),
                format!(
                    "{scheme}: does not take `{name}` (it takes: {})",
                    takes.join(", ")
                ),
            ));
        }
        if seen.contains(&name) {
            return Err(UrlError::new(
                UrlPart::Parameter(name.clone()),
                "given twice",
            ));
        }
        seen.push(name.clone());
        let secret = name == "sentinel_password";
        let value = decode(value).map_err(|m| {
            UrlError::new(
                UrlPart::Value(name.clone()),
                if secret {
                    "malformed percent-escape".to_string()
                } else {
                    m
                },
            )
        })?;
        if value.is_empty() {
            return Err(UrlError::new(UrlPart::Value(name.clone()), "empty value"));
        }
        match name.as_str() {
            "ttl" => {
                let ttl = humantime::parse_duration(&value).map_err(|e| {
                    UrlError::new(
                        UrlPart::Value(name.clone()),
                        format!("{value:?} is not a duration like 10s, 1500ms or 1m30s: {e}"),
                    )
                })?;
                url.ttl = Some(check_ttl(ttl)?);
            }
            "namespace" => {
                check_namespace(&value)?;
                url.namespace = Some(value);
            }
            "ca" => url.tls.ca = Some(PathBuf::from(value)),
            "cert" => url.tls.cert = Some(PathBuf::from(value)),
            "key" => url.tls.key = Some(PathBuf::from(value)),
            "sentinel_password" => url.sentinel_password = Some(value),
            _ => {}
        }
    }
    Ok(())
}

/// Credentials only where the backend takes them, and complete where it needs both parts.
fn check_credentials(url: &LockerUrl) -> Result<(), UrlError> {
    let (user, password) = (url.user.is_some(), url.password.is_some());
    if !user && !password {
        return Ok(());
    }
    let err = |m: String| Err(UrlError::new(UrlPart::Credentials, m));
    match url.scheme {
        Scheme::Memory => err("memory: takes no credentials".into()),
        Scheme::Etcd | Scheme::Zk => {
            if url.scheme.feature() == "zk" && url.user.as_deref().is_some_and(|u| u.contains(':'))
            {
                err("a ZooKeeper digest user must not hold ':'".into())
            } else if user && password {
                Ok(())
            } else {
                let what = if url.scheme.feature() == "zk" {
                    "ZooKeeper digest authentication"
                } else {
                    "etcd authentication"
                };
                err(format!(
                    "{what} needs both a user and a password (user:password@)"
                ))
            }
        }
        // Redis: `user:password@` (an ACL user) or `:password@` (the default user); a user
        // without a password cannot authenticate.
        _ => {
            if password {
                Ok(())
            } else {
                err("a Redis user needs a password (user:password@, or :password@ for the default user)".into())
            }
        }
    }
}

/// `cert=` and `key=` come together; the ZooKeeper client identity needs `ca=`.
fn check_tls(url: &LockerUrl) -> Result<(), UrlError> {
    let t = &url.tls;
    match (&t.cert, &t.key) {
        (Some(_), None) => {
            return Err(UrlError::new(
                UrlPart::Parameter("key".into()),
                "missing: `cert=` needs `key=` (the client certificate's private key)",
            ));
        }
        (None, Some(_)) => {
            return Err(UrlError::new(
                UrlPart::Parameter("cert".into()),
                "missing: `key=` needs `cert=` (the client certificate)",
            ));
        }
        _ => {}
    }
    if url.scheme == Scheme::Zk && url.over_tls && t.ca.is_none() {
        return Err(UrlError::new(
            UrlPart::Parameter("ca".into()),
            "missing: zk+tls:// needs `ca=` (the CA that signed the servers' certificates)",
        ));
    }
    Ok(())
}

/// Percent-decodes `s` into UTF-8.
fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(b) = hex else {
                return Err(format!("malformed percent-escape at byte {i}"));
            };
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-escapes that are not UTF-8".to_string())
}

/// Percent-encodes everything but unreserved characters.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn encode(s: &str) -> String {
    encode_except(s, b"")
}

/// Percent-encodes everything but unreserved characters and `/`.
fn encode_path(s: &str) -> String {
    encode_except(s, b"/")
}

fn encode_except(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') || keep.contains(&b)
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
