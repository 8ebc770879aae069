//! Compaction of etcd's history while a waiter watches: no stale key, no stuck waiter.

use crate::support;

use std::time::Duration;

use dlock_etcd::etcd_client::CompactionOptions;

#[test]
fn compaction_while_waiting_leaves_no_stale_key_or_stuck_waiter() {
    support::on_single("compaction", |cluster, ns| async move {
        let name = support::name("c");
        let (holder, lease, _waiter, waiting) =
            support::held_and_waiting(&cluster, &ns, &name, Duration::from_secs(20)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished());

        // Move the store forward and compact all history up to now, physically.
        let mut c = holder.client().clone();
        let mut rev = 0;
        for i in 0..20 {
            rev = c
                .put(format!("{ns}-junk/{i}"), "x", None)
                .await
                .expect("put")
                .header()
                .map(|h| h.revision())
                .expect("header");
        }
        c.compact(rev, Some(CompactionOptions::new().with_physical()))
            .await
            .expect("compact");
        c.delete(
            format!("{ns}-junk/"),
            Some(dlock_etcd::etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .expect("clean junk");

        assert!(!waiting.is_finished(), "granted while the lock is held");
        let token = lease.token();
        lease.release().await.expect("release");
        let got = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiter is stuck after a compaction")
            .expect("task")
            .expect("granted");
        assert!(got.token() > token);
        assert_eq!(
            support::keys_under(&holder, &ns).await.len(),
            1,
            "only the new holder's key"
        );
        got.release().await.expect("release");
        assert!(
            support::keys_under(&holder, &ns).await.is_empty(),
            "stale keys left"
        );
    });
}
