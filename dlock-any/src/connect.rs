//! From a [`LockerUrl`] to a backend's builder, and the built locker as a `dyn Locker`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use dlock_core::{Error, Locker, MemoryLocker, MemoryServer};

#[cfg(feature = "etcd")]
use dlock_etcd::EtcdLocker;
#[cfg(feature = "redis")]
use dlock_redis::{RedisLocker, RedlockLocker};
#[cfg(feature = "zk")]
use dlock_zk::ZkLocker;

#[cfg(any(feature = "redis", feature = "etcd", feature = "zk"))]
use crate::url::TlsFiles;
#[cfg(feature = "redis")]
use crate::url::encode;
use crate::url::{LockerUrl, Scheme};

/// Builds the locker `url` names (see the crate docs for each scheme's mapping), its metrics
/// labelled with `tier` when given (the builders' `metrics_tier`).
pub(crate) async fn build(url: &LockerUrl, tier: Option<&str>) -> Result<Arc<dyn Locker>, Error> {
    match url.scheme() {
        Scheme::Memory => Ok(Arc::new(memory(url, tier)?)),
        #[cfg(feature = "redis")]
        Scheme::Redis | Scheme::RedisSentinel | Scheme::RedisCluster => {
            Ok(Arc::new(redis(url, tier).await?))
        }
        #[cfg(feature = "redis")]
        Scheme::Redlock => Ok(Arc::new(redlock(url, tier).await?)),
        #[cfg(feature = "etcd")]
        Scheme::Etcd => Ok(Arc::new(etcd(url, tier).await?)),
        #[cfg(feature = "zk")]
        Scheme::Zk => Ok(Arc::new(zk(url, tier).await?)),
        // Parsing rejects the schemes of disabled features.
        #[allow(unreachable_patterns)]
        other => Err(Error::invalid_option(
            "url.scheme",
            format!(
                "scheme: {other}:// needs dlock-any's cargo feature `{}`",
                other.feature()
            ),
        )),
    }
}

/// The process-wide memory servers, one per namespace.
fn memory_server(namespace: &str) -> Arc<MemoryServer> {
    static SERVERS: OnceLock<Mutex<HashMap<String, Arc<MemoryServer>>>> = OnceLock::new();
    let map = SERVERS.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    Arc::clone(map.entry(namespace.to_string()).or_default())
}

fn memory(url: &LockerUrl, tier: Option<&str>) -> Result<MemoryLocker, Error> {
    let mut b = MemoryLocker::builder().server(memory_server(url.namespace().unwrap_or("")));
    if let Some(ttl) = url.ttl() {
        b = b.ttl(ttl);
    }
    if let Some(tier) = tier {
        b = b.metrics_tier(tier);
    }
    b.build()
}

/// Reads one TLS file named by a query parameter.
#[cfg(any(feature = "redis", feature = "etcd", feature = "zk"))]
fn read_file(param: &'static str, path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| {
        Error::invalid_option(
            "url.value",
            format!(
                "value of query parameter `{param}`: cannot read {}: {e}",
                path.display()
            ),
        )
    })
}

/// The PEM contents of `ca=` and of `cert=` + `key=`.
#[cfg(any(feature = "redis", feature = "etcd", feature = "zk"))]
#[allow(clippy::type_complexity)]
fn tls_pem(files: &TlsFiles) -> Result<(Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>)>), Error> {
    let ca = files
        .ca
        .as_deref()
        .map(|p| read_file("ca", p))
        .transpose()?;
    let identity = match (&files.cert, &files.key) {
        (Some(c), Some(k)) => Some((read_file("cert", c)?, read_file("key", k)?)),
        _ => None,
    };
    Ok((ca, identity))
}

/// `$builder` with the URL's `ttl=`, `namespace=` and TLS files, and the tier's metrics label:
/// the options every backend's builder takes with the same methods (dlock-core's
/// `common_builder_options!`).
#[cfg(any(feature = "redis", feature = "etcd", feature = "zk"))]
macro_rules! common_options {
    ($builder:expr, $url:expr, $tier:expr) => {{
        let mut b = $builder;
        if let Some(tier) = $tier {
            b = b.metrics_tier(tier);
        }
        if let Some(ttl) = $url.ttl() {
            b = b.ttl(ttl);
        }
        if let Some(ns) = $url.namespace() {
            b = b.namespace(ns);
        }
        let (ca, identity) = tls_pem(&$url.tls)?;
        if let Some(ca) = ca {
            b = b.tls_root_certificates(ca);
        }
        if let Some((cert, key)) = identity {
            b = b.tls_client_identity(cert, key);
        }
        b
    }};
}

/// `redis://[user:password@]host:port[/db]` (`rediss://` over TLS) for one host of `url`.
#[cfg(feature = "redis")]
fn redis_node_url(url: &LockerUrl, host: &crate::HostPort) -> String {
    let scheme = if url.is_tls() { "rediss" } else { "redis" };
    let mut s = format!("{scheme}://");
    if let Some(password) = url.password() {
        s.push_str(&encode(url.user().unwrap_or("")));
        s.push(':');
        s.push_str(&encode(password));
        s.push('@');
    }
    s.push_str(&host.to_string());
    if let Some(db) = url.path() {
        s.push('/');
        s.push_str(db);
    }
    s
}

#[cfg(feature = "redis")]
async fn redis(url: &LockerUrl, tier: Option<&str>) -> Result<RedisLocker, Error> {
    let mut b = RedisLocker::builder();
    match url.scheme() {
        Scheme::Redis => b = b.url(redis_node_url(url, &url.hosts()[0])),
        Scheme::RedisSentinel => {
            let addrs: Vec<String> = url.hosts().iter().map(ToString::to_string).collect();
            b = b.sentinels(addrs, url.path().unwrap_or_default());
            if let Some(user) = url.user() {
                b = b.master_username(user);
            }
            if let Some(password) = url.password() {
                b = b.master_password(password);
            }
            if let Some(p) = &url.sentinel_password {
                b = b.sentinel_password(p.clone());
            }
            b = b.tls(url.is_tls());
        }
        _ => {
            let nodes: Vec<String> = url.hosts().iter().map(|h| redis_node_url(url, h)).collect();
            b = b.cluster(nodes);
        }
    }
    common_options!(b, url, tier).build().await
}

#[cfg(feature = "redis")]
async fn redlock(url: &LockerUrl, tier: Option<&str>) -> Result<RedlockLocker, Error> {
    let nodes: Vec<String> = url.hosts().iter().map(|h| redis_node_url(url, h)).collect();
    let b = RedlockLocker::builder().nodes(nodes);
    common_options!(b, url, tier).build().await
}

#[cfg(feature = "etcd")]
async fn etcd(url: &LockerUrl, tier: Option<&str>) -> Result<EtcdLocker, Error> {
    let http = if url.is_tls() { "https" } else { "http" };
    let endpoints: Vec<String> = url
        .hosts()
        .iter()
        .map(|h| format!("{http}://{h}"))
        .collect();
    let prefix = url.path().unwrap_or(dlock_etcd::DEFAULT_PREFIX);
    let mut b = EtcdLocker::builder().endpoints(endpoints).prefix(prefix);
    if let (Some(user), Some(password)) = (url.user(), url.password()) {
        b = b.user(user, password);
    }
    common_options!(b, url, tier).build().await
}

#[cfg(feature = "zk")]
async fn zk(url: &LockerUrl, tier: Option<&str>) -> Result<ZkLocker, Error> {
    let connect = url
        .hosts()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut b = ZkLocker::builder().connect_string(connect);
    if let Some(root) = url.path() {
        b = b.prefix(format!("/{root}"));
    }
    if let (Some(user), Some(password)) = (url.user(), url.password()) {
        b = b.digest_auth(user, password);
    }
    common_options!(b, url, tier).build().await
}
