//! The locker's builder and its validated configuration.

use std::fmt;
use std::time::Duration;

use dlock_core::{CommonOptions, Error};
use zookeeper_client as zk;

use crate::ZkLocker;
use crate::keys::{connect_hosts, join_prefix, validate_connect, validate_prefix};
use crate::tls::Tls;

/// The default prefix: the znode under which lock parents are created.
pub const DEFAULT_PREFIX: &str = "/dlock";
/// The default session timeout requested from the server.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// Which ACL the locker puts on the nodes it creates (lock parents and contender nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ZkAcl {
    /// `world:anyone` may do anything (ZooKeeper's `OPEN_ACL_UNSAFE`; the default).
    #[default]
    Open,
    /// Only the identity the session authenticated as (`auth` scheme) may do anything
    /// (`CREATOR_ALL_ACL`). Needs [`ZkLockerBuilder::digest_auth`].
    CreatorAll,
    /// The creator may do anything, everyone may read (so monitoring tools can list holders).
    /// Needs [`ZkLockerBuilder::digest_auth`].
    CreatorAllAnyoneRead,
}

static CREATOR_ALL_ANYONE_READ: [zk::Acl; 2] = [
    zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
    zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
];

impl ZkAcl {
    pub(crate) fn acls(self) -> zk::Acls<'static> {
        match self {
            ZkAcl::Open => zk::Acls::anyone_all(),
            ZkAcl::CreatorAll => zk::Acls::creator_all(),
            ZkAcl::CreatorAllAnyoneRead => zk::Acls::new(&CREATOR_ALL_ANYONE_READ),
        }
    }
}

/// The validated configuration of a locker.
#[derive(Clone)]
pub(crate) struct Config {
    /// The connect string; with TLS, every member without a scheme is written `tcp+tls://`.
    pub(crate) connect: String,
    /// The session timeout requested from the server.
    pub(crate) ttl: Duration,
    /// `<prefix>[/<namespace>]`: where lock parents live.
    pub(crate) base: String,
    /// How sessions authenticate (digest, TLS).
    pub(crate) access: Access,
    pub(crate) acl: ZkAcl,
    /// The ensemble's `tickTime` as the user declared it (`None`: ZooKeeper's default assumed;
    /// see [`proof_ttl`](crate::renew::proof_ttl)).
    pub(crate) server_tick: Option<Duration>,
    /// The options the locker's metrics labels come from (`metrics_tier`, …).
    pub(crate) common: CommonOptions,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("connect", &self.connect)
            .field("ttl", &self.ttl)
            .field("base", &self.base)
            .field("access", &self.access)
            .field("acl", &self.acl)
            .finish()
    }
}

/// How every session of a locker (and every probe session) reaches and authenticates to the
/// servers: digest credentials and TLS. Its `Debug` shows neither the password nor any key.
#[derive(Clone, Default)]
pub(crate) struct Access {
    /// `digest` scheme credentials (user, password).
    pub(crate) digest: Option<(String, String)>,
    /// TLS trust and identity, when the locker uses TLS.
    pub(crate) tls: Option<Tls>,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("digest_user", &self.digest.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls.is_some())
            .field(
                "tls_client_identity",
                &self.tls.as_ref().is_some_and(|t| t.client_identity),
            )
            .finish()
    }
}

/// Builds a [`ZkLocker`]. Every option is checked before any I/O.
///
/// ```no_run
/// use std::time::Duration;
/// use dlock_zk::ZkLocker;
/// # async fn demo() -> Result<(), dlock_core::Error> {
/// let locker = ZkLocker::builder()
///     .connect_string("127.0.0.1:2181")
///     .ttl(Duration::from_secs(6))
///     .prefix("/my-app/locks")
///     .build()
///     .await?;
/// println!("negotiated session timeout: {:?}", locker.negotiated_timeout());
/// # Ok(()) }
/// ```
///
/// # TLS
///
/// [`tls_root_certificates`](Self::tls_root_certificates) turns TLS on: the servers must serve
/// it on their `secureClientPort` (ZooKeeper's Netty connection factory; see the crate's
/// README). A member written without a scheme (`host:port`) or as `tcp+tls://host:port` is then
/// reached over TLS; one written `tcp://host:port` stays plain; without root certificates a
/// `tcp+tls://` member is refused. The server's certificate must name the host as written in
/// the connect string (an IP address or a DNS name). A
/// [`tls_client_identity`](Self::tls_client_identity) (for servers with
/// `ssl.clientAuth=need`) needs the root certificates too. When every member fails the
/// handshake over certificates (one that fails verification, or a server that refuses the
/// client certificate), [`build`](Self::build) (and any later session) fails after one try of
/// each member with a non-retryable error.
#[derive(Clone, Default)]
pub struct ZkLockerBuilder {
    connect: String,
    /// `None`: [`DEFAULT_PREFIX`].
    prefix: Option<String>,
    common: CommonOptions,
    digest: Option<(String, String)>,
    acl: ZkAcl,
    server_tick: Option<Duration>,
}

impl fmt::Debug for ZkLockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLockerBuilder")
            .field("connect", &self.connect)
            .field("prefix", &self.prefix.as_deref().unwrap_or(DEFAULT_PREFIX))
            .field("common", &self.common)
            .field("digest_user", &self.digest.as_ref().map(|(u, _)| u))
            .field("acl", &self.acl)
            .field("server_tick_time", &self.server_tick)
            .finish()
    }
}

impl ZkLockerBuilder {
    dlock_core::common_builder_options!(
        "Here the TTL is the session timeout to request (default 10 s). The server clamps it to \
         its `[minSessionTimeout, maxSessionTimeout]` (by default 2–20 × tickTime); the locker \
         uses the NEGOTIATED value for every deadline and reports it through \
         [`Locker::ttl`](dlock_core::Locker::ttl) and \
         [`ZkLocker::negotiated_timeout`](crate::ZkLocker::negotiated_timeout)."
    );

    /// The ensemble: `host:port[,host:port…][/chroot]` (required), as ZooKeeper's own clients
    /// take it. With TLS, members without a scheme are reached over `tcp+tls://`.
    pub fn connect_string(mut self, connect: impl Into<String>) -> Self {
        self.connect = connect.into();
        self
    }

    /// The ensemble's `tickTime`, when it is known to be shorter than ZooKeeper's default
    /// 2 s (default: 2 s assumed, and no more than half the negotiated timeout, which
    /// ZooKeeper's default `minSessionTimeout` of 2 × `tickTime` implies).
    ///
    /// Only the leader expires sessions, and it hears of a client's requests to a follower
    /// only when that follower answers its next ping (every half tick), so every deadline
    /// keeps half a tick in reserve (see the crate's README, "Deadlines"). A shorter tick
    /// declared here gives longer deadlines; **declaring one shorter than the servers' real
    /// `tickTime` makes deadlines outlast the leader's session expiry**: set it only from the
    /// servers' own configuration. Checked by [`build`](Self::build): 1 ms to 60 s.
    pub fn server_tick_time(mut self, tick: Duration) -> Self {
        self.server_tick = Some(tick);
        self
    }

    /// The absolute znode path under which lock parents are created (default `/dlock`); the
    /// [`namespace`](Self::namespace), if any, is appended to it.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Authenticates the session with ZooKeeper's `digest` scheme (`user:password`).
    pub fn digest_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// The ACL put on every node the locker creates (default [`ZkAcl::Open`]): contender
    /// nodes, lock parents, and the prefix and namespace nodes when they do not exist yet. Give
    /// lockers with different identities different prefixes, or create the prefix beforehand
    /// with the ACL you want.
    pub fn acl(mut self, acl: ZkAcl) -> Self {
        self.acl = acl;
        self
    }

    /// Checks every option without connecting.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the bad option: an empty or malformed connect string,
    /// a TTL outside [`MIN_TTL`](dlock_core::MIN_TTL)..=[`MAX_TTL`](dlock_core::MAX_TTL), a
    /// server tick time outside 1 ms..=60 s, a bad prefix path or namespace, an empty digest
    /// user or password (or a user holding `:`), a
    /// creator ACL without digest authentication, root certificates or a client identity that
    /// are not PEM (or a key that does not go with its certificate), a client identity without
    /// root certificates, or a `tcp+tls://` member without root certificates.
    pub fn validate(&self) -> Result<(), Error> {
        self.config().map(|_| ())
    }

    /// The checked configuration (see [`ZkLockerBuilder::validate`]).
    pub(crate) fn config(&self) -> Result<Config, Error> {
        // `tcp+tls://` is the client crate's scheme for a TLS member; the address after it is
        // checked like any other.
        validate_connect(&self.connect.replace("tcp+tls://", "tcp://"))?;
        self.common.validate(DEFAULT_TTL)?;
        let tls = match (
            self.common.root_certificates(),
            self.common.client_identity(),
        ) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(Error::invalid_option(
                    "tls_client_identity",
                    "a client identity needs tls_root_certificates (TLS is on with root certificates)",
                ));
            }
            (Some(roots), identity) => Some(Tls::new(roots, identity)?),
        };
        let connect = match &tls {
            Some(_) => tls_connect_string(&self.connect),
            None if self.connect.contains("tcp+tls://") => {
                return Err(Error::invalid_option(
                    "connect",
                    "a tcp+tls:// member needs tls_root_certificates",
                ));
            }
            None => self.connect.clone(),
        };
        if let Some(tick) = self.server_tick
            && (tick < Duration::from_millis(1) || tick > Duration::from_secs(60))
        {
            return Err(Error::invalid_option(
                "server_tick_time",
                format!("{tick:?} is outside 1 ms..=60 s"),
            ));
        }
        let prefix = self.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
        validate_prefix(prefix)?;
        if let Some((user, password)) = &self.digest {
            if user.is_empty() || user.contains(':') {
                return Err(Error::invalid_option(
                    "digest_auth",
                    "the user must be non-empty and hold no ':'",
                ));
            }
            if password.is_empty() {
                return Err(Error::invalid_option(
                    "digest_auth",
                    "the password must not be empty",
                ));
            }
        }
        if self.acl != ZkAcl::Open && self.digest.is_none() {
            return Err(Error::invalid_option(
                "acl",
                format!(
                    "{:?} needs digest_auth: the server rejects creator ACLs of an unauthenticated session",
                    self.acl
                ),
            ));
        }
        Ok(Config {
            connect,
            ttl: self.common.ttl_or(DEFAULT_TTL),
            base: join_prefix(prefix, self.common.namespace()),
            access: Access {
                digest: self.digest.clone(),
                tls,
            },
            acl: self.acl,
            server_tick: self.server_tick,
            common: self.common.clone(),
        })
    }

    /// Validates the options, then opens the locker's ZooKeeper session.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for bad options (before any I/O, see the setters);
    /// [`Error::Unavailable`] when no server accepts a session within about the requested
    /// timeout; with TLS, when every member fails the handshake over certificates (see the
    /// builder's documentation, "TLS"), at once and not retryable:
    /// [`Error::Backend`] for a server certificate that is not trusted or names another host,
    /// [`Error::AccessDenied`] for a refused client certificate.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes closes the half-opened session.
    pub async fn build(self) -> Result<ZkLocker, Error> {
        let cfg = self.config()?;
        ZkLocker::open(cfg).await
    }
}

/// The (validated) connect string with every member that has no scheme written
/// `tcp+tls://`, so that the client's plain `connect` reaches it over TLS.
fn tls_connect_string(connect: &str) -> String {
    let hosts = connect_hosts(connect);
    let hosts_len = hosts.join(",").len();
    let chroot = connect.get(hosts_len..).unwrap_or("");
    let hosts: Vec<String> = hosts
        .into_iter()
        .map(|h| {
            if h.contains("://") {
                h
            } else {
                format!("tcp+tls://{h}")
            }
        })
        .collect();
    format!("{}{chroot}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_option(b: ZkLockerBuilder) -> &'static str {
        match b.validate() {
            Err(Error::InvalidOption { option, .. }) => option,
            other => panic!("expected InvalidOption, got {other:?}"),
        }
    }

    #[test]
    fn rejects_bad_options_before_io() {
        let b = || ZkLockerBuilder::default().connect_string("127.0.0.1:2181");
        assert_eq!(
            err_option(ZkLockerBuilder::default().connect_string("")),
            "connect"
        );
        assert_eq!(err_option(b().ttl(Duration::ZERO)), "ttl");
        assert_eq!(
            err_option(b().ttl(Duration::from_secs(100 * 24 * 3600))),
            "ttl"
        );
        assert_eq!(err_option(b().prefix("relative")), "prefix");
        assert_eq!(err_option(b().prefix("/a/../b")), "prefix");
        assert_eq!(err_option(b().namespace("/abs")), "namespace");
        assert_eq!(err_option(b().digest_auth("", "p")), "digest_auth");
        assert_eq!(err_option(b().digest_auth("u:x", "p")), "digest_auth");
        assert_eq!(err_option(b().digest_auth("u", "")), "digest_auth");
        assert_eq!(err_option(b().acl(ZkAcl::CreatorAll)), "acl");
        assert_eq!(
            err_option(b().server_tick_time(Duration::ZERO)),
            "server_tick_time"
        );
        assert_eq!(
            err_option(b().server_tick_time(Duration::from_secs(61))),
            "server_tick_time"
        );
    }

    #[test]
    fn tls_reaches_every_member_without_a_scheme_over_tls() {
        assert_eq!(
            tls_connect_string("a:1,tcp://b:2,tcp+tls://c:3/chroot"),
            "tcp+tls://a:1,tcp://b:2,tcp+tls://c:3/chroot"
        );
        assert_eq!(tls_connect_string("a:1/x"), "tcp+tls://a:1/x");
        assert_eq!(tls_connect_string("[::1]:2181"), "tcp+tls://[::1]:2181");
        // Without TLS a `tcp+tls://` member is refused before any I/O.
        assert_eq!(
            err_option(ZkLockerBuilder::default().connect_string("tcp+tls://a:1")),
            "connect"
        );
    }

    #[test]
    fn accepts_a_full_configuration() {
        let cfg = ZkLockerBuilder::default()
            .connect_string("a:1,b:2,c:3/chroot")
            .ttl(Duration::from_secs(2))
            .prefix("/locks")
            .namespace("app/test-1")
            .digest_auth("user", "secret")
            .acl(ZkAcl::CreatorAllAnyoneRead)
            .config()
            .expect("valid");
        assert_eq!(cfg.base, "/locks/app/test-1");
        assert_eq!(cfg.ttl, Duration::from_secs(2));
        assert!(
            !format!("{cfg:?}").contains("secret"),
            "the password must not be printed"
        );
    }
}
