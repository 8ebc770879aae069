//! The etcd topologies as conformance backends (plain or TLS), shared by the conformance test
//! binaries: `conformance.rs` (`etcd`, `etcd-cluster`) and `conformance_tls.rs` (`etcd-tls`).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions, TlsFiles};
use dlock_conformance::{ClientOptions, Declared, ServerExpiry, TestBackend};
use dlock_core::{
    Election, Error, FencingStrength, FencingToken, LockName, Locker, RwLocker, Semaphore,
};
use dlock_etcd::EtcdLocker;
use dlock_etcd::etcd_client::{
    self, Certificate, GetOptions, Identity, SortOrder, SortTarget, TlsOptions,
};

/// An etcd topology under test.
pub struct EtcdBackend {
    name: &'static str,
    cluster: Arc<Cluster>,
    /// How the servers serve (TLS): a private cluster a scenario starts is reconfigured so
    /// ([`Cluster::reconfigure`]) before the backend uses it.
    options: ServerOptions,
}

/// What a client of a TLS cluster presents: trust in the cluster's CA, and the client identity
/// its CA signed (the servers check client certificates).
fn tls_options(files: &TlsFiles) -> TlsOptions {
    let read = |p: &std::path::Path| {
        std::fs::read(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    };
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(files.ca())));
    if let Some((cert, key)) = files.client_identity() {
        tls = tls.identity(Identity::from_pem(read(cert), read(key)));
    }
    tls
}

fn etcd_error(what: &str, e: etcd_client::Error) -> Error {
    Error::backend(format!("{what}: {e}"), Some(Box::new(e) as _))
}

/// The holder's lease id (the key with the lowest create revision), or `None` without one.
async fn holder_lease(
    c: &mut etcd_client::Client,
    namespace: &str,
    name: &LockName,
) -> Result<Option<i64>, Error> {
    let range = format!("{namespace}/{}/", name.encoded());
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let resp = c
        .get(range, Some(first))
        .await
        .map_err(|e| etcd_error("read the holder", e))?;
    Ok(resp.kvs().first().map(|kv| kv.lease()))
}

impl EtcdBackend {
    /// A locker with the scenario's options (through its proxies when given).
    async fn locker(&self, opts: &ClientOptions) -> Result<EtcdLocker, Error> {
        let tls = self.cluster.tls();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoints = match &opts.via {
            Some(addrs) => addrs.iter().map(|a| format!("{scheme}://{a}")).collect(),
            None => self.cluster.endpoints(),
        };
        let mut b = EtcdLocker::builder()
            .endpoints(endpoints)
            .ttl(opts.ttl)
            .prefix(opts.namespace.clone())
            .request_timeout(opts.request_timeout.unwrap_or(Duration::from_secs(2)));
        if let Some(files) = &tls {
            b = b.tls(tls_options(files));
        }
        b.build().await
    }

    /// A plain client for audits and server-side breaks (per call: each test has its own
    /// runtime, and a client's connection lives on the runtime that made it); over TLS with
    /// the client identity on a TLS cluster.
    async fn raw(&self) -> Result<etcd_client::Client, Error> {
        let opts = self
            .cluster
            .tls()
            .map(|files| etcd_client::ConnectOptions::new().with_tls(tls_options(&files)));
        etcd_client::Client::connect(self.cluster.endpoints(), opts)
            .await
            .map_err(|e| etcd_error("audit client", e))
    }
}

#[async_trait]
impl TestBackend for EtcdBackend {
    fn name(&self) -> &str {
        self.name
    }

    fn node_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.cluster.addrs()
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Ok(Arc::new(self.locker(&opts).await?))
    }

    async fn election(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Election>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts).await?)))
    }

    async fn rw(&self, opts: ClientOptions) -> Result<Option<Arc<dyn RwLocker>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts).await?)))
    }

    async fn semaphore(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Semaphore>>, Error> {
        Ok(Some(Arc::new(self.locker(&opts).await?)))
    }

    /// Every key under the namespace (queue keys of waiters and holders). Keys of expired
    /// leases are deleted by etcd itself.
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let mut c = self.raw().await?;
        let resp = c
            .get(
                format!("{namespace}/"),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(|e| etcd_error("list the namespace", e))?;
        let mut keys: Vec<String> = resp
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Revokes the holder's lease (the key with the lowest create revision), as an operator
    /// would with `etcdctl lease revoke`.
    /// Revokes the lease of the range's first key (or deletes a key without one); returns that
    /// key's create revision, the fencing token of its grant.
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Vec<FencingToken>, Error> {
        let mut c = self.raw().await?;
        let range = format!("{namespace}/{}/", name.encoded());
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let resp = c
            .get(range, Some(first))
            .await
            .map_err(|e| etcd_error("read the holder", e))?;
        let Some(holder) = resp.kvs().first() else {
            return Err(Error::NotHeld {
                name: name.to_string(),
            });
        };
        if holder.lease() != 0 {
            c.lease_revoke(holder.lease())
                .await
                .map_err(|e| etcd_error("revoke the holder's lease", e))?;
        } else {
            c.delete(holder.key(), None)
                .await
                .map_err(|e| etcd_error("delete the holder's key", e))?;
        }
        Ok(u64::try_from(holder.create_revision())
            .ok()
            .map(FencingToken)
            .into_iter()
            .collect())
    }

    /// Deletes only the holder's key: its session lease carries the locker's other locks.
    async fn break_entry(&self, namespace: &str, name: &LockName) -> Result<(), Error> {
        let mut c = self.raw().await?;
        let range = format!("{namespace}/{}/", name.encoded());
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let resp = c
            .get(range, Some(first))
            .await
            .map_err(|e| etcd_error("read the holder", e))?;
        let Some(holder) = resp.kvs().first() else {
            return Err(Error::NotHeld {
                name: name.to_string(),
            });
        };
        c.delete(holder.key(), None)
            .await
            .map_err(|e| etcd_error("delete the holder's key", e))?;
        Ok(())
    }

    /// `LeaseTimeToLive` of the holder's lease: whole seconds, rounded down.
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let mut c = self.raw().await?;
        let Some(lease) = holder_lease(&mut c, namespace, name).await? else {
            return Ok(ServerExpiry::NoHolder);
        };
        if lease == 0 {
            return Ok(ServerExpiry::Never);
        }
        let ttl = c
            .lease_time_to_live(lease, None)
            .await
            .map_err(|e| etcd_error("read the holder's lease TTL", e))?
            .ttl();
        Ok(if ttl < 0 {
            ServerExpiry::NoHolder
        } else {
            ServerExpiry::Remaining {
                remaining: Duration::from_secs(ttl as u64),
                resolution: Duration::from_secs(1),
            }
        })
    }

    /// Watch events sent by the members (`etcd_debugging_mvcc_events_total` in `/metrics`,
    /// over TLS on a TLS cluster).
    fn wake_signals(&self) -> Result<u64, String> {
        let mut total = 0;
        for node in self.cluster.nodes() {
            let addr = node.addr();
            let text = node
                .read_text(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .ok_or_else(|| format!("etcd at {addr} did not answer /metrics"))?;
            total += dlock_conformance::sum_samples(&text, "etcd_debugging_mvcc_events_total")
                .ok_or_else(|| {
                    format!("etcd at {addr} reports no etcd_debugging_mvcc_events_total")
                })?;
        }
        Ok(total)
    }

    /// The endpoints, and for a TLS cluster the CA and client identity files (the child's
    /// factory asks for the same [`ServerOptions`], so the external provider gives it the same
    /// servers).
    fn child_env(&self) -> Vec<(String, String)> {
        self.cluster.external_env()
    }

    /// gRPC requests handled (`/metrics`, over TLS on a TLS cluster).
    fn server_requests(&self) -> Option<u64> {
        self.cluster.server_requests()
    }

    fn logs(&self) -> String {
        self.cluster.logs()
    }

    fn topology(&self) -> Option<(ServerKind, usize)> {
        Some((ServerKind::Etcd, self.cluster.len()))
    }

    /// The same backend over `cluster`, first made to serve as this backend's servers do.
    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        if cluster.options() != self.options {
            // Blocking (a restart of every member): off the runtime's worker thread.
            let reconfigure = || cluster.reconfigure(&self.options);
            let done = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                    tokio::task::block_in_place(reconfigure)
                }
                _ => reconfigure(),
            };
            done.unwrap_or_else(|e| panic!("cannot reconfigure the private cluster: {e}"));
        }
        Some(Arc::new(EtcdBackend {
            name: self.name,
            cluster,
            options: self.options.clone(),
        }))
    }
}

/// The backend `name` over the shared cluster of `nodes` members serving as `options` say.
pub fn backend(nodes: usize, name: &'static str, options: ServerOptions) -> Arc<dyn TestBackend> {
    let cluster = Cluster::shared_with(ServerKind::Etcd, nodes, &options)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    Arc::new(EtcdBackend {
        name,
        cluster,
        options,
    })
}

/// A queue with one watcher per release; tokens from the store revision.
pub const ETCD: Declared = Declared {
    fair: true,
    herd_free: true,
    fencing: FencingStrength::Linearizable,
};
