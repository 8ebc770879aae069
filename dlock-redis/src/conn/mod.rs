//! Connections to one Redis server (or the master the sentinels name, or a whole Redis
//! Cluster): a node's connection, rebuilt when the server stops being a usable master, and
//! every request bounded by a time budget.

mod cluster;
mod sentinel;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::Error;
use dlock_core::backend::Counters;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Client, FromRedisValue, RedisError, ScriptInvocation};

pub(crate) use cluster::open_cluster;
pub(crate) use cluster::{ClusterTarget, key_slot};
pub(crate) use sentinel::{Sentinels, client_for, open_sentinel};

use crate::error::{is_cluster_redirect, is_not_master, map_err, timed_out};

/// One server: a multiplexed auto-reconnecting connection and its display name (never the
/// password).
///
/// The connection is REBUILT (a new one, resolving the host name again) when the server says
/// it is not a usable master (`READONLY`, `LOADING`, `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`)
/// or after [`REBUILD_AFTER_TIMEOUTS`] timeouts in a row: a failover behind a DNS name then
/// reaches the new master instead of keeping a connection to the demoted one.
///
/// A node found through Redis Sentinel ([`Target::Sentinel`]) has no connection until its
/// first request: that request asks the sentinels for the master (see [`Sentinels`]), and a
/// rebuild (also after a connection error, the master being gone) drops the connection so that
/// the next request asks them again.
///
/// A Redis Cluster node ([`Target::Cluster`]) stands for the whole cluster: its connection is a
/// redis-rs [`ClusterConnection`] (opened at the first request), which sends each request to
/// the master of its key's slot and follows `MOVED` / `ASK`; a rebuild drops it.
#[derive(Clone)]
pub(crate) struct Node {
    /// The current master's client and connection; `None` until a sentinel or cluster node
    /// opened one.
    conn: Arc<Mutex<Option<Current>>>,
    target: Target,
    /// Held while the sentinels are asked: one discovery at a time.
    discovery: Arc<tokio::sync::Mutex<()>>,
    request_timeout: Duration,
    timeouts: Arc<AtomicU32>,
    pub(crate) display: Arc<str>,
}

/// A node's open connection, with the master's client for a single server (`None` for a
/// cluster).
type Current = (Option<Client>, Conn);

/// Where a node's server is.
#[derive(Clone)]
pub(crate) enum Target {
    /// A fixed address (a URL).
    Fixed(Box<Client>),
    /// The master the sentinels name.
    Sentinel(Arc<Sentinels>),
    /// A Redis Cluster: every request goes to its key's slot owner.
    Cluster(Arc<ClusterTarget>),
}

/// A connection of any of the shapes a node uses; each one sends a request where it belongs.
#[derive(Clone)]
pub(crate) enum Conn {
    /// A single server's auto-reconnecting connection.
    Manager(ConnectionManager),
    /// A single server's plain multiplexed connection (a connection of one's own).
    Multiplexed(MultiplexedConnection),
    /// A Redis Cluster: routed by key slot, following redirects.
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Manager(c) => c.req_packed_command(cmd),
            Conn::Multiplexed(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Manager(c) => c.get_db(),
            Conn::Multiplexed(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// How many timed-out requests in a row make a node rebuild its connection.
pub(crate) const REBUILD_AFTER_TIMEOUTS: u32 = 3;

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("addr", &self.display).finish()
    }
}

/// `url` with the password (and anything that is not plainly a URL) masked, for `Debug`
/// output: `redis://user:***@host:6379/0`. A string without `://` shows as `***`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".to_owned();
    };
    // Credentials end at the last '@' (a password may hold an unescaped '/', '@', '?' or
    // '#'), so look for it before cutting at a query or fragment.
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        // A query or fragment may carry a password too (`?password=`): drop it whole.
        let rest = rest.split(['?', '#']).next().unwrap_or("");
        return format!("{scheme}://{rest}");
    };
    if userinfo.contains(['?', '#']) {
        // Either the password holds '?' / '#' or the '@' lies in a query or fragment (which
        // may be part of a password there): which part is the host is unclear.
        return format!("{scheme}://***");
    }
    let host = host.split(['?', '#']).next().unwrap_or("");
    let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
    let user = if user.contains('/') { "" } else { user };
    format!("{scheme}://{user}:***@{host}")
}

/// Parses a `redis://` / `rediss://` / `unix://` URL without any I/O.
///
/// `rediss://…#insecure` (accept any certificate) is rejected: this build's TLS stack verifies
/// certificates and cannot turn that off, so such a URL could only fail at the first request.
pub(crate) fn parse_url(option: &'static str, url: &str) -> Result<Client, Error> {
    let client = Client::open(url).map_err(|e| {
        Error::invalid_option(
            option,
            format!(
                "cannot parse the Redis URL: {}",
                e.detail().unwrap_or("malformed URL")
            ),
        )
    })?;
    if let redis::ConnectionAddr::TcpTls { insecure: true, .. } =
        client.get_connection_info().addr()
    {
        return Err(Error::invalid_option(
            option,
            "`#insecure` (TLS without certificate verification) is not supported; use a \
             certificate the system trusts",
        ));
    }
    if let redis::ConnectionAddr::TcpTls { .. } = client.get_connection_info().addr() {
        dlock_core::backend::tls::ensure_provider();
    }
    Ok(client)
}

/// Opens the node's connection lazily: no I/O happens until the first request, so building a
/// locker never blocks and a node that is down only makes requests to it fail.
///
/// Must run inside a tokio runtime.
pub(crate) fn open(client: Client, request_timeout: Duration) -> Result<Node, Error> {
    let display: Arc<str> = Arc::from(client.get_connection_info().addr().to_string());
    let conn =
        manager(&client, request_timeout).map_err(|e| map_err(&display, "connecting", &e))?;
    let current = (Some(client.clone()), Conn::Manager(conn));
    let target = Target::Fixed(Box::new(client));
    Ok(Node::new(target, Some(current), display, request_timeout))
}

/// Parses a sentinel address `host:port` (`[v6]:port` for an IPv6 address). No I/O.
pub(crate) fn parse_host_port(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    let valid = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'));
    valid.then(|| (host.to_owned(), port))
}

fn manager(client: &Client, request_timeout: Duration) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        // dlock bounds every request itself; the client must fail fast rather than queue
        // requests behind long reconnect back-offs.
        .set_connection_timeout(Some(request_timeout))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(5))
        .set_max_delay(Duration::from_millis(100));
    ConnectionManager::new_lazy_with_config(client.clone(), config)
}

/// Starts connecting in the background, so that the first request does not pay for the
/// connection set-up (errors are left for real requests to report).
pub(crate) fn warm_up(node: &Node, budget: Duration) {
    let node = node.clone();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(budget, async move {
            if let Ok(mut conn) = node.connection(budget).await {
                let _ = redis::cmd("PING")
                    .query_async::<redis::Value>(&mut conn)
                    .await;
            }
        })
        .await;
    });
}

impl Node {
    /// A node of `target`, with its connection when one is open already.
    fn new(
        target: Target,
        current: Option<Current>,
        display: Arc<str>,
        request_timeout: Duration,
    ) -> Node {
        Node {
            conn: Arc::new(Mutex::new(current)),
            target,
            discovery: Arc::default(),
            request_timeout,
            timeouts: Arc::default(),
            display,
        }
    }

    fn current(&self) -> Option<Current> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether this node finds its master through Redis Sentinel (and so follows failovers:
    /// an unreachable master is looked up again).
    pub(crate) fn follows_failovers(&self) -> bool {
        matches!(self.target, Target::Sentinel(_))
    }

    /// Whether this node stands for a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// The current connection (and the master's client, for a single server): for a sentinel
    /// node without one, the sentinels are asked first; a cluster node without one connects to
    /// the cluster (one at a time, within `budget`).
    async fn current_or_discover(&self, budget: Duration) -> Result<Current, Error> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let work = async {
            let _one = self.discovery.lock().await;
            if let Some(c) = self.current() {
                return Ok(c);
            }
            let fresh = match &self.target {
                Target::Fixed(_) => {
                    return Err(Error::unavailable(
                        format!("{}: no connection", self.display),
                        None,
                    ));
                }
                Target::Sentinel(sentinels) => {
                    let (client, addr) = sentinels.discover(self.request_timeout).await?;
                    let conn = manager(&client, self.request_timeout)
                        .map_err(|e| map_err(&self.display, "connecting", &e))?;
                    tracing::info!(node = %self.display, master = %addr, "connected to the master the sentinels name");
                    (Some(client), Conn::Manager(conn))
                }
                Target::Cluster(cluster) => {
                    let conn = cluster
                        .client
                        .get_async_connection()
                        .await
                        .map_err(|e| map_err(&self.display, "connecting to the cluster", &e))?;
                    tracing::info!(node = %self.display, "connected to the cluster");
                    (None, Conn::Cluster(conn))
                }
            };
            *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(fresh.clone());
            self.timeouts.store(0, Ordering::Relaxed);
            Ok(fresh)
        };
        match tokio::time::timeout(budget, work).await {
            Ok(r) => r,
            Err(_) => Err(timed_out(&self.display, "connecting", budget)),
        }
    }

    /// The current connection (see [`current_or_discover`](Self::current_or_discover)).
    async fn connection(&self, budget: Duration) -> Result<Conn, Error> {
        // The common case clones only the connection (a few reference counts), not the
        // master's client (its address and credentials, allocated anew per clone).
        let open = self
            .conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(_, c)| c.clone());
        if let Some(c) = open {
            return Ok(c);
        }
        self.current_or_discover(budget).await.map(|(_, c)| c)
    }

    /// Replaces the connection with a new one (requests in flight finish on the old one); a
    /// sentinel node drops it, so that the next request asks the sentinels again, and a
    /// cluster node, so that the next request connects to the cluster again.
    fn rebuild(&self, why: &str) {
        let client = match &self.target {
            Target::Fixed(client) => client,
            Target::Sentinel(_) | Target::Cluster(_) => {
                let had = self
                    .conn
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .is_some();
                if had {
                    tracing::warn!(node = %self.display, why, "connecting again");
                }
                self.timeouts.store(0, Ordering::Relaxed);
                return;
            }
        };
        match manager(client, self.request_timeout) {
            Ok(fresh) => {
                tracing::warn!(node = %self.display, why, "rebuilding the connection");
                *self.conn.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((Some(Client::clone(client)), Conn::Manager(fresh)));
                self.timeouts.store(0, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(node = %self.display, error = %e, "cannot rebuild the connection")
            }
        }
    }

    /// Counts a request's outcome; rebuilds the connection when the server is not a usable
    /// master or after too many timeouts in a row (a sentinel node also when the server is
    /// unreachable: the master may have moved). A cluster connection reconnects to a node
    /// that went away and refreshes its slot map by itself.
    fn observe<T>(&self, r: &Result<T, Error>) {
        match r {
            Ok(_) => self.timeouts.store(0, Ordering::Relaxed),
            Err(Error::Unavailable { source, .. }) => {
                let redis_err = source.as_ref().and_then(|s| s.downcast_ref::<RedisError>());
                let sentinel = matches!(self.target, Target::Sentinel(_));
                if redis_err.is_some_and(is_not_master) {
                    self.rebuild("the server is not a usable master");
                } else if redis_err.is_some_and(is_cluster_redirect) {
                    self.rebuild("the cluster's slots moved");
                } else if sentinel
                    && redis_err.is_some_and(|e| {
                        e.is_io_error()
                            || e.is_connection_refusal()
                            || e.is_connection_dropped()
                            || e.is_unrecoverable_error()
                    })
                {
                    self.rebuild("the master is unreachable");
                } else if redis_err.is_none_or(RedisError::is_timeout)
                    // A cluster connection keeps one connection per master: a slow or frozen
                    // master says nothing about the others, and the cluster connection
                    // reconnects to it by itself.
                    && !self.is_cluster()
                    && self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= REBUILD_AFTER_TIMEOUTS
                {
                    self.rebuild("requests timed out repeatedly");
                }
            }
            Err(_) => self.timeouts.store(0, Ordering::Relaxed),
        }
    }

    /// Runs `fut` on the current connection within `budget` (the sentinels' answer or the
    /// cluster connection's set-up included).
    async fn run<T, F, Fut>(&self, what: &'static str, budget: Duration, fut: F) -> Result<T, Error>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let start = tokio::time::Instant::now();
        let r = match self.connection(budget).await {
            Ok(conn) => {
                let left = budget.saturating_sub(start.elapsed());
                bounded(&self.display, what, left, fut(conn)).await
            }
            Err(e) => Err(e),
        };
        self.observe(&r);
        r
    }

    /// Runs one script invocation within `budget`, counting one request.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptInvocation<'_>,
        budget: Duration,
        counters: &Counters,
    ) -> Result<T, Error> {
        counters.add_requests(1);
        self.run(what, budget, |mut conn| async move {
            inv.invoke_async::<T>(&mut conn).await
        })
        .await
    }
}

impl Node {
    /// The client of a server to open a connection of one's own to (the notification
    /// subscription): the current master; a sentinel node asks the sentinels when it has none,
    /// within `budget`; a cluster node names its seed nodes in turn (a `PUBLISH` on any node
    /// of a cluster reaches the subscribers of every node).
    pub(crate) async fn client(&self, budget: Duration) -> Result<Client, Error> {
        match &self.target {
            Target::Fixed(client) => Ok(Client::clone(client)),
            Target::Sentinel(_) => match self.current_or_discover(budget).await? {
                (Some(c), _) => Ok(c),
                (None, _) => Err(Error::unavailable(
                    format!("{}: no master", self.display),
                    None,
                )),
            },
            Target::Cluster(cluster) => {
                let i = cluster.next_seed.fetch_add(1, Ordering::Relaxed);
                Ok(cluster.seeds[i % cluster.seeds.len()].clone())
            }
        }
    }

    /// A connection of one's own for blocking reads (no response timeout: the caller bounds
    /// every read): a multiplexed connection to the master, or for a cluster node a cluster
    /// connection of its own (routed by key slot). Within `budget`.
    pub(crate) async fn own_connection(&self, budget: Duration) -> Result<Conn, Error> {
        let cluster = match &self.target {
            Target::Cluster(c) => Arc::clone(c),
            _ => {
                let client = self.client(budget).await?;
                let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
                return bounded(&self.display, "connecting", budget, async move {
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                })
                .await
                .map(Conn::Multiplexed);
            }
        };
        let config = redis::cluster::ClusterConfig::new()
            .set_connection_timeout(self.request_timeout)
            .set_response_timeout(Duration::from_secs(24 * 3600));
        bounded(
            &self.display,
            "connecting to the cluster",
            budget,
            async move {
                cluster
                    .client
                    .get_async_connection_with_config(config)
                    .await
            },
        )
        .await
        .map(Conn::Cluster)
    }

    /// Runs a pipeline (one round trip) within `budget`, counting one request.
    pub(crate) async fn pipeline<T: FromRedisValue>(
        &self,
        what: &'static str,
        pipe: &redis::Pipeline,
        budget: Duration,
        counters: &Counters,
    ) -> Result<T, Error> {
        counters.add_requests(1);
        self.run(what, budget, |mut conn| async move {
            pipe.query_async::<T>(&mut conn).await
        })
        .await
    }
}

/// Awaits a client future within `budget`, mapping its error.
pub(crate) async fn bounded<T>(
    node: &str,
    what: &'static str,
    budget: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, Error> {
    match tokio::time::timeout(budget, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(map_err(node, what, &e)),
        Err(_) => Err(timed_out(node, what, budget)),
    }
}

/// Milliseconds for a Redis argument (TTLs are validated far below `u64::MAX` ms).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_urls_keep_no_password() {
        assert_eq!(
            redact_url("redis://alice:s3cret@h:6379/0"),
            "redis://alice:***@h:6379/0"
        );
        assert_eq!(
            redact_url("rediss://:s3cret@h:6380"),
            "rediss://:***@h:6380"
        );
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
        // A password holding '@' or '/', one in the query, and text that is not a URL.
        assert_eq!(redact_url("redis://u:a@b@h:1"), "redis://u:***@h:1");
        assert_eq!(redact_url("redis://h:1/0?password=s3cret"), "redis://h:1/0");
        assert_eq!(redact_url("u:s3cret@h"), "***");
        assert_eq!(
            redact_url("redis://u:a@h:1/0?db=1#x"),
            "redis://u:***@h:1/0"
        );
        for url in [
            "redis://u:s3cret@h",
            "redis://u:x/s3cret@h:1",
            "redis://u:pa?s3cret@h",
            "redis://u:s3?cret@h",
            "redis://u:s3#cret@h:1",
            "redis://h:1/0?password=s3cret@x",
            "redis://h:1/0?password=x@s3cret",
        ] {
            let shown = redact_url(url);
            for part in ["s3cret", "s3", "cret", "pa"] {
                assert!(!shown.contains(part), "{url} shows {shown}");
            }
        }
    }

    #[test]
    fn sentinel_addresses_are_host_and_port() {
        let ok = |a: &str| parse_host_port(a).map(|(h, p)| format!("{h}|{p}"));
        assert_eq!(ok("127.0.0.1:26379").as_deref(), Some("127.0.0.1|26379"));
        assert_eq!(
            ok("sentinel-1.example:1").as_deref(),
            Some("sentinel-1.example|1")
        );
        assert_eq!(ok("[::1]:26379").as_deref(), Some("::1|26379"));
        for bad in [
            "127.0.0.1",
            ":26379",
            "h:0",
            "h:65536",
            "h:x",
            "::1:26379",
            "a b:1",
            "[::1:1",
        ] {
            assert_eq!(ok(bad), None, "{bad}");
        }
    }
}
