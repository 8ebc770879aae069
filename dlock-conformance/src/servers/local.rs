//! The `local` provider: the Debian-packaged binaries, on reserved loopback ports (see
//! `ports.rs`) in temp dirs.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::process::Launch;
use super::tls::{TlsFiles, Transport};
use super::{HarnessError, ServerKind, ServerOptions};

/// ZooKeeper's jar as packaged by Debian.
pub const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";

/// Whether the server binaries for `kind` are here; the apt-get hint otherwise.
pub(crate) fn check_installed(kind: ServerKind) -> Result<(), HarnessError> {
    let (found, pkg) = match kind {
        ServerKind::Redis => (which("redis-server").is_some(), "redis-server"),
        ServerKind::Etcd => (which("etcd").is_some(), "etcd-server etcd-client"),
        ServerKind::Zk => (
            which("java").is_some() && Path::new(ZK_JAR).exists(),
            "zookeeper default-jre-headless",
        ),
    };
    if found {
        Ok(())
    } else {
        Err(HarnessError::Missing {
            kind,
            hint: format!(
                "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y {pkg}"
            ),
        })
    }
}

/// Whether `openssl` (which makes the certificates of TLS clusters) is here.
pub(crate) fn check_openssl(kind: ServerKind) -> Result<(), HarnessError> {
    if which("openssl").is_some() {
        Ok(())
    } else {
        Err(HarnessError::Missing {
            kind,
            hint: "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y openssl (it makes the certificates of TLS test servers)".into(),
        })
    }
}

pub(crate) fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn fsync() -> bool {
    std::env::var("DLOCK_SERVER_FSYNC").is_ok_and(|v| v == "1" || v == "true")
}

/// The ports one node needs. Redis: the client port, and the cluster bus port (used only when
/// the node runs in cluster mode, `--cluster-enabled yes` among the extra arguments: the
/// default bus port, client port + 10000, may lie outside the reserved ports or above 65535).
pub(crate) fn ports_per_node(kind: ServerKind) -> usize {
    match kind {
        ServerKind::Redis => 2,
        ServerKind::Etcd => 2,
        ServerKind::Zk => 3,
    }
}

static CLUSTER_SEQ: AtomicU64 = AtomicU64::new(0);

/// How the nodes of a cluster reach their peers.
#[derive(Debug, Clone)]
pub(crate) enum Peers {
    /// On each other's own peer ports.
    Direct,
    /// ZooKeeper: `dial[from][to]` = the (quorum, election) ports `from` dials for `to`.
    Zk {
        /// The ports per ordered pair (ignored on the diagonal).
        dial: Vec<Vec<Vec<u16>>>,
    },
    /// etcd: member `i` advertises `advertise[i]` as its peer port (it listens on its own).
    Etcd {
        /// The advertised peer port per member.
        advertise: Vec<u16>,
    },
}

/// Ticks a ZooKeeper follower of a partitionable ensemble waits for its leader before it gives
/// up on it (10 s at a 100 ms tick), as with common settings (syncLimit 5 × tickTime 2 s):
/// longer than the sessions the tests use, so a follower cut from its leader keeps serving its
/// clients' reads and pings while the leader expires their sessions.
pub(crate) const PARTITION_SYNC_LIMIT: u32 = 100;

/// How to launch every node of a `kind` cluster with the given ports (`ports_per_node` each),
/// data under `dir`, serving as `options` say (with `tls`'s certificates when it is TLS).
/// Writes config files.
pub(crate) fn launches(
    kind: ServerKind,
    dir: &Path,
    ports: &[Vec<u16>],
    peers: &Peers,
    options: &ServerOptions,
    tls: Option<&TlsFiles>,
) -> Result<Vec<Launch>, HarnessError> {
    let n = ports.len();
    let mut out = Vec::with_capacity(n);
    let tls = match (options.tls, tls) {
        (None, _) => None,
        (Some(mode), Some(files)) => {
            let Some((cert, key)) = files.server_identity() else {
                return Err(HarnessError::Io(
                    "a local TLS server needs its own certificate and key".into(),
                ));
            };
            Some((mode, files.ca(), cert, key))
        }
        (Some(_), None) => {
            return Err(HarnessError::Io(
                "a TLS cluster needs its certificates generated first".into(),
            ));
        }
    };
    match kind {
        ServerKind::Redis => {
            for (i, p) in ports.iter().enumerate() {
                let data = dir.join(format!("redis{i}"));
                mkdir(&data)?;
                // TLS only: the plain port is closed (0), the client port serves TLS.
                let listen: Vec<String> = match tls {
                    None => vec!["--port".into(), p[0].to_string()],
                    Some((mode, ca, cert, key)) => vec![
                        "--port".into(),
                        "0".into(),
                        "--tls-port".into(),
                        p[0].to_string(),
                        "--tls-cert-file".into(),
                        path_str(cert),
                        "--tls-key-file".into(),
                        path_str(key),
                        "--tls-ca-cert-file".into(),
                        path_str(ca),
                        "--tls-auth-clients".into(),
                        if mode.client_auth { "yes" } else { "no" }.into(),
                    ],
                };
                let mut args = listen;
                args.extend(
                    [
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--daemonize",
                        "no",
                        "--dir",
                        &path_str(&data),
                    ]
                    .iter()
                    .map(|s| s.to_string()),
                );
                args.extend(options.args.iter().cloned());
                if let Some(bus) = p.get(1)
                    && options.args.iter().any(|a| a == "--cluster-enabled")
                {
                    args.extend(["--cluster-port".to_string(), bus.to_string()]);
                }
                out.push(Launch {
                    program: PathBuf::from("redis-server"),
                    args,
                    cwd: Some(data),
                    env: Vec::new(),
                    stdin_piped: false,
                });
            }
        }
        ServerKind::Etcd => {
            let token = format!(
                "dlock-{}-{}",
                std::process::id(),
                CLUSTER_SEQ.fetch_add(1, Ordering::Relaxed)
            );
            let advertised = |i: usize| match peers {
                Peers::Etcd { advertise } => advertise[i],
                _ => ports[i][1],
            };
            let initial = (0..n)
                .map(|i| format!("n{i}=http://127.0.0.1:{}", advertised(i)))
                .collect::<Vec<_>>()
                .join(",");
            let scheme = if tls.is_some() { "https" } else { "http" };
            for (i, p) in ports.iter().enumerate() {
                let data = dir.join(format!("etcd{i}"));
                let client = format!("{scheme}://127.0.0.1:{}", p[0]);
                let peer = format!("http://127.0.0.1:{}", p[1]);
                let advertise = format!("http://127.0.0.1:{}", advertised(i));
                let mut args: Vec<String> = [
                    "--name",
                    &format!("n{i}"),
                    "--data-dir",
                    &path_str(&data),
                    "--listen-client-urls",
                    &client,
                    "--advertise-client-urls",
                    &client,
                    "--listen-peer-urls",
                    &peer,
                    "--initial-advertise-peer-urls",
                    &advertise,
                    "--initial-cluster",
                    &initial,
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    &token,
                    "--logger",
                    "zap",
                    "--log-outputs",
                    "stderr",
                    "--log-level",
                    "warn",
                    "--heartbeat-interval",
                    "50",
                    "--election-timeout",
                    "500",
                    // As etcd 3.5+ does by default: a member cut from the leader cannot force
                    // elections (without it, 3.4 let a cut follower bounce the leadership and
                    // the rest of the cluster had no leader for 12 s in `leader_partition`).
                    "--pre-vote=true",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if !fsync() {
                    args.push("--unsafe-no-fsync".into());
                }
                // Client TLS (peers stay plain http).
                if let Some((mode, ca, cert, key)) = tls {
                    args.extend([
                        "--cert-file".into(),
                        path_str(cert),
                        "--key-file".into(),
                        path_str(key),
                    ]);
                    if mode.client_auth {
                        args.extend([
                            "--client-cert-auth".into(),
                            "--trusted-ca-file".into(),
                            path_str(ca),
                        ]);
                    }
                }
                args.extend(options.args.iter().cloned());
                out.push(Launch {
                    program: PathBuf::from("etcd"),
                    args,
                    cwd: Some(dir.to_path_buf()),
                    env: Vec::new(),
                    stdin_piped: false,
                });
            }
        }
        ServerKind::Zk => {
            for (i, p) in ports.iter().enumerate() {
                let node_dir = dir.join(format!("zk{i}"));
                let data = node_dir.join("data");
                mkdir(&data)?;
                let sync_limit = match peers {
                    Peers::Zk { .. } => PARTITION_SYNC_LIMIT,
                    _ => 20,
                };
                let mut cfg = format!(
                    "tickTime={}\ninitLimit=50\nsyncLimit={sync_limit}\ndataDir={}\n\
                     maxClientCnxns=0\nminSessionTimeout=200\n\
                     maxSessionTimeout=60000\nadmin.enableServer=false\n4lw.commands.whitelist=*\n\
                     forceSync={}\n",
                    super::ZK_LAB_TICK.as_millis(),
                    path_str(&data),
                    if fsync() { "yes" } else { "no" }
                );
                match tls {
                    None => cfg.push_str(&format!(
                        "clientPort={}\nclientPortAddress=127.0.0.1\n",
                        p[0]
                    )),
                    Some((mode, ca, cert, key)) => {
                        cfg.push_str(&zk_tls_config(&node_dir, p[0], mode, ca, cert, key)?)
                    }
                }
                if n > 1 {
                    for (j, q) in ports.iter().enumerate() {
                        let (quorum, election) = match peers {
                            Peers::Zk { dial } if i != j => (dial[i][j][0], dial[i][j][1]),
                            _ => (q[1], q[2]),
                        };
                        cfg.push_str(&format!("server.{}=127.0.0.1:{quorum}:{election}\n", j + 1));
                    }
                    write(&data.join("myid"), &format!("{}\n", i + 1))?;
                }
                // Extra options are zoo.cfg lines (`key=value`).
                for line in &options.args {
                    cfg.push_str(line);
                    cfg.push('\n');
                }
                let cfg_path = node_dir.join("zoo.cfg");
                write(&cfg_path, &cfg)?;
                let mut cp = ZK_JAR.to_string();
                if Path::new("/usr/share/java/slf4j-simple.jar").exists() {
                    cp.push_str(":/usr/share/java/slf4j-simple.jar");
                }
                if tls.is_some() {
                    // The Netty connection factory needs more of Netty than the jar's manifest
                    // names (it lists buffer, common, handler, transport and epoll).
                    for jar in ZK_NETTY_JARS {
                        if Path::new(jar).exists() {
                            cp.push(':');
                            cp.push_str(jar);
                        }
                    }
                }
                out.push(Launch {
                    program: PathBuf::from("java"),
                    args: [
                        "-Xms32m",
                        "-Xmx256m",
                        "-XX:+UseSerialGC",
                        "-XX:TieredStopAtLevel=1",
                        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                        "-Dzookeeper.admin.enableServer=false",
                        "-cp",
                        &cp,
                        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                        &path_str(&cfg_path),
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                    cwd: Some(node_dir),
                    env: Vec::new(),
                    stdin_piped: false,
                });
            }
        }
    }
    Ok(out)
}

/// The Netty jars (Debian `libnetty-java`, a dependency of `libzookeeper-java`) that
/// ZooKeeper's `NettyServerCnxnFactory` needs beyond those its jar's manifest names: the TLS
/// handler's codec base classes, the transport's resolver, and the native transport's common
/// part.
const ZK_NETTY_JARS: &[&str] = &[
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
    "/usr/share/java/netty-transport-native-unix-common.jar",
];

/// The `zoo.cfg` lines of a TLS-only ZooKeeper node: no plain client port, the secure client
/// port on `port` served by the Netty connection factory (the only one that speaks TLS), PEM
/// key and trust stores (ZooKeeper 3.8 reads PEM; the key store is one file holding the key and
/// the certificate, written into `node_dir`), and client certificates required with
/// `client_auth` (the server does not match them against the client's host: the test client
/// certificate names none). ZooKeeper turns unknown `zoo.cfg` keys into `zookeeper.*` system
/// properties, which is where the factory reads its TLS settings.
fn zk_tls_config(
    node_dir: &Path,
    port: u16,
    mode: super::TlsMode,
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> Result<String, HarnessError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| HarnessError::Io(format!("cannot read {}: {e}", p.display())))
    };
    let store = node_dir.join("server-keystore.pem");
    write(&store, &format!("{}\n{}", read(key)?, read(cert)?))?;
    Ok(format!(
        "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
         ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
         ssl.clientAuth={}\nssl.hostnameVerification=false\n",
        path_str(&store),
        path_str(ca),
        if mode.client_auth { "need" } else { "none" }
    ))
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn mkdir(p: &Path) -> Result<(), HarnessError> {
    std::fs::create_dir_all(p)
        .map_err(|e| HarnessError::Io(format!("cannot create {}: {e}", p.display())))
}

fn write(p: &Path, text: &str) -> Result<(), HarnessError> {
    std::fs::write(p, text)
        .map_err(|e| HarnessError::Io(format!("cannot write {}: {e}", p.display())))
}

/// One request/reply exchange over a fresh connection; the reply read until EOF or `until`
/// appears.
pub(crate) fn exchange(addr: SocketAddr, request: &[u8], until: &str) -> Option<String> {
    exchange_via(&Transport::Plain, addr, request, until)
}

/// As [`exchange`], over `transport` (TLS for a TLS node).
pub(crate) fn exchange_via(
    transport: &Transport,
    addr: SocketAddr,
    request: &[u8],
    until: &str,
) -> Option<String> {
    let timeout = Duration::from_millis(500);
    let mut s = transport.connect(addr, timeout).ok()?;
    s.write_all(request).ok()?;
    s.flush().ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if String::from_utf8_lossy(&buf).contains(until) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Whether the server at `addr` serves requests (protocol-level check, not just the port).
pub fn probe(kind: ServerKind, addr: SocketAddr) -> bool {
    probe_via(kind, addr, &Transport::Plain)
}

/// As [`probe`], over `transport`.
pub(crate) fn probe_via(kind: ServerKind, addr: SocketAddr, transport: &Transport) -> bool {
    let exchange = |addr, request: &[u8], until| exchange_via(transport, addr, request, until);
    match kind {
        ServerKind::Redis => {
            exchange(addr, b"PING\r\n", "\r\n").is_some_and(|r| r.starts_with("+PONG"))
        }
        ServerKind::Etcd => exchange(
            addr,
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            "}",
        )
        .is_some_and(|r| r.contains("\"health\":\"true\"")),
        ServerKind::Zk => exchange(addr, b"srvr", "\u{0}").is_some_and(|r| {
            r.contains("Mode: standalone")
                || r.contains("Mode: leader")
                || r.contains("Mode: follower")
        }),
    }
}

/// The ZooKeeper mode of the node at `addr` (`leader`, `follower`, `standalone`), if serving.
pub fn zk_mode(addr: SocketAddr) -> Option<String> {
    let reply = exchange(addr, b"srvr", "\u{0}")?;
    reply
        .lines()
        .find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_string()))
}

/// The value of `metric` in the `/metrics` of the etcd member at `addr` (e.g.
/// `etcd_server_is_leader`, `etcd_server_leader_changes_seen_total`); `None` when it does not
/// answer or has no such sample.
pub(crate) fn etcd_metric(addr: SocketAddr, transport: &Transport, metric: &str) -> Option<f64> {
    // HTTP/1.0: a plain (not chunked) body, read to its end.
    let reply = exchange_via(
        transport,
        addr,
        b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
        "\u{0}",
    )?;
    reply
        .lines()
        .find_map(|l| l.strip_prefix(metric)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
}
