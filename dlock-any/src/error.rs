//! The typed error of a URL that does not parse or does not fit its backend.

use std::fmt;

/// The part of a locker URL an [`UrlError`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UrlPart {
    /// The scheme (`redis`, `etcd+tls`, …): unknown, missing, or its backend's cargo feature is
    /// off.
    Scheme,
    /// The user name or password in the authority (`user:password@`).
    Credentials,
    /// A host of the authority (empty, malformed, duplicated, or too many for the scheme).
    Host,
    /// A port of the authority (not a number in 1..=65535).
    Port,
    /// The path: the Redis database, the Sentinel master name, the etcd prefix or the
    /// ZooKeeper root.
    Path,
    /// A query parameter this scheme does not take, given twice, or missing its partner
    /// (`cert=` without `key=`); holds the parameter's name.
    Parameter(String),
    /// The value of a query parameter (`ttl=0s`, `namespace=a//b`); holds the parameter's name.
    Value(String),
}

impl UrlPart {
    /// The part as the `option` of a [`dlock_core::Error::InvalidOption`]: `url.scheme`,
    /// `url.credentials`, `url.host`, `url.port`, `url.path`, `url.parameter`, `url.value`.
    /// (The parameter's name is in the message.)
    pub fn option_name(&self) -> &'static str {
        match self {
            UrlPart::Scheme => "url.scheme",
            UrlPart::Credentials => "url.credentials",
            UrlPart::Host => "url.host",
            UrlPart::Port => "url.port",
            UrlPart::Path => "url.path",
            UrlPart::Parameter(_) => "url.parameter",
            UrlPart::Value(_) => "url.value",
        }
    }
}

impl fmt::Display for UrlPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlPart::Scheme => f.write_str("scheme"),
            UrlPart::Credentials => f.write_str("credentials"),
            UrlPart::Host => f.write_str("host"),
            UrlPart::Port => f.write_str("port"),
            UrlPart::Path => f.write_str("path"),
            UrlPart::Parameter(name) => write!(f, "query parameter `{name}`"),
            UrlPart::Value(name) => write!(f, "value of query parameter `{name}`"),
        }
    }
}

/// A locker URL that was rejected before any I/O, naming the part at fault.
///
/// Its message never contains a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlError {
    part: UrlPart,
    message: String,
}

impl UrlError {
    pub(crate) fn new(part: UrlPart, message: impl Into<String>) -> Self {
        UrlError {
            part,
            message: message.into(),
        }
    }

    /// The part of the URL at fault.
    pub fn part(&self) -> &UrlPart {
        &self.part
    }

    /// What is wrong with it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad locker URL: {}: {}", self.part, self.message)
    }
}

impl std::error::Error for UrlError {}

impl From<UrlError> for dlock_core::Error {
    /// An [`Error::InvalidOption`](dlock_core::Error::InvalidOption) whose `option` is
    /// [`UrlPart::option_name`] and whose reason names the part and says what is wrong.
    fn from(e: UrlError) -> Self {
        dlock_core::Error::invalid_option(
            e.part.option_name(),
            format!("{}: {}", e.part, e.message),
        )
    }
}
