//! The server harness starts every topology, each node answers, and teardown leaves no process.

use std::time::Duration;

use dlock_conformance::servers::{Cluster, HarnessError, ServerKind, ServerOptions, local};

fn alive(pid: u32) -> bool {
    // /proc/<pid> disappears once the process is reaped; a zombie would still show, and we reap.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The cluster `started` made, or `None` (the reason printed) when its server binaries are
/// missing; any other failure panics, naming `what` did not start.
fn or_skip(
    started: Result<Cluster, HarnessError>,
    what: std::fmt::Arguments<'_>,
) -> Option<Cluster> {
    match started {
        Ok(c) => Some(c),
        Err(e) if e.may_skip() => {
            println!("skip: {e}");
            None
        }
        Err(e) => panic!("{what} did not start: {e}"),
    }
}

fn start_or_skip(kind: ServerKind, n: usize) -> Option<Cluster> {
    or_skip(Cluster::start(kind, n), format_args!("{kind}×{n}"))
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

/// One test per topology: every node answers, and teardown leaves no process or data dir.
macro_rules! topologies {
    ($($test:ident: $kind:ident, $n:literal;)*) => {
        $(
            #[test]
            fn $test() {
                topology(ServerKind::$kind, $n);
            }
        )*
    };
}

topologies! {
    redis_1: Redis, 1;
    redis_5: Redis, 5;
    etcd_1: Etcd, 1;
    etcd_3: Etcd, 3;
    zk_1: Zk, 1;
    zk_3: Zk, 3;
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

fn start_with_or_skip(kind: ServerKind, n: usize, options: &ServerOptions) -> Option<Cluster> {
    or_skip(
        Cluster::start_with(kind, n, options),
        format_args!("{kind}×{n} ({options:?})"),
    )
}

/// A TLS-only Redis: no plain answer on its port, TLS answers with the generated CA, the
/// variables a child needs name the CA, and a restart serves TLS again with the same
/// certificates.
#[test]
fn redis_tls_only_restarts_with_its_certificates() {
    let Some(cluster) = start_with_or_skip(
        ServerKind::Redis,
        1,
        &ServerOptions::default().with_tls(false),
    ) else {
        return;
    };
    let node = cluster.node(0);
    assert!(node.is_tls());
    assert!(node.endpoint().starts_with("rediss://127.0.0.1:"));
    assert!(node.is_serving(), "{}", cluster.logs());
    assert!(
        !local::probe(ServerKind::Redis, node.addr()),
        "a TLS-only redis answered in plain text"
    );
    let tls = cluster.tls().expect("a TLS cluster has certificates");
    let ca = tls.ca_pem().expect("the CA is readable");
    assert!(tls.client_identity().is_some());
    let env = cluster.external_env();
    let [ca_var, cert_var, key_var] = ServerKind::Redis.tls_env_vars();
    for var in [ServerKind::Redis.env_var(), ca_var, cert_var, key_var] {
        assert!(env.iter().any(|(k, _)| k == var), "{var} missing: {env:?}");
    }
    let info = node
        .read_text(b"INFO server\r\nQUIT\r\n")
        .expect("INFO over TLS");
    assert!(info.contains("redis_version"), "{info}");
    assert!(cluster.server_requests().is_some());
    node.restart().unwrap_or_else(|e| panic!("{e}"));
    assert!(node.is_serving(), "{}", cluster.logs());
    assert!(!local::probe(ServerKind::Redis, node.addr()));
    assert_eq!(tls.ca_pem().expect("the CA is readable"), ca);
}

/// etcd with client TLS and client-certificate authentication: `etcdctl` with the CA alone is
/// refused, with the client identity it is served.
#[test]
fn etcd_tls_checks_client_certificates() {
    let Some(cluster) = start_with_or_skip(
        ServerKind::Etcd,
        1,
        &ServerOptions::default().with_tls(true),
    ) else {
        return;
    };
    let node = cluster.node(0);
    assert!(node.endpoint().starts_with("https://127.0.0.1:"));
    assert!(node.is_serving(), "{}", cluster.logs());
    assert!(!local::probe(ServerKind::Etcd, node.addr()));
    let tls = cluster.tls().expect("certificates");
    let (cert, key) = tls.client_identity().expect("a client identity");
    let health = |identity: bool| {
        let mut cmd = std::process::Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .args(["--endpoints", &node.endpoint(), "--dial-timeout", "2s"])
            .arg(format!("--cacert={}", tls.ca().display()));
        if identity {
            cmd.arg(format!("--cert={}", cert.display()))
                .arg(format!("--key={}", key.display()));
        }
        cmd.args(["endpoint", "health"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(health(true), "{}", cluster.logs());
    assert!(!health(false), "served a client without a certificate");
    let metrics = node
        .read_text(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("/metrics over TLS with the client identity");
    assert!(metrics.contains("etcd_server_has_leader"), "{metrics}");
}

/// A plain cluster takes another shape in place (what a private cluster of a TLS or ACL
/// topology goes through): same ports, the new arguments and TLS, and back.
#[test]
fn reconfigure_changes_how_nodes_serve() {
    let Some(cluster) = start_or_skip(ServerKind::Redis, 1) else {
        return;
    };
    let node = cluster.node(0);
    let addr = node.addr();
    let options = ServerOptions::default()
        .with_tls(false)
        .with_args(["--maxclients", "777"]);
    cluster
        .reconfigure(&options)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cluster.options(), options);
    assert_eq!(node.addr(), addr);
    assert!(node.is_serving() && !local::probe(ServerKind::Redis, addr));
    let config = node
        .read_text(b"CONFIG GET maxclients\r\nQUIT\r\n")
        .expect("CONFIG GET over TLS");
    assert!(config.contains("777"), "{config}");
    node.restart().unwrap_or_else(|e| panic!("{e}"));
    assert!(node.is_serving(), "a restart keeps TLS");
    cluster
        .reconfigure(&ServerOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(cluster.tls().is_none() && !node.is_tls());
    assert!(local::probe(ServerKind::Redis, addr));
    let shared = Cluster::shared(ServerKind::Redis, 1).expect("plain shared");
    let tls = Cluster::shared_with(
        ServerKind::Redis,
        1,
        &ServerOptions::default().with_tls(false),
    )
    .expect("TLS shared");
    assert!(
        !std::sync::Arc::ptr_eq(&shared, &tls),
        "one shared cluster per options"
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

fn start_partitionable_or_skip(kind: ServerKind, n: usize) -> Option<Cluster> {
    or_skip(
        Cluster::start_partitionable(kind, n),
        format_args!("partitionable {kind}×{n}"),
    )
}

/// Polls `f` every 50 ms until it holds or `within` passes.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last zxid the ZooKeeper server at `addr` applied (`Zxid:` of `srvr`).
fn zk_zxid(addr: std::net::SocketAddr) -> Option<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(b"srvr").ok()?;
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    let hex = reply.lines().find_map(|l| l.strip_prefix("Zxid: 0x"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Opens a ZooKeeper session at `addr` with a raw ConnectRequest (a transaction: the zxid
/// moves on every member that hears from the leader) and waits for the server's reply.
fn zk_open_session(addr: std::net::SocketAddr) {
    use std::io::{Read, Write};
    let mut req = Vec::new();
    req.extend_from_slice(&0i32.to_be_bytes()); // protocol version
    req.extend_from_slice(&0i64.to_be_bytes()); // last zxid seen
    req.extend_from_slice(&4000i32.to_be_bytes()); // session timeout, ms
    req.extend_from_slice(&0i64.to_be_bytes()); // session id: a new session
    req.extend_from_slice(&16i32.to_be_bytes()); // password length
    req.extend_from_slice(&[0u8; 16]);
    req.push(0); // not read-only
    let mut framed = (req.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&req);
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the leader");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    s.write_all(&framed).expect("send the connect request");
    let mut len = [0u8; 4];
    s.read_exact(&mut len)
        .expect("the leader answers the connect request");
}

/// A ZooKeeper follower cut from its leader stops applying the leader's transactions while the
/// other follower keeps up, and catches up once the links heal.
#[test]
fn zk_3_partition_cuts_and_heals_peer_links() {
    assert!(
        Cluster::start_partitionable(ServerKind::Redis, 3).is_err(),
        "Redis nodes have no peer links to cut"
    );
    let Some(cluster) = start_partitionable_or_skip(ServerKind::Zk, 3) else {
        return;
    };
    assert!(cluster.is_partitionable());
    let leader = cluster
        .wait_leader(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}"));
    let (cut, other) = ((leader + 1) % 3, (leader + 2) % 3);
    let addrs = cluster.addrs();
    cluster.cut(cut, leader).expect("cut");
    assert!(cluster.is_cut(cut, leader) && cluster.is_cut(leader, cut));
    assert!(!cluster.is_cut(other, leader));
    let before = zk_zxid(addrs[cut]).expect("the cut follower answers srvr");
    zk_open_session(addrs[leader]);
    let on_leader = zk_zxid(addrs[leader]).expect("the leader answers srvr");
    assert!(on_leader > before, "opening a session is a transaction");
    assert!(
        eventually(Duration::from_secs(5), || zk_zxid(addrs[other])
            >= Some(on_leader)),
        "the follower that is not cut does not keep up:\n{}",
        cluster.logs()
    );
    // The cut follower still serves (it waits 10 s for its leader) but applies nothing.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        local::zk_mode(addrs[cut]).as_deref(),
        Some("follower"),
        "the cut follower gave up on its leader early"
    );
    assert_eq!(
        zk_zxid(addrs[cut]),
        Some(before),
        "the cut follower applied a transaction of the leader it was cut from"
    );
    cluster.heal_all().expect("heal");
    assert!(!cluster.is_cut(cut, leader));
    assert!(
        eventually(Duration::from_secs(20), || zk_zxid(addrs[cut])
            >= Some(on_leader)),
        "the healed follower does not catch up:\n{}",
        cluster.logs()
    );
}

/// `etcdctl put` through `endpoint` with a short timeout; whether it succeeded.
fn etcd_put(endpoint: &str, key: &str) -> bool {
    std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "--command-timeout=1500ms"])
        .args(["put", key, "v"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// An etcd member cut from its leader cannot commit a write (its proposals go through the
/// leader), while the leader and the other member can; once healed, it can again.
#[test]
fn etcd_3_partition_cuts_and_heals_peer_links() {
    let Some(cluster) = start_partitionable_or_skip(ServerKind::Etcd, 3) else {
        return;
    };
    let leader = cluster
        .wait_leader(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}"));
    let (cut, other) = ((leader + 1) % 3, (leader + 2) % 3);
    let ends = cluster.endpoints();
    assert!(etcd_put(&ends[cut], "before"), "a healthy member commits");
    cluster.cut(cut, leader).expect("cut");
    assert!(
        !etcd_put(&ends[cut], "during"),
        "a member cut from its leader committed a write:\n{}",
        cluster.logs()
    );
    assert!(
        etcd_put(&ends[leader], "leader"),
        "the leader keeps its quorum"
    );
    assert!(etcd_put(&ends[other], "other"), "the other member keeps up");
    cluster.heal_all().expect("heal");
    assert!(
        eventually(Duration::from_secs(20), || etcd_put(&ends[cut], "after")),
        "the healed member cannot commit:\n{}",
        cluster.logs()
    );
}

/// A raw Redis connection subscribed with `command` (`SUBSCRIBE x` or `PSUBSCRIBE x*`), kept
/// open by the caller.
fn subscriber(addr: std::net::SocketAddr, command: &str) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to redis");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(format!("{command}\r\n").as_bytes())
        .expect("subscribe");
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).expect("subscription confirmed");
    assert!(
        String::from_utf8_lossy(&buf[..n]).contains("subscribe"),
        "no confirmation of {command}"
    );
    s
}

#[test]
fn redis_fanout_counts_the_connections_a_publish_reaches() {
    let Some(cluster) = start_or_skip(ServerKind::Redis, 1) else {
        return;
    };
    let node = cluster.node(0);
    assert_eq!(node.redis_fanout(), Some(0), "no subscriber yet");
    let addr = node.addr();
    let mut held = vec![
        subscriber(addr, "SUBSCRIBE own-1"),
        subscriber(addr, "SUBSCRIBE own-2"),
    ];
    assert_eq!(node.redis_fanout(), Some(1), "one subscriber per channel");
    // The herd: three more connections on one channel, and a pattern that matches every one.
    held.extend((0..3).map(|_| subscriber(addr, "SUBSCRIBE shared")));
    assert_eq!(node.redis_fanout(), Some(3));
    held.push(subscriber(addr, "PSUBSCRIBE *"));
    assert_eq!(node.redis_fanout(), Some(4));
    // Sentinel's own hello channel is not a lock client's.
    held.extend((0..5).map(|_| subscriber(addr, "SUBSCRIBE __sentinel__:hello")));
    assert_eq!(node.redis_fanout(), Some(4));
    drop(held);
}
