//! dlock's `Election` on etcd against etcd's own (`etcdctl elect`, which is
//! `concurrency.Election`), contending and observing both ways.

use crate::support;

use std::time::Duration;

use dlock_core::{AcquireOptions, Election};
use support::Etcdctl;

const WAIT: Duration = Duration::from_secs(10);

/// The next change of an observation, within `WAIT`.
async fn next(changes: &mut Box<dyn dlock_core::LeaderChanges>) -> dlock_core::Leader {
    tokio::time::timeout(WAIT, changes.next())
        .await
        .expect("a change within the wait")
        .expect("the observation goes on")
}

#[test]
fn etcdctl_elect_leads_then_dlock_campaigns_and_observes() {
    support::on_single("elect-etcdctl-first", |cluster, ns| async move {
        let locker = support::locker(&cluster, &ns).await;
        let name = support::name("leader");
        let election = locker.etcd_mutex_name(&name);
        let ctl = Etcdctl::spawn(
            &cluster.endpoints()[0],
            &["elect", &election, "from-etcdctl"],
        );
        let key = ctl.line(WAIT).expect("etcdctl won the free election");
        assert!(
            key.starts_with(&format!("{election}/")),
            "etcdctl key {key}"
        );
        assert_eq!(ctl.line(WAIT).as_deref(), Some("from-etcdctl"));

        let leader = locker.leader(&name).await.expect("read").expect("a leader");
        assert_eq!(leader.value, b"from-etcdctl");
        let mut changes = locker.observe(&name).await.expect("observe");
        assert_eq!(next(&mut changes).await, leader);

        let (l2, n2) = (locker.clone(), name.clone());
        let campaign = tokio::spawn(async move {
            l2.campaign(&n2, b"from-dlock", AcquireOptions::wait(WAIT))
                .await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!campaign.is_finished(), "dlock led while etcdctl leads");
        ctl.interrupt();
        let leading = campaign
            .await
            .expect("task")
            .expect("dlock leads after etcdctl resigned");
        assert!(
            leading.term() > leader.term,
            "term {} after {}",
            leading.term(),
            leader.term
        );
        let change = next(&mut changes).await;
        assert_eq!(
            (change.term, change.value.as_slice()),
            (leading.term(), &b"from-dlock"[..])
        );
        leading.resign().await.expect("resign");
    });
}

#[test]
fn dlock_leads_then_etcdctl_observes_and_campaigns() {
    support::on_single("elect-dlock-first", |cluster, ns| async move {
        let locker = support::locker(&cluster, &ns).await;
        let name = support::name("leader");
        let election = locker.etcd_mutex_name(&name);
        let endpoint = cluster.endpoints()[0].clone();
        let leading = locker
            .campaign(&name, b"dlock-1", AcquireOptions::wait(WAIT))
            .await
            .expect("dlock leads the free election");

        let observer = Etcdctl::spawn(&endpoint, &["elect", "-l", &election]);
        let key = observer.line(WAIT).expect("etcdctl sees a leader");
        assert!(key.starts_with(&format!("{election}/")), "leader key {key}");
        assert_eq!(observer.line(WAIT).as_deref(), Some("dlock-1"));
        leading.proclaim(b"dlock-2").await.expect("proclaim");
        assert_eq!(observer.line(WAIT).as_deref(), Some(key.as_str()));
        assert_eq!(observer.line(WAIT).as_deref(), Some("dlock-2"));

        let ctl = Etcdctl::spawn(&endpoint, &["elect", &election, "from-etcdctl"]);
        assert_eq!(
            ctl.line(Duration::from_millis(500)),
            None,
            "etcdctl led while dlock leads"
        );
        leading.resign().await.expect("resign");
        let ctl_key = ctl.line(WAIT).expect("etcdctl leads after dlock resigned");
        assert_eq!(ctl.line(WAIT).as_deref(), Some("from-etcdctl"));
        assert_eq!(observer.line(WAIT).as_deref(), Some(ctl_key.as_str()));
        assert_eq!(observer.line(WAIT).as_deref(), Some("from-etcdctl"));
        ctl.interrupt();
    });
}
