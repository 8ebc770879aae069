//! Mapping etcd-client errors to dlock's error kinds.

use std::time::Duration;

use dlock_core::{BoxError, Error};
use tonic::Code;

/// Whether an etcd error means the lease does not exist (expired or revoked).
pub(crate) fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == Code::NotFound || s.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("lease not found"),
        _ => false,
    }
}

/// Whether an etcd error means our auth token is no longer accepted: it expired
/// (`--auth-token-ttl`, a JWT's expiry) or the auth store changed since it was issued. A new
/// token fixes it, so it is worth refreshing and retrying.
pub(crate) fn is_stale_auth(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == Code::Unauthenticated
                || s.message().contains("invalid auth token")
                || s.message().contains("revision of auth store is old")
        }
        etcd_client::Error::LeaseKeepAliveError(m) | etcd_client::Error::WatchError(m) => {
            m.contains("invalid auth token") || m.contains("revision of auth store is old")
        }
        _ => false,
    }
}

/// Whether etcd refused our user, password or role permissions for good (a stale token is
/// not: see [`is_stale_auth`]).
fn is_access_denied(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == Code::PermissionDenied
                || s.message().contains("authentication failed")
                || s.message().contains("user name is empty")
                || s.message().contains("user name not found")
        }
        _ => false,
    }
}

/// Converts an etcd-client error: transport trouble and a stale auth token (refreshed before
/// the retry) are [`Error::Unavailable`], refused credentials or permissions
/// [`Error::AccessDenied`], anything else the server answered is [`Error::Backend`].
pub(crate) fn map(what: &str, e: etcd_client::Error) -> Error {
    let unavailable = match &e {
        etcd_client::Error::TransportError(_)
        | etcd_client::Error::IoError(_)
        | etcd_client::Error::WatchError(_)
        | etcd_client::Error::LeaseKeepAliveError(_) => true,
        etcd_client::Error::GRpcStatus(s) => matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Aborted
                | Code::Unknown
        ),
        _ => false,
    } || is_stale_auth(&e);
    let denied = !unavailable && is_access_denied(&e);
    let message = format!("{what}: {e}");
    let source: BoxError = Box::new(e);
    if unavailable {
        Error::unavailable(message, Some(source))
    } else if denied {
        Error::access_denied(message, Some(source))
    } else {
        Error::backend(message, Some(source))
    }
}

/// A request that got no reply in time.
pub(crate) fn no_reply(what: &str, after: Duration) -> Error {
    Error::unavailable(format!("{what}: no reply from etcd within {after:?}"), None)
}

/// A reply that does not have the shape dlock expects.
pub(crate) fn unexpected(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::backend(
        format!("{what}: unexpected reply from etcd: {detail}"),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, msg: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg))
    }

    #[test]
    fn stale_auth_is_retryable_other_refusals_are_not() {
        for e in [
            status(Code::Unauthenticated, "etcdserver: invalid auth token"),
            status(
                Code::InvalidArgument,
                "etcdserver: revision of auth store is old",
            ),
        ] {
            assert!(is_stale_auth(&e), "{e}");
            assert!(map("x", e).is_retryable());
        }
        for e in [
            status(Code::InvalidArgument, "etcdserver: user name is empty"),
            status(
                Code::FailedPrecondition,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            status(Code::PermissionDenied, "etcdserver: permission denied"),
        ] {
            assert!(!is_stale_auth(&e), "{e}");
            let mapped = map("x", e);
            assert!(!mapped.is_retryable());
            assert_eq!(
                mapped.kind(),
                dlock_core::ErrorKind::AccessDenied,
                "{mapped}"
            );
        }
    }
}
