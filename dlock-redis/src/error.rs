//! redis-rs errors (and malformed replies) as `dlock_core::Error`s: refused access, a server
//! that is not a usable master, unreachable or slow servers.

use std::time::Duration;

use dlock_core::Error;
use redis::RedisError;

/// Whether the server answered that it cannot serve writes right now (a replica, loading its
/// data, a failover in progress, too few replicas for `min-replicas-to-write`): retryable, and
/// worth a new connection.
pub(crate) fn is_not_master(e: &RedisError) -> bool {
    use redis::ServerErrorKind as K;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(
            K::ReadOnly | K::BusyLoading | K::MasterDown | K::TryAgain | K::ClusterDown
        )
    ) || matches!(
        e.code(),
        Some("READONLY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "NOREPLICAS")
    )
}

/// Whether a Redis Cluster's routing failed for now: a redirect (`MOVED`, `ASK`) still
/// pending when the cluster connection's retries ran out (a resharding under way), or no
/// connection to the slot's master: retryable.
pub(crate) fn is_cluster_redirect(e: &RedisError) -> bool {
    use redis::ServerErrorKind as K;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(K::Moved | K::Ask) | redis::ErrorKind::ClusterConnectionNotFound
    ) || matches!(e.code(), Some("MOVED" | "ASK"))
}

/// Whether the server refused our credentials or our ACL permissions (`WRONGPASS`, `NOAUTH`,
/// `NOPERM`, or a command inside our script refused by ACL, which Redis reports as a script
/// error "The user executing the script can't …"): retrying cannot help until an operator
/// changes them.
pub(crate) fn is_refused_access(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::AuthenticationFailed
            | redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
    ) || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        || e.to_string()
            .contains("The user executing the script can't")
}

/// Maps a client error: refused credentials, permissions or client certificates are
/// `AccessDenied` (not retryable), a server certificate our roots refuse a `Backend` error
/// (see [`refused`](crate::tls::refused)); connection problems are `Unavailable`
/// (retryable); everything else is a `Backend` error.
pub(crate) fn map_err(node: &str, what: &str, e: &RedisError) -> Error {
    if let Some(refused) = crate::tls::refused(node, what, e) {
        return refused;
    }
    let source: dlock_core::BoxError = Box::new(e.clone());
    if is_refused_access(e) {
        return Error::access_denied(
            format!("{what} on {node}: credentials or ACL permissions refused: {e}"),
            Some(source),
        );
    }
    let message = format!("{what} on {node}: {e}");
    if is_not_master(e)
        || is_cluster_redirect(e)
        || e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
    {
        Error::unavailable(message, Some(source))
    } else {
        Error::backend(message, Some(source))
    }
}

/// Whether `e` is worth retrying within the caller's wait: the server was slow (our budget ran
/// out, or the client timed out), or answered that it cannot serve writes right now
/// ([`is_not_master`]), as opposed to definitely down (refused, reset) or answering with an
/// error.
pub(crate) fn is_slow(e: &Error) -> bool {
    match e {
        Error::Unavailable { source: None, .. } => true,
        Error::Unavailable {
            source: Some(s), ..
        } => s
            .downcast_ref::<RedisError>()
            .is_some_and(|r| r.is_timeout() || is_not_master(r) || is_cluster_redirect(r)),
        _ => false,
    }
}

/// Whether `e` says the server could not be reached or dropped the connection (refused,
/// reset, broken pipe), as opposed to slow ([`is_slow`]) or answering with an error.
pub(crate) fn is_unreachable(e: &Error) -> bool {
    match e {
        Error::Unavailable {
            source: Some(s), ..
        } => s.downcast_ref::<RedisError>().is_some_and(|r| {
            r.is_io_error()
                || r.is_connection_refusal()
                || r.is_connection_dropped()
                || r.is_unrecoverable_error()
        }),
        _ => false,
    }
}

/// The error of a request cut by its time budget.
pub(crate) fn timed_out(node: &str, what: &str, budget: Duration) -> Error {
    Error::unavailable(
        format!("{what} on {node}: no reply within {budget:?}"),
        None,
    )
}

/// A Redis integer reply as a fencing counter.
pub(crate) fn token_of(node: &str, v: i64) -> Result<u64, Error> {
    u64::try_from(v).ok().filter(|t| *t > 0).ok_or_else(|| {
        Error::backend(
            format!("{node} returned an invalid fencing counter {v}"),
            None,
        )
    })
}

/// A reply of the wrong shape.
pub(crate) fn unexpected(node: &str, what: &str, reply: &[i64]) -> Error {
    Error::backend(
        format!("unexpected reply to {what} from {node}: {reply:?}"),
        None,
    )
}
