//! Redis Sentinel: the sentinels and the master they are asked for, and the discovery of the
//! current master (each sentinel in turn, the first address whose `ROLE` is master).

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
use redis::{Client, RedisError};

use super::{Node, Target};
use crate::error::is_refused_access;

/// Redis Sentinels and the master they are asked for, with the settings of the data connection
/// (TLS, roots, credentials), which the sentinels do not tell.
pub(crate) struct Sentinels {
    /// One client per sentinel, in the configured order.
    pub(crate) sentinels: Vec<Client>,
    /// The sentinels' `host:port`, in the same order (for messages).
    pub(crate) addrs: Vec<String>,
    pub(crate) master: String,
    pub(crate) tls: bool,
    /// The roots and client identity, when given.
    pub(crate) certs: Option<redis::TlsCertificates>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

/// A node whose master the sentinels name: no I/O until its first request.
pub(crate) fn open_sentinel(sentinels: Sentinels, request_timeout: Duration) -> Node {
    let display: Arc<str> = Arc::from(format!(
        "master `{}` (sentinels {})",
        sentinels.master,
        sentinels.addrs.join(",")
    ));
    Node::new(
        Target::Sentinel(Arc::new(sentinels)),
        None,
        display,
        request_timeout,
    )
}

/// The client of `host:port` with TLS (with these roots and client identity, when given) or
/// not, and these credentials. No I/O.
pub(crate) fn client_for(
    host: &str,
    port: u16,
    tls: bool,
    certs: Option<&redis::TlsCertificates>,
    username: Option<&str>,
    password: Option<&str>,
) -> redis::RedisResult<Client> {
    use redis::IntoConnectionInfo;
    let addr = if tls {
        dlock_core::backend::tls::ensure_provider();
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
    match certs {
        Some(certs) if tls => Client::build_with_tls(info, certs.clone()),
        _ => Client::open(info),
    }
}

impl Sentinels {
    /// Asks each sentinel in turn (each within `per_sentinel`) for the master's address
    /// (`SENTINEL get-master-addr-by-name`), and returns the first address that answers `ROLE`
    /// as a master, with its client. A sentinel that is down, slow or names a server that is
    /// not (or no longer) a master is skipped; when none gives a master, the error lists why.
    pub(super) async fn discover(&self, per_sentinel: Duration) -> Result<(Client, String), Error> {
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
            self.certs.as_ref(),
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
