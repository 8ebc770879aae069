//! Redis Cluster: the cluster's client and seed nodes, pipelines routed to one slot's master,
//! the slot map (`CLUSTER SLOTS`) and the key slot of a name.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use dlock_core::Error;
use dlock_core::backend::Counters;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, FromRedisValue};

use super::{Conn, Node, Target};

/// A Redis Cluster's client (seed nodes, credentials, TLS, address map) and the seed nodes'
/// own clients, for the pub/sub connection (a `PUBLISH` reaches every node of a cluster).
pub(crate) struct ClusterTarget {
    pub(crate) client: ClusterClient,
    /// One client per seed node, in the configured order.
    pub(crate) seeds: Vec<Client>,
    /// The seed the next pub/sub connection goes to (round robin: a seed that failed is not
    /// asked again first).
    pub(crate) next_seed: AtomicUsize,
}

/// A cluster connection whose pipelines all go to the master of one slot (the renewal of the
/// leases of one node: one script call per slot, in one round trip).
struct ToSlot {
    conn: ClusterConnection,
    slot: u16,
}

impl redis::aio::ConnectionLike for ToSlot {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(self.slot, SlotAddr::Master));
        Box::pin(
            self.conn
                .route_pipeline(pipeline.clone(), offset, count, route),
        )
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A node standing for a whole Redis Cluster: no I/O until its first request.
pub(crate) fn open_cluster(
    target: ClusterTarget,
    display: String,
    request_timeout: Duration,
) -> Node {
    let target = Target::Cluster(Arc::new(target));
    Node::new(target, None, Arc::from(display), request_timeout)
}

impl Node {
    /// For a cluster node: runs a pipeline (one round trip) on the master of `slot` within
    /// `budget`, counting one request; every command of it must touch keys of slots that node
    /// serves (a `MOVED` reply sends the whole pipeline where it points).
    pub(crate) async fn pipeline_to_slot<T: FromRedisValue>(
        &self,
        what: &'static str,
        pipe: &redis::Pipeline,
        slot: u16,
        budget: Duration,
        counters: &Counters,
    ) -> Result<T, Error> {
        counters.add_requests(1);
        self.run(what, budget, |conn| async move {
            match conn {
                Conn::Cluster(conn) => pipe.query_async::<T>(&mut ToSlot { conn, slot }).await,
                mut other => pipe.query_async::<T>(&mut other).await,
            }
        })
        .await
    }

    /// For a cluster node: which master serves each slot now (`CLUSTER SLOTS`), as
    /// `(first slot, last slot, master "host:port")` ranges; one request within `budget`.
    pub(crate) async fn cluster_slots(
        &self,
        budget: Duration,
        counters: &Counters,
    ) -> Result<Vec<(u16, u16, String)>, Error> {
        counters.add_requests(1);
        let reply: redis::Value = self
            .run("reading the slot map", budget, |mut conn| async move {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        parse_cluster_slots(&reply).ok_or_else(|| {
            Error::backend(
                format!("unexpected reply to CLUSTER SLOTS from {}", self.display),
                None,
            )
        })
    }
}

/// Parses a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, …], replicas…], …]`.
fn parse_cluster_slots(reply: &redis::Value) -> Option<Vec<(u16, u16, String)>> {
    use redis::Value as V;
    let V::Array(ranges) = reply else { return None };
    let int = |v: &V| match v {
        V::Int(i) => u16::try_from(*i).ok(),
        _ => None,
    };
    let text = |v: &V| match v {
        V::BulkString(b) => String::from_utf8(b.clone()).ok(),
        V::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    ranges
        .iter()
        .map(|r| {
            let V::Array(parts) = r else { return None };
            let (start, end) = (int(parts.first()?)?, int(parts.get(1)?)?);
            let V::Array(master) = parts.get(2)? else {
                return None;
            };
            let host = text(master.first()?)?;
            let port = match master.get(1)? {
                V::Int(p) => u16::try_from(*p).ok()?,
                _ => return None,
            };
            Some((start, end, format!("{host}:{port}")))
        })
        .collect()
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{`
/// and the next `}`, when not empty) or of the whole key, modulo 16384.
pub(crate) fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tag = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16::State::<crc16::XMODEM>::calculate(tag) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_replies_parse_to_master_ranges() {
        use redis::Value as V;
        let node = |host: &str, port: i64| {
            V::Array(vec![
                V::BulkString(host.as_bytes().to_vec()),
                V::Int(port),
                V::BulkString(b"id".to_vec()),
            ])
        };
        let reply = V::Array(vec![
            V::Array(vec![
                V::Int(0),
                V::Int(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            V::Array(vec![V::Int(5461), V::Int(16383), node("10.0.0.2", 7001)]),
        ]);
        assert_eq!(
            parse_cluster_slots(&reply),
            Some(vec![
                (0, 5460, "127.0.0.1:7000".to_string()),
                (5461, 16383, "10.0.0.2:7001".to_string()),
            ])
        );
        // A malformed range makes the whole reply unusable.
        let bad = V::Array(vec![V::Array(vec![V::Int(0), V::Int(70000), node("h", 1)])]);
        assert_eq!(parse_cluster_slots(&bad), None);
        assert_eq!(parse_cluster_slots(&V::Nil), None);
    }

    #[test]
    fn key_slots_follow_the_cluster_spec() {
        // The cluster specification's example: "123456789" hashes to 0x31C3 (12739).
        assert_eq!(key_slot("123456789"), 12739);
        // Only the hash tag counts.
        assert_eq!(key_slot("p/dlock:{123456789}:fence"), 12739);
        assert_eq!(key_slot("x{123456789}"), key_slot("y{123456789}z"));
        // An empty tag is no tag: the whole key is hashed.
        assert_ne!(key_slot("a{}1"), key_slot("a{}2"));
        assert_eq!(
            key_slot("{user1000}.following"),
            key_slot("{user1000}.followers")
        );
    }
}
