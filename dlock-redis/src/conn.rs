//! Connections to one Redis server and the mapping of client errors to dlock errors.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::Error;
use dlock_core::backend::Counters;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
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

/// A Redis Cluster's client (seed nodes, credentials, TLS, address map) and the seed nodes'
/// own clients, for the pub/sub connection (a `PUBLISH` reaches every node of a cluster).
pub(crate) struct ClusterTarget {
    pub(crate) client: ClusterClient,
    /// One client per seed node, in the configured order.
    pub(crate) seeds: Vec<Client>,
    /// The seed the next pub/sub connection goes to (round robin: a seed that failed is not
    /// asked again first).
    pub(crate) next_seed: std::sync::atomic::AtomicUsize,
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

/// Redis Sentinels and the master they are asked for, with the settings of the data connection
/// (TLS, roots, credentials), which the sentinels do not tell.
pub(crate) struct Sentinels {
    /// One client per sentinel, in the configured order.
    pub(crate) sentinels: Vec<Client>,
    /// The sentinels' `host:port`, in the same order (for messages).
    pub(crate) addrs: Vec<String>,
    pub(crate) master: String,
    pub(crate) tls: bool,
    pub(crate) root_pem: Option<Vec<u8>>,
    pub(crate) identity: Option<Identity>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
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

/// A client identity for TLS: a certificate chain and its private key, both PEM.
pub(crate) type Identity = (Vec<u8>, Vec<u8>);

/// What redis-rs needs for TLS with these roots and identity (`None`: neither given, the
/// system's roots and no client certificate).
pub(crate) fn tls_certificates(
    root_pem: Option<&[u8]>,
    identity: Option<&Identity>,
) -> Option<redis::TlsCertificates> {
    if root_pem.is_none() && identity.is_none() {
        return None;
    }
    Some(redis::TlsCertificates {
        client_tls: identity.map(|(cert, key)| redis::ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        }),
        root_cert: root_pem.map(<[u8]>::to_vec),
    })
}

/// Checks a client identity: one or more PEM certificates and a PEM private key. No I/O; the
/// error never quotes the key.
pub(crate) fn check_identity(identity: &Identity) -> Result<(), Error> {
    let (cert, key) = identity;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(cert).collect();
    if !certs.is_ok_and(|c| !c.is_empty()) {
        return Err(Error::invalid_option(
            "tls_client_identity",
            "the certificate is not PEM (-----BEGIN CERTIFICATE-----)",
        ));
    }
    if rustls::pki_types::PrivateKeyDer::from_pem_slice(key).is_err() {
        return Err(Error::invalid_option(
            "tls_client_identity",
            "the key is not a PEM private key (PKCS#8, PKCS#1 or SEC1)",
        ));
    }
    Ok(())
}

/// [`parse_url`], trusting only the PEM root certificates `root_pem` when given (instead of
/// the system's roots) and presenting `identity` when given; both need a `rediss://` URL.
/// No I/O.
pub(crate) fn parse_url_with_roots(
    option: &'static str,
    url: &str,
    root_pem: Option<&[u8]>,
    identity: Option<&Identity>,
) -> Result<Client, Error> {
    let client = parse_url(option, url)?;
    let Some(certs) = tls_certificates(root_pem, identity) else {
        return Ok(client);
    };
    if !matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    ) {
        let option = if root_pem.is_some() {
            "tls_root_certificates"
        } else {
            "tls_client_identity"
        };
        return Err(Error::invalid_option(
            option,
            "TLS options need a rediss:// URL",
        ));
    }
    if let Some(pem) = root_pem {
        check_pem(pem)?;
    }
    if let Some(identity) = identity {
        check_identity(identity)?;
    }
    Client::build_with_tls(url, certs).map_err(|e| {
        Error::invalid_option(
            if identity.is_some() {
                "tls_client_identity"
            } else {
                "tls_root_certificates"
            },
            format!(
                "cannot use the TLS certificates: {}",
                e.detail().unwrap_or("not PEM")
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
        conn: Arc::new(Mutex::new(Some((
            Some(client.clone()),
            Conn::Manager(conn),
        )))),
        target: Target::Fixed(Box::new(client)),
        discovery: Arc::new(tokio::sync::Mutex::new(())),
        request_timeout,
        timeouts: Arc::new(AtomicU32::new(0)),
        display,
    })
}

/// A node whose master the sentinels name: no I/O until its first request.
pub(crate) fn open_sentinel(sentinels: Sentinels, request_timeout: Duration) -> Node {
    let display: Arc<str> = Arc::from(format!(
        "master `{}` (sentinels {})",
        sentinels.master,
        sentinels.addrs.join(",")
    ));
    Node {
        conn: Arc::new(Mutex::new(None)),
        target: Target::Sentinel(Arc::new(sentinels)),
        discovery: Arc::new(tokio::sync::Mutex::new(())),
        request_timeout,
        timeouts: Arc::new(AtomicU32::new(0)),
        display,
    }
}

/// A node standing for a whole Redis Cluster: no I/O until its first request.
pub(crate) fn open_cluster(
    target: ClusterTarget,
    display: String,
    request_timeout: Duration,
) -> Node {
    Node {
        conn: Arc::new(Mutex::new(None)),
        target: Target::Cluster(Arc::new(target)),
        discovery: Arc::new(tokio::sync::Mutex::new(())),
        request_timeout,
        timeouts: Arc::new(AtomicU32::new(0)),
        display: Arc::from(display),
    }
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

/// The client of `host:port` with TLS (trusting `root_pem`, presenting `identity` when given)
/// or not, and these credentials. No I/O.
pub(crate) fn client_for(
    host: &str,
    port: u16,
    tls: bool,
    root_pem: Option<&[u8]>,
    identity: Option<&Identity>,
    username: Option<&str>,
    password: Option<&str>,
) -> redis::RedisResult<Client> {
    use redis::IntoConnectionInfo;
    let addr = if tls {
        ensure_tls_provider();
        redis::ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        redis::ConnectionAddr::Tcp(host.to_owned(), port)
    };
    let mut settings = redis::RedisConnectionInfo::default();
    if let Some(u) = username {
        settings = settings.set_username(u);
    }
    if let Some(p) = password {
        settings = settings.set_password(p);
    }
    let info = addr.into_connection_info()?.set_redis_settings(settings);
    match tls_certificates(root_pem, identity) {
        Some(certs) if tls => Client::build_with_tls(info, certs),
        _ => Client::open(info),
    }
}

/// Checks PEM root certificates (one or more). No I/O.
pub(crate) fn check_pem(pem: &[u8]) -> Result<(), Error> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem).collect();
    if certs.is_ok_and(|c| !c.is_empty()) {
        Ok(())
    } else {
        Err(Error::invalid_option(
            "tls_root_certificates",
            "expected one or more PEM certificates",
        ))
    }
}

impl Sentinels {
    /// Asks each sentinel in turn (each within `per_sentinel`) for the master's address
    /// (`SENTINEL get-master-addr-by-name`), and returns the first address that answers `ROLE`
    /// as a master, with its client. A sentinel that is down, slow or names a server that is
    /// not (or no longer) a master is skipped; when none gives a master, the error lists why.
    async fn discover(&self, per_sentinel: Duration) -> Result<(Client, String), Error> {
        let mut why = Vec::with_capacity(self.sentinels.len());
        let mut access_denied = None;
        for (sentinel, addr) in self.sentinels.iter().zip(&self.addrs) {
            match tokio::time::timeout(per_sentinel, self.ask(sentinel)).await {
                Ok(Ok(found)) => return Ok(found),
                Ok(Err(e)) => {
                    if let AskError::Redis(r) = &e
                        && is_refused_access(r)
                    {
                        access_denied = Some(r.clone());
                    }
                    why.push(format!("sentinel {addr}: {e}"));
                }
                Err(_) => why.push(format!(
                    "sentinel {addr}: no answer within {per_sentinel:?}"
                )),
            }
        }
        let message = format!(
            "no sentinel named a usable master `{}`: {}",
            self.master,
            why.join("; ")
        );
        Err(match access_denied {
            Some(e) => Error::access_denied(message, Some(Box::new(e) as dlock_core::BoxError)),
            // No source: the caller's wait goes on (a failover is usually under way).
            None => Error::unavailable(message, None),
        })
    }

    async fn ask(&self, sentinel: &Client) -> Result<(Client, String), AskError> {
        let mut conn = sentinel.get_multiplexed_async_connection().await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .query_async(&mut conn)
            .await?;
        let Some((host, port)) = addr else {
            return Err(AskError::Other("it does not know this master name".into()));
        };
        let client = client_for(
            &host,
            port,
            self.tls,
            self.root_pem.as_deref(),
            self.identity.as_ref(),
            self.username.as_deref(),
            self.password.as_deref(),
        )?;
        let mut master = client.get_multiplexed_async_connection().await?;
        let role: redis::Role = redis::cmd("ROLE").query_async(&mut master).await?;
        match role {
            redis::Role::Primary { .. } => Ok((client, format!("{host}:{port}"))),
            _ => Err(AskError::Other(format!(
                "it names {host}:{port}, which is not a master (yet)"
            ))),
        }
    }
}

enum AskError {
    Redis(RedisError),
    Other(String),
}

impl From<RedisError> for AskError {
    fn from(e: RedisError) -> Self {
        AskError::Redis(e)
    }
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::Redis(e) => e.fmt(f),
            AskError::Other(s) => f.write_str(s),
        }
    }
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
/// data, a failover in progress, too few replicas for `min-replicas-to-write`): retryable, and
/// worth a new connection.
pub(crate) fn is_not_master(e: &RedisError) -> bool {
    use redis::ServerErrorKind as K;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(
            K::ReadOnly | K::BusyLoading | K::MasterDown | K::TryAgain | K::ClusterDown
        )
    ) || matches!(
        e.code(),
        Some("READONLY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "NOREPLICAS")
    )
}

/// Whether a Redis Cluster's routing failed for now: a redirect (`MOVED`, `ASK`) still
/// pending when the cluster connection's retries ran out (a resharding under way), or no
/// connection to the slot's master: retryable.
pub(crate) fn is_cluster_redirect(e: &RedisError) -> bool {
    use redis::ServerErrorKind as K;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(K::Moved | K::Ask) | redis::ErrorKind::ClusterConnectionNotFound
    ) || matches!(e.code(), Some("MOVED" | "ASK"))
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
    // A TLS handshake refused over certificates: retrying the same connection cannot help, so
    // it is not retryable (an acquire fails at once instead of retrying until its wait ends).
    match tls_refusal(e) {
        Some(TlsRefusal::ServerCertificate) => {
            return Error::backend(
                format!(
                    "{what} on {node}: TLS: the server's certificate is not accepted (check \
                     tls_root_certificates and that the certificate names the URL's host): {e}"
                ),
                Some(source),
            );
        }
        Some(TlsRefusal::ClientCertificate) => {
            return Error::access_denied(
                format!(
                    "{what} on {node}: TLS: the server refused our client certificate (check \
                     tls_client_identity): {e}"
                ),
                Some(source),
            );
        }
        None => {}
    }
    if is_refused_access(e) {
        return Error::access_denied(
            format!("{what} on {node}: credentials or ACL permissions refused: {e}"),
            Some(source),
        );
    }
    let message = format!("{what} on {node}: {e}");
    if is_not_master(e)
        || is_cluster_redirect(e)
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

/// Why a TLS handshake failed for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsRefusal {
    /// Our roots do not accept the server's certificate (another CA, another host name,
    /// expired): rustls' "invalid peer certificate".
    ServerCertificate,
    /// The server refused our client certificate (none, another CA's, expired): its alert.
    ClientCertificate,
}

/// The alerts a server sends when it refuses the client's certificate (rustls' names).
const CLIENT_CERTIFICATE_ALERTS: &[&str] = &[
    "received fatal alert: CertificateRequired",
    "received fatal alert: BadCertificate",
    "received fatal alert: UnknownCA",
    "received fatal alert: CertificateUnknown",
    "received fatal alert: CertificateExpired",
    "received fatal alert: UnsupportedCertificate",
    "received fatal alert: HandshakeFailure",
];

/// Whether `e` (or an error it was caused by) is a TLS handshake refused over certificates.
fn tls_refusal(e: &RedisError) -> Option<TlsRefusal> {
    let mut texts = vec![e.to_string()];
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        texts.push(s.to_string());
        source = s.source();
    }
    texts.iter().find_map(|t| {
        if t.contains("invalid peer certificate") {
            Some(TlsRefusal::ServerCertificate)
        } else if CLIENT_CERTIFICATE_ALERTS.iter().any(|a| t.contains(a)) {
            Some(TlsRefusal::ClientCertificate)
        } else {
            None
        }
    })
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
            .is_some_and(|r| r.is_timeout() || is_not_master(r) || is_cluster_redirect(r)),
        _ => false,
    }
}

/// Whether `e` says the server could not be reached or dropped the connection (refused,
/// reset, broken pipe), as opposed to slow ([`is_slow`]) or answering with an error.
pub(crate) fn is_unreachable(e: &Error) -> bool {
    match e {
        Error::Unavailable {
            source: Some(s), ..
        } => s.downcast_ref::<RedisError>().is_some_and(|r| {
            r.is_io_error()
                || r.is_connection_refusal()
                || r.is_connection_dropped()
                || r.is_unrecoverable_error()
        }),
        _ => false,
    }
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

/// The error of a request cut by its time budget.
pub(crate) fn timed_out(node: &str, what: &str, budget: Duration) -> Error {
    Error::unavailable(
        format!("{what} on {node}: no reply within {budget:?}"),
        None,
    )
}

impl Node {
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
