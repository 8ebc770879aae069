//! The key layout, shared with etcd's own `concurrency.Mutex` and `etcdctl lock`.
//!
//! A lock named `n` under prefix `p` is the key range `p/<n encoded>/`; each contender puts ONE
//! key `p/<n encoded>/<session lease id in lowercase hex>` attached to its session lease. The
//! contender whose key has the lowest create revision holds the lock.

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
