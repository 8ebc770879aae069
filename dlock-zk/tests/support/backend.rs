//! The ZooKeeper topologies as conformance backends (plain, TLS, or with digest
//! authentication and creator-only ACLs), shared by the conformance test binaries:
//! `conformance.rs` (`zk`, `zk-cluster`) and `conformance_secure.rs` (`zk-tls`, `zk-digest`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions, TlsFiles};
use dlock_conformance::{ClientOptions, Declared, ServerExpiry, Slack, TestBackend};
use dlock_core::{Error, FencingStrength, FencingToken, LockName, Locker};
use dlock_zk::{DEFAULT_PREFIX, ZkAcl, ZkLocker, ZkLockerBuilder};
use zookeeper_client as zkc;

/// Curator's recipe: a queue with one watcher per release; tokens from the zxid.
pub const ZK: Declared = Declared {
    fair: true,
    herd_free: true,
    fencing: FencingStrength::Linearizable,
    crash_release_slack: Slack::ttl_fraction_plus(1, 2, Duration::from_millis(300)),
};

/// The digest user of the `zk-digest` row. ZooKeeper's `digest` scheme needs no user set up
/// at the server: the identity is the user and a hash of the password, so the crash-test child
/// (this same binary) authenticates as the same identity with these same constants.
pub const DIGEST_USER: &str = "dlock-conformance";
/// The digest password of the `zk-digest` row.
pub const DIGEST_PASSWORD: &str = "conformance-digest-secret";

/// A ZooKeeper topology under test.
pub struct ZkBackend {
    name: &'static str,
    cluster: Arc<Cluster>,
    /// How the servers serve (TLS): a private cluster a scenario starts is reconfigured so
    /// ([`Cluster::reconfigure`]) before the backend uses it.
    options: ServerOptions,
    /// Whether the lockers (and audits) authenticate with [`DIGEST_USER`] and the lockers
    /// create every node with [`ZkAcl::CreatorAll`].
    digest: bool,
}

impl ZkBackend {
    /// The backend `name` over `cluster` (which serves as `options` say); with `digest`, the
    /// sessions authenticate and the nodes are the creator's alone.
    pub fn new(
        name: &'static str,
        cluster: Arc<Cluster>,
        options: ServerOptions,
        digest: bool,
    ) -> ZkBackend {
        ZkBackend {
            name,
            cluster,
            options,
            digest,
        }
    }

    /// The backend `name` over the shared cluster of `nodes` servers serving as `options` say.
    pub fn shared(
        name: &'static str,
        nodes: usize,
        options: ServerOptions,
        digest: bool,
    ) -> Arc<dyn TestBackend> {
        let cluster = Cluster::shared_with(ServerKind::Zk, nodes, &options)
            .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
        Arc::new(ZkBackend::new(name, cluster, options, digest))
    }

    /// The cluster.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    fn connect(&self) -> String {
        self.cluster.endpoints().join(",")
    }

    fn base(namespace: &str) -> String {
        format!("{DEFAULT_PREFIX}/{namespace}")
    }

    /// A builder for `connect` with this row's TLS and digest settings.
    pub fn builder(&self, connect: &str) -> ZkLockerBuilder {
        let mut b = ZkLocker::builder().connect_string(connect);
        if !self.cluster.is_external() {
            // The harness's servers run the tick their options give (the lab's 100 ms unless
            // a row sets ZooKeeper's default); external servers' tick is unknown, and the
            // locker then assumes ZooKeeper's default.
            b = b.server_tick_time(self.options.zk_tick());
        }
        if let Some(files) = self.cluster.tls() {
            let (roots, identity) = tls_pem(&files);
            b = b.tls_root_certificates(roots);
            if let Some((cert, key)) = identity {
                b = b.tls_client_identity(cert, key);
            }
        }
        if self.digest {
            b = b
                .digest_auth(DIGEST_USER, DIGEST_PASSWORD)
                .acl(ZkAcl::CreatorAll);
        }
        b
    }

    /// A locker for `opts` (through the proxies of `opts.via` when set).
    async fn locker(&self, opts: &ClientOptions) -> Result<ZkLocker, Error> {
        let connect = match &opts.via {
            Some(addrs) => addrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            None => self.connect(),
        };
        self.builder(&connect)
            .ttl(opts.ttl)
            .namespace(opts.namespace.clone())
            .build()
            .await
    }

    /// A short-lived session for audits and server-side breaks (authenticated and over TLS as
    /// the row's lockers are).
    pub async fn raw(&self) -> Result<zkc::Client, Error> {
        let mut connector = zkc::Client::connector().with_session_timeout(Duration::from_secs(5));
        if let Some(files) = self.cluster.tls() {
            // The client crate takes the process default provider (the lockers install `ring`
            // when none is; an audit may come first).
            if rustls::crypto::CryptoProvider::get_default().is_none() {
                let _ = rustls::crypto::ring::default_provider().install_default();
            }
            let (roots, identity) = tls_pem(&files);
            let text = |b: Vec<u8>| String::from_utf8(b).expect("PEM is text");
            let mut tls = zkc::TlsOptions::new()
                .with_pem_ca(&text(roots))
                .expect("the cluster's CA");
            if let Some((cert, key)) = identity {
                tls = tls
                    .with_pem_identity(&text(cert), &text(key))
                    .expect("the cluster's client identity");
            }
            connector = connector.with_tls(tls);
        }
        if self.digest {
            connector = connector.with_auth(
                "digest",
                format!("{DIGEST_USER}:{DIGEST_PASSWORD}").as_bytes(),
            );
        }
        connector
            .connect(&self.connect())
            .await
            .map_err(|e| Error::unavailable(format!("audit session: {e}"), Some(Box::new(e) as _)))
    }
}

/// A client identity as PEM text: (certificate chain, private key).
pub type PemIdentity = (Vec<u8>, Vec<u8>);

/// The CA and the client identity of a TLS cluster, as PEM text.
pub fn tls_pem(files: &TlsFiles) -> (Vec<u8>, Option<PemIdentity>) {
    let read = |p: &std::path::Path| {
        std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
    };
    let identity = files
        .client_identity()
        .map(|(cert, key)| (read(cert), read(key)));
    (read(files.ca()), identity)
}

fn backend_error(what: &str, e: zkc::Error) -> Error {
    Error::backend(format!("{what}: {e}"), Some(Box::new(e) as _))
}

async fn children(z: &zkc::Client, path: &str) -> Result<Vec<String>, Error> {
    match z.list_children(path).await {
        Ok(c) => Ok(c),
        Err(zkc::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(backend_error(&format!("list {path}"), e)),
    }
}

#[async_trait]
impl TestBackend for ZkBackend {
    fn name(&self) -> &str {
        self.name
    }

    fn node_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.cluster.addrs()
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Ok(Arc::new(self.locker(&opts).await?))
    }

    /// Every contender node under the namespace (`<lock parent>/<node>`, and a semaphore's
    /// `<lock parent>/locks/<node>` and `<lock parent>/leases/<node>`). Empty lock parents
    /// (and a semaphore's `locks` and `leases`) are container nodes the server reaps by
    /// itself, so they do not count.
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let z = self.raw().await?;
        let base = Self::base(namespace);
        let mut out = Vec::new();
        for parent in children(&z, &base).await? {
            for node in children(&z, &format!("{base}/{parent}")).await? {
                if node == "locks" || node == "leases" {
                    for sub in children(&z, &format!("{base}/{parent}/{node}")).await? {
                        out.push(format!("{parent}/{node}/{sub}"));
                    }
                    continue;
                }
                out.push(format!("{parent}/{node}"));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Deletes the holder's node (the lowest sequence of the mutex's or the election's
    /// nodes), as an operator would; returns its czxid, the fencing token of its grant.
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error> {
        let z = self.raw().await?;
        let parent = format!("{}/{}", Self::base(namespace), name.encoded());
        let mut nodes: Vec<(i64, String)> = children(&z, &parent)
            .await?
            .into_iter()
            .filter_map(|n| {
                // A mutex's `lock-` nodes or an election's `latch-` nodes.
                let (_, seq) = n.rsplit_once("lock-").or_else(|| n.rsplit_once("latch-"))?;
                Some((seq.parse().ok()?, n))
            })
            .collect();
        nodes.sort();
        let Some((_, holder)) = nodes.first() else {
            return Ok(None);
        };
        let path = format!("{parent}/{holder}");
        let stat = match z.check_stat(&path).await {
            Ok(Some(stat)) => stat,
            // Gone before we could read it (released or expired meanwhile): nothing broken.
            Ok(None) => {
                return Ok(None);
            }
            Err(e) => return Err(backend_error("read the holder's node", e)),
        };
        dlock_conformance::history::deleting_now();
        match z.delete(&path, Some(stat.version)).await {
            Ok(()) => Ok(Some(
                u64::try_from(stat.czxid)
                    .ok()
                    .map(FencingToken)
                    .into_iter()
                    .collect(),
            )),
            Err(zkc::Error::NoNode) => Ok(None),
            Err(e) => Err(backend_error("delete the holder's node", e)),
        }
    }

    /// A session's remaining time is known to the server only: no client request reads it.
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let _ = (namespace, name);
        Ok(ServerExpiry::Unreadable(
            "ZooKeeper exposes no request that reads another session's remaining time".into(),
        ))
    }

    /// Watch notifications sent: the `zk_sum_node_*_watch_count` summaries of `mntr` (over
    /// TLS on a TLS cluster).
    fn wake_signals(&self) -> Result<u64, String> {
        let mut total = 0;
        for node in self.cluster.nodes() {
            let addr = node.addr();
            let text = node
                .read_text(b"mntr")
                .ok_or_else(|| format!("zookeeper at {addr} did not answer mntr"))?;
            let mut seen = false;
            for kind in ["created", "deleted", "changed", "children"] {
                if let Some(n) = dlock_conformance::sum_samples(
                    &text,
                    &format!("zk_sum_node_{kind}_watch_count"),
                ) {
                    total += n;
                    seen = true;
                }
            }
            if !seen {
                return Err(format!(
                    "zookeeper at {addr} reports no zk_sum_node_*_watch_count in mntr"
                ));
            }
        }
        Ok(total)
    }

    /// The endpoints, and for a TLS cluster the CA and client identity files (the child's
    /// factory asks for the same [`ServerOptions`], so the external provider gives it the same
    /// servers). The digest credentials are this binary's constants.
    fn child_env(&self) -> Vec<(String, String)> {
        self.cluster.external_env()
    }

    /// Packets received (`mntr`, over TLS on a TLS cluster).
    fn server_requests(&self) -> Option<u64> {
        self.cluster.server_requests()
    }

    fn logs(&self) -> String {
        self.cluster.logs()
    }

    fn topology(&self) -> Option<(ServerKind, usize)> {
        Some((ServerKind::Zk, self.cluster.len()))
    }

    /// The same backend over `cluster`, first made to serve as this backend's servers do.
    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        cluster
            .reconfigure(&self.options)
            .unwrap_or_else(|e| panic!("cannot reconfigure the private cluster: {e}"));
        Some(Arc::new(ZkBackend {
            name: self.name,
            cluster,
            options: self.options.clone(),
            digest: self.digest,
        }))
    }
}
