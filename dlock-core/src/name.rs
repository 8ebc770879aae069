//! Validated lock names.

use std::fmt;

use crate::error::{Error, NameError};

/// A validated lock name: 1..=256 bytes of `[A-Za-z0-9._:/-]`, with no empty, `.` or `..`
/// segment and no leading or trailing `/`.
///
/// Names are validated once, here, so every backend sees the same set of names and bad input is
/// rejected before any I/O. Backends encode names so that no name's keys contain another's:
/// holding `a` never blocks `a/b` or `ab`.
///
/// ```
/// use dlock_core::LockName;
/// let name = LockName::new("orders/42")?;
/// assert_eq!(name.as_str(), "orders/42");
/// assert!(LockName::new("a//b").is_err());
/// # Ok::<(), dlock_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(String);

impl LockName {
    /// The longest accepted name, in bytes.
    pub const MAX_LEN: usize = 256;

    /// Validates `name`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] saying why the name was rejected.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        match Self::check(&name) {
            Ok(()) => Ok(LockName(name)),
            Err(reason) => Err(Error::InvalidName {
                name: name.chars().take(64).collect(),
                reason,
            }),
        }
    }

    fn check(name: &str) -> Result<(), NameError> {
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > Self::MAX_LEN {
            return Err(NameError::TooLong { len: name.len() });
        }
        if let Some(at) = name.bytes().position(|b| {
            !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-'))
        }) {
            return Err(NameError::BadChar { at });
        }
        if name.starts_with('/') || name.ends_with('/') {
            return Err(NameError::EdgeSlash);
        }
        for segment in name.split('/') {
            match segment {
                "" => return Err(NameError::EmptySegment),
                "." | ".." => return Err(NameError::DotSegment),
                _ => {}
            }
        }
        Ok(())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name encoded as ONE path segment with no `/`, such that distinct names give distinct
    /// segments and no segment is a prefix-extension problem for key-range backends.
    ///
    /// `/` becomes `%2F` and `%` cannot occur in a valid name, so the encoding is injective.
    /// Backends that build keys or node paths under a shared prefix (etcd, ZooKeeper) use it.
    ///
    /// ```
    /// use dlock_core::LockName;
    /// assert_eq!(LockName::new("a/b")?.encoded(), "a%2Fb");
    /// # Ok::<(), dlock_core::Error>(())
    /// ```
    pub fn encoded(&self) -> String {
        self.0.replace('/', "%2F")
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self, Error> {
        LockName::new(value)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(value: String) -> Result<Self, Error> {
        LockName::new(value)
    }
}

impl std::str::FromStr for LockName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        LockName::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(name: &str) -> Option<NameError> {
        match LockName::new(name) {
            Ok(_) => None,
            Err(Error::InvalidName { reason, .. }) => Some(reason),
            Err(other) => panic!("unexpected error kind {other:?}"),
        }
    }

    #[test]
    fn table() {
        let max = "a".repeat(256);
        let over = "a".repeat(257);
        let cases: &[(&str, Option<NameError>)] = &[
            ("a", None),
            ("orders/42", None),
            ("A-z_0.9:x/y", None),
            ("a.b", None),
            ("..a", None),
            (max.as_str(), None),
            ("", Some(NameError::Empty)),
            (over.as_str(), Some(NameError::TooLong { len: 257 })),
            ("a//b", Some(NameError::EmptySegment)),
            ("/a", Some(NameError::EdgeSlash)),
            ("a/", Some(NameError::EdgeSlash)),
            ("/", Some(NameError::EdgeSlash)),
            (".", Some(NameError::DotSegment)),
            ("..", Some(NameError::DotSegment)),
            ("a/./b", Some(NameError::DotSegment)),
            ("a/..", Some(NameError::DotSegment)),
            ("a\0b", Some(NameError::BadChar { at: 1 })),
            ("a b", Some(NameError::BadChar { at: 1 })),
            ("é", Some(NameError::BadChar { at: 0 })),
            ("a*", Some(NameError::BadChar { at: 1 })),
            ("a%2F", Some(NameError::BadChar { at: 1 })),
        ];
        for (name, want) in cases {
            assert_eq!(reason(name), *want, "name {name:?}");
        }
    }

    #[test]
    fn rejection_says_why() {
        let err = LockName::new("a//b").expect_err("must reject");
        assert!(err.to_string().contains("empty segment"), "{err}");
        assert_eq!(err.kind(), crate::ErrorKind::InvalidInput);
    }

    #[test]
    fn encoding_is_injective_and_slash_free() {
        let names = [
            "a",
            "a/b",
            "ab",
            "a%2Fb".replace('%', "_").as_str().to_owned().leak() as &str,
            "a:b",
        ];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            let enc = LockName::new(n).expect("valid").encoded();
            assert!(!enc.contains('/'));
            assert!(seen.insert(enc), "collision for {n}");
        }
    }
}
