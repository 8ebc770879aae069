//! The server-side layout of names: key prefixes, the keys of one lock name, and owner
//! values.

use dlock_core::{Error, LockName};
use rand::RngCore;

/// The longest key prefix a locker accepts, in bytes (the namespace included).
const MAX_PREFIX_LEN: usize = 512;

/// The prefix of every key: the raw `prefix`, then `<namespace>/` when a namespace is given
/// (checked by core: its characters are all fine here). The raw prefix must be printable ASCII
/// without whitespace, `{` or `}` (they would change the hash tag that keeps a lock's keys in
/// one cluster slot), and the whole at most [`MAX_PREFIX_LEN`] bytes.
pub(crate) fn key_prefix(prefix: &str, namespace: Option<&str>) -> Result<String, Error> {
    if let Some(at) = prefix
        .bytes()
        .position(|b| !b.is_ascii_graphic() || b == b'{' || b == b'}')
    {
        return Err(Error::invalid_option(
            "prefix",
            format!(
                "byte {at} must be printable ASCII other than '{{' and '}}', without whitespace"
            ),
        ));
    }
    let full = match namespace {
        Some(ns) => format!("{prefix}{ns}/"),
        None => prefix.to_owned(),
    };
    if full.len() > MAX_PREFIX_LEN {
        return Err(Error::invalid_option(
            "prefix",
            format!(
                "{} bytes (with the namespace) is longer than the maximum {MAX_PREFIX_LEN}",
                full.len()
            ),
        ));
    }
    Ok(full)
}

/// The keys of one lock name. All share the hash tag `{name}`, so they live in one cluster slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    /// `<prefix>dlock:{name}`: the lock itself, a plain string holding the owner value with a TTL.
    pub(crate) lock: String,
    /// `<prefix>dlock:{name}:fence`: the fencing counter (expires a week after the last grant).
    pub(crate) fence: String,
    /// `<prefix>dlock:{name}:q`: the FIFO queue of waiter entries (a list).
    pub(crate) queue: String,
    /// `<prefix>dlock:{name}:qt`: waiter entry → deadline in server milliseconds (a hash).
    pub(crate) deadlines: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let lock = format!("{prefix}dlock:{{{}}}", name.as_str());
        Keys {
            fence: format!("{lock}:fence"),
            queue: format!("{lock}:q"),
            deadlines: format!("{lock}:qt"),
            lock,
        }
    }
}

/// The keys of one name's read-write lock or semaphore (see `family_scripts`), in the name's
/// hash tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FamilyKeys {
    /// `<lock>:holders`: member `<mode>:<owner>` → expiry in server milliseconds (a sorted set).
    pub(crate) holders: String,
    /// `<lock>:holders:q`: the FIFO queue of waiting requests (a list).
    pub(crate) queue: String,
    /// `<lock>:holders:qt`: queue entry → deadline in server milliseconds (a hash).
    pub(crate) deadlines: String,
    /// `<lock>:fence`: the name's fencing counter, shared with the mutex.
    pub(crate) fence: String,
}

impl FamilyKeys {
    /// The family keys of the name whose mutex keys are `keys`.
    pub(crate) fn of(keys: &Keys) -> Self {
        let holders = format!("{}:holders", keys.lock);
        FamilyKeys {
            queue: format!("{holders}:q"),
            deadlines: format!("{holders}:qt"),
            fence: keys.fence.clone(),
            holders,
        }
    }
}

/// A random 128-bit value, hex-encoded: unique per acquire call across all clients.
pub(crate) fn random_id() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    let mut s = String::with_capacity(32);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = Keys::new("ns/", &LockName::new("a/b").expect("valid name"));
        assert_eq!(k.lock, "ns/dlock:{a/b}");
        assert_eq!(k.fence, "ns/dlock:{a/b}:fence");
        assert_eq!(k.queue, "ns/dlock:{a/b}:q");
        assert_eq!(k.deadlines, "ns/dlock:{a/b}:qt");
        let f = FamilyKeys::of(&k);
        assert_eq!(f.holders, "ns/dlock:{a/b}:holders");
        assert_eq!(f.queue, "ns/dlock:{a/b}:holders:q");
        assert_eq!(f.deadlines, "ns/dlock:{a/b}:holders:qt");
        assert_eq!(f.fence, "ns/dlock:{a/b}:fence");
    }

    #[test]
    fn names_are_isolated() {
        let a = Keys::new("", &LockName::new("a").expect("valid name"));
        let ab = Keys::new("", &LockName::new("ab").expect("valid name"));
        let a_b = Keys::new("", &LockName::new("a/b").expect("valid name"));
        for other in [&ab, &a_b] {
            assert_ne!(a.lock, other.lock);
            assert!(!other.lock.starts_with(&a.lock));
        }
    }

    #[test]
    fn prefixes_are_checked() {
        assert_eq!(key_prefix("app:", None).ok().as_deref(), Some("app:"));
        assert_eq!(
            key_prefix("", Some("t/run-1")).ok().as_deref(),
            Some("t/run-1/")
        );
        assert_eq!(
            key_prefix("app:", Some("t")).ok().as_deref(),
            Some("app:t/")
        );
        for (prefix, ns) in [("a{b", None), ("a b", None), ("x", Some("y".repeat(512)))] {
            let e = key_prefix(prefix, ns.as_deref()).expect_err(prefix);
            assert!(e.to_string().contains("prefix"), "{e}");
        }
    }

    #[test]
    fn owner_values_are_128_bit_and_distinct() {
        let a = random_id();
        assert_eq!(a.len(), 32);
        assert_ne!(a, random_id());
    }
}
