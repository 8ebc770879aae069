//! The one error type of dlock, with semantic kinds.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A boxed error from a backend's client library, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a held lease is no longer held.
///
/// Delivered by [`Lease::lost`](crate::Lease::lost). A lost lease is final: the lock may already
/// belong to someone else, so nothing about it is retryable.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The lease was not extended before its deadline (renewals failed or were too slow).
    Expired,
    /// The server says the lock is no longer ours (key gone or owned by another value,
    /// node deleted, lease revoked).
    Gone(String),
    /// The backend session (etcd lease, ZooKeeper session) ended.
    SessionEnded(String),
    /// The locker that granted the lease was shut down.
    Closed,
    /// Not a loss: the holder released the lease. [`Lease::lost`](crate::Lease::lost) futures
    /// still pending at release resolve with this.
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Expired => f.write_str("the lease was not renewed before its deadline"),
            LossReason::Gone(why) => write!(f, "the lock is no longer ours at the server: {why}"),
            LossReason::SessionEnded(why) => write!(f, "the backend session ended: {why}"),
            LossReason::Closed => f.write_str("the locker was closed"),
            LossReason::Released => f.write_str("the lease was released by its holder"),
        }
    }
}

/// Why a [`LockName`](crate::LockName) was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    Empty,
    /// The name is longer than [`LockName::MAX_LEN`](crate::LockName::MAX_LEN) bytes.
    TooLong {
        /// The length of the rejected name, in bytes.
        len: usize,
    },
    /// The name holds a byte outside `[A-Za-z0-9._:/-]`.
    BadChar {
        /// Byte offset of the first offending character.
        at: usize,
    },
    /// The name starts or ends with `/`.
    EdgeSlash,
    /// The name holds an empty segment (`a//b`).
    EmptySegment,
    /// The name holds a `.` or `..` segment.
    DotSegment,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::Empty => f.write_str("a lock name must not be empty"),
            NameError::TooLong { len } => {
                write!(f, "a lock name is at most 256 bytes, this one has {len}")
            }
            NameError::BadChar { at } => write!(
                f,
                "byte {at} is not one of the allowed characters [A-Za-z0-9._:/-]"
            ),
            NameError::EdgeSlash => f.write_str("a lock name must not start or end with '/'"),
            NameError::EmptySegment => {
                f.write_str("a lock name must not hold an empty segment ('//')")
            }
            NameError::DotSegment => f.write_str("a lock name must not hold a '.' or '..' segment"),
        }
    }
}

/// The failure of one node in a quorum operation (Redlock).
#[derive(Debug, Clone)]
pub struct NodeError {
    /// The node, as the user configured it (password removed).
    pub node: String,
    /// What went wrong there.
    pub cause: String,
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.cause)
    }
}

/// The coarse kind of an [`Error`], for matching without caring about the details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input from the caller; nothing was sent to a server.
    InvalidInput,
    /// The wait given to `acquire` elapsed.
    Timeout,
    /// The lease is lost.
    Lost,
    /// Fewer nodes than a quorum agreed.
    QuorumNotReached,
    /// The backend could not be reached.
    Unavailable,
    /// The backend answered with an error or something unexpected.
    Backend,
    /// The server refused our credentials or permissions; retrying cannot help until an
    /// operator changes them.
    AccessDenied,
    /// The locker was closed.
    Closed,
}

/// The error type of every dlock operation.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lock name was rejected.
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name (truncated to 64 characters).
        name: String,
        /// Why it was rejected.
        reason: NameError,
    },
    /// An option (TTL, wait, endpoint, …) was rejected.
    #[error("invalid option `{option}`: {reason}")]
    InvalidOption {
        /// The option's name.
        option: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// The wait elapsed before the lock was granted; nothing was left behind.
    #[error("timed out after {waited:?} waiting for the lock")]
    Timeout {
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lease was lost.
    #[error("lease lost: {0}")]
    Lost(LossReason),
    /// Fewer nodes than a quorum agreed; every node's cause is listed.
    #[error("quorum not reached: {granted} of {needed} needed nodes agreed ({})", display_causes(.causes))]
    QuorumNotReached {
        /// How many nodes a quorum needs.
        needed: usize,
        /// How many agreed.
        granted: usize,
        /// The cause for each node that did not agree.
        causes: Vec<NodeError>,
    },
    /// The backend could not be reached (connection refused, reset, timed out).
    #[error("backend unavailable: {message}")]
    Unavailable {
        /// What failed.
        message: String,
        /// The client library's error, when there is one.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// The server refused our credentials (a wrong password or user) or our permissions (an
    /// ACL rule the locker needs is missing). Not retryable: it lasts until an operator changes
    /// the credentials or the rules.
    #[error("access denied: {message}")]
    AccessDenied {
        /// What was refused (never the password).
        message: String,
        /// The client library's error, when there is one.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// The locker was closed ([`Locker::close`](crate::Locker::close)): it grants nothing more.
    #[error("the locker was closed")]
    Closed,
    /// The backend answered with an error or a reply dlock did not expect.
    #[error("backend error: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// The client library's error, when there is one.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
    },
}

fn display_causes(causes: &[NodeError]) -> String {
    causes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Error {
    /// The coarse kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidName { .. } | Error::InvalidOption { .. } => ErrorKind::InvalidInput,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Lost(_) => ErrorKind::Lost,
            Error::QuorumNotReached { .. } => ErrorKind::QuorumNotReached,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Backend { .. } => ErrorKind::Backend,
            Error::AccessDenied { .. } => ErrorKind::AccessDenied,
            Error::Closed => ErrorKind::Closed,
        }
    }

    /// Whether the same call may succeed if tried again later.
    ///
    /// Timeouts, unreachable backends and missed quorums are retryable; bad input, a lost lease
    /// and a closed locker are not.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::Timeout | ErrorKind::Unavailable | ErrorKind::QuorumNotReached
        )
    }

    /// An [`Error::InvalidOption`].
    pub fn invalid_option(option: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidOption {
            option,
            reason: reason.into(),
        }
    }

    /// An [`Error::Unavailable`] with the client library's error as its source.
    pub fn unavailable(message: impl Into<String>, source: impl Into<Option<BoxError>>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: source.into().map(Arc::from),
        }
    }

    /// An [`Error::AccessDenied`] with the client library's error as its source.
    pub fn access_denied(message: impl Into<String>, source: impl Into<Option<BoxError>>) -> Self {
        Error::AccessDenied {
            message: message.into(),
            source: source.into().map(Arc::from),
        }
    }

    /// An [`Error::Backend`] with the client library's error as its source.
    pub fn backend(message: impl Into<String>, source: impl Into<Option<BoxError>>) -> Self {
        Error::Backend {
            message: message.into(),
            source: source.into().map(Arc::from),
        }
    }
}

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_is_never_retryable() {
        assert!(!Error::Lost(LossReason::Expired).is_retryable());
        assert!(!Error::Lost(LossReason::Gone("x".into())).is_retryable());
        assert!(Error::unavailable("down", None).is_retryable());
        assert!(
            Error::Timeout {
                waited: Duration::from_secs(1)
            }
            .is_retryable()
        );
        assert!(!Error::invalid_option("ttl", "zero").is_retryable());
        assert!(!Error::Closed.is_retryable());
    }

    #[test]
    fn quorum_error_lists_each_node() {
        let e = Error::QuorumNotReached {
            needed: 3,
            granted: 1,
            causes: vec![
                NodeError {
                    node: "n1".into(),
                    cause: "refused".into(),
                },
                NodeError {
                    node: "n2".into(),
                    cause: "timeout".into(),
                },
            ],
        };
        let text = e.to_string();
        assert!(
            text.contains("n1: refused") && text.contains("n2: timeout"),
            "{text}"
        );
        assert_eq!(e.kind(), ErrorKind::QuorumNotReached);
    }
}
