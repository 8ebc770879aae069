//! Releases at once share transactions (`conn/deletes.rs`), each delete keeping its own guard:
//! 200 concurrent releases take far fewer than 200 requests, every one of them deletes its
//! key, and a key that was replaced by another incarnation in the meantime is left alone.

use crate::support;

use dlock_core::Locker;
use dlock_etcd::etcd_client::{GetOptions, PutOptions};

const LOCKS: usize = 200;

#[test]
fn concurrent_releases_share_transactions_and_keep_their_guards() {
    support::on_single("batched-release", |cluster, ns| async move {
        let locker = support::locker(&cluster, &ns).await;
        let names: Vec<_> = (0..LOCKS)
            .map(|i| support::name(&format!("b{i}")))
            .collect();
        let leases =
            futures::future::join_all(names.iter().map(|n| support::hold(&locker, n))).await;
        // Replace the first lock's key by another incarnation (same key, a new create revision).
        let mut c = locker.client().clone();
        let range = format!("{}/", locker.etcd_mutex_name(&names[0]));
        let ours = c
            .get(range.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .expect("read the first key");
        let key = ours
            .kvs()
            .first()
            .expect("the first lock's key")
            .key()
            .to_vec();
        c.delete(key.clone(), None).await.expect("delete by hand");
        c.put(key.clone(), "foreign", Some(PutOptions::new()))
            .await
            .expect("put another incarnation");

        let before = locker.stats().requests;
        let mut released = futures::future::join_all(leases.into_iter().map(|l| l.release())).await;
        let requests = locker.stats().requests - before;
        // The replaced key's lease may already be known lost: either answer is right for it.
        let _ = released.remove(0);
        for (i, r) in released.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("release of lock {} failed: {e}", i + 1));
        }
        assert!(
            requests * 4 < u64::try_from(LOCKS).expect("count"),
            "{LOCKS} releases at once took {requests} requests"
        );
        let left = support::keys_under(&locker, &ns).await;
        assert_eq!(
            left,
            vec![String::from_utf8_lossy(&key).into_owned()],
            "every held key deleted, the other incarnation kept"
        );
        c.delete(key, None).await.expect("clean up");
    });
}
