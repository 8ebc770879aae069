//! A Redis Sentinel deployment for tests: 1 master, 1 replica, 3 sentinels monitoring the
//! master as [`MASTER`] (quorum 2), and the `redis-sentinel` conformance backend over it.
//!
//! The data servers are harness clusters of one node each (the master a shared or private
//! cluster, the replica a private one started with `--replicaof`), both with
//! `min-replicas-to-write 1` as the README requires. The sentinels are `redis-server
//! <conf> --sentinel` processes of this module, each under a `sh` guard that kills it when the
//! pipe to its stdin closes (the deployment dropped, or the test process gone however it
//! ended), with their configurations and logs under the master's data dir.
//!
//! Link faults: a client built with [`ClientOptions::via`] asks the sentinels for a master
//! name of its own, `via-<proxy port>`, which every sentinel monitors at the proxy's address
//! (registered on first use, failover disabled in effect: a day's `down-after-milliseconds`
//! and `failover-timeout`). So the locker still discovers the master through real sentinels,
//! and every byte it exchanges with the master crosses the fault proxy. The sentinels'
//! own monitoring links to that name cross the proxy too.
//!
//! Node faults: the row's topology is its master (`(Redis, 1)`): the one server that holds
//! the locks. A scenario's private cluster becomes the master of a deployment of its own
//! ([`TestBackend::on_cluster`]); `server_restart` restarts that master within the sentinels'
//! `down-after-milliseconds` (5 s, [`Timing::STEADY`]): no failover, the master comes back
//! empty (no persistence) and its replica resyncs empty, so every lock is lost (a forced
//! break) while tokens must still increase. Failovers are `tests/sentinel.rs`'s.
//!
//! Wake signals (the herd scenario): every sentinel `PUBLISH`es a hello message on the
//! master every 2 s, so the master's `PUBLISH` count is read from its `MONITOR` stream without
//! those ([`PublishCounter`]).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_conformance::servers::{Cluster, HarnessError, ServerKind, ServerOptions};
use dlock_conformance::{ClientOptions, ServerExpiry, TestBackend};
use dlock_core::{Error, FencingToken, LockName, Locker};
use dlock_redis::{RedisLocker, RedisLockerBuilder};

use super::{ClusterRef, Kind, RedisBackend, blocking, scenario};

/// The name the sentinels monitor the master under.
pub const MASTER: &str = "m";

/// The variable that names the sentinels (`host:port,…`) to a crash-test child process; the
/// master comes from the harness' external provider (`DLOCK_REDIS_URLS`).
pub const SENTINELS_VAR: &str = "DLOCK_REDIS_SENTINELS";

/// How long a deployment may take to become ready.
const READY: Duration = Duration::from_secs(45);

/// A day: the `down-after-milliseconds` and `failover-timeout` of the proxied master names
/// (never failed over, never used to reconfigure the replica).
const NEVER_MS: u64 = 86_400_000;

/// The data servers' options: a master without a replica acknowledging within 2 s refuses
/// writes (README, "Redis Sentinel"), so a demoted master stops granting and renewing as soon
/// as its replica is promoted.
pub fn data_options() -> ServerOptions {
    ServerOptions::default().with_args([
        "--min-replicas-to-write",
        "1",
        "--min-replicas-max-lag",
        "2",
    ])
}

/// The sentinels' timing for the master.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// `sentinel down-after-milliseconds`.
    pub down_after: Duration,
    /// `sentinel failover-timeout`.
    pub failover_timeout: Duration,
}

impl Timing {
    /// For failover tests: down after 1 s, failover timeout 10 s.
    pub const FAST: Timing = Timing {
        down_after: Duration::from_secs(1),
        failover_timeout: Duration::from_secs(10),
    };
    /// For the conformance row: down after 5 s (a master restarted within that is not failed
    /// over; a loaded machine does not fail the shared master over), failover timeout 30 s.
    pub const STEADY: Timing = Timing {
        down_after: Duration::from_secs(5),
        failover_timeout: Duration::from_secs(30),
    };
}

/// A sentinel process under its `sh` guard; killed when dropped.
struct SentinelProc {
    guard: Child,
    stdin: Option<ChildStdin>,
    log: PathBuf,
}

impl SentinelProc {
    fn spawn(conf: &Path, log: &Path) -> Result<SentinelProc, HarnessError> {
        // The guard starts the sentinel, then blocks reading its stdin: EOF (this process
        // closed the pipe, or exited) kills the sentinel.
        let mut guard = Command::new("sh")
            .arg("-c")
            .arg(r#"redis-server "$0" --sentinel >"$1" 2>&1 & p=$!; read x; kill -9 $p; wait $p"#)
            .arg(conf)
            .arg(log)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| HarnessError::Io(format!("cannot start a sentinel: {e}")))?;
        let stdin = guard.stdin.take();
        Ok(SentinelProc {
            guard,
            stdin,
            log: log.to_path_buf(),
        })
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for SentinelProc {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
        let _ = self.guard.wait();
    }
}

/// A running deployment (or, in a crash-test child, the parent's, reached through
/// [`SENTINELS_VAR`]).
pub struct Deployment {
    /// The first master (node 0).
    pub master: Arc<Cluster>,
    /// The first replica; `None` when the deployment is the parent's.
    pub replica: Option<Cluster>,
    /// The sentinels' addresses.
    pub sentinels: Vec<SocketAddr>,
    procs: Vec<SentinelProc>,
    dir: Option<PathBuf>,
    /// Proxy addresses registered with the sentinels as `via-<port>`.
    vias: tokio::sync::Mutex<BTreeSet<SocketAddr>>,
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.procs.clear();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A free loopback port (free when asked: the caller binds it soon after).
///
/// # Errors
/// [`HarnessError::Io`] when no port is free.
pub fn free_port() -> Result<u16, HarnessError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| HarnessError::Io(format!("no free port for a sentinel: {e}")))
}

/// A blocking connection to `addr` (2 s timeouts).
fn sync_conn(addr: SocketAddr) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://{addr}")).ok()?;
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    conn.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    Some(conn)
}

/// `INFO <section>` of `addr`, empty when it does not answer.
pub fn info(addr: SocketAddr, section: &str) -> String {
    sync_conn(addr)
        .and_then(|mut c| redis::cmd("INFO").arg(section).query(&mut c).ok())
        .unwrap_or_default()
}

/// How many replicas and peers the sentinel at `addr` knows for `master`.
fn sentinel_view(addr: SocketAddr, master: &str) -> Option<(usize, usize)> {
    let mut c = sync_conn(addr)?;
    let peers: Vec<redis::Value> = redis::cmd("SENTINEL")
        .arg("sentinels")
        .arg(master)
        .query(&mut c)
        .ok()?;
    let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
        .arg("replicas")
        .arg(master)
        .query(&mut c)
        .ok()?;
    Some((peers.len(), replicas.len()))
}

impl Deployment {
    /// A deployment around `master` (a cluster of one node already serving with
    /// [`data_options`]): starts the replica and the sentinels, and waits until the replica
    /// has synced, the master counts it, and every sentinel knows the replica and its two
    /// peers. Blocking.
    ///
    /// # Errors
    /// The harness' error ([`HarnessError::may_skip`] when redis-server is missing);
    /// [`HarnessError::External`] when the master is external; [`HarnessError::NotReady`]
    /// with every server's output when the deployment does not become ready.
    pub fn start(master: Arc<Cluster>, timing: Timing) -> Result<Deployment, HarnessError> {
        if master.is_external() || master.len() != 1 {
            return Err(HarnessError::External(format!(
                "start a sentinel deployment around the {} cluster of {} nodes (the redis-sentinel row needs servers of its own, or {SENTINELS_VAR} with DLOCK_REDIS_URLS)",
                master.kind(),
                master.len()
            )));
        }
        let m = master.addrs()[0];
        let replica = Cluster::start_with(
            ServerKind::Redis,
            1,
            &data_options().with_args([
                "--replicaof".to_string(),
                m.ip().to_string(),
                m.port().to_string(),
            ]),
        )?;
        let base = master
            .data_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join(format!("sentinels-{}", free_port()?));
        std::fs::create_dir_all(&base)
            .map_err(|e| HarnessError::Io(format!("cannot create {}: {e}", base.display())))?;
        let mut procs = Vec::new();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port()?;
            let conf = base.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER} {ip} {mport} 2\n\
                     sentinel down-after-milliseconds {MASTER} {down}\n\
                     sentinel failover-timeout {MASTER} {failover}\n\
                     sentinel parallel-syncs {MASTER} 1\n",
                    dir = base.display(),
                    ip = m.ip(),
                    mport = m.port(),
                    down = timing.down_after.as_millis(),
                    failover = timing.failover_timeout.as_millis(),
                ),
            )
            .map_err(|e| HarnessError::Io(format!("cannot write {}: {e}", conf.display())))?;
            procs.push(SentinelProc::spawn(
                &conf,
                &base.join(format!("sentinel-{i}.log")),
            )?);
            sentinels.push(SocketAddr::from(([127, 0, 0, 1], port)));
        }
        let d = Deployment {
            master,
            replica: Some(replica),
            sentinels,
            procs,
            dir: Some(base),
            vias: Default::default(),
        };
        d.wait_ready()?;
        tracing::info!(master = %m, sentinels = ?d.sentinels, "sentinel deployment ready");
        Ok(d)
    }

    /// The parent's deployment, in a crash-test child: the master from the external
    /// provider, the sentinels from [`SENTINELS_VAR`]. `None` when the variable is unset.
    ///
    /// # Errors
    /// [`HarnessError::BadEnv`] when the variable does not parse.
    pub fn from_env() -> Result<Option<Deployment>, HarnessError> {
        let Ok(value) = std::env::var(SENTINELS_VAR) else {
            return Ok(None);
        };
        let sentinels = value
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<SocketAddr>()
                    .map_err(|e| HarnessError::BadEnv(format!("{SENTINELS_VAR}={value}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let master = Cluster::shared_with(ServerKind::Redis, 1, &data_options())?;
        Ok(Some(Deployment {
            master,
            replica: None,
            sentinels,
            procs: Vec::new(),
            dir: None,
            vias: Default::default(),
        }))
    }

    fn wait_ready(&self) -> Result<(), HarnessError> {
        let until = Instant::now() + READY;
        let wait = |what: &str, check: &dyn Fn() -> bool| -> Result<(), HarnessError> {
            while !check() {
                if Instant::now() >= until {
                    return Err(HarnessError::NotReady {
                        what: format!("sentinel deployment: {what} within {READY:?}"),
                        logs: self.logs(),
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        };
        let m = self.master.addrs()[0];
        if let Some(r) = &self.replica {
            let r = r.addrs()[0];
            wait("the replica syncs", &|| {
                info(r, "replication").contains("master_link_status:up")
            })?;
        }
        wait("the master counts its replica", &|| {
            info(m, "replication").contains("min_slaves_good_slaves:1")
        })?;
        for &s in &self.sentinels {
            wait(
                &format!("sentinel {s} knows its 2 peers and the replica"),
                &|| sentinel_view(s, MASTER) == Some((2, 1)),
            )?;
        }
        Ok(())
    }

    /// The first master's address.
    pub fn master_addr(&self) -> SocketAddr {
        self.master.addrs()[0]
    }

    /// The first replica's address (`None` in a crash-test child).
    pub fn replica_addr(&self) -> Option<SocketAddr> {
        self.replica.as_ref().map(|r| r.addrs()[0])
    }

    /// The sentinels' `host:port` strings, as the builder takes them.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(ToString::to_string).collect()
    }

    /// A locker builder that discovers `master_name` through the sentinels.
    pub fn locker(&self, master_name: &str) -> RedisLockerBuilder {
        RedisLocker::builder().sentinels(self.sentinel_addrs(), master_name)
    }

    /// The master name under which every sentinel names `proxy` (a fault proxy in front of
    /// the master): `via-<port>`, registered on first use (`SENTINEL MONITOR`, then a day's
    /// `down-after-milliseconds` and `failover-timeout`, so the sentinels never fail it over
    /// nor move the replica to it).
    ///
    /// # Errors
    /// The sentinels' error.
    pub async fn via(&self, proxy: SocketAddr) -> Result<String, Error> {
        let name = format!("via-{}", proxy.port());
        let mut known = self.vias.lock().await;
        if known.contains(&proxy) {
            return Ok(name);
        }
        let err = |e: redis::RedisError| {
            Error::backend(
                format!("test setup: registering {name} with the sentinels: {e}"),
                None,
            )
        };
        // Names of proxies gone (their scenarios are over) are removed first, so the
        // sentinels never reach whatever listens on such a port next.
        let mut gone = Vec::new();
        for &old in known.iter() {
            // Loopback: refused at once when nothing listens.
            let probe = std::net::TcpStream::connect_timeout(&old, Duration::from_secs(1));
            if probe.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused) {
                gone.push(old);
            }
        }
        for old in gone {
            let mut remove = redis::cmd("SENTINEL");
            remove.arg("REMOVE").arg(format!("via-{}", old.port()));
            self.on_sentinels(&[remove]).await.map_err(err)?;
            known.remove(&old);
        }
        let mut monitor = redis::cmd("SENTINEL");
        monitor
            .arg("MONITOR")
            .arg(&name)
            .arg(proxy.ip().to_string())
            .arg(proxy.port())
            .arg(2);
        let mut set = redis::cmd("SENTINEL");
        set.arg("SET")
            .arg(&name)
            .arg("down-after-milliseconds")
            .arg(NEVER_MS)
            .arg("failover-timeout")
            .arg(NEVER_MS);
        self.on_sentinels(&[monitor, set]).await.map_err(err)?;
        known.insert(proxy);
        Ok(name)
    }

    /// Runs `cmds` in order on every sentinel.
    async fn on_sentinels(&self, cmds: &[redis::Cmd]) -> redis::RedisResult<()> {
        for s in &self.sentinels {
            let client = redis::Client::open(format!("redis://{s}"))?;
            let mut c = client.get_multiplexed_async_connection().await?;
            for cmd in cmds {
                let _: () = cmd.query_async(&mut c).await?;
            }
        }
        Ok(())
    }

    /// The servers' output: master, replica, sentinels.
    pub fn logs(&self) -> String {
        let mut out = self.master.logs();
        if let Some(r) = &self.replica {
            out.push_str("\n==== replica ====\n");
            out.push_str(&r.logs());
        }
        for (i, p) in self.procs.iter().enumerate() {
            out.push_str(&format!(
                "\n==== sentinel {i} ({}) ====\n",
                self.sentinels[i]
            ));
            out.push_str(&p.logs());
        }
        out
    }

    /// The variables that make [`Deployment::from_env`] in a child process reach this
    /// deployment.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let mut env = self.master.external_env();
        env.push((SENTINELS_VAR.to_string(), self.sentinel_addrs().join(",")));
        env
    }
}

/// The `PUBLISH` calls a master executes, other than the sentinels' hello messages
/// (`__sentinel__:hello`), counted from its `MONITOR` stream by a thread of its own: the
/// master's `PUBLISH` count mixes both. A read first sends a marker (`ECHO`) on another
/// connection and waits until the stream has shown it, so every call executed before the read
/// is counted.
struct PublishCounter {
    state: Arc<(std::sync::Mutex<Counted>, std::sync::Condvar)>,
    master: SocketAddr,
    stream: std::net::TcpStream,
    next_marker: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Counted {
    publishes: u64,
    marker: u64,
    ended: Option<String>,
}

const MARKER: &str = "dlock-wake-marker-";

impl PublishCounter {
    fn start(master: SocketAddr) -> Result<PublishCounter, String> {
        use std::io::{BufRead, BufReader};
        let stream = std::net::TcpStream::connect_timeout(&master, Duration::from_secs(2))
            .map_err(|e| format!("cannot connect to the master {master}: {e}"))?;
        (&stream)
            .write_all(b"MONITOR\r\n")
            .map_err(|e| format!("MONITOR on {master}: {e}"))?;
        let mut reader = BufReader::new(
            stream
                .try_clone()
                .map_err(|e| format!("MONITOR on {master}: {e}"))?,
        );
        let mut first = String::new();
        reader
            .read_line(&mut first)
            .map_err(|e| format!("MONITOR on {master}: {e}"))?;
        if first.trim_end() != "+OK" {
            return Err(format!("MONITOR on {master} answered {first:?}"));
        }
        let state: Arc<(std::sync::Mutex<Counted>, std::sync::Condvar)> = Arc::default();
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            let mut line = String::new();
            let why = loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) => break "the MONITOR stream ended".to_string(),
                    Err(e) => break format!("the MONITOR stream failed: {e}"),
                    Ok(_) => {}
                }
                // `+<time> [<db> <client>] "<command>" "<arg>" …`
                let Some((_, call)) = line.split_once("] ") else {
                    continue;
                };
                let mut words = call.trim_end().split(' ');
                let (command, first) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let (lock, wake) = &*shared;
                let mut c = lock.lock().unwrap_or_else(|p| p.into_inner());
                if command.eq_ignore_ascii_case("\"publish\"") && first != "\"__sentinel__:hello\""
                {
                    c.publishes += 1;
                } else if command.eq_ignore_ascii_case("\"echo\"")
                    && let Some(n) = first
                        .trim_matches('"')
                        .strip_prefix(MARKER)
                        .and_then(|n| n.parse::<u64>().ok())
                {
                    c.marker = c.marker.max(n);
                    wake.notify_all();
                }
            };
            let (lock, wake) = &*shared;
            lock.lock().unwrap_or_else(|p| p.into_inner()).ended = Some(why);
            wake.notify_all();
        });
        Ok(PublishCounter {
            state,
            master,
            stream,
            next_marker: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// The count, once every call executed before now is in it.
    fn read(&self) -> Result<u64, String> {
        let n = self
            .next_marker
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut conn = sync_conn(self.master)
            .ok_or_else(|| format!("the master {} did not answer", self.master))?;
        let _: String = redis::cmd("ECHO")
            .arg(format!("{MARKER}{n}"))
            .query(&mut conn)
            .map_err(|e| format!("ECHO on {}: {e}", self.master))?;
        let (lock, wake) = &*self.state;
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let (c, timeout) = wake
            .wait_timeout_while(guard, Duration::from_secs(5), |c| {
                c.marker < n && c.ended.is_none()
            })
            .unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &c.ended {
            return Err(why.clone());
        }
        if timeout.timed_out() {
            return Err(format!(
                "the MONITOR stream of {} did not show the marker within 5 s",
                self.master
            ));
        }
        Ok(c.publishes)
    }
}

impl Drop for PublishCounter {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The `redis-sentinel` conformance backend: fair-mode lockers that find the master through
/// the sentinels; the audits (leftovers, breaks, expiry) on the first master, through a
/// [`RedisBackend`] over it.
pub struct SentinelBackend {
    name: String,
    deployment: Arc<Deployment>,
    audit: RedisBackend,
    /// Started by the first [`TestBackend::wake_signals`].
    publishes: std::sync::Mutex<Option<PublishCounter>>,
}

impl SentinelBackend {
    /// The backend over `deployment`.
    pub fn new(name: &str, deployment: Deployment) -> Self {
        let audit = RedisBackend::new(
            name,
            Kind::Single,
            ClusterRef::Shared(Arc::clone(&deployment.master)),
        );
        SentinelBackend {
            name: name.into(),
            deployment: Arc::new(deployment),
            audit,
            publishes: std::sync::Mutex::new(None),
        }
    }

    /// The backend of the shared deployment: the master a shared cluster serving with
    /// [`data_options`] (or, in a crash-test child, the parent's deployment). Blocking.
    ///
    /// # Errors
    /// As [`Deployment::start`].
    pub fn shared(name: &str) -> Result<Self, HarnessError> {
        let deployment = match Deployment::from_env()? {
            Some(d) => d,
            None => Deployment::start(
                Cluster::shared_with(ServerKind::Redis, 1, &data_options())?,
                Timing::STEADY,
            )?,
        };
        Ok(SentinelBackend::new(name, deployment))
    }

    /// The deployment.
    pub fn deployment(&self) -> &Deployment {
        &self.deployment
    }

    /// A fair-mode locker with the scenario's options; through `via` (one proxy, in front of
    /// the master) it asks the sentinels for the proxy's master name.
    async fn locker(&self, opts: &ClientOptions) -> Result<RedisLocker, Error> {
        let master = match opts.via.as_deref() {
            None => MASTER.to_string(),
            Some([proxy]) => self.deployment.via(*proxy).await?,
            Some(other) => {
                return Err(Error::backend(
                    format!(
                        "test setup: one proxy in front of the master expected, got {}",
                        other.len()
                    ),
                    None,
                ));
            }
        };
        scenario(self.deployment.locker(&master), opts)
            .fair(true)
            .build()
            .await
    }
}

#[async_trait]
impl TestBackend for SentinelBackend {
    fn name(&self) -> &str {
        &self.name
    }

    /// The master (the proxies of the link-fault scenarios sit in front of it).
    fn node_addrs(&self) -> Vec<SocketAddr> {
        vec![self.deployment.master_addr()]
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Ok(Arc::new(self.locker(&opts).await?))
    }

    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        self.audit.leftovers(namespace).await
    }

    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error> {
        self.audit.break_holder(namespace, name).await
    }

    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        self.audit.server_expiry(namespace, name).await
    }

    /// The test servers run without persistence: a restart of the master loses every lock
    /// (and its replica, resyncing from the empty master, loses them too).
    fn restart_keeps_locks(&self) -> bool {
        false
    }

    /// `PUBLISH` calls on the master (also from scripts), without the sentinels' hello
    /// messages (every sentinel publishes one on the master every 2 s), counted from the
    /// master's `MONITOR` stream from the first call on ([`PublishCounter`]).
    fn wake_signals(&self) -> Result<u64, String> {
        let mut counter = self.publishes.lock().unwrap_or_else(|p| p.into_inner());
        if counter.is_none() {
            *counter = Some(PublishCounter::start(self.deployment.master_addr())?);
        }
        counter.as_ref().map_or(Ok(0), PublishCounter::read)
    }

    fn child_env(&self) -> Vec<(String, String)> {
        self.deployment.child_env()
    }

    /// The master's request count (the sentinels' monitoring included).
    fn server_requests(&self) -> Option<u64> {
        self.audit.server_requests()
    }

    fn logs(&self) -> String {
        self.deployment.logs()
    }

    /// One node: the master, which holds every lock (the replica is a standby, the sentinels
    /// hold no data). The private cluster a scenario starts is that master; [`on_cluster`]
    /// builds the replica and sentinels around it.
    ///
    /// [`on_cluster`]: TestBackend::on_cluster
    fn topology(&self) -> Option<(ServerKind, usize)> {
        Some((ServerKind::Redis, 1))
    }

    /// A deployment of its own around `cluster` (its only node the master): reconfigured with
    /// [`data_options`], a replica and 3 sentinels started. Panics with the harness' error
    /// when it cannot be started.
    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        super::reconfigure(&cluster, &data_options());
        let deployment = blocking(|| Deployment::start(cluster, Timing::STEADY))
            .unwrap_or_else(|e| panic!("cannot start a private sentinel deployment: {e}"));
        Some(Arc::new(SentinelBackend::new(&self.name, deployment)))
    }
}
