//! The tiered configuration file: tiers named by URL, lock names routed to tiers by pattern
//! (first match wins), parsed and checked whole before any I/O.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use dlock_core::{Error, LockName, MAX_PERMITS};
use serde::Deserialize;
use toml::Spanned;

use super::pattern;
use crate::url::{LockerUrl, Scheme};

/// The lock name every router holds one permit of on each guarded tier (see the crate docs,
/// "Tiers"). Never routed: the router refuses it.
pub const GUARD_NAME: &str = "dlock-tiers";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    tiers: BTreeMap<String, Spanned<RawTier>>,
    #[serde(default)]
    routes: Vec<Spanned<RawRoute>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    url: Spanned<String>,
    guard: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    pattern: Spanned<String>,
    tier: Spanned<String>,
}

/// The part of a tiered configuration a [`ConfigError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigPart {
    /// The file cannot be read.
    File,
    /// Not TOML, or a key the format does not have, or a value of the wrong type.
    Syntax,
    /// A tier: a bad name, never routed to, or a drift guard its backend cannot keep.
    Tier,
    /// A tier's URL.
    Url,
    /// A route: an unknown tier, an empty pattern, or a pattern no name can reach.
    Route,
}

impl ConfigPart {
    /// The part as the `option` of an [`Error::InvalidOption`]: `config.file`,
    /// `config.syntax`, `config.tier`, `config.url`, `config.route`.
    pub fn option_name(self) -> &'static str {
        match self {
            ConfigPart::File => "config.file",
            ConfigPart::Syntax => "config.syntax",
            ConfigPart::Tier => "config.tier",
            ConfigPart::Url => "config.url",
            ConfigPart::Route => "config.route",
        }
    }
}

impl fmt::Display for ConfigPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigPart::File => "file",
            ConfigPart::Syntax => "syntax",
            ConfigPart::Tier => "tier",
            ConfigPart::Url => "url",
            ConfigPart::Route => "route",
        })
    }
}

/// A tiered configuration rejected before any I/O, naming the line and the part at fault. Its
/// message never contains a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    line: Option<usize>,
    part: ConfigPart,
    message: String,
}

impl ConfigError {
    fn new(line: Option<usize>, part: ConfigPart, message: impl Into<String>) -> Self {
        ConfigError {
            line,
            part,
            message: message.into(),
        }
    }

    /// The line (from 1) at fault, when the error is about one.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The part at fault.
    pub fn part(&self) -> ConfigPart {
        self.part
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "config:{line}: {}: {}", self.part, self.message),
            None => write!(f, "config: {}: {}", self.part, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for Error {
    /// An [`Error::InvalidOption`] whose `option` is [`ConfigPart::option_name`] and whose
    /// reason starts with `config:LINE:`.
    fn from(e: ConfigError) -> Self {
        Error::invalid_option(e.part.option_name(), e.to_string())
    }
}

/// One tier: a name and the locker URL it connects to.
#[derive(Debug, Clone)]
pub struct Tier {
    name: String,
    url: LockerUrl,
    guard: bool,
    line: usize,
}

impl Tier {
    /// The tier's name (`fast`, `strict`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its locker URL (printed with passwords as `***`).
    pub fn url(&self) -> &LockerUrl {
        &self.url
    }

    /// Whether the router keeps the drift guard on it (`guard = false` turns it off).
    pub fn guarded(&self) -> bool {
        self.guard
    }

    /// The line of its `url`.
    pub fn line(&self) -> usize {
        self.line
    }

    /// What identifies the tier's locks: scheme, hosts (sorted), path and namespace; no
    /// credentials, TTL or TLS files.
    fn identity(&self) -> String {
        let mut hosts: Vec<String> = self.url.hosts().iter().map(ToString::to_string).collect();
        hosts.sort();
        format!(
            "{}://{}/{}?{}",
            self.url.scheme().as_str(),
            hosts.join(","),
            self.url.path().unwrap_or(""),
            self.url.namespace().unwrap_or("")
        )
    }
}

/// One route: names its pattern matches go to its tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pattern: String,
    tier: String,
    line: usize,
}

impl Route {
    /// The pattern: `*` stands for any run of characters (`/` included).
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The tier's name.
    pub fn tier(&self) -> &str {
        &self.tier
    }

    /// The line of its `pattern`.
    pub fn line(&self) -> usize {
        self.line
    }

    /// Whether the route takes `name`.
    pub fn matches(&self, name: &LockName) -> bool {
        pattern::matches(&self.pattern, name.as_str())
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "route `{}` -> {} (line {})",
            self.pattern, self.tier, self.line
        )
    }
}

/// A checked tiered configuration: tiers by URL, routes by pattern, first match wins.
///
/// ```
/// use dlock_any::TieredConfig;
/// use dlock_core::LockName;
///
/// let config: TieredConfig = r#"
/// [tiers.fast]
/// url = "redis://10.0.0.5:6379"
/// [tiers.strict]
/// url = "etcd://10.0.0.7:2379/locks"
///
/// [[routes]]
/// pattern = "orders/*"
/// tier = "strict"
/// [[routes]]
/// pattern = "*"
/// tier = "fast"
/// "#.parse()?;
/// let (route, tier) = config.route(&LockName::new("orders/42")?)?;
/// assert_eq!((route.pattern(), tier.name()), ("orders/*", "strict"));
/// assert_eq!(config.route(&LockName::new("cache/x")?)?.1.name(), "fast");
///
/// // A route after one that takes everything it would is refused, naming its line.
/// let err = "[tiers.a]\nurl = 'memory:'\n[[routes]]\npattern = '*'\ntier = 'a'\n\
///            [[routes]]\npattern = 'orders/*'\ntier = 'a'\n".parse::<TieredConfig>().unwrap_err();
/// assert_eq!(err.line(), Some(7));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct TieredConfig {
    tiers: Vec<Tier>,
    routes: Vec<Route>,
}

/// The line (from 1) of byte offset `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    1 + text
        .as_bytes()
        .iter()
        .take(at)
        .filter(|&&b| b == b'\n')
        .count()
}

fn valid_tier_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl std::str::FromStr for TieredConfig {
    type Err = ConfigError;

    /// Parses and checks a configuration (see [`TieredConfig::parse`]).
    fn from_str(text: &str) -> Result<Self, ConfigError> {
        TieredConfig::parse(text)
    }
}

impl TieredConfig {
    /// Parses and checks a configuration: every tier's URL parses, every route names a tier,
    /// every pattern is reachable (no earlier route matches every name it matches), every
    /// tier is routed to, and a guarded tier's backend has a semaphore.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the line and part at fault; the first one found.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start));
            ConfigError::new(line, ConfigPart::Syntax, e.message().trim().to_string())
        })?;
        let mut tiers = Vec::new();
        for (name, raw_tier) in &raw.tiers {
            let t = raw_tier.get_ref();
            let line = line_of(text, t.url.span().start);
            if !valid_tier_name(name) {
                return Err(ConfigError::new(
                    Some(line),
                    ConfigPart::Tier,
                    format!("tier name {name:?}: use 1 to 64 of [A-Za-z0-9_-]"),
                ));
            }
            let url: LockerUrl = t.url.get_ref().parse().map_err(|e: crate::UrlError| {
                ConfigError::new(Some(line), ConfigPart::Url, format!("tier `{name}`: {e}"))
            })?;
            let guard = t.guard.as_ref().is_none_or(|g| *g.get_ref());
            if guard && url.scheme() == Scheme::Redlock {
                return Err(ConfigError::new(
                    Some(line),
                    ConfigPart::Tier,
                    format!(
                        "tier `{name}`: redlock:// has no semaphore to hold the drift guard \
                         `{GUARD_NAME}` on; set `guard = false` on it to go without"
                    ),
                ));
            }
            tiers.push(Tier {
                name: name.clone(),
                url,
                guard,
                line,
            });
        }
        let mut routes: Vec<Route> = Vec::new();
        for raw_route in &raw.routes {
            let r = raw_route.get_ref();
            let line = line_of(text, r.pattern.span().start);
            let (pat, tier) = (r.pattern.get_ref(), r.tier.get_ref());
            if pat.is_empty() {
                return Err(ConfigError::new(
                    Some(line),
                    ConfigPart::Route,
                    "empty pattern (`*` takes every name)",
                ));
            }
            if pattern::matches(pat, GUARD_NAME) && !pat.contains('*') {
                return Err(ConfigError::new(
                    Some(line),
                    ConfigPart::Route,
                    format!("`{GUARD_NAME}` is the router's own guard, not a lock name"),
                ));
            }
            if !tiers.iter().any(|t| t.name == *tier) {
                return Err(ConfigError::new(
                    Some(line_of(text, r.tier.span().start)),
                    ConfigPart::Route,
                    format!("unknown tier `{tier}` (the tiers: {})", names(&tiers)),
                ));
            }
            if let Some(earlier) = routes.iter().find(|e| pattern::matches(&e.pattern, pat)) {
                return Err(ConfigError::new(
                    Some(line),
                    ConfigPart::Route,
                    format!(
                        "pattern `{pat}` is unreachable: the {earlier} already takes every \
                         name it matches"
                    ),
                ));
            }
            routes.push(Route {
                pattern: pat.clone(),
                tier: tier.clone(),
                line,
            });
        }
        if routes.is_empty() {
            return Err(ConfigError::new(
                None,
                ConfigPart::Route,
                "no [[routes]]: every name needs one",
            ));
        }
        if let Some(unused) = tiers
            .iter()
            .find(|t| !routes.iter().any(|r| r.tier == t.name))
        {
            return Err(ConfigError::new(
                Some(unused.line),
                ConfigPart::Tier,
                format!("tier `{}` is never routed to", unused.name),
            ));
        }
        Ok(TieredConfig { tiers, routes })
    }

    /// Reads and checks the configuration file at `path` (see [`TieredConfig::parse`]).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] with `option` `config.file` when the file cannot be read, or
    /// the [`ConfigError`] of its contents (`config.syntax`, `config.tier`, …), the reason
    /// starting with `PATH:LINE:`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid_option(
                ConfigPart::File.option_name(),
                format!("config {}: {e}", path.display()),
            )
        })?;
        TieredConfig::parse(&text).map_err(|e| {
            Error::invalid_option(
                e.part.option_name(),
                format!(
                    "{}: {}",
                    path.display(),
                    e.to_string().trim_start_matches("config")
                ),
            )
        })
    }

    /// This configuration with every tier's lease TTL set to `ttl` (`None`: each URL's own);
    /// the fingerprint does not change.
    ///
    /// # Errors
    /// A [`ConfigError`] (`config.url`) when `ttl` is outside dlock-core's limits.
    pub fn with_ttl(mut self, ttl: Option<std::time::Duration>) -> Result<Self, ConfigError> {
        for tier in &mut self.tiers {
            tier.url = tier.url.clone().with_ttl(ttl).map_err(|e| {
                ConfigError::new(None, ConfigPart::Url, format!("tier `{}`: {e}", tier.name))
            })?;
        }
        Ok(self)
    }

    /// The tiers, by name.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// The routes, in order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The first route that takes `name`, and its tier.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] (`config.route`) when no route takes `name`, or `name` is the
    /// router's guard ([`GUARD_NAME`]).
    pub fn route(&self, name: &LockName) -> Result<(&Route, &Tier), Error> {
        if name.as_str() == GUARD_NAME {
            return Err(Error::invalid_option(
                ConfigPart::Route.option_name(),
                format!("`{GUARD_NAME}` is the tiered router's own guard, not a lock name"),
            ));
        }
        let route = self
            .routes
            .iter()
            .find(|r| r.matches(name))
            .ok_or_else(|| {
                Error::invalid_option(
                    ConfigPart::Route.option_name(),
                    format!(
                        "no route takes the name `{}` (the patterns: {})",
                        name.as_str(),
                        self.routes
                            .iter()
                            .map(|r| format!("`{}`", r.pattern))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
        let tier = self.tier(&route.tier).ok_or_else(|| {
            Error::invalid_option(ConfigPart::Route.option_name(), "route to a missing tier")
        })?;
        Ok((route, tier))
    }

    /// The tier called `name`.
    pub fn tier(&self, name: &str) -> Option<&Tier> {
        self.tiers.iter().find(|t| t.name == name)
    }

    /// What decides where a name goes: every route in order, each with its tier's identity
    /// (scheme, sorted hosts, path, namespace; no credentials, TTL or TLS files), hashed with
    /// 64-bit FNV-1a (stable across Rust versions and platforms). Renaming a tier or changing a
    /// TTL keeps it; changing a pattern, the order, or where a tier points changes it.
    pub fn fingerprint(&self) -> u64 {
        let mut canonical = String::new();
        for r in &self.routes {
            let identity = self.tier(&r.tier).map(Tier::identity).unwrap_or_default();
            canonical.push_str(&format!("{}\u{0}{identity}\u{0}", r.pattern));
        }
        fnv1a(canonical.as_bytes())
    }

    /// The permit count of the drift guard's semaphore: the fingerprint mapped into
    /// `MAX_PERMITS/2 + 1 ..= MAX_PERMITS` (500,001 counts; a count that large never runs out
    /// of permits for the routers of one configuration).
    pub fn guard_permits(&self) -> u32 {
        let half = u64::from(MAX_PERMITS / 2);
        // Lossless: the value is at most MAX_PERMITS.
        (half + 1 + self.fingerprint() % half) as u32
    }
}

fn names(tiers: &[Tier]) -> String {
    tiers
        .iter()
        .map(|t| format!("`{}`", t.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
