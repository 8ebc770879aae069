//! TLS, authentication and secrets: certificates through the builder, auth token refresh,
//! and passwords and keys that never show in `Debug`, errors or traces.

#[path = "../support/backend.rs"]
mod backend;
#[path = "../support/mod.rs"]
mod support;

mod auth_refresh;
mod secrets;
#[cfg(feature = "tls")]
mod tls;

use dlock_conformance::servers::{Cluster, ServerOptions};

/// A private etcd with authentication on, set up as an operator would (`AuthUsers::enable`:
/// root, and `users`' locker user with `readwrite` on `dlock-test/` only), issuing simple
/// tokens that expire after 2 s unused (etcd's default is 300 s), with the cheapest bcrypt.
fn auth_etcd(users: &backend::AuthUsers) -> Cluster {
    let cluster = support::private(&ServerOptions::default().with_args([
        "--auth-token-ttl",
        "2",
        "--bcrypt-cost",
        "4",
    ]));
    users
        .enable(cluster.endpoints())
        .expect("enable authentication");
    cluster
}
