//! The etcd topologies as conformance backends (plain, TLS, or with authentication), shared by
//! the conformance test binaries: `conformance.rs` (`etcd`), `conformance_cluster.rs`,
//! `conformance_prod.rs`, `conformance_tls.rs` and `conformance_auth.rs`.

#![allow(dead_code)]

// `mod.rs` includes it too: a binary with both (`security`) has it twice.
#[allow(clippy::duplicate_mod)]
#[path = "keys.rs"]
mod keys;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions, TlsFiles};
use dlock_conformance::{ClientOptions, Declared, ServerExpiry, Slack, TestBackend};
use dlock_core::{Error, FencingStrength, FencingToken, LockName, Locker};
use dlock_etcd::EtcdLocker;
use dlock_etcd::etcd_client::{
    self, Certificate, GetOptions, Identity, KeyValue, SortOrder, SortTarget, TlsOptions,
};

/// An etcd topology under test.
pub struct EtcdBackend {
    name: &'static str,
    cluster: Arc<Cluster>,
    /// How the servers serve (TLS): a private cluster a scenario starts is reconfigured so
    /// ([`Cluster::reconfigure`]) before the backend uses it.
    options: ServerOptions,
    /// Authentication on: the lockers log in as the locker user, audits as `root`; a private
    /// cluster gets the same users and role ([`AuthUsers::enable`]) before the backend uses it.
    auth: Option<AuthUsers>,
}

/// The role of the locker user: read and write on [`LOCKER_PREFIX`], nothing else.
pub const LOCKER_ROLE: &str = "dlock-locker";
/// The key prefix every conformance namespace lies under (`dlock-test/<run>/<row>/<scenario>`):
/// the locker role's whole permission.
pub const LOCKER_PREFIX: &str = "dlock-test/";
/// The variables that give a child process (the crash-test holder) the credentials of an
/// `etcd-auth` cluster: the locker user, its password, and root's password (for audits).
pub const AUTH_ENV: [&str; 3] = [
    "DLOCK_ETCD_USER",
    "DLOCK_ETCD_PASSWORD",
    "DLOCK_ETCD_ROOT_PASSWORD",
];

/// The users of an etcd with authentication enabled: `root` (audits and breaks; etcd requires
/// it to enable authentication) and a non-root locker user whose only role is [`LOCKER_ROLE`].
#[derive(Clone)]
pub struct AuthUsers {
    /// The locker user's name.
    pub user: String,
    /// The locker user's password.
    pub password: String,
    /// root's password.
    pub root_password: String,
}

impl std::fmt::Debug for AuthUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthUsers")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl AuthUsers {
    /// Fresh random passwords for root and the user `dlock-locker`.
    pub fn generate() -> AuthUsers {
        let pw = || {
            use rand::Rng;
            let mut rng = rand::rng();
            (0..24)
                .map(|_| char::from(rng.sample(rand::distr::Alphanumeric)))
                .collect::<String>()
        };
        AuthUsers {
            user: "dlock-locker".into(),
            password: pw(),
            root_password: pw(),
        }
    }

    /// The credentials a parent process passed in [`AUTH_ENV`], if it did.
    pub fn from_env() -> Option<AuthUsers> {
        let [user, password, root_password] = AUTH_ENV.map(|v| std::env::var(v).ok());
        Some(AuthUsers {
            user: user?,
            password: password?,
            root_password: root_password?,
        })
    }

    /// [`AUTH_ENV`] with these credentials.
    pub fn env(&self) -> Vec<(String, String)> {
        AUTH_ENV
            .iter()
            .zip([&self.user, &self.password, &self.root_password])
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    /// Connect options that log in as root.
    fn root(&self) -> etcd_client::ConnectOptions {
        etcd_client::ConnectOptions::new()
            .with_user("root", self.root_password.clone())
            .with_auto_token_refresh(true)
    }

    /// Checks that authentication is on and the locker user has exactly its role: a client
    /// without credentials is refused a read under [`LOCKER_PREFIX`], the locker user may write
    /// there but is refused a write outside it.
    async fn verify(&self, endpoints: &[String]) -> Result<(), Error> {
        let fail = |why: String| Err(Error::backend(why, None));
        let inside = format!("{LOCKER_PREFIX}auth-check");
        let mut anonymous = etcd_client::Client::connect(endpoints, None)
            .await
            .map_err(|e| etcd_error("connect without credentials", e))?;
        if anonymous.get(inside.as_str(), None).await.is_ok() {
            return fail(format!("a client without credentials read {inside:?}"));
        }
        let opts =
            etcd_client::ConnectOptions::new().with_user(self.user.clone(), self.password.clone());
        let mut user = etcd_client::Client::connect(endpoints, Some(opts))
            .await
            .map_err(|e| etcd_error("log in as the locker user", e))?;
        user.put(inside.as_str(), "ok", None)
            .await
            .map_err(|e| etcd_error("the locker user's write in its prefix", e))?;
        user.delete(inside.as_str(), None)
            .await
            .map_err(|e| etcd_error("the locker user's delete in its prefix", e))?;
        match user.put("dlock-auth-check", "no", None).await {
            Ok(_) => fail("the locker user wrote outside its prefix".into()),
            Err(e) if e.to_string().contains("permission denied") => Ok(()),
            Err(e) => Err(etcd_error("the locker user's write outside its prefix", e)),
        }
    }

    /// Enables authentication on the (plain) servers at `endpoints`, as an operator would
    /// with `etcdctl` (README, "Deployments"): root with the root role, the role
    /// [`LOCKER_ROLE`] with `readwrite` on the prefix [`LOCKER_PREFIX`], the locker user with
    /// that role only, then `auth enable`. Nothing happens when root can already log in (set
    /// up before). Blocking: runs on a thread of its own with its own runtime.
    ///
    /// # Errors
    /// What etcd answered to the first step that failed.
    pub fn enable(&self, endpoints: Vec<String>) -> Result<(), Error> {
        let users = self.clone();
        let setup = async move {
            let connect_timeout = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(5))
                .with_timeout(Duration::from_secs(10));
            if etcd_client::Client::connect(&endpoints, Some(users.root()))
                .await
                .is_ok()
            {
                return users.verify(&endpoints).await;
            }
            let mut c = etcd_client::Client::connect(&endpoints, Some(connect_timeout))
                .await
                .map_err(|e| etcd_error("connect to enable auth", e))?;
            c.user_add("root", users.root_password.clone(), None)
                .await
                .map_err(|e| etcd_error("user add root", e))?;
            c.role_add("root")
                .await
                .map_err(|e| etcd_error("role add root", e))?;
            c.user_grant_role("root", "root")
                .await
                .map_err(|e| etcd_error("user grant-role root root", e))?;
            c.role_add(LOCKER_ROLE)
                .await
                .map_err(|e| etcd_error("role add", e))?;
            c.role_grant_permission(
                LOCKER_ROLE,
                etcd_client::Permission::read_write(LOCKER_PREFIX).with_prefix(),
            )
            .await
            .map_err(|e| etcd_error("role grant-permission", e))?;
            c.user_add(users.user.clone(), users.password.clone(), None)
                .await
                .map_err(|e| etcd_error("user add", e))?;
            c.user_grant_role(users.user.clone(), LOCKER_ROLE)
                .await
                .map_err(|e| etcd_error("user grant-role", e))?;
            c.auth_enable()
                .await
                .map_err(|e| etcd_error("auth enable", e))?;
            users.verify(&endpoints).await
        };
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::backend(format!("runtime: {e}"), None))?
                .block_on(setup)
        })
        .join()
        .unwrap_or_else(|_| Err(Error::backend("the auth setup thread panicked", None)))
    }
}

/// What a plain etcd-client of a TLS cluster (audits) presents: trust in the cluster's CA, and
/// the client identity its CA signed (the servers check client certificates). Lockers get the
/// same files through `tls_root_certificates` and `tls_client_identity`.
fn tls_options(files: &TlsFiles) -> TlsOptions {
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(files.ca())));
    if let Some((cert, key)) = files.client_identity() {
        tls = tls.identity(Identity::from_pem(read(cert), read(key)));
    }
    tls
}

/// A certificate or key file of the harness.
fn read(p: &std::path::Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

fn etcd_error(what: &str, e: etcd_client::Error) -> Error {
    Error::backend(format!("{what}: {e}"), Some(Box::new(e) as _))
}

/// The holder's key (the one with the lowest create revision in `name`'s range), if any.
async fn holder_key(
    c: &mut etcd_client::Client,
    namespace: &str,
    name: &LockName,
) -> Result<Option<KeyValue>, Error> {
    let range = format!("{namespace}/{}/", name.encoded());
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let resp = c
        .get(range, Some(first))
        .await
        .map_err(|e| etcd_error("read the holder", e))?;
    Ok(resp.kvs().first().cloned())
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
            b = b.tls_root_certificates(read(files.ca()));
            if let Some((cert, key)) = files.client_identity() {
                b = b.tls_client_identity(read(cert), read(key));
            }
        }
        if let Some(auth) = &self.auth {
            b = b.user(auth.user.clone(), auth.password.clone());
        }
        b.build().await
    }

    /// A plain client for audits and server-side breaks (per call: each test has its own
    /// runtime, and a client's connection lives on the runtime that made it); over TLS with
    /// the client identity on a TLS cluster; as root on a cluster with authentication.
    async fn raw(&self) -> Result<etcd_client::Client, Error> {
        let opts = match (self.cluster.tls(), &self.auth) {
            (Some(files), _) => {
                Some(etcd_client::ConnectOptions::new().with_tls(tls_options(&files)))
            }
            (None, Some(auth)) => Some(auth.root()),
            (None, None) => None,
        };
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

    /// Every key under the namespace (queue keys of waiters and holders). Keys of expired
    /// leases are deleted by etcd itself.
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let mut c = self.raw().await?;
        keys::list(&mut c, namespace)
            .await
            .map_err(|e| etcd_error("list the namespace", e))
    }

    /// Revokes the holder's lease (the key with the lowest create revision), as an operator
    /// would with `etcdctl lease revoke`, or deletes a key without one; returns that key's
    /// create revision, the fencing token of its grant.
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error> {
        let mut c = self.raw().await?;
        let Some(holder) = holder_key(&mut c, namespace, name).await? else {
            return Ok(None);
        };
        dlock_conformance::history::deleting_now();
        if holder.lease() != 0 {
            match c.lease_revoke(holder.lease()).await {
                Ok(_) => {}
                // The holder released (or its session ended) between the read and the revoke:
                // its lease and key are gone, and nothing was broken.
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => {
                    return Ok(None);
                }
                Err(e) => return Err(etcd_error("revoke the holder's lease", e)),
            }
        } else {
            c.delete(holder.key(), None)
                .await
                .map_err(|e| etcd_error("delete the holder's key", e))?;
        }
        Ok(Some(
            u64::try_from(holder.create_revision())
                .ok()
                .map(FencingToken)
                .into_iter()
                .collect(),
        ))
    }

    /// Deletes only the holder's key: its session lease carries the locker's other locks.
    async fn break_entry(&self, namespace: &str, name: &LockName) -> Result<bool, Error> {
        let mut c = self.raw().await?;
        let Some(holder) = holder_key(&mut c, namespace, name).await? else {
            return Ok(false);
        };
        c.delete(holder.key(), None)
            .await
            .map_err(|e| etcd_error("delete the holder's key", e))?;
        Ok(true)
    }

    /// `LeaseTimeToLive` of the holder's lease: whole seconds, rounded down.
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let mut c = self.raw().await?;
        let Some(lease) = holder_key(&mut c, namespace, name)
            .await?
            .map(|kv| kv.lease())
        else {
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
    /// With authentication, the credentials too ([`AUTH_ENV`]).
    fn child_env(&self) -> Vec<(String, String)> {
        let mut env = self.cluster.external_env();
        if let Some(auth) = &self.auth {
            env.extend(auth.env());
        }
        env
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
        cluster
            .reconfigure(&self.options)
            .unwrap_or_else(|e| panic!("cannot reconfigure the private cluster: {e}"));
        if let Some(auth) = &self.auth {
            auth.enable(cluster.endpoints())
                .unwrap_or_else(|e| panic!("cannot enable auth on the private cluster: {e}"));
        }
        Some(Arc::new(EtcdBackend {
            name: self.name,
            cluster,
            options: self.options.clone(),
            auth: self.auth.clone(),
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
        auth: None,
    })
}

/// The backend `name` over the shared cluster of `nodes` members serving as `options` say,
/// with authentication enabled: the lockers log in as a non-root user whose role grants
/// exactly [`LOCKER_ROLE`]'s permission. The credentials come from [`AUTH_ENV`] when the
/// cluster is external (a crash-test holder reaching its parent's servers, or a user's
/// servers with auth already on); otherwise fresh ones are made and auth is enabled.
pub fn auth_backend(
    nodes: usize,
    name: &'static str,
    options: ServerOptions,
) -> Arc<dyn TestBackend> {
    let cluster = Cluster::shared_with(ServerKind::Etcd, nodes, &options)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    let auth = match AuthUsers::from_env().filter(|_| cluster.is_external()) {
        Some(given) => given,
        None => {
            let fresh = AuthUsers::generate();
            fresh
                .enable(cluster.endpoints())
                .unwrap_or_else(|e| panic!("cannot enable auth on the {name} cluster: {e}"));
            fresh
        }
    };
    Arc::new(EtcdBackend {
        name,
        cluster,
        options,
        auth: Some(auth),
    })
}

/// A queue with one watcher per release; tokens from the store revision.
pub const ETCD: Declared = Declared {
    fair: true,
    herd_free: true,
    fencing: FencingStrength::Linearizable,
    crash_release_slack: Slack::fixed(Duration::from_millis(1000)),
};
