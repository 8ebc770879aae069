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

/// Set in the child process that runs [`__port_pressure_helper`] inside its own network
/// namespace.
const PRESSURE_HELPER: &str = "DLOCK_PORT_PRESSURE_HELPER";

/// The ephemeral range the helper's network namespace gets: small, so that "every port the
/// kernel hands out" is a few hundred binds.
const PRESSURE_RANGE: (u16, u16) = (40000, 40255);

/// Everything else on the host, compressed: binds port 0 until the kernel has no port left to
/// hand out (what every other test's `bind(…:0)` and every outgoing connection draws from),
/// keeps the sockets that landed on one of `targets` and releases the rest (so clients can
/// still connect).
fn grab_ephemeral(targets: &[u16]) -> Vec<(u16, std::net::TcpListener)> {
    let mut all = Vec::new();
    while let Ok(l) = std::net::TcpListener::bind("127.0.0.1:0") {
        all.push(l);
        assert!(all.len() < 70_000, "port-0 binds never ran out");
    }
    all.into_iter()
        .filter_map(|l| {
            let port = l.local_addr().expect("bound").port();
            targets.contains(&port).then_some((port, l))
        })
        .collect()
}

/// Kills node `i`, lets the rest of the host take every port the kernel hands out, then
/// restarts the node: it must come back on its own ports.
fn kill_grab_restart(cluster: &Cluster, i: usize) {
    let kind = cluster.kind();
    let node = cluster.node(i);
    let before = node.addr();
    node.kill().expect("kill");
    let targets: Vec<u16> = cluster
        .nodes()
        .iter()
        .flat_map(|n| n.ports().to_vec())
        .collect();
    let grabbed = grab_ephemeral(&targets);
    let taken: Vec<u16> = grabbed.iter().map(|(p, _)| *p).collect();
    node.restart().unwrap_or_else(|e| {
        panic!("{kind} node {i} could not restart while other sockets held {taken:?}: {e}")
    });
    assert_eq!(node.addr(), before, "restart keeps the port");
    assert!(
        node.is_serving(),
        "{kind} node {i} does not serve after restart"
    );
    assert!(
        taken.is_empty(),
        "the kernel handed ports {taken:?} of a live {kind} cluster to other sockets"
    );
}

/// In a private network namespace (see [`restart_keeps_ports_under_port_pressure`]).
#[test]
#[ignore = "helper process for restart_keeps_ports_under_port_pressure"]
fn __port_pressure_helper() {
    if std::env::var_os(PRESSURE_HELPER).is_none() {
        return;
    }
    let redis = Cluster::start(ServerKind::Redis, 2).unwrap_or_else(|e| panic!("{e}"));
    kill_grab_restart(&redis, 0);
    let etcd = Cluster::start(ServerKind::Etcd, 3).unwrap_or_else(|e| panic!("{e}"));
    let leader = etcd
        .wait_leader(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}"));
    kill_grab_restart(&etcd, leader);
    // Many clusters started at once from many threads, while the others live: every one
    // starts, and no two share a port.
    let started: Vec<Cluster> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| s.spawn(|| Cluster::start(ServerKind::Redis, 2)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .expect("no panic")
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    });
    let mut ports: Vec<u16> = started
        .iter()
        .chain([&redis, &etcd])
        .flat_map(|c| c.nodes().iter().flat_map(|n| n.ports().to_vec()))
        .collect();
    let n = ports.len();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), n, "two live clusters share a port: {ports:?}");
    println!("PORT_PRESSURE_OK");
}

/// A killed node is restarted on its old ports while the rest of the host draws ports from the
/// kernel: no port of a live cluster — running or killed — is ever handed to another socket.
/// Runs in its own network namespace (`unshare -rn`) with a small ephemeral range, so it
/// disturbs nothing else on the machine and "every port the kernel hands out" is cheap.
#[test]
fn restart_keeps_ports_under_port_pressure() {
    if std::env::var_os("DLOCK_REDIS_URLS").is_some() {
        return println!("skip: external servers are not started by the harness");
    }
    if start_or_skip(ServerKind::Redis, 1).is_none() {
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let script = format!(
        "echo '{} {}' > /proc/sys/net/ipv4/ip_local_port_range && ip link set lo up && exec \"$0\" \"$@\"",
        PRESSURE_RANGE.0, PRESSURE_RANGE.1
    );
    let out = std::process::Command::new("unshare")
        .args(["-rn", "sh", "-c", &script])
        .arg(&exe)
        .args([
            "__port_pressure_helper",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PRESSURE_HELPER, "1")
        .output()
        .expect("run unshare (util-linux) for a private network namespace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("PORT_PRESSURE_OK"),
        "the port-pressure helper failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

/// Every harness failure names the server, its ports and the step: here a restart whose port a
/// foreign program took, and a pause of a node that is not running.
#[test]
fn failures_name_server_port_and_step() {
    let Some(cluster) = start_or_skip(ServerKind::Redis, 1) else {
        return;
    };
    let node = cluster.node(0);
    let port = node.addr().port();
    node.kill().expect("kill");
    let squatter = std::net::TcpListener::bind(node.addr()).expect("take the killed node's port");
    let err = node
        .restart()
        .expect_err("a restart onto a taken port must fail")
        .to_string();
    for want in [
        "redis node 0",
        &format!("ports {port}"),
        "step restart",
        "address already in use",
    ] {
        assert!(err.contains(want), "{want:?} missing from: {err}");
    }
    drop(squatter);
    node.kill().expect("kill");
    let err = node.pause().expect_err("pausing a killed node").to_string();
    for want in ["redis node 0", &format!("ports {port}"), "step pause"] {
        assert!(err.contains(want), "{want:?} missing from: {err}");
    }
    node.restart().unwrap_or_else(|e| panic!("{e}"));
}
