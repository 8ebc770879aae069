//! The key layout, shared with etcd's own `concurrency.Mutex` and `etcdctl lock`.
//!
//! A lock named `n` under prefix `p` is the key range `p/<n encoded>/`; each contender puts ONE
//! key `p/<n encoded>/<session lease id in lowercase hex>` attached to its session lease. The
//! contender whose key has the lowest create revision holds the lock.
//!
//! The read-write lock and the semaphore of `n` put their keys in sub-ranges of that range
//! (`read/`, `write/`, `permit/`; see `queue.rs`), so no key of theirs is a mutex key.

use dlock_core::LockName;

/// The range every contender of `name` puts its key in: `<prefix>/<name>/`, the name encoded
/// (`/` as `%2F`) unless `raw`.
pub(crate) fn lock_range(prefix: &str, name: &LockName, raw: bool) -> String {
    format!("{}/", etcd_mutex_name(prefix, name, raw))
}

/// The name to pass to `etcdctl lock` (or `concurrency.NewMutex`) to contend with dlock for
/// `name`: `<prefix>/<name>` (no trailing slash; etcd appends it), the name encoded unless
/// `raw`.
pub(crate) fn etcd_mutex_name(prefix: &str, name: &LockName, raw: bool) -> String {
    if raw {
        format!("{prefix}/{}", name.as_str())
    } else {
        format!("{prefix}/{}", name.encoded())
    }
}

/// Our key in a lock range: the range followed by the lease id in lowercase hex, exactly as
/// etcd's `Mutex` writes it (`fmt.Sprintf("%s%x", pfx, leaseID)`).
pub(crate) fn contender_key(range: &str, lease_id: i64) -> String {
    format!("{range}{lease_id:x}")
}

/// Whether `key` is a mutex contender key of `range` (`<range><lease hex>`, as
/// [`contender_key`] and etcd's `Mutex` write it): a non-empty rest without `/`. The read, write
/// and permit keys of the same range (and, with raw names, the keys of a name below this one)
/// have a `/` in their rest.
pub(crate) fn is_contender_key(range: &str, key: &[u8]) -> bool {
    key.strip_prefix(range.as_bytes())
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
}

/// A read, write or permit key: `<sub-range><request number in hex>/<session lease hex>`.
/// The request number (unique in the process) lets several requests of one locker queue on
/// one name at once; the key still ends with the session's lease id, as every key of the
/// session does.
pub(crate) fn request_key(sub_range: &str, request: u64, lease_id: i64) -> String {
    format!("{sub_range}{request:x}/{lease_id:x}")
}

/// The range of a read-write lock's readers: `<lock range>read/`, as etcd's recipes
/// `RWMutex` (created with the prefix `<prefix>/<name>`) names its read keys.
pub(crate) fn read_range(lock_range: &str) -> String {
    format!("{lock_range}read/")
}

/// The range of a read-write lock's writers: `<lock range>write/` (etcd's recipes
/// `RWMutex`).
pub(crate) fn write_range(lock_range: &str) -> String {
    format!("{lock_range}write/")
}

/// The range of a semaphore's permit keys: `<lock range>permit/`.
pub(crate) fn permit_range(lock_range: &str) -> String {
    format!("{lock_range}permit/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_etcd_mutex() {
        let name = LockName::new("orders/42").expect("valid");
        let range = lock_range("app/locks", &name, false);
        assert_eq!(range, "app/locks/orders%2F42/");
        assert_eq!(
            contender_key(&range, 0x694d_7a3b_51c2_0a0f),
            "app/locks/orders%2F42/694d7a3b51c20a0f"
        );
        assert_eq!(
            etcd_mutex_name("app/locks", &name, false),
            "app/locks/orders%2F42"
        );
    }

    #[test]
    fn raw_layout_matches_etcd_mutex_on_slash_prefixes() {
        let name = LockName::new("orders/42").expect("valid");
        assert_eq!(etcd_mutex_name("/locks", &name, true), "/locks/orders/42");
        let range = lock_range("/locks", &name, true);
        assert_eq!(range, "/locks/orders/42/");
        assert_eq!(contender_key(&range, 0xab), "/locks/orders/42/ab");
    }

    #[test]
    fn family_ranges_lie_apart_from_mutex_keys() {
        let name = LockName::new("orders/42").expect("valid");
        let range = lock_range("app", &name, false);
        assert_eq!(read_range(&range), "app/orders%2F42/read/");
        assert_eq!(write_range(&range), "app/orders%2F42/write/");
        assert_eq!(permit_range(&range), "app/orders%2F42/permit/");
        // A mutex key is `<range><hex>`: it never lies in a sub-range (hex has no '/').
        let mutex_key = contender_key(&range, 0x1f);
        for sub in [
            read_range(&range),
            write_range(&range),
            permit_range(&range),
        ] {
            assert!(!mutex_key.starts_with(&sub));
            let key = request_key(&sub, 0x2a, 0x1f);
            assert_eq!(key, format!("{sub}2a/1f"));
            assert!(key.starts_with(&range) && key.ends_with("/1f"));
        }
    }

    #[test]
    fn contender_keys_are_told_from_family_keys() {
        let name = LockName::new("orders/42").expect("valid");
        let range = lock_range("app", &name, false);
        assert!(is_contender_key(
            &range,
            contender_key(&range, 0x1f).as_bytes()
        ));
        assert!(!is_contender_key(&range, range.as_bytes()));
        assert!(!is_contender_key(&range, b"app/other/1f"));
        for sub in [
            read_range(&range),
            write_range(&range),
            permit_range(&range),
        ] {
            assert!(!is_contender_key(
                &range,
                request_key(&sub, 2, 0x1f).as_bytes()
            ));
        }
    }

    #[test]
    fn no_lock_range_contains_another() {
        let names = ["a", "a/b", "ab", "a:b", "a.b"];
        for x in names {
            for y in names {
                if x == y {
                    continue;
                }
                let rx = lock_range("p", &LockName::new(x).expect("valid"), false);
                let ry = lock_range("p", &LockName::new(y).expect("valid"), false);
                assert!(!ry.starts_with(&rx), "{ry} lies inside {rx}");
            }
        }
    }
}
