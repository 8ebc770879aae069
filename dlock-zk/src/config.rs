//! The locker's builder and its validated configuration.

use std::fmt;
use std::time::Duration;

use dlock_core::{Error, validate_ttl};
use zookeeper_client as zk;

use crate::ZkLocker;
use crate::paths::{join_root, validate_connect, validate_namespace, validate_root};

/// The default root under which lock parents are created.
pub const DEFAULT_ROOT: &str = "/dlock";
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
    pub(crate) connect: String,
    /// The session timeout requested from the server.
    pub(crate) ttl: Duration,
    /// `<root>[/<namespace>]`: where lock parents live.
    pub(crate) base: String,
    pub(crate) digest: Option<(String, String)>,
    pub(crate) acl: ZkAcl,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("connect", &self.connect)
            .field("ttl", &self.ttl)
            .field("base", &self.base)
            .field("digest_user", &self.digest.as_ref().map(|(u, _)| u))
            .field("acl", &self.acl)
            .finish()
    }
}

/// Builds a [`ZkLocker`]. Every option is checked before any I/O.
///
/// ```no_run
/// use std::time::Duration;
/// use dlock_zk::ZkLocker;
/// # async fn demo() -> Result<(), dlock_core::Error> {
/// let locker = ZkLocker::builder("127.0.0.1:2181")
///     .ttl(Duration::from_secs(6))
///     .root("/my-app/locks")
///     .build()
///     .await?;
/// println!("negotiated session timeout: {:?}", locker.negotiated_timeout());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkLockerBuilder {
    connect: String,
    ttl: Duration,
    root: String,
    namespace: Option<String>,
    digest: Option<(String, String)>,
    acl: ZkAcl,
}

impl fmt::Debug for ZkLockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLockerBuilder")
            .field("connect", &self.connect)
            .field("ttl", &self.ttl)
            .field("root", &self.root)
            .field("namespace", &self.namespace)
            .field("digest_user", &self.digest.as_ref().map(|(u, _)| u))
            .field("acl", &self.acl)
            .finish()
    }
}

impl ZkLockerBuilder {
    pub(crate) fn new(connect: impl Into<String>) -> Self {
        ZkLockerBuilder {
            connect: connect.into(),
            ttl: DEFAULT_TTL,
            root: DEFAULT_ROOT.to_owned(),
            namespace: None,
            digest: None,
            acl: ZkAcl::Open,
        }
    }

    /// The session timeout to request (default 10 s): the bound on how long a crashed holder
    /// blocks others. The server clamps it to its `[minSessionTimeout, maxSessionTimeout]`
    /// (by default 2–20 × tickTime); the locker uses the NEGOTIATED value for every deadline
    /// and reports it through [`Locker::ttl`](dlock_core::Locker::ttl) and
    /// [`ZkLocker::negotiated_timeout`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The absolute znode path under which lock parents are created (default `/dlock`).
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// A relative path (`a/b`) appended to the root, to keep applications or tests apart.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Authenticates the session with ZooKeeper's `digest` scheme (`user:password`).
    pub fn digest_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// The ACL put on every node the locker creates (default [`ZkAcl::Open`]): contender
    /// nodes, lock parents, and the root and namespace nodes when they do not exist yet. Give
    /// lockers with different identities different roots, or create the root beforehand with
    /// the ACL you want.
    pub fn acl(mut self, acl: ZkAcl) -> Self {
        self.acl = acl;
        self
    }

    /// Checks every option without connecting.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the bad option: an empty or malformed connect string,
    /// a TTL outside [`MIN_TTL`](dlock_core::MIN_TTL)..=[`MAX_TTL`](dlock_core::MAX_TTL), a bad
    /// root or namespace path, an empty digest user or password (or a user holding `:`), or a
    /// creator ACL without digest authentication.
    pub(crate) fn validate(&self) -> Result<Config, Error> {
        validate_connect(&self.connect)?;
        let ttl = validate_ttl(self.ttl)?;
        validate_root(&self.root)?;
        if let Some(ns) = &self.namespace {
            validate_namespace(ns)?;
        }
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
            connect: self.connect.clone(),
            ttl,
            base: join_root(&self.root, self.namespace.as_deref()),
            digest: self.digest.clone(),
            acl: self.acl,
        })
    }

    /// Validates the options, then opens the locker's ZooKeeper session.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for bad options (before any I/O, see the setters);
    /// [`Error::Unavailable`] when no server accepts a session within about the requested
    /// timeout.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes closes the half-opened session.
    pub async fn build(self) -> Result<ZkLocker, Error> {
        let cfg = self.validate()?;
        ZkLocker::open(cfg).await
    }
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
        let b = || ZkLockerBuilder::new("127.0.0.1:2181");
        assert_eq!(err_option(ZkLockerBuilder::new("")), "connect");
        assert_eq!(err_option(b().ttl(Duration::ZERO)), "ttl");
        assert_eq!(
            err_option(b().ttl(Duration::from_secs(100 * 24 * 3600))),
            "ttl"
        );
        assert_eq!(err_option(b().root("relative")), "root");
        assert_eq!(err_option(b().root("/a/../b")), "root");
        assert_eq!(err_option(b().namespace("/abs")), "namespace");
        assert_eq!(err_option(b().digest_auth("", "p")), "digest_auth");
        assert_eq!(err_option(b().digest_auth("u:x", "p")), "digest_auth");
        assert_eq!(err_option(b().digest_auth("u", "")), "digest_auth");
        assert_eq!(err_option(b().acl(ZkAcl::CreatorAll)), "acl");
    }

    #[test]
    fn accepts_a_full_configuration() {
        let cfg = ZkLockerBuilder::new("a:1,b:2,c:3/chroot")
            .ttl(Duration::from_secs(2))
            .root("/locks")
            .namespace("app/test-1")
            .digest_auth("user", "secret")
            .acl(ZkAcl::CreatorAllAnyoneRead)
            .validate()
            .expect("valid");
        assert_eq!(cfg.base, "/locks/app/test-1");
        assert_eq!(cfg.ttl, Duration::from_secs(2));
        assert!(
            !format!("{cfg:?}").contains("secret"),
            "the password must not be printed"
        );
    }
}
