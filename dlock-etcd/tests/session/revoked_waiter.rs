//! A queued waiter whose key is removed from the server side (its session lease revoked, as
//! an operator or a forced break does) must never be granted on that removed key: when the
//! holder releases, the waiter queues again on a fresh session and its token is higher than
//! every earlier grant, and its key exists with that create revision.

use crate::support;

use std::time::Duration;

use dlock_etcd::etcd_client::{GetOptions, SortOrder, SortTarget};

#[test]
fn waiter_with_revoked_lease_is_never_granted_on_its_removed_key() {
    support::on_single("revoked-waiter", |cluster, ns| async move {
        let name = support::name("w");
        let (holder, held, waiter, queued) =
            support::held_and_waiting(&cluster, &ns, &name, Duration::from_secs(10)).await;
        // Wait until the waiter's key is in the queue behind the holder's.
        let mut c = holder.client().clone();
        let range = format!("{}/", holder.etcd_mutex_name(&name));
        let in_order = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let waiter_key = loop {
            let resp = c
                .get(range.as_str(), Some(in_order.clone()))
                .await
                .expect("read");
            if let Some(kv) = resp.kvs().get(1) {
                break kv.clone();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let revoked = waiter_key.lease();
        assert_ne!(revoked, 0, "queue keys are attached to a session lease");
        c.lease_revoke(revoked)
            .await
            .expect("revoke the waiter's lease");

        // The holder is still unaffected; now it releases.
        held.check().expect("the holder still holds");
        let released_token = held.token();
        held.release().await.expect("release");

        let granted = queued
            .await
            .expect("task")
            .expect("the waiter is granted after queueing again");
        assert!(
            granted.token() > released_token,
            "token {:?} not above the released hold's {released_token:?}",
            granted.token()
        );
        assert!(
            granted.token().0 > u64::try_from(waiter_key.create_revision()).expect("revision"),
            "granted on the removed key's revision {}",
            waiter_key.create_revision()
        );
        // The grant stands on a key that exists, of a live (new) session.
        let session = waiter.session_lease().await.expect("a live session");
        assert_ne!(session, revoked, "granted on the revoked session");
        let resp = c.get(range.as_str(), Some(in_order)).await.expect("read");
        let first = resp.kvs().first().expect("the holder's key exists");
        assert_eq!(first.lease(), session);
        assert_eq!(
            u64::try_from(first.create_revision()).expect("revision"),
            granted.token().0
        );
        granted.check().expect("held");
        granted.release().await.expect("release");
    });
}
