//! Real servers for tests, benches and examples: Redis, etcd and ZooKeeper, single nodes and
//! clusters, with per-node kill / pause / resume / restart.
//!
//! Providers, chosen per [`Cluster::start`] / [`Cluster::shared`] call:
//! - **external**: `DLOCK_REDIS_URLS`, `DLOCK_ETCD_ENDPOINTS` or `DLOCK_ZK_CONNECT`
//!   (comma-separated) name running servers; used when set and its node count matches. No
//!   process is started and the fault methods return [`HarnessError::External`].
//! - **local** (the default here): the Debian-packaged binaries as direct child processes on
//!   loopback ports, each in a temp dir; killed with their process group at teardown. Ports
//!   lie outside the kernel's ephemeral range in blocks owned by one process at a time, and
//!   stay reserved for the cluster's whole life, so a killed node restarts on its own ports
//!   however many test processes and threads start servers meanwhile (see `ports.rs`).
//! - **partitionable** ([`Cluster::start_partitionable`], local only): a private etcd or
//!   ZooKeeper cluster whose peer links go through fault proxies, one set per ordered pair of
//!   nodes, so [`Cluster::cut`] silences the links between two nodes while clients stay
//!   connected (see `partition.rs`).
//! - **containers** (cargo feature `containers`): image and port configuration for
//!   testcontainers, in the `containers` module when the feature is on.
//!
//! [`ServerOptions`] shape how a cluster's nodes serve ([`Cluster::shared_with`],
//! [`Cluster::start_with`], [`Cluster::reconfigure`]): TLS only for clients, with a CA, server
//! and client certificates generated for the cluster ([`TlsFiles`]), and extra server
//! arguments (e.g. a Redis ACL user). Restarts keep them.
//!
//! Every [`HarnessError`] names the server (kind, node, endpoint, every port) and the step
//! (start, restart, pause, …) that failed.
//!
//! ```no_run
//! use dlock_conformance::servers::{Cluster, ServerKind};
//! let cluster = Cluster::shared(ServerKind::Redis, 1)?;
//! println!("redis at {}", cluster.endpoints()[0]);
//! # Ok::<(), dlock_conformance::servers::HarnessError>(())
//! ```

mod external;
pub mod local;
mod node;
mod partition;
mod ports;
pub(crate) mod process;
pub mod redis_cluster;
pub mod stats;
mod tls;

#[cfg(feature = "containers")]
pub mod containers;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use node::Node;
pub use tls::TlsFiles;

pub(crate) use tls::Transport;

/// Which server a cluster runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerKind {
    /// `redis-server`, standalone, no persistence. N nodes are N independent masters (Redlock).
    Redis,
    /// `etcd`; N nodes form one raft cluster.
    Etcd,
    /// ZooKeeper (`QuorumPeerMain`); N > 1 nodes form one ensemble.
    Zk,
}

impl ServerKind {
    /// The environment variable of the external provider for this kind.
    pub fn env_var(self) -> &'static str {
        match self {
            ServerKind::Redis => "DLOCK_REDIS_URLS",
            ServerKind::Etcd => "DLOCK_ETCD_ENDPOINTS",
            ServerKind::Zk => "DLOCK_ZK_CONNECT",
        }
    }

    /// A short lowercase name (`redis`, `etcd`, `zk`).
    pub fn as_str(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis",
            ServerKind::Etcd => "etcd",
            ServerKind::Zk => "zk",
        }
    }

    /// The endpoint string clients use for a node at `addr`.
    pub fn endpoint(self, addr: SocketAddr) -> String {
        self.endpoint_for(addr, false)
    }

    /// The endpoint string clients use for a node at `addr` that serves TLS when `tls`
    /// (`rediss://`, `https://`, ZooKeeper's `tcp+tls://`).
    pub fn endpoint_for(self, addr: SocketAddr, tls: bool) -> String {
        match (self, tls) {
            (ServerKind::Redis, false) => format!("redis://{addr}"),
            (ServerKind::Redis, true) => format!("rediss://{addr}"),
            (ServerKind::Etcd, false) => format!("http://{addr}"),
            (ServerKind::Etcd, true) => format!("https://{addr}"),
            (ServerKind::Zk, false) => addr.to_string(),
            (ServerKind::Zk, true) => format!("tcp+tls://{addr}"),
        }
    }

    /// The variables naming an external TLS server's CA bundle, client certificate and client
    /// key (`DLOCK_REDIS_TLS_CA`, `DLOCK_REDIS_TLS_CERT`, `DLOCK_REDIS_TLS_KEY`, …).
    pub fn tls_env_vars(self) -> [&'static str; 3] {
        match self {
            ServerKind::Redis => [
                "DLOCK_REDIS_TLS_CA",
                "DLOCK_REDIS_TLS_CERT",
                "DLOCK_REDIS_TLS_KEY",
            ],
            ServerKind::Etcd => [
                "DLOCK_ETCD_TLS_CA",
                "DLOCK_ETCD_TLS_CERT",
                "DLOCK_ETCD_TLS_KEY",
            ],
            ServerKind::Zk => ["DLOCK_ZK_TLS_CA", "DLOCK_ZK_TLS_CERT", "DLOCK_ZK_TLS_KEY"],
        }
    }
}

/// How the nodes of a cluster serve: plain (the default) or TLS only, and extra server
/// arguments. Part of a shared cluster's identity: [`Cluster::shared_with`] keeps one cluster
/// per (kind, nodes, options).
///
/// ```no_run
/// use dlock_conformance::servers::{Cluster, ServerKind, ServerOptions};
/// // etcd serving clients over TLS only, and only to clients with a certificate of its CA.
/// let cluster = Cluster::start_with(ServerKind::Etcd, 1, &ServerOptions::default().with_tls(true))?;
/// let ca = cluster.tls().expect("a TLS cluster").ca_pem();
/// # Ok::<(), dlock_conformance::servers::HarnessError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ServerOptions {
    /// Serve clients over TLS only (Redis: `--port 0 --tls-port P`; etcd: `https://` client
    /// URLs, peers stay plain; ZooKeeper: no plain client port, `secureClientPort` served by
    /// the Netty connection factory with PEM key and trust stores, quorum links stay plain),
    /// with certificates generated when the cluster starts ([`Cluster::tls`]).
    pub tls: Option<TlsMode>,
    /// Extra arguments appended to every node's command line (Redis: config directives,
    /// `--user alice on …`; etcd: flags); for ZooKeeper, extra `zoo.cfg` lines. The external
    /// provider ignores them: its servers must already be configured so.
    pub args: Vec<String>,
}

/// TLS settings of [`ServerOptions::tls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct TlsMode {
    /// Accept only clients presenting a certificate signed by the cluster's CA (Redis
    /// `--tls-auth-clients yes`; etcd `--client-cert-auth --trusted-ca-file`; ZooKeeper
    /// `ssl.clientAuth=need`).
    pub client_auth: bool,
}

/// The `tickTime` of the harness's ZooKeeper servers unless their options set another
/// (fast, so sessions of a 2 s TTL are allowed and expire promptly).
pub const ZK_LAB_TICK: Duration = Duration::from_millis(100);

impl ServerOptions {
    /// ZooKeeper at its defaults where the lab settings differ: `tickTime=2000` with the
    /// session bounds that follow from it (`minSessionTimeout` 2 ticks, `maxSessionTimeout`
    /// 20 ticks), the sample configuration's `initLimit=10` (20 s; the lab's 50 ticks would be
    /// 100 s at this tick, and an ensemble whose elected leader gets no followers waits that
    /// long before it elects again) and transaction logs synced to disk (`forceSync=yes`).
    pub fn zk_production() -> Self {
        ServerOptions::default().with_args([
            "tickTime=2000",
            "initLimit=10",
            "minSessionTimeout=4000",
            "maxSessionTimeout=40000",
            "forceSync=yes",
        ])
    }

    /// etcd at its defaults where the lab settings differ: heartbeat 100 ms, election timeout
    /// 1000 ms, and fsync on.
    pub fn etcd_production() -> Self {
        ServerOptions::default().with_args([
            "--heartbeat-interval=100",
            "--election-timeout=1000",
            "--unsafe-no-fsync=false",
        ])
    }

    /// The `tickTime` these options give a local ZooKeeper server: the last `tickTime=` line
    /// of [`ServerOptions::args`], else [`ZK_LAB_TICK`].
    pub fn zk_tick(&self) -> Duration {
        self.args
            .iter()
            .rev()
            .find_map(|line| line.trim().strip_prefix("tickTime="))
            .and_then(|ms| ms.trim().parse::<u64>().ok())
            .map_or(ZK_LAB_TICK, Duration::from_millis)
    }

    /// Serve clients over TLS only; with `client_auth`, only to clients presenting a
    /// certificate of the cluster's CA ([`TlsFiles::client_identity`] is one).
    pub fn with_tls(mut self, client_auth: bool) -> Self {
        self.tls = Some(TlsMode { client_auth });
        self
    }

    /// Appends extra server arguments (see [`ServerOptions::args`]).
    pub fn with_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the harness could not provide or operate a server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum HarnessError {
    /// The server binaries are not installed; `hint` is the command that installs them.
    /// With `CI` set, callers must treat this as a failure, never as a skip.
    Missing {
        /// The server kind.
        kind: ServerKind,
        /// The install command.
        hint: String,
    },
    /// A server did not become ready; `logs` is its captured output.
    NotReady {
        /// What did not become ready.
        what: String,
        /// Captured server output.
        logs: String,
    },
    /// The operation needs a process this harness started, but the cluster is external.
    External(String),
    /// An external provider variable could not be parsed.
    BadEnv(String),
    /// An OS-level failure (spawn, signal, temp dir, port).
    Io(String),
}

impl HarnessError {
    /// Whether this is [`HarnessError::Missing`] and the `CI` variable is unset, so that a test
    /// may skip (with this error as its printed reason) instead of failing.
    pub fn may_skip(&self) -> bool {
        matches!(self, HarnessError::Missing { .. }) && std::env::var_os("CI").is_none()
    }
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::Missing { kind, hint } => {
                write!(
                    f,
                    "{kind} server binaries are not installed; install them with: {hint}"
                )
            }
            HarnessError::NotReady { what, logs } => {
                write!(f, "{what} did not become ready; its output:\n{logs}")
            }
            HarnessError::External(what) => write!(f, "cannot {what}: the cluster is external"),
            HarnessError::BadEnv(why) => write!(f, "bad external server variable: {why}"),
            HarnessError::Io(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for HarnessError {}

impl HarnessError {
    /// The same error with `what` (the cluster and step it happened in) in front.
    fn context(self, what: &str) -> HarnessError {
        match self {
            HarnessError::NotReady { what: inner, logs } => HarnessError::NotReady {
                what: format!("{what}: {inner}"),
                logs,
            },
            HarnessError::Io(why) => HarnessError::Io(format!("{what}: {why}")),
            other => other,
        }
    }
}

/// How long a start or restart may take before it is reported as [`HarnessError::NotReady`].
///
/// Above ZooKeeper's own worst case: a member whose leader dropped it goes back to leader
/// election, whose notification rounds back off exponentially up to 60 s
/// (`FastLeaderElection`'s `maxNotificationInterval`), so an ensemble restarted all at once can
/// take over a minute to serve again.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running set of server nodes of one kind.
pub struct Cluster {
    kind: ServerKind,
    nodes: Vec<Node>,
    external: bool,
    /// How the nodes serve now, and the certificates of a TLS cluster (replaced by
    /// [`Cluster::reconfigure`]). Boxed: test code keeps clusters in enums beside `Arc`s.
    serving: Box<Mutex<Serving>>,
    /// How the nodes reach their peers (kept to launch them again with other options).
    peers: local::Peers,
    dir: Option<tempfile::TempDir>,
    /// Held until the cluster is dropped (after its processes are killed).
    _ports: Option<ports::Reservation>,
    /// The peer-link proxies of a partitionable cluster (dropped after the processes).
    links: Option<partition::Links>,
}

struct Serving {
    options: ServerOptions,
    tls: Option<TlsFiles>,
    /// Certificate sets made so far (each reconfiguration to TLS makes a fresh one).
    generation: usize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("kind", &self.kind)
            .field("endpoints", &self.endpoints())
            .field("external", &self.external)
            .finish()
    }
}

type SharedMap = HashMap<(ServerKind, usize, ServerOptions), Result<Arc<Cluster>, HarnessError>>;
static SHARED: Mutex<Option<SharedMap>> = Mutex::new(None);

/// Held while a local cluster starts: one start at a time per test process.
///
/// A test binary starts its scenarios together (24 threads), and five of them start a private
/// cluster at once. For ZooKeeper that was twelve JVMs booting beside the shared ensemble on 2
/// cores: a client of the shared ensemble then went 800 ms without a ping reply, reconnected,
/// and its acquire ran out of time (CI, `zk_cluster::one_way_delay`: "timed out after 2.78 s
/// waiting for the lock" right after "ZooKeeper connection lost"). Started one after another,
/// at most three JVMs boot at a time; a running idle server costs little.
static STARTING: Mutex<()> = Mutex::new(());

/// The last `tail` bytes of every node's output of every shared cluster started in this
/// process (what the suite prints when a scenario fails).
pub fn shared_logs(tail: usize) -> String {
    let guard = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    let Some(map) = guard.as_ref() else {
        return String::new();
    };
    let mut out = String::new();
    for cluster in map.values().flatten() {
        for n in cluster.nodes() {
            let log = n.logs();
            let mut cut = log.len().saturating_sub(tail);
            while !log.is_char_boundary(cut) {
                cut += 1;
            }
            out.push_str(&format!(
                "==== {} node {} ({}) ====\n{}\n",
                cluster.kind,
                n.index(),
                n.endpoint(),
                &log[cut..]
            ));
        }
    }
    out
}

impl Cluster {
    /// The cluster of `kind` with `nodes` nodes shared by every caller in this process; started
    /// on first use (or taken from the external provider), killed at process exit.
    ///
    /// Do not kill or pause nodes of a shared cluster: other tests use it. Use
    /// [`Cluster::start`] for destructive tests.
    ///
    /// # Errors
    /// [`HarnessError::Missing`] when the binaries are absent (see
    /// [`HarnessError::may_skip`]), [`HarnessError::NotReady`] when a server did not start.
    /// A failed start is remembered: later calls return the same error at once.
    pub fn shared(kind: ServerKind, nodes: usize) -> Result<Arc<Cluster>, HarnessError> {
        Cluster::shared_with(kind, nodes, &ServerOptions::default())
    }

    /// As [`Cluster::shared`], for a cluster serving as `options` say: one shared cluster per
    /// (kind, nodes, options).
    ///
    /// # Errors
    /// As [`Cluster::shared`]; TLS needs `openssl` ([`HarnessError::Missing`] without it).
    pub fn shared_with(
        kind: ServerKind,
        nodes: usize,
        options: &ServerOptions,
    ) -> Result<Arc<Cluster>, HarnessError> {
        let mut guard = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        let map = guard.get_or_insert_with(HashMap::new);
        let key = (kind, nodes, options.clone());
        if let Some(found) = map.get(&key) {
            return found.clone();
        }
        // Shared clusters live in a static that is never dropped: the atexit handler kills
        // their processes and removes their data dirs.
        let started = Cluster::start_with(kind, nodes, options).map(Arc::new);
        map.insert(key, started.clone());
        started
    }

    /// Starts a private cluster of `kind` with `nodes` nodes (or takes it from the external
    /// provider); its processes are killed when it is dropped. Blocks until every node is ready.
    ///
    /// # Errors
    /// As [`Cluster::shared`].
    pub fn start(kind: ServerKind, nodes: usize) -> Result<Cluster, HarnessError> {
        Cluster::start_with(kind, nodes, &ServerOptions::default())
    }

    /// As [`Cluster::start`], serving as `options` say.
    ///
    /// The external provider serves a TLS cluster when `DLOCK_<KIND>_TLS_CA` is set too
    /// ([`ServerKind::tls_env_vars`]; a plain one when it is not), and ignores
    /// [`ServerOptions::args`].
    ///
    /// # Errors
    /// As [`Cluster::start`]; TLS needs `openssl` ([`HarnessError::Missing`] without it).
    pub fn start_with(
        kind: ServerKind,
        nodes: usize,
        options: &ServerOptions,
    ) -> Result<Cluster, HarnessError> {
        if nodes == 0 {
            return Err(HarnessError::Io("a cluster needs at least one node".into()));
        }
        let tls = TlsFiles::from_env(kind)?;
        if tls.is_some() == options.tls.is_some()
            && let Some(addrs) = external::addrs(kind, nodes)?
        {
            let transport = match &tls {
                Some(files) => Transport::Tls(files.client_config()?),
                None => Transport::Plain,
            };
            let nodes = addrs
                .into_iter()
                .enumerate()
                .map(|(i, a)| Node::external(kind, i, a, transport.clone()))
                .collect();
            return Ok(Cluster {
                kind,
                nodes,
                external: true,
                serving: Box::new(Mutex::new(Serving {
                    options: options.clone(),
                    tls,
                    generation: 0,
                })),
                peers: local::Peers::Direct,
                dir: None,
                _ports: None,
                links: None,
            });
        }
        Cluster::start_retrying(kind, nodes, false, options)
    }

    /// Starts a private cluster of `kind` with `nodes` nodes whose peer links go through fault
    /// proxies, one set per ordered pair of nodes, so that [`Cluster::cut`] can partition two
    /// nodes while every client connection stays up. Blocks until every node is ready.
    ///
    /// ZooKeeper followers of such an ensemble wait 10 s for a silent leader before they give
    /// up on it (`syncLimit` × `tickTime`, as with common settings), longer than the sessions
    /// tests use: a follower cut from its leader keeps serving reads meanwhile. etcd members
    /// advertise a router that sends each peer's connection through that pair's proxies (see
    /// the `partition` module). Always local: the external provider's servers cannot be cut.
    ///
    /// # Errors
    /// [`HarnessError::External`] when an external provider is configured for `kind`,
    /// [`HarnessError::Io`] for Redis (its nodes have no peer links) or fewer than 2 nodes;
    /// otherwise as [`Cluster::start`].
    pub fn start_partitionable(kind: ServerKind, nodes: usize) -> Result<Cluster, HarnessError> {
        if kind == ServerKind::Redis || nodes < 2 {
            return Err(HarnessError::Io(format!(
                "a partitionable cluster needs etcd or ZooKeeper and at least 2 nodes, not {kind} × {nodes}"
            )));
        }
        if external::addrs(kind, nodes)?.is_some() {
            return Err(HarnessError::External(format!(
                "put the peer links of the {kind} × {nodes} cluster behind fault proxies"
            )));
        }
        Cluster::start_retrying(kind, nodes, true, &ServerOptions::default())
    }

    fn start_retrying(
        kind: ServerKind,
        nodes: usize,
        partitionable: bool,
        options: &ServerOptions,
    ) -> Result<Cluster, HarnessError> {
        local::check_installed(kind)?;
        if options.tls.is_some() {
            local::check_openssl(kind)?;
        }
        const ATTEMPTS: usize = 3;
        let mut last = None;
        for attempt in 1..=ATTEMPTS {
            let started = {
                let _one_at_a_time = STARTING.lock().unwrap_or_else(|p| p.into_inner());
                Cluster::start_local(kind, nodes, partitionable, options)
            };
            match started {
                Ok(c) => return Ok(c),
                // Reserved ports are not taken by other tests; a server that still fails to
                // start (a slow host, a port some foreign program took) gets fresh ports.
                Err(e) => {
                    tracing::warn!(%kind, nodes, attempt, "cluster start failed: {e}");
                    last = Some(e.context(&format!(
                        "{kind}×{nodes} cluster start, attempt {attempt} of {ATTEMPTS}"
                    )));
                }
            }
        }
        Err(last.unwrap_or_else(|| HarnessError::Io(format!("{kind}×{nodes} cluster start"))))
    }

    fn start_local(
        kind: ServerKind,
        n: usize,
        partitionable: bool,
        options: &ServerOptions,
    ) -> Result<Cluster, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("dlock-{kind}-"))
            .tempdir()
            .map_err(|e| HarnessError::Io(format!("cannot create a temp dir: {e}")))?;
        // Removed on drop; also at exit, for clusters kept in statics.
        process::register_dir(dir.path().to_path_buf());
        let per = local::ports_per_node(kind);
        let reservation = ports::reserve(per * n)?;
        let ports: Vec<Vec<u16>> = reservation
            .ports()
            .chunks(per)
            .map(<[u16]>::to_vec)
            .collect();
        let (links, peers, pids) = if partitionable {
            let (links, peers, pids) = partition_links(kind, &ports)?;
            (Some(links), peers, pids)
        } else {
            (None, local::Peers::Direct, None)
        };
        let tls = match options.tls {
            Some(_) => Some(TlsFiles::generate(&dir.path().join("tls0"))?),
            None => None,
        };
        let transport = match &tls {
            Some(files) => Transport::Tls(files.client_config()?),
            None => Transport::Plain,
        };
        let launches = local::launches(kind, dir.path(), &ports, &peers, options, tls.as_ref())?;
        let mut nodes = Vec::with_capacity(n);
        for (i, (launch, p)) in launches.into_iter().zip(ports).enumerate() {
            nodes.push(Node::local(
                kind,
                i,
                p,
                launch,
                transport.clone(),
                pids.clone(),
            )?);
        }
        let cluster = Cluster {
            kind,
            nodes,
            external: false,
            serving: Box::new(Mutex::new(Serving {
                options: options.clone(),
                tls,
                generation: 1,
            })),
            peers,
            dir: Some(dir),
            _ports: Some(reservation),
            links,
        };
        let until = Instant::now() + READY_TIMEOUT;
        for node in &cluster.nodes {
            node.wait_ready(until, "start")?;
        }
        tracing::info!(%kind, nodes = n, endpoints = ?cluster.endpoints(), "cluster ready");
        Ok(cluster)
    }

    /// Makes every node serve as `options` say: kills each node and starts it again with them
    /// (same ports, same data dirs; TLS with a freshly generated certificate set), then waits
    /// until every node serves. Later restarts keep them. Nothing happens when the cluster
    /// already serves so. This is how a backend whose topology serves TLS or needs extra
    /// configuration turns the plain private cluster a scenario started
    /// ([`TestBackend::on_cluster`](crate::TestBackend::on_cluster)) into its own shape.
    /// What the servers held is lost where a restart loses it (Redis without persistence).
    ///
    /// It blocks while the nodes restart; called on a worker of a multi-thread runtime it
    /// leaves the worker first (`block_in_place`).
    ///
    /// # Errors
    /// [`HarnessError::External`] for an external cluster (unless it already serves so);
    /// [`HarnessError::NotReady`] when a node does not come back; [`HarnessError::Missing`]
    /// without `openssl` for TLS.
    pub fn reconfigure(&self, options: &ServerOptions) -> Result<(), HarnessError> {
        let on_worker = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if on_worker {
            tokio::task::block_in_place(|| self.reconfigure_here(options))
        } else {
            self.reconfigure_here(options)
        }
    }

    /// [`Cluster::reconfigure`] on this thread.
    fn reconfigure_here(&self, options: &ServerOptions) -> Result<(), HarnessError> {
        let mut serving = lock(&self.serving);
        if serving.options == *options {
            return Ok(());
        }
        let Some(dir) = self.dir.as_ref().filter(|_| !self.external) else {
            return Err(HarnessError::External(format!(
                "reconfigure the {} cluster",
                self.kind
            )));
        };
        let what = format!("{} cluster [{}], step reconfigure", self.kind, {
            self.nodes
                .iter()
                .map(Node::describe)
                .collect::<Vec<_>>()
                .join(", ")
        });
        let tls = match options.tls {
            Some(_) => {
                local::check_openssl(self.kind)?;
                let sub = dir.path().join(format!("tls{}", serving.generation));
                Some(TlsFiles::generate(&sub).map_err(|e| e.context(&what))?)
            }
            None => None,
        };
        let transport = match &tls {
            Some(files) => Transport::Tls(files.client_config().map_err(|e| e.context(&what))?),
            None => Transport::Plain,
        };
        let ports: Vec<Vec<u16>> = self.nodes.iter().map(|n| n.ports().to_vec()).collect();
        let launches = local::launches(
            self.kind,
            dir.path(),
            &ports,
            &self.peers,
            options,
            tls.as_ref(),
        )
        .map_err(|e| e.context(&what))?;
        // Every node down first (an etcd member must not see its peers half reconfigured).
        for node in &self.nodes {
            node.kill_quietly();
        }
        for (node, launch) in self.nodes.iter().zip(launches) {
            node.relaunch(launch, transport.clone())?;
        }
        *serving = Serving {
            options: options.clone(),
            tls,
            generation: serving.generation + 1,
        };
        drop(serving);
        let until = Instant::now() + READY_TIMEOUT;
        for node in &self.nodes {
            node.wait_ready(until, "reconfigure")?;
        }
        tracing::info!(kind = %self.kind, ?options, "cluster reconfigured");
        Ok(())
    }

    /// How the nodes serve now.
    pub fn options(&self) -> ServerOptions {
        lock(&self.serving).options.clone()
    }

    /// The certificates of a TLS cluster (`None` for a plain one): the CA clients trust and a
    /// client identity the servers accept.
    pub fn tls(&self) -> Option<TlsFiles> {
        lock(&self.serving).tls.clone()
    }

    /// Requests the nodes have received so far, summed (see [`stats::requests`]), read over
    /// each node's own transport (TLS when it serves TLS); `None` when a node does not answer.
    pub fn server_requests(&self) -> Option<u64> {
        self.nodes.iter().map(Node::requests).sum()
    }

    /// Waits until every node serves requests.
    ///
    /// # Errors
    /// [`HarnessError::NotReady`] with the logs when `timeout` passes or a node exits.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), HarnessError> {
        let until = Instant::now() + timeout;
        for node in &self.nodes {
            node.wait_ready(until, "wait ready")?;
        }
        Ok(())
    }

    /// The server kind.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    /// Whether the servers come from the external provider.
    pub fn is_external(&self) -> bool {
        self.external
    }

    /// Client endpoints in node order: `redis://127.0.0.1:P`, `http://127.0.0.1:P` or
    /// `127.0.0.1:P` (ZooKeeper; `tcp+tls://127.0.0.1:P` when it serves TLS).
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.endpoint().to_string())
            .collect()
    }

    /// Client addresses in node order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(Node::addr).collect()
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no node (never true for a started cluster).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i` (node order as in [`Cluster::endpoints`]).
    ///
    /// # Panics
    /// When `i >= len()`: a bug in the calling test.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Every node.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The `DLOCK_*` variables that make [`Cluster::shared`] (or [`Cluster::shared_with`] with
    /// the same TLS setting) in a child process reach these same servers: the endpoints, and
    /// for a TLS cluster the CA and client identity files ([`ServerKind::tls_env_vars`]).
    pub fn external_env(&self) -> Vec<(String, String)> {
        let mut env = vec![(self.kind.env_var().to_string(), self.endpoints().join(","))];
        if let Some(tls) = self.tls() {
            env.extend(tls.env(self.kind));
        }
        env
    }

    /// The captured output of every node, with a header per node.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "==== {} node {} ({}) ====\n{}",
                    self.kind,
                    n.index(),
                    n.endpoint(),
                    n.logs()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The index of the leader: the ZooKeeper node whose `srvr` reports `Mode: leader`, or the
    /// etcd member whose `/metrics` reports `etcd_server_is_leader 1`. `None` for Redis, for a
    /// single ZooKeeper node (standalone), or when no node reports it.
    pub fn leader(&self) -> Option<usize> {
        self.leader_claims().first().copied()
    }

    /// The running nodes that report being the leader, in index order.
    fn leader_claims(&self) -> Vec<usize> {
        let claims = |n: &Node| match self.kind {
            ServerKind::Redis => false,
            ServerKind::Zk => local::zk_mode(n.addr()).as_deref() == Some("leader"),
            ServerKind::Etcd => {
                local::etcd_metric(n.addr(), &n.transport(), "etcd_server_is_leader") == Some(1.0)
            }
        };
        (0..self.nodes.len())
            .filter(|&i| !self.nodes[i].is_paused() && claims(&self.nodes[i]))
            .collect()
    }

    /// The leader changes the members have seen, summed (etcd:
    /// `etcd_server_leader_changes_seen_total`). `None` for Redis and ZooKeeper, or when a
    /// running member does not answer.
    pub fn leader_changes(&self) -> Option<u64> {
        if self.kind != ServerKind::Etcd {
            return None;
        }
        self.nodes
            .iter()
            .filter(|n| !n.is_paused())
            .map(|n| {
                local::etcd_metric(
                    n.addr(),
                    &n.transport(),
                    "etcd_server_leader_changes_seen_total",
                )
            })
            .map(|v| v.map(|v| v as u64))
            .sum()
    }

    /// The index of the ZooKeeper leader; [`Cluster::leader`] for ZooKeeper only.
    pub fn zk_leader(&self) -> Option<usize> {
        if self.kind == ServerKind::Zk {
            self.leader()
        } else {
            None
        }
    }

    /// Waits until exactly one running node reports being the leader (see
    /// [`Cluster::leader`]). While two do — a leader just resumed from a pause still reports
    /// itself until it hears of its successor's term — it waits: picking the stale one would
    /// aim the next fault at a follower.
    ///
    /// # Errors
    /// [`HarnessError::NotReady`] when no single node does within `timeout`.
    pub fn wait_leader(&self, timeout: Duration) -> Result<usize, HarnessError> {
        let until = Instant::now() + timeout;
        loop {
            if let [i] = self.leader_claims()[..] {
                return Ok(i);
            }
            if Instant::now() >= until {
                let nodes = self
                    .nodes
                    .iter()
                    .map(Node::describe)
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(HarnessError::NotReady {
                    what: format!(
                        "{} cluster [{nodes}], step wait for a leader: none within {:.1} s",
                        self.kind,
                        timeout.as_secs_f64()
                    ),
                    logs: self.logs(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the cluster was started by [`Cluster::start_partitionable`].
    pub fn is_partitionable(&self) -> bool {
        self.links.is_some()
    }

    fn links(&self, step: &str) -> Result<&partition::Links, HarnessError> {
        self.links.as_ref().ok_or_else(|| {
            HarnessError::Io(format!(
                "{} cluster of {} nodes, step {step}: its peer links are not behind proxies (start it with Cluster::start_partitionable)",
                self.kind,
                self.len()
            ))
        })
    }

    fn check_pair(&self, a: usize, b: usize, step: &str) -> Result<(), HarnessError> {
        if a == b || a >= self.len() || b >= self.len() {
            return Err(HarnessError::Io(format!(
                "{} cluster of {} nodes, step {step}: no peer link between nodes {a} and {b}",
                self.kind,
                self.len()
            )));
        }
        Ok(())
    }

    /// Cuts every peer link between nodes `a` and `b`, both directions (ZooKeeper: quorum and
    /// election; etcd: every connection either member dialed to the other): connections stay
    /// open and nothing passes, as in a silent network partition. Client connections are not
    /// touched. Takes effect at once.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when the cluster is not partitionable or `a`, `b` is not a pair
    /// of distinct nodes.
    pub fn cut(&self, a: usize, b: usize) -> Result<(), HarnessError> {
        self.check_pair(a, b, "cut")?;
        self.links("cut")?
            .set_pair(a, b, crate::faults::Mode::Blackhole);
        tracing::info!(kind = %self.kind, a, b, "peer links cut");
        Ok(())
    }

    /// Cuts node `a` from every other node (see [`Cluster::cut`]).
    ///
    /// # Errors
    /// As [`Cluster::cut`].
    pub fn isolate(&self, a: usize) -> Result<(), HarnessError> {
        for b in (0..self.len()).filter(|&b| b != a) {
            self.cut(a, b)?;
        }
        Ok(())
    }

    /// Lets the peer links between `a` and `b` pass again (bytes held during the cut are
    /// delivered, as TCP would retransmit them).
    ///
    /// # Errors
    /// As [`Cluster::cut`].
    pub fn heal(&self, a: usize, b: usize) -> Result<(), HarnessError> {
        self.check_pair(a, b, "heal")?;
        self.links("heal")?
            .set_pair(a, b, crate::faults::Mode::Pass);
        tracing::info!(kind = %self.kind, a, b, "peer links healed");
        Ok(())
    }

    /// Lets every peer link pass again.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when the cluster is not partitionable.
    pub fn heal_all(&self) -> Result<(), HarnessError> {
        self.links("heal every link")?;
        for a in 0..self.len() {
            for b in (a + 1)..self.len() {
                self.heal(a, b)?;
            }
        }
        Ok(())
    }

    /// Whether any peer link between `a` and `b` is cut right now (`false` when the cluster is
    /// not partitionable).
    pub fn is_cut(&self, a: usize, b: usize) -> bool {
        self.check_pair(a, b, "is cut").is_ok()
            && self.links.as_ref().is_some_and(|l| l.is_cut(a, b))
    }

    /// The temp dir holding the nodes' data (local provider, private clusters).
    pub fn data_dir(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.path().to_path_buf())
    }
}

/// The per-pair proxies of a partitionable cluster on `ports` (per node, as reserved), how the
/// nodes reach their peers through them, and (etcd) the pid slots its routers read.
fn partition_links(
    kind: ServerKind,
    ports: &[Vec<u16>],
) -> Result<(partition::Links, local::Peers, Option<partition::Pids>), HarnessError> {
    let n = ports.len();
    match kind {
        ServerKind::Zk => {
            let links = partition::Links::start(n, |to| vec![ports[to][1], ports[to][2]])?;
            let dial = (0..n)
                .map(|from| (0..n).map(|to| links.dial_ports(from, to)).collect())
                .collect();
            Ok((links, local::Peers::Zk { dial }, None))
        }
        ServerKind::Etcd => {
            let mut links = partition::Links::start(n, |to| vec![ports[to][1]])?;
            let pids: partition::Pids = Arc::new(Mutex::new(vec![None; n]));
            let mut advertise = Vec::with_capacity(n);
            for (to, p) in ports.iter().enumerate() {
                let via = (0..n)
                    .map(|from| {
                        links.links[from][to]
                            .as_ref()
                            .and_then(|l| l.proxies.first().map(crate::faults::Proxy::addr))
                    })
                    .collect();
                let direct = SocketAddr::from(([127, 0, 0, 1], p[1]));
                let router = partition::Router::start(to, via, direct, Arc::clone(&pids))?;
                advertise.push(router.addr().port());
                links.routers.push(router);
            }
            Ok((links, local::Peers::Etcd { advertise }, Some(pids)))
        }
        ServerKind::Redis => Err(HarnessError::Io(
            "Redis nodes have no peer links to partition".into(),
        )),
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.kill_quietly();
        }
    }
}
