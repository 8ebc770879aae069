//! `etcdctl lock` (etcd's own `concurrency.Mutex`) and dlock exclude each other on the same
//! name, in both orders.

use crate::support;

use std::time::Duration;

use dlock_core::{AcquireOptions, Lease, LockName, Locker};
use dlock_etcd::EtcdLocker;
use support::Etcdctl;

/// The create revision of `key`, read with etcdctl's own view of the store.
async fn create_revision(locker: &EtcdLocker, key: &str) -> i64 {
    let mut c = locker.client().clone();
    let resp = c.get(key, None).await.expect("read etcdctl's key");
    resp.kvs()
        .first()
        .map(|kv| kv.create_revision())
        .expect("etcdctl's key exists")
}

/// etcdctl holds `etcd_name` (dlock's `name`) first: dlock is refused and times out, then
/// queues and is granted once etcdctl unlocks, with a token above etcdctl's revision.
async fn etcdctl_first(endpoint: &str, locker: &EtcdLocker, name: &LockName) -> Lease {
    let etcd_name = locker.etcd_mutex_name(name);
    let ctl = Etcdctl::lock(endpoint, &etcd_name);
    let key = ctl
        .line(Duration::from_secs(10))
        .expect("etcdctl got the free lock");
    assert!(
        key.starts_with(&format!("{etcd_name}/")),
        "etcdctl key {key}"
    );
    let etcdctl_rev = create_revision(locker, &key).await;
    let tried = locker.try_acquire(name).await.expect("try_acquire");
    assert!(tried.is_none(), "dlock got a lock etcdctl holds");
    support::kept_out(
        locker
            .acquire(name, AcquireOptions::wait(Duration::from_millis(700)))
            .await,
        "dlock got a lock etcdctl holds",
    );
    let waiter =
        support::spawn_acquire(locker, name, AcquireOptions::wait(Duration::from_secs(15)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "granted while etcdctl holds the lock"
    );
    ctl.interrupt();
    let lease = waiter
        .await
        .expect("task")
        .expect("granted after etcdctl unlocked");
    assert!(lease.token().get() > etcdctl_rev as u64);
    lease
}

/// dlock holds `lease` on `name` first: etcdctl waits until it is released, then holds with a
/// revision above its token. Returns etcdctl, holding.
async fn dlock_first(
    endpoint: &str,
    locker: &EtcdLocker,
    name: &LockName,
    lease: Lease,
) -> Etcdctl {
    let ctl = Etcdctl::lock(endpoint, &locker.etcd_mutex_name(name));
    assert_eq!(
        ctl.line(Duration::from_secs(2)),
        None,
        "etcdctl got a lock dlock holds"
    );
    lease.check().expect("held");
    let token = lease.token();
    lease.release().await.expect("release");
    let key = ctl
        .line(Duration::from_secs(10))
        .expect("etcdctl granted after dlock released");
    assert!(create_revision(locker, &key).await as u64 > token.get());
    ctl
}

#[test]
fn etcdctl_holds_then_dlock_waits() {
    support::on_single("interop-etcdctl-first", |cluster, ns| async move {
        let locker = support::locker(&cluster, &ns).await;
        let name = support::name("jobs/nightly");
        assert_eq!(
            locker.etcd_mutex_name(&name),
            format!("{ns}/jobs%2Fnightly")
        );
        let lease = etcdctl_first(&cluster.endpoints()[0], &locker, &name).await;
        lease.release().await.expect("release");
    });
}

#[test]
fn dlock_holds_then_etcdctl_waits() {
    support::on_single("interop-dlock-first", |cluster, ns| async move {
        let locker = support::locker(&cluster, &ns).await;
        let name = support::name("jobs/nightly");
        let lease = support::hold(&locker, &name).await;
        let ctl = dlock_first(&cluster.endpoints()[0], &locker, &name, lease).await;
        // While etcdctl holds it, dlock is excluded again.
        let tried = locker.try_acquire(&name).await.expect("try_acquire");
        assert!(tried.is_none(), "dlock got a lock etcdctl holds");
        ctl.interrupt();
        let again = locker
            .acquire(&name, AcquireOptions::wait(Duration::from_secs(15)))
            .await
            .expect("free again after etcdctl");
        again.release().await.expect("release");
    });
}

/// The layout people use with etcd: `etcdctl lock /locks/orders/42` (Go:
/// `concurrency.NewMutex(s, "/locks/orders/42")`), met by a locker with the prefix `/locks`
/// and raw names, in both orders.
#[test]
fn etcdctl_and_dlock_meet_on_a_slash_prefixed_raw_name() {
    let cluster = support::single();
    let endpoint = cluster.endpoints()[0].clone();
    support::runtime().block_on(async {
        let locker = support::builder(cluster.endpoints(), "/locks")
            .raw_names(true)
            .build()
            .await
            .expect("a leading '/' and raw names are accepted");
        let name = support::name("orders/42");
        assert_eq!(locker.etcd_mutex_name(&name), "/locks/orders/42");
        let lease = etcdctl_first(&endpoint, &locker, &name).await;
        let session = locker.session_lease().await.expect("a session");
        let ours = format!("/locks/orders/42/{session:x}");
        assert_eq!(
            create_revision(&locker, &ours).await as u64,
            lease.token().get(),
            "our key is where etcd's Mutex puts it"
        );
        dlock_first(&endpoint, &locker, &name, lease)
            .await
            .interrupt();
    });
}
