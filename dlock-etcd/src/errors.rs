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

/// Converts an etcd-client error: transport trouble is [`Error::Unavailable`], anything the
/// server answered is [`Error::Backend`].
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
    };
    let message = format!("{what}: {e}");
    let source: BoxError = Box::new(e);
    if unavailable {
        Error::unavailable(message, Some(source))
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
