//! Server-side request counters, read with blocking I/O: how many requests the servers
//! received, to measure herd effects from the server's side too.

use std::net::SocketAddr;

use super::ServerKind;
use super::local::exchange_via;
use super::tls::Transport;

/// Requests received so far by the server at `addr`:
/// - Redis: the sum of `calls=` over `INFO commandstats`;
/// - etcd: the sum of `grpc_server_msg_received_total` in `/metrics` (unary requests and
///   stream messages), or of `grpc_server_started_total` (RPCs and streams started) when the
///   server does not expose the former;
/// - ZooKeeper: `zk_packets_received` from `mntr`.
///
/// `None` when the node does not answer or the reply has no such counter.
pub fn node_requests(kind: ServerKind, addr: SocketAddr) -> Option<u64> {
    node_requests_via(kind, addr, &Transport::Plain)
}

/// As [`node_requests`], over `transport` (TLS for a TLS node).
pub(crate) fn node_requests_via(
    kind: ServerKind,
    addr: SocketAddr,
    transport: &Transport,
) -> Option<u64> {
    let exchange = |addr, request: &[u8], until| exchange_via(transport, addr, request, until);
    match kind {
        ServerKind::Redis => {
            // QUIT makes the server close the connection, so the reply is read to its end.
            let reply = exchange(addr, b"INFO commandstats\r\nQUIT\r\n", "\u{0}")?;
            let mut total = 0u64;
            let mut seen = false;
            for line in reply.lines().filter(|l| l.starts_with("cmdstat_")) {
                let calls = line
                    .split([':', ','])
                    .find_map(|part| part.strip_prefix("calls="))
                    .and_then(|v| v.trim().parse::<u64>().ok())?;
                total += calls;
                seen = true;
            }
            seen.then_some(total)
        }
        ServerKind::Etcd => {
            let reply = exchange(
                addr,
                // HTTP/1.0: a plain body read to EOF (HTTP/1.1 replies come chunked, and a chunk
                // boundary may split a sample line).
                b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
                "\u{0}",
            )?;
            // Message counts when the server exposes them (extensive metrics), otherwise
            // RPCs started (unary requests and streams opened).
            [
                "grpc_server_msg_received_total",
                "grpc_server_started_total",
            ]
            .iter()
            .find_map(|metric| sum_metric(&reply, metric))
        }
        ServerKind::Zk => {
            let reply = exchange(addr, b"mntr", "\u{0}")?;
            reply.lines().find_map(|l| {
                l.strip_prefix("zk_packets_received")
                    .and_then(|v| v.trim().parse().ok())
            })
        }
    }
}

/// [`node_requests`] summed over `addrs`; `None` when any node does not answer.
pub fn requests(kind: ServerKind, addrs: &[SocketAddr]) -> Option<u64> {
    if addrs.is_empty() {
        return None;
    }
    addrs
        .iter()
        .map(|a| node_requests(kind, *a))
        .sum::<Option<u64>>()
}

/// The sum of every sample of a Prometheus counter in `text`; `None` when it has none.
fn sum_metric(text: &str, metric: &str) -> Option<u64> {
    let mut total = 0f64;
    let mut seen = false;
    for line in text.lines().filter(|l| {
        l.strip_prefix(metric)
            .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
    }) {
        total += line.rsplit(' ').next()?.trim().parse::<f64>().ok()?;
        seen = true;
    }
    seen.then_some(total as u64)
}

#[cfg(test)]
mod tests {
    use super::sum_metric;

    #[test]
    fn counters_are_summed_over_labels() {
        let text = "# HELP x\ngrpc_server_started_total{grpc_method=\"Range\"} 12\n\
                    grpc_server_started_total{grpc_method=\"Txn\"} 3\n\
                    grpc_server_started_totalx 99\n";
        assert_eq!(sum_metric(text, "grpc_server_started_total"), Some(15));
        assert_eq!(sum_metric(text, "grpc_server_msg_received_total"), None);
    }
}
