//! Where `dlock` locks: one locker URL (`--url` / `DLOCK_URL`) or a tiered configuration
//! (`--config` / `DLOCK_CONFIG`) that routes each name to one tier.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dlock_any::{LockerUrl, Route, TieredConfig};
use dlock_core::{Error, LockName, Locker};

use crate::exit::Failure;
use crate::locker_url;

/// `--url` and `--config` as given (either may come from its environment variable).
#[derive(Debug, Clone, Default)]
pub(crate) struct Source {
    pub(crate) url: Option<String>,
    pub(crate) config: Option<PathBuf>,
}

/// The checked target.
pub(crate) enum Target {
    /// One locker.
    Url(LockerUrl),
    /// A tiered configuration, read from `path`.
    Tiered { path: String, config: TieredConfig },
}

/// Where a name goes: the tier's URL, and under a configuration the tier and the route.
pub(crate) struct Routed {
    pub(crate) url: LockerUrl,
    pub(crate) tier: Option<(String, Route)>,
}

impl Source {
    /// The target, checked before any I/O, with `--ttl` applied to it (every tier's).
    pub(crate) fn target(&self, ttl: Option<Duration>) -> Result<Target, Failure> {
        match (&self.url, &self.config) {
            (Some(_), Some(_)) => Err(Failure::usage(
                "give a locker URL (--url / DLOCK_URL) or a tiered configuration (--config / \
                 DLOCK_CONFIG), not both",
            )),
            (None, Some(path)) => {
                let config = TieredConfig::load(path)
                    .map_err(|e| {
                        Failure::from_error(&e).with("config", path.display().to_string())
                    })?
                    .with_ttl(ttl)
                    .map_err(|e| {
                        Failure::usage(format!("--ttl: {}", e.message())).with("part", "--ttl")
                    })?;
                Ok(Target::Tiered {
                    path: path.display().to_string(),
                    config,
                })
            }
            (url, None) => Ok(Target::Url(locker_url(url.as_deref(), ttl)?)),
        }
    }
}

impl Target {
    /// What reports show for it: the URL (passwords as `***`) or `config:PATH`.
    pub(crate) fn shown(&self) -> String {
        match self {
            Target::Url(url) => url.to_string(),
            Target::Tiered { path, .. } => format!("config:{path}"),
        }
    }

    /// Connects the locker (under a configuration: the router, which takes its drift guard
    /// on every tier).
    pub(crate) async fn connect(&self) -> Result<Arc<dyn Locker>, Error> {
        match self {
            Target::Url(url) => url.connect().await,
            Target::Tiered { config, .. } => Ok(config.connect().await?),
        }
    }

    /// Where `name` goes (before any I/O): the URL itself, or the tier of the first route
    /// that takes the name.
    pub(crate) fn route(&self, name: &LockName) -> Result<Routed, Failure> {
        match self {
            Target::Url(url) => Ok(Routed {
                url: url.clone(),
                tier: None,
            }),
            Target::Tiered { config, .. } => {
                let (route, tier) = config.route(name).map_err(|e| Failure::from_error(&e))?;
                Ok(Routed {
                    url: tier.url().clone(),
                    tier: Some((tier.name().to_string(), route.clone())),
                })
            }
        }
    }
}
