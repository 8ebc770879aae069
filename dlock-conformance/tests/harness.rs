//! The server harness starts every topology, each node answers, and teardown leaves no process.

use std::time::Duration;

use dlock_conformance::servers::{Cluster, HarnessError, ServerKind, local};

fn alive(pid: u32) -> bool {
    // /proc/<pid> disappears once the process is reaped; a zombie would still show, and we reap.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn start_or_skip(kind: ServerKind, n: usize) -> Option<Cluster> {
    match Cluster::start(kind, n) {
        Ok(c) => Some(c),
        Err(e) if e.may_skip() => {
            println!("skip: {e}");
            None
        }
        Err(e) => panic!("{kind}×{n} did not start: {e}"),
    }
}

fn topology(kind: ServerKind, n: usize) {
    let Some(cluster) = start_or_skip(kind, n) else {
        return;
    };
    assert_eq!(cluster.len(), n);
    assert_eq!(cluster.endpoints().len(), n);
    let mut pids = Vec::new();
    for node in cluster.nodes() {
        assert!(
            local::probe(kind, node.addr()),
            "{kind} node {} does not answer:\n{}",
            node.index(),
            cluster.logs()
        );
        if !cluster.is_external() {
            let pid = node.pid().expect("a local node has a pid");
            assert!(alive(pid));
            pids.push(pid);
        }
    }
    let env = cluster.external_env();
    assert_eq!(env.len(), 1);
    assert_eq!(env[0].0, kind.env_var());
    assert_eq!(env[0].1.split(',').count(), n);
    let dir = cluster.data_dir();
    drop(cluster);
    for pid in pids {
        assert!(!alive(pid), "{kind} pid {pid} survived teardown");
    }
    if let Some(dir) = dir {
        assert!(
            !dir.exists(),
            "data dir {} survived teardown",
            dir.display()
        );
    }
}

#[test]
fn redis_1() {
    topology(ServerKind::Redis, 1);
}

#[test]
fn redis_5() {
    topology(ServerKind::Redis, 5);
}

#[test]
fn etcd_1() {
    topology(ServerKind::Etcd, 1);
}

#[test]
fn etcd_3() {
    topology(ServerKind::Etcd, 3);
}

#[test]
fn zk_1() {
    topology(ServerKind::Zk, 1);
}

#[test]
fn zk_3() {
    topology(ServerKind::Zk, 3);
}

#[test]
fn kill_pause_resume_restart() {
    let Some(cluster) = start_or_skip(ServerKind::Redis, 1) else {
        return;
    };
    let node = cluster.node(0);
    node.pause().expect("pause");
    assert!(
        !local::probe(ServerKind::Redis, node.addr()),
        "a paused redis answered"
    );
    node.resume().expect("resume");
    assert!(
        local::probe(ServerKind::Redis, node.addr()),
        "a resumed redis does not answer"
    );
    let old = node.pid().expect("pid");
    node.kill().expect("kill");
    assert!(!alive(old));
    assert!(
        !local::probe(ServerKind::Redis, node.addr()),
        "a killed redis answered"
    );
    node.restart().expect("restart");
    assert_eq!(cluster.addrs()[0], node.addr(), "restart keeps the port");
    assert!(local::probe(ServerKind::Redis, node.addr()));
    assert!(cluster.logs().contains("killed"));
}

#[test]
fn shared_is_shared() {
    let a = match Cluster::shared(ServerKind::Redis, 1) {
        Ok(a) => a,
        Err(e) if e.may_skip() => return println!("skip: {e}"),
        Err(e) => panic!("{e}"),
    };
    let b = Cluster::shared(ServerKind::Redis, 1).expect("second call");
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    let logs = dlock_conformance::servers::shared_logs(4096);
    assert!(
        logs.contains("==== redis node 0") && logs.contains("started pid"),
        "{logs}"
    );
    assert!(local::probe(ServerKind::Redis, a.addrs()[0]));
}

#[test]
fn missing_binary_is_typed() {
    let err = HarnessError::Missing {
        kind: ServerKind::Zk,
        hint: "apt-get install -y zookeeper".into(),
    };
    assert!(
        err.to_string().contains("apt-get install -y zookeeper"),
        "{err}"
    );
    assert!(
        !HarnessError::Io("x".into()).may_skip(),
        "only a missing binary may skip"
    );
}

/// Kill the leader of a 3-node cluster: a new leader is elected among the others, and the old
/// leader restarts on its port with its data and rejoins.
fn leader_failover(kind: ServerKind) {
    let Some(cluster) = start_or_skip(kind, 3) else {
        return;
    };
    let first = cluster
        .wait_leader(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}"));
    cluster.node(first).kill().expect("kill the leader");
    let second = cluster
        .wait_leader(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(first, second, "a killed node cannot lead");
    cluster
        .node(first)
        .restart()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        cluster.node(first).is_serving(),
        "the old leader did not rejoin:\n{}",
        cluster.logs()
    );
    // Pausing the leader also moves leadership.
    let leader = cluster
        .wait_leader(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}"));
    cluster.node(leader).pause().expect("pause");
    let next = cluster
        .wait_leader(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(leader, next, "a paused node cannot keep leading");
    cluster.node(leader).resume().expect("resume");
}

#[test]
fn etcd_3_leader_failover() {
    leader_failover(ServerKind::Etcd);
}

#[test]
fn zk_3_leader_failover() {
    leader_failover(ServerKind::Zk);
}
