//! Server-side operations while locking: compaction during a wait, etcd authentication.

mod support;

use std::process::Command;
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};
use dlock_etcd::etcd_client::{CompactionOptions, GetOptions};

/// Keys under `ns/`.
async fn keys(locker: &dlock_etcd::EtcdLocker, ns: &str) -> Vec<String> {
    let mut c = locker.client().clone();
    let resp = c
        .get(
            format!("{ns}/"),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("list");
    resp.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

#[test]
fn compaction_while_waiting_leaves_no_stale_key_or_stuck_waiter() {
    let cluster = support::single();
    support::runtime().block_on(async {
        let ns = support::namespace("compaction");
        let holder = support::locker(&cluster, &ns).await;
        let waiter = support::locker(&cluster, &ns).await;
        let name = LockName::new("c").expect("valid");
        let lease = holder
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("hold");
        let (w, n) = (waiter.clone(), name.clone());
        let waiting = tokio::spawn(async move {
            w.acquire(&n, AcquireOptions::wait(Duration::from_secs(20)))
                .await
        });
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
            keys(&holder, &ns).await.len(),
            1,
            "only the new holder's key"
        );
        got.release().await.expect("release");
        assert!(keys(&holder, &ns).await.is_empty(), "stale keys left");
    });
}

fn etcdctl(endpoint: &str, args: &[&str]) {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .output()
        .expect("run etcdctl");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn user_and_password_are_passed_to_etcd() {
    let cluster = Cluster::start(ServerKind::Etcd, 1).expect("a private etcd");
    let endpoint = cluster.endpoints()[0].clone();
    etcdctl(
        &endpoint,
        &["user", "add", "root", "--new-user-password=s3cret"],
    );
    etcdctl(&endpoint, &["auth", "enable"]);
    support::runtime().block_on(async {
        let ns = support::namespace("auth");
        let name = LockName::new("a").expect("valid");

        let good = support::builder(cluster.endpoints(), &ns)
            .user("root", "s3cret")
            .build()
            .await
            .expect("authenticated locker");
        let lease = good
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect("acquire with auth");
        // Renewal works through the authenticated keep-alive stream.
        tokio::time::sleep(good.ttl() * 2).await;
        assert!(lease.check().is_ok(), "{:?}", lease.check());
        lease.release().await.expect("release");

        let err = support::builder(cluster.endpoints(), &ns)
            .user("root", "wrong")
            .build()
            .await
            .expect_err("a wrong password must be rejected");
        assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
        assert!(!err.is_retryable());

        let anonymous = support::builder(cluster.endpoints(), &ns)
            .build()
            .await
            .expect("lazy");
        let err = anonymous
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .expect_err("anonymous access must be refused");
        assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
    });
}
