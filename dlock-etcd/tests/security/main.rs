//! TLS, authentication and secrets: certificates through the builder, auth token refresh,
//! and passwords and keys that never show in `Debug`, errors or traces.

#[path = "../support/mod.rs"]
mod support;

mod auth_refresh;
mod secrets;
#[cfg(feature = "tls")]
mod tls;
