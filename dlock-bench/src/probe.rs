//! Server-side request counters, read before and after a measurement: Redis `INFO
//! commandstats`, etcd's `/metrics` (gRPC messages received), ZooKeeper's `mntr`
//! (`zk_packets_received`). They count every client's requests, dlock's and the peers' alike.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where to read the counters.
pub enum Probe {
    /// One plain connection per node.
    Redis(Vec<redis::aio::MultiplexedConnection>),
    /// Client URLs' socket addresses.
    Etcd(Vec<SocketAddr>),
    /// Client ports' socket addresses.
    Zk(Vec<SocketAddr>),
}

impl Probe {
    /// The metric name for a count `suffix`: Redis counts executed commands (those a Lua script
    /// calls included, so a one-request script call of k commands counts 1 + k); etcd counts
    /// gRPC messages received, ZooKeeper packets received (session pings included).
    pub fn metric(&self, suffix: &str) -> String {
        match self {
            Probe::Redis(_) => format!("server_commands_{suffix}"),
            _ => format!("server_requests_{suffix}"),
        }
    }

    /// Requests served so far, summed over the nodes; `None` when a node does not answer.
    pub async fn count(&self) -> Option<u64> {
        let mut total = 0;
        match self {
            Probe::Redis(conns) => {
                for c in conns {
                    total += redis_calls(&mut c.clone()).await?;
                }
            }
            Probe::Etcd(addrs) => {
                for a in addrs {
                    let text = exchange(
                        *a,
                        // HTTP/1.0: a plain body read to EOF (an HTTP/1.1 reply comes
                        // chunked, and a chunk boundary can split a sample line).
                        b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
                    )
                    .await?;
                    total += etcd_received(&text)?;
                }
            }
            Probe::Zk(addrs) => {
                for a in addrs {
                    let text = exchange(*a, b"mntr").await?;
                    total += text.lines().find_map(|l| {
                        l.strip_prefix("zk_packets_received")?
                            .trim()
                            .parse::<u64>()
                            .ok()
                    })?;
                }
            }
        }
        Some(total)
    }
}

/// The sum of `grpc_server_msg_received_total` samples in a `/metrics` HTTP response; `None`
/// for an error status, a malformed reply or one without any such sample (not a count of 0).
pub fn etcd_received(response: &str) -> Option<u64> {
    let body = crate::http::body(response)?;
    let samples: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect::<Option<_>>()?;
    if samples.is_empty() {
        return None;
    }
    Some(samples.iter().sum::<f64>() as u64)
}

/// Sum of `calls=` over `INFO commandstats`, without the probe's own INFO / CONFIG calls.
async fn redis_calls(conn: &mut redis::aio::MultiplexedConnection) -> Option<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .ok()?;
    Some(parse_commandstats(&info))
}

/// Parses `cmdstat_<cmd>:calls=N,...` lines.
pub fn parse_commandstats(info: &str) -> u64 {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|rest| rest.split_once(':'))
        .filter(|(cmd, _)| !cmd.starts_with("info") && !cmd.starts_with("config"))
        .filter_map(|(_, fields)| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// Sends `request`, reads until the server closes.
async fn exchange(addr: SocketAddr, request: &[u8]) -> Option<String> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(request).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .ok()?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_sum_skips_probe_commands() {
        let info = "# Commandstats\r\ncmdstat_set:calls=10,usec=5\r\ncmdstat_evalsha:calls=7,usec=1\r\ncmdstat_info:calls=3,usec=9\r\n";
        assert_eq!(parse_commandstats(info), 17);
    }

    const SAMPLES: &str = "# HELP grpc_server_msg_received_total Total number of RPC stream messages received on the server.\n\
# TYPE grpc_server_msg_received_total counter\n\
grpc_server_msg_received_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1234\n\
grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 4321\n\
grpc_server_started_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 99\n";

    /// `body` as an HTTP/1.1 chunked response, cut into chunks at `cuts`.
    fn chunked(body: &str, cuts: &[usize]) -> String {
        let mut out = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
Transfer-Encoding: chunked\r\n\r\n"
            .to_string();
        let mut from = 0;
        for &to in cuts.iter().chain([body.len()].iter()) {
            out.push_str(&format!("{:x}\r\n{}\r\n", to - from, &body[from..to]));
            from = to;
        }
        out.push_str("0\r\n\r\n");
        out
    }

    #[test]
    fn etcd_metrics_survive_a_chunk_boundary_inside_a_sample_line() {
        let in_value = SAMPLES.find("} 1234").map(|i| i + 4).unwrap_or_default();
        let in_name = SAMPLES
            .find("grpc_server_msg_received_total{grpc_method=\"Txn")
            .map(|i| i + 10)
            .unwrap_or_default();
        for cuts in [vec![in_value], vec![in_name], vec![in_value, in_name]] {
            assert_eq!(
                etcd_received(&chunked(SAMPLES, &cuts)),
                Some(5555),
                "cuts {cuts:?}"
            );
        }
        let plain = format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{SAMPLES}");
        assert_eq!(etcd_received(&plain), Some(5555));
    }

    #[test]
    fn etcd_metrics_without_samples_are_not_a_zero() {
        let empty = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n# nothing\n";
        assert_eq!(etcd_received(empty), None);
        let refused = format!("HTTP/1.0 404 Not Found\r\n\r\n{SAMPLES}");
        assert_eq!(etcd_received(&refused), None);
        assert_eq!(etcd_received(""), None);
    }
}
