//! Mapping of zookeeper-client errors onto dlock's error kinds.

use dlock_core::Error;
use zookeeper_client as zk;

/// Whether the error means the ZooKeeper session is over (its ephemeral nodes are gone or
/// about to be).
pub(crate) fn session_ended(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed
    )
}

/// Whether the error is a transient connection problem worth retrying on the same session.
///
/// When a connection dies, the client fails the requests in flight with the connection's own
/// error (an I/O error, "no response from connection", an unexpected reply), not only with
/// `ConnectionLoss`: those are transient too.
pub(crate) fn transient(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::ConnectionLoss
            | zk::Error::Timeout
            | zk::Error::Throttled
            | zk::Error::SessionMoved
            | zk::Error::Custom(_)
            | zk::Error::UnexpectedError(_)
            | zk::Error::UnmarshalError { .. }
    )
}

/// Converts a client error met while doing `what` into a dlock [`Error`].
pub(crate) fn map(what: &str, e: zk::Error) -> Error {
    let message = format!("ZooKeeper {what}: {e}");
    match e {
        zk::Error::ConnectionLoss
        | zk::Error::Timeout
        | zk::Error::NoHosts
        | zk::Error::Throttled
        | zk::Error::SessionMoved
        | zk::Error::SessionExpired
        | zk::Error::ClientClosed
        | zk::Error::Custom(_) => Error::unavailable(message, Some(Box::new(e) as _)),
        zk::Error::NoAuth | zk::Error::AuthFailed => {
            Error::access_denied(message, Some(Box::new(e) as _))
        }
        other => Error::backend(message, Some(Box::new(other) as _)),
    }
}
