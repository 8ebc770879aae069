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

/// Channels of Redis's own (Sentinel's hello messages), not a lock client's.
const SERVER_CHANNELS: &str = "__sentinel__:";

/// How many connections one `PUBLISH` reaches at most on a Redis node, from its pub/sub state
/// right now: the most subscribers any channel has (Sentinel's own channels aside) plus the
/// pattern subscriptions (`PUBSUB NUMPAT`), which every message may match. `read` sends one
/// request (inline commands ending in `QUIT`) and returns the whole reply.
///
/// `None` when a reply cannot be read.
pub fn redis_fanout(read: impl Fn(&[u8]) -> Option<String>) -> Option<u64> {
    let channels = resp_items(&read(b"PUBSUB CHANNELS\r\nQUIT\r\n")?)?;
    let client: Vec<&String> = channels
        .iter()
        .filter(|c| !c.starts_with(SERVER_CHANNELS) && !c.contains(char::is_whitespace))
        .collect();
    let mut request = String::from("PUBSUB NUMPAT\r\n");
    if !client.is_empty() {
        request.push_str("PUBSUB NUMSUB");
        for c in &client {
            request.push(' ');
            request.push_str(c);
        }
        request.push_str("\r\n");
    }
    request.push_str("QUIT\r\n");
    fanout_of(&read(request.as_bytes())?, client.len())
}

/// [`redis_fanout`] from the reply to `PUBSUB NUMPAT` then `PUBSUB NUMSUB` of `channels`
/// channels (absent when there are none).
fn fanout_of(reply: &str, channels: usize) -> Option<u64> {
    let mut lines = reply.lines();
    let patterns: u64 = lines.next()?.strip_prefix(':')?.trim().parse().ok()?;
    if channels == 0 {
        return Some(patterns);
    }
    let rest: String = lines.map(|l| format!("{l}\r\n")).collect();
    let items = resp_items(&rest)?;
    // Name, count, name, count, ...
    let most = items
        .iter()
        .skip(1)
        .step_by(2)
        .map(|n| n.parse::<u64>().ok())
        .collect::<Option<Vec<u64>>>()?
        .into_iter()
        .max()
        .unwrap_or(0);
    Some(most + patterns)
}

/// The items of one flat RESP array reply (bulk strings and integers, as text); `None` when
/// the reply does not start with an array.
fn resp_items(reply: &str) -> Option<Vec<String>> {
    let mut lines = reply.lines();
    let len: usize = lines.next()?.strip_prefix('*')?.trim().parse().ok()?;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let line = lines.next()?;
        if line.starts_with('$') {
            out.push(lines.next()?.to_string());
        } else if let Some(n) = line.strip_prefix(':') {
            out.push(n.to_string());
        } else {
            return None;
        }
    }
    Some(out)
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
    use super::{fanout_of, resp_items, sum_metric};

    #[test]
    fn counters_are_summed_over_labels() {
        let text = "# HELP x\ngrpc_server_started_total{grpc_method=\"Range\"} 12\n\
                    grpc_server_started_total{grpc_method=\"Txn\"} 3\n\
                    grpc_server_started_totalx 99\n";
        assert_eq!(sum_metric(text, "grpc_server_started_total"), Some(15));
        assert_eq!(sum_metric(text, "grpc_server_msg_received_total"), None);
    }

    #[test]
    fn the_fanout_is_the_busiest_channel_plus_the_patterns() {
        assert_eq!(
            resp_items("*2\r\n$3\r\nabc\r\n$2\r\nde\r\n"),
            Some(vec!["abc".to_string(), "de".to_string()])
        );
        assert_eq!(resp_items("+OK\r\n"), None);
        // One subscriber on each of two channels, no pattern.
        let one = ":0\r\n*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n:1\r\n+OK\r\n";
        assert_eq!(fanout_of(one, 2), Some(1));
        // A channel every waiter subscribed to: a herd at the server.
        let herd = ":0\r\n*4\r\n$1\r\na\r\n:8\r\n$1\r\nb\r\n:1\r\n+OK\r\n";
        assert_eq!(fanout_of(herd, 2), Some(8));
        assert_eq!(fanout_of(":2\r\n+OK\r\n", 0), Some(2));
        assert_eq!(fanout_of("-ERR\r\n", 0), None);
    }
}
