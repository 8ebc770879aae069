//! Tiers: one configuration file names lockers by URL and routes each lock name to exactly
//! one of them (see the crate docs, "Tiers").

mod config;
mod guard;
mod pattern;
mod router;

#[cfg(test)]
mod tests;

pub use config::{ConfigError, ConfigPart, GUARD_NAME, Route, Tier, TieredConfig};
pub use router::TieredLocker;
