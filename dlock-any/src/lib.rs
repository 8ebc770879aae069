#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod connect;
mod error;
mod tiered;
mod url;

use std::sync::Arc;

pub use dlock_core::{Election, Error, Locker, RwLocker, Semaphore};
pub use error::{UrlError, UrlPart};
pub use tiered::{ConfigError, ConfigPart, GUARD_NAME, Route, Tier, TieredConfig, TieredLocker};
pub use url::{HostPort, LockerUrl, Scheme};

/// Connects to the locker a URL names (see the crate docs for the URL forms).
///
/// The URL is parsed and every option checked before any I/O. Redis lockers open their
/// connections in the background (a server that is down makes the first acquire fail, not
/// this call); etcd connects lazily and authenticates at once when the URL has credentials;
/// ZooKeeper opens its session here.
///
/// # Errors
/// [`Error::InvalidOption`] for a malformed URL, naming the part at fault in its `option`
/// (`url.scheme`, `url.host`, `url.port`, `url.path`, `url.credentials`, `url.parameter`,
/// `url.value`; see [`UrlPart::option_name`]) and in its reason, or for an option the backend
/// rejects (before any I/O), or a TLS file that cannot be read; what the backend's builder
/// fails with otherwise ([`Error::Unavailable`] when a ZooKeeper ensemble or an authenticating
/// etcd cannot be reached, [`Error::AccessDenied`] for refused credentials, …).
///
/// The primitives a backend offers beside the mutex are reached through the locker:
/// [`Locker::into_election`], [`Locker::into_rw_locker`] and [`Locker::into_semaphore`]
/// (`None` for `redlock://`, which offers only the mutex).
pub async fn connect(url: &str) -> Result<Arc<dyn Locker>, Error> {
    url.parse::<LockerUrl>()?.connect().await
}

/// Reads the tiered configuration at `path` and connects its router (see the crate docs,
/// "Tiers"): [`TieredConfig::load`], then [`TieredConfig::connect`].
///
/// # Errors
/// As [`TieredConfig::load`] (every configuration error before any I/O, naming its line),
/// then as [`TieredConfig::connect`].
pub async fn connect_config(path: impl AsRef<std::path::Path>) -> Result<Arc<TieredLocker>, Error> {
    TieredConfig::load(path)?.connect().await
}

impl LockerUrl {
    /// Connects to the locker this URL names; see [`connect`].
    ///
    /// # Errors
    /// As [`connect`], without the parse errors.
    pub async fn connect(&self) -> Result<Arc<dyn Locker>, Error> {
        connect::build(self, None).await
    }
}

#[cfg(test)]
mod tests;

/// The workspace README's examples, compiled and run as doctests (here: this crate reaches
/// every backend and the URL form the README opens with).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
