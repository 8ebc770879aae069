//! Redis Cluster topologies: Redis nodes in cluster mode ([`options`]: the bus on each node's
//! second reserved port) made one cluster with `redis-cli --cluster create` ([`form`]), each
//! master with a third of the slots, no replicas.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Cluster, HarnessError, ServerOptions};

/// How long a cluster may take to agree on its slots after `--cluster create` or a restart.
pub const FORM_TIMEOUT: Duration = Duration::from_secs(60);

/// Cluster mode: nodes.conf in the node's data dir (kept across restarts, so a restarted node
/// rejoins with its slots), a node timeout well above a test's pauses of the client links, and
/// the slots of a failed master simply unavailable (no replicas to fail over to) while the
/// others keep serving.
pub fn options() -> ServerOptions {
    ServerOptions::default().with_args([
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "5000",
        "--cluster-require-full-coverage",
        "no",
    ])
}

/// One line `field:value` of `CLUSTER INFO` on `addr` (plain text over a fresh connection).
fn cluster_info(addr: SocketAddr, field: &str) -> Option<String> {
    let text = crate::read_text(addr, b"CLUSTER INFO\r\nQUIT\r\n")?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// Whether every node reports `cluster_state:ok`, knows every node and sees every slot served.
pub fn is_formed(cluster: &Cluster) -> bool {
    let n = cluster.len().to_string();
    cluster.addrs().into_iter().all(|a| {
        cluster_info(a, "cluster_state").as_deref() == Some("ok")
            && cluster_info(a, "cluster_known_nodes").as_deref() == Some(n.as_str())
            && cluster_info(a, "cluster_slots_assigned").as_deref() == Some("16384")
    })
}

/// Waits until [`is_formed`], at most `timeout`.
pub fn wait_formed(cluster: &Cluster, timeout: Duration) -> Result<(), HarnessError> {
    let until = Instant::now() + timeout;
    while !is_formed(cluster) {
        if Instant::now() >= until {
            return Err(HarnessError::Io(format!(
                "the Redis Cluster at {:?} did not reach cluster_state:ok within {timeout:?}",
                cluster.addrs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Makes the (cluster-mode) nodes of `cluster` one Redis Cluster, each master with a third of
/// the slots, unless they already are (or the servers are external: then they must be), and
/// waits until every node agrees.
pub fn form(cluster: &Cluster) -> Result<(), HarnessError> {
    if cluster.is_external() || is_formed(cluster) {
        return wait_formed(cluster, FORM_TIMEOUT);
    }
    let mut cmd = Command::new("redis-cli");
    cmd.arg("--cluster").arg("create");
    for a in cluster.addrs() {
        cmd.arg(a.to_string());
    }
    cmd.args(["--cluster-replicas", "0", "--cluster-yes"]);
    let out = cmd
        .output()
        .map_err(|e| HarnessError::Io(format!("cannot run redis-cli --cluster create: {e}")))?;
    if !out.status.success() {
        return Err(HarnessError::Io(format!(
            "redis-cli --cluster create failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    wait_formed(cluster, FORM_TIMEOUT)
}
