//! Connections to one Redis server and the mapping of client errors to dlock errors.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{Counters, Error};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, FromRedisValue, RedisError, ScriptInvocation};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// One server: a multiplexed auto-reconnecting connection and its display name (never the
/// password).
///
/// The connection is REBUILT (a new one, resolving the host name again) when the server says
/// it is not a usable master (`READONLY`, `LOADING`, `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`)
/// or after [`REBUILD_AFTER_TIMEOUTS`] timeouts in a row: a failover behind a DNS name then
/// reaches the new master instead of keeping a connection to the demoted one.
#[derive(Clone)]
pub(crate) struct Node {
    conn: Arc<Mutex<ConnectionManager>>,
    client: Client,
    request_timeout: Duration,
    timeouts: Arc<AtomicU32>,
    pub(crate) display: Arc<str>,
}

/// How many timed-out requests in a row make a node rebuild its connection.
pub(crate) const REBUILD_AFTER_TIMEOUTS: u32 = 3;

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("addr", &self.display).finish()
    }
}

/// [`parse_url`], trusting only the PEM root certificates `root_pem` when given (instead of
/// the system's roots); they need a `rediss://` URL. No I/O.
pub(crate) fn parse_url_with_roots(
    option: &'static str,
    url: &str,
    root_pem: Option<&[u8]>,
) -> Result<Client, Error> {
    let client = parse_url(option, url)?;
    let Some(pem) = root_pem else {
        return Ok(client);
    };
    if !matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    ) {
        return Err(Error::invalid_option(
            "tls_root_certificates",
            "root certificates need a rediss:// URL",
        ));
    }
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem).collect();
    if !certs.is_ok_and(|c| !c.is_empty()) {
        return Err(Error::invalid_option(
            "tls_root_certificates",
            "expected one or more PEM certificates",
        ));
    }
    Client::build_with_tls(
        url,
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        },
    )
    .map_err(|e| {
        Error::invalid_option(
            "tls_root_certificates",
            format!(
                "cannot use the root certificates: {}",
                e.detail().unwrap_or("not PEM certificates")
            ),
        )
    })
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
        ensure_tls_provider();
    }
    Ok(client)
}

/// Makes sure rustls has a process-wide crypto provider before the first TLS connection: when
/// the final binary enables more than one provider (e.g. `ring` here and `aws-lc-rs`
/// elsewhere), rustls cannot pick one and the client's TLS set-up would panic. Installs `ring`
/// only when no provider is installed yet; an application's own choice is kept.
fn ensure_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one meanwhile, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Opens the node's connection lazily: no I/O happens until the first request, so building a
/// locker never blocks and a node that is down only makes requests to it fail.
///
/// Must run inside a tokio runtime.
pub(crate) fn open(client: Client, request_timeout: Duration) -> Result<Node, Error> {
    let display: Arc<str> = Arc::from(client.get_connection_info().addr().to_string());
    let conn =
        manager(&client, request_timeout).map_err(|e| map_err(&display, "connecting", &e))?;
    Ok(Node {
        conn: Arc::new(Mutex::new(conn)),
        client,
        request_timeout,
        timeouts: Arc::new(AtomicU32::new(0)),
        display,
    })
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

/// Whether the server answered that it cannot serve writes right now (a replica, loading its
/// data, a failover in progress): retryable, and worth a new connection.
pub(crate) fn is_not_master(e: &RedisError) -> bool {
    use redis::ServerErrorKind as K;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(
            K::ReadOnly | K::BusyLoading | K::MasterDown | K::TryAgain | K::ClusterDown
        )
    ) || matches!(
        e.code(),
        Some("READONLY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN")
    )
}

/// Whether the server refused our credentials or our ACL permissions (`WRONGPASS`, `NOAUTH`,
/// `NOPERM`, or a command inside our script refused by ACL, which Redis reports as a script
/// error "The user executing the script can't …"): retrying cannot help until an operator
/// changes them.
pub(crate) fn is_refused_access(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::AuthenticationFailed
            | redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
    ) || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        || e.to_string()
            .contains("The user executing the script can't")
}

/// Maps a client error: refused credentials or permissions are `AccessDenied` (not
/// retryable); connection problems are `Unavailable` (retryable); everything else is a
/// `Backend` error.
pub(crate) fn map_err(node: &str, what: &str, e: &RedisError) -> Error {
    let source: dlock_core::BoxError = Box::new(e.clone());
    if is_refused_access(e) {
        return Error::access_denied(
            format!("{what} on {node}: credentials or ACL permissions refused: {e}"),
            Some(source),
        );
    }
    let message = format!("{what} on {node}: {e}");
    if is_not_master(e)
        || e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
    {
        Error::unavailable(message, Some(source))
    } else {
        Error::backend(message, Some(source))
    }
}

/// Whether `e` is worth retrying within the caller's wait: the server was slow (our budget ran
/// out, or the client timed out), or answered that it cannot serve writes right now
/// ([`is_not_master`]), as opposed to definitely down (refused, reset) or answering with an
/// error.
pub(crate) fn is_slow(e: &Error) -> bool {
    match e {
        Error::Unavailable { source: None, .. } => true,
        Error::Unavailable {
            source: Some(s), ..
        } => s
            .downcast_ref::<RedisError>()
            .is_some_and(|r| r.is_timeout() || is_not_master(r)),
        _ => false,
    }
}

/// Starts connecting in the background, so that the first request does not pay for the
/// connection set-up (errors are left for real requests to report).
pub(crate) fn warm_up(node: &Node, budget: Duration) {
    let mut conn = node.connection();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(budget, conn.send_packed_command(&redis::cmd("PING"))).await;
    });
}

/// The error of a request cut by its time budget.
pub(crate) fn timed_out(node: &str, what: &str, budget: Duration) -> Error {
    Error::unavailable(
        format!("{what} on {node}: no reply within {budget:?}"),
        None,
    )
}

impl Node {
    /// The current connection.
    fn connection(&self) -> ConnectionManager {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the connection with a new one (requests in flight finish on the old one).
    fn rebuild(&self, why: &str) {
        match manager(&self.client, self.request_timeout) {
            Ok(fresh) => {
                tracing::warn!(node = %self.display, why, "rebuilding the connection");
                *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
                self.timeouts.store(0, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(node = %self.display, error = %e, "cannot rebuild the connection")
            }
        }
    }

    /// Counts a request's outcome; rebuilds the connection when the server is not a usable
    /// master or after too many timeouts in a row.
    fn observe<T>(&self, r: &Result<T, Error>) {
        match r {
            Ok(_) => self.timeouts.store(0, Ordering::Relaxed),
            Err(Error::Unavailable { source, .. }) => {
                let redis_err = source.as_ref().and_then(|s| s.downcast_ref::<RedisError>());
                if redis_err.is_some_and(is_not_master) {
                    self.rebuild("the server is not a usable master");
                } else if redis_err.is_none_or(RedisError::is_timeout)
                    && self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= REBUILD_AFTER_TIMEOUTS
                {
                    self.rebuild("requests timed out repeatedly");
                }
            }
            Err(_) => self.timeouts.store(0, Ordering::Relaxed),
        }
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
        let mut conn = self.connection();
        let r = bounded(&self.display, what, budget, async move {
            inv.invoke_async::<T>(&mut conn).await
        })
        .await;
        self.observe(&r);
        r
    }
}

impl Node {
    /// The client the node connects with (for a connection of one's own).
    pub(crate) fn client(&self) -> &Client {
        &self.client
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
        let mut conn = self.connection();
        let r = bounded(&self.display, what, budget, async move {
            pipe.query_async::<T>(&mut conn).await
        })
        .await;
        self.observe(&r);
        r
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

/// A Redis integer reply as a fencing counter.
pub(crate) fn token_of(node: &str, v: i64) -> Result<u64, Error> {
    u64::try_from(v).ok().filter(|t| *t > 0).ok_or_else(|| {
        Error::backend(
            format!("{node} returned an invalid fencing counter {v}"),
            None,
        )
    })
}

/// A reply of the wrong shape.
pub(crate) fn unexpected(node: &str, what: &str, reply: &[i64]) -> Error {
    Error::backend(
        format!("unexpected reply to {what} from {node}: {reply:?}"),
        None,
    )
}

/// Milliseconds for a Redis argument (TTLs are validated far below `u64::MAX` ms).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
