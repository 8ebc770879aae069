//! Mapping etcd-client errors to `dlock_core::Error` kinds.

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

/// Why a TLS handshake failed for good: retrying the same connection cannot help.
#[cfg(feature = "tls")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsRefusal {
    /// Our roots do not accept the server's certificate (another CA, a name the certificate
    /// does not carry, expired).
    ServerCertificate,
    /// The server refused our client certificate (none, another CA's, expired).
    ClientCertificate,
}

/// Whether `e` (or an error it was caused by) is a TLS handshake failure over certificates:
/// a server certificate our roots reject, or one of core's
/// [`REFUSAL_ALERTS`](dlock_core::backend::tls::REFUSAL_ALERTS) from the server.
#[cfg(feature = "tls")]
fn tls_refusal(e: &etcd_client::Error) -> Option<TlsRefusal> {
    let first: &(dyn std::error::Error + 'static) = e;
    let chain = std::iter::successors(Some(first), |e| e.source());
    chain.map(ToString::to_string).find_map(|t| {
        if t.contains("invalid peer certificate") {
            Some(TlsRefusal::ServerCertificate)
        } else if dlock_core::backend::tls::refusal_in(&t).is_some() {
            Some(TlsRefusal::ClientCertificate)
        } else {
            None
        }
    })
}

/// Converts an etcd-client error: transport trouble and a stale auth token (refreshed before
/// the retry) are [`Error::Unavailable`], refused credentials or permissions
/// [`Error::AccessDenied`], anything else the server answered is [`Error::Backend`]. A TLS
/// handshake that failed over certificates is not retryable: a server certificate our roots
/// do not accept is [`Error::Backend`], our client certificate refused [`Error::AccessDenied`].
pub(crate) fn map(what: &str, e: etcd_client::Error) -> Error {
    #[cfg(feature = "tls")]
    match tls_refusal(&e) {
        Some(TlsRefusal::ServerCertificate) => {
            let message = format!(
                "{what}: TLS: the server's certificate is not accepted (check \
                 tls_root_certificates and that the certificate names the endpoint's host): {e}"
            );
            return Error::backend(message, Some(Box::new(e) as BoxError));
        }
        Some(TlsRefusal::ClientCertificate) => {
            let message = format!(
                "{what}: TLS: the server refused our client certificate (check \
                 tls_client_identity): {e}"
            );
            return Error::access_denied(message, Some(Box::new(e) as BoxError));
        }
        None => {}
    }
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
    fn certificate_failures_are_not_retryable() {
        let unknown = status(Code::Unavailable, "invalid peer certificate: UnknownIssuer");
        let mapped = map("x", unknown);
        assert!(!mapped.is_retryable(), "{mapped}");
        assert_eq!(mapped.kind(), dlock_core::ErrorKind::Backend, "{mapped}");
        assert!(
            mapped.to_string().contains("tls_root_certificates"),
            "{mapped}"
        );
        let refused = status(
            Code::Unavailable,
            "transport error: received fatal alert: CertificateRequired",
        );
        let mapped = map("x", refused);
        assert_eq!(
            mapped.kind(),
            dlock_core::ErrorKind::AccessDenied,
            "{mapped}"
        );
        assert!(
            mapped.to_string().contains("tls_client_identity"),
            "{mapped}"
        );
        // Other transport trouble stays retryable.
        let reset = status(Code::Unavailable, "connection reset by peer");
        assert!(map("x", reset).is_retryable());
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
