//! The shared conformance suite against etcd with authentication enabled: `etcd_auth` (one
//! member). The lockers log in as a non-root user whose only role grants `readwrite` on the
//! conformance prefix (`dlock-test/`), exactly the permission the README's "Deployments"
//! section documents; audits and server-side breaks log in as `root`. The members issue simple
//! auth tokens that expire after 5 s without use (`--auth-token-ttl 5`, etcd's default is
//! 300 s), so the lockers' token refresh runs during the scenarios: runs of the row logged 3
//! to 5 refreshes (`auth token refreshed` at debug level). A 2 s TTL gave 76 to 87 a run (each
//! a login: a password check and a raft round at the server); on a 2-core host loaded by other
//! work, runs with it had up to 26 of 40 scenarios starved, runs with 5 s 0 to 1 (and runs
//! with 300 s up to 7: the load varied, so this is no clean measurement).
//! `tests/security/auth_refresh.rs` and `secrets.rs` expire 2 s tokens on purpose. The backend is
//! in `support/backend.rs`.
//!
//! Its own test binary, for the reason `conformance_tls.rs` gives: the other etcd rows keep
//! both cores busy. With authentication on, etcd answers more slowly under load (on a host
//! loaded by other work it logged "apply request took too long", up to 0.57 s, for the
//! permission-checked reads of the scenarios), so this row's timing scenarios starve sooner
//! than the `etcd` row's.

#[path = "support/backend.rs"]
mod backend;

use backend::{ETCD, auth_backend};
use dlock_conformance::servers::ServerOptions;

/// The simple-token TTL of the `etcd-auth` members, in seconds: short, so that tokens expire
/// between a locker's requests and are refreshed (etcd restarts a simple token's TTL when a
/// request uses it); see the module documentation for why not shorter.
const AUTH_TOKEN_TTL_SECS: &str = "5";

/// The bcrypt cost of the stored password hashes: the lowest etcd accepts (its default is
/// 10). Every locker logs in when it is built (once for its balanced client and once per
/// member it sends requests to), and etcd checks each login's password with bcrypt: at the
/// default cost the suite's burst of lockers (24 scenarios starting together on 2 cores, several
/// lockers each) queued past the 2 s request timeout and every scenario failed at
/// "connect: no reply from etcd within 2 s". What this row tests (permissions, token
/// expiry and refresh) does not depend on the cost; the README's "Deployments" section says
/// what logins cost a deployment.
const BCRYPT_COST: &str = "4";

// One member with authentication enabled (`auth enable` after `user add root`), issuing
// simple tokens with a 5 s TTL; the lockers log in as the locker user
// (`EtcdLockerBuilder::user`).
dlock_conformance::conformance_tests!(
    etcd_auth,
    {
        auth_backend(
            1,
            "etcd-auth",
            ServerOptions::default().with_args([
                "--auth-token",
                "simple",
                "--auth-token-ttl",
                AUTH_TOKEN_TTL_SECS,
                "--bcrypt-cost",
                BCRYPT_COST,
            ]),
        )
    },
    declared = ETCD
);
