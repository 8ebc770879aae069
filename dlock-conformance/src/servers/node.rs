//! One server node: its process, its captured output, and the faults tests inflict on it.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::Child;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::process::{self, Launch};
use super::tls::Transport;
use super::{HarnessError, READY_TIMEOUT, ServerKind, local};

/// Captured output is kept up to this many bytes (the tail).
const LOG_CAP: usize = 512 * 1024;

/// One server node of a [`Cluster`](super::Cluster).
pub struct Node {
    kind: ServerKind,
    index: usize,
    addr: SocketAddr,
    ports: Vec<u16>,
    /// Whether the harness started this node (and may kill, pause and restart it).
    local: bool,
    /// How the node is launched and how the harness talks to it; replaced by
    /// [`Node::relaunch`].
    config: Mutex<Config>,
    child: Mutex<Option<Child>>,
    paused: Mutex<bool>,
    log: Arc<Mutex<String>>,
    /// Where the node's current pid is published (partitionable etcd: the routers read it).
    pid_slot: Option<super::partition::Pids>,
}

/// What a restart launches and how the harness reaches the node.
struct Config {
    launch: Option<Launch>,
    transport: Transport,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("kind", &self.kind)
            .field("index", &self.index)
            .field("endpoint", &self.endpoint())
            .field("pid", &self.pid())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Node {
    pub(crate) fn external(
        kind: ServerKind,
        index: usize,
        addr: SocketAddr,
        transport: Transport,
    ) -> Node {
        Node {
            kind,
            index,
            addr,
            ports: vec![addr.port()],
            local: false,
            config: Mutex::new(Config {
                launch: None,
                transport,
            }),
            child: Mutex::new(None),
            paused: Mutex::new(false),
            log: Arc::new(Mutex::new(String::from(
                "(external server: no output captured)\n",
            ))),
            pid_slot: None,
        }
    }

    /// A node listening on `ports` (client port first) on 127.0.0.1, started now.
    pub(crate) fn local(
        kind: ServerKind,
        index: usize,
        ports: Vec<u16>,
        launch: Launch,
        transport: Transport,
        pid_slot: Option<super::partition::Pids>,
    ) -> Result<Node, HarnessError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], ports.first().copied().unwrap_or(0)));
        let node = Node {
            kind,
            index,
            addr,
            ports,
            local: true,
            config: Mutex::new(Config {
                launch: Some(launch),
                transport,
            }),
            child: Mutex::new(None),
            paused: Mutex::new(false),
            log: Arc::new(Mutex::new(String::new())),
            pid_slot,
        };
        node.spawn("start")?;
        Ok(node)
    }

    /// `redis node 0 (redis://127.0.0.1:P; ports P)`: which server, for error messages.
    pub(crate) fn describe(&self) -> String {
        let ports = self
            .ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "{} node {} ({}; ports {ports})",
            self.kind,
            self.index,
            self.endpoint()
        )
    }

    /// How the harness talks to the node (plain or TLS).
    pub(crate) fn transport(&self) -> Transport {
        lock(&self.config).transport.clone()
    }

    fn spawn(&self, step: &str) -> Result<(), HarnessError> {
        let launch = lock(&self.config).launch.clone();
        let Some(launch) = launch else {
            return Err(HarnessError::External(format!(
                "{step} {}",
                self.describe()
            )));
        };
        let mut child = process::spawn(launch.clone()).map_err(|e| {
            HarnessError::Io(format!(
                "{}, step {step}: cannot spawn {}: {e}",
                self.describe(),
                launch.program.display()
            ))
        })?;
        append(
            &self.log,
            &format!("---- started pid {} ----\n", child.id()),
        );
        if let Some(out) = child.stdout.take() {
            capture(out, Arc::clone(&self.log));
        }
        if let Some(err) = child.stderr.take() {
            capture(err, Arc::clone(&self.log));
        }
        self.publish_pid(Some(child.id()));
        *lock(&self.child) = Some(child);
        *lock(&self.paused) = false;
        Ok(())
    }

    /// Waits until the node serves requests or `until` passes; `step` names what it waits
    /// for in the error.
    pub(crate) fn wait_ready(&self, until: Instant, step: &str) -> Result<(), HarnessError> {
        let since = Instant::now();
        let transport = self.transport();
        loop {
            if let Some(child) = lock(&self.child).as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let logs = self.logs();
                return Err(HarnessError::NotReady {
                    what: format!(
                        "{}, step {step}: exited with {status}{}",
                        self.describe(),
                        port_taken_hint(&logs)
                    ),
                    logs,
                });
            }
            if local::probe_via(self.kind, self.addr, &transport) {
                return Ok(());
            }
            if Instant::now() >= until {
                let logs = self.logs();
                return Err(HarnessError::NotReady {
                    what: format!(
                        "{}, step {step}: not serving after {:.1} s{}",
                        self.describe(),
                        since.elapsed().as_secs_f64(),
                        port_taken_hint(&logs)
                    ),
                    logs,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The node's index in its cluster.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The node's client address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The node's client endpoint (see [`Cluster::endpoints`](super::Cluster::endpoints)):
    /// `rediss://` or `https://` when it serves TLS.
    pub fn endpoint(&self) -> String {
        let tls = matches!(lock(&self.config).transport, Transport::Tls(_));
        self.kind.endpoint_for(self.addr, tls)
    }

    /// Whether the node serves its clients over TLS.
    pub fn is_tls(&self) -> bool {
        matches!(lock(&self.config).transport, Transport::Tls(_))
    }

    /// Every port the node listens on, the client port first (etcd: client, peer; ZooKeeper:
    /// client, quorum, election). Reserved for the cluster's whole life, so a restart finds
    /// them free (see the `servers` module).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The server process id, when this harness runs it.
    pub fn pid(&self) -> Option<u32> {
        lock(&self.child).as_ref().map(Child::id)
    }

    /// Whether the node's process is running (paused counts as running).
    pub fn is_running(&self) -> bool {
        lock(&self.child)
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Whether the node serves requests right now (protocol-level probe).
    pub fn is_serving(&self) -> bool {
        local::probe_via(self.kind, self.addr, &self.transport())
    }

    /// Sends `request` over a fresh connection (TLS when the node serves TLS, with the
    /// cluster's client identity) and reads the reply until the server closes the connection
    /// or 2 s pass: for the servers' text stats (`INFO` + `QUIT`, HTTP/1.0 `/metrics`). `None`
    /// when the node does not answer. The plain-TCP form is [`crate::read_text`].
    pub fn read_text(&self, request: &[u8]) -> Option<String> {
        self.transport().read_text(self.addr, request)
    }

    /// How many connections one `PUBLISH` reaches at most on this Redis node right now
    /// ([`stats::redis_fanout`](super::stats::redis_fanout)); `None` for other servers or
    /// when the node does not answer.
    pub fn redis_fanout(&self) -> Option<u64> {
        if self.kind != ServerKind::Redis {
            return None;
        }
        super::stats::redis_fanout(|request| self.read_text(request))
    }

    /// Requests the node has received so far (see [`stats::node_requests`](super::stats)),
    /// read over the node's own transport (TLS when it serves TLS).
    pub fn requests(&self) -> Option<u64> {
        super::stats::node_requests_via(self.kind, self.addr, &self.transport())
    }

    /// The node's captured output.
    pub fn logs(&self) -> String {
        lock(&self.log).clone()
    }

    /// SIGKILLs the node (its whole process group) and reaps it. Killing a stopped node is fine.
    ///
    /// # Errors
    /// [`HarnessError::External`] for an external node.
    pub fn kill(&self) -> Result<(), HarnessError> {
        if !self.local {
            return Err(HarnessError::External(format!("kill {}", self.describe())));
        }
        self.kill_quietly();
        Ok(())
    }

    pub(crate) fn kill_quietly(&self) {
        if let Some(mut child) = lock(&self.child).take() {
            process::kill_and_reap(&mut child);
            append(&self.log, "---- killed ----\n");
        }
        self.publish_pid(None);
        *lock(&self.paused) = false;
    }

    fn publish_pid(&self, pid: Option<u32>) {
        if let Some(slot) = &self.pid_slot
            && let Some(p) = lock(slot).get_mut(self.index)
        {
            *p = pid;
        }
    }

    fn signal(&self, sig: i32, what: &str) -> Result<(), HarnessError> {
        if !self.local {
            return Err(HarnessError::External(format!(
                "{what} {}",
                self.describe()
            )));
        }
        let pid = self.pid().ok_or_else(|| {
            HarnessError::Io(format!("{}, step {what}: not running", self.describe()))
        })?;
        process::signal(pid, sig).map_err(|e| {
            HarnessError::Io(format!(
                "{}, step {what}: cannot signal pid {pid}: {e}",
                self.describe()
            ))
        })
    }

    /// Freezes the node with SIGSTOP (a hung server: connections stay open, nothing answers).
    ///
    /// # Errors
    /// [`HarnessError::External`] for an external node; [`HarnessError::Io`] when it is not
    /// running.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.signal(libc::SIGSTOP, "pause")?;
        *lock(&self.paused) = true;
        append(&self.log, "---- paused (SIGSTOP) ----\n");
        Ok(())
    }

    /// Resumes a paused node with SIGCONT.
    ///
    /// # Errors
    /// As [`Node::pause`].
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.signal(libc::SIGCONT, "resume")?;
        *lock(&self.paused) = false;
        append(&self.log, "---- resumed (SIGCONT) ----\n");
        Ok(())
    }

    /// Whether the node is paused.
    pub fn is_paused(&self) -> bool {
        *lock(&self.paused)
    }

    /// Kills the node if it runs, starts it again on the same port with the same data dir, and
    /// waits until it serves requests (for etcd and ZooKeeper that needs a quorum of the
    /// cluster up).
    ///
    /// # Errors
    /// [`HarnessError::External`] for an external node; [`HarnessError::NotReady`] when it does
    /// not come back within [`READY_TIMEOUT`].
    pub fn restart(&self) -> Result<(), HarnessError> {
        self.start_again()?;
        self.wait_ready(Instant::now() + READY_TIMEOUT, "restart")
    }

    /// As [`Node::restart`] without waiting until the node serves.
    ///
    /// # Errors
    /// [`HarnessError::External`] for an external node; [`HarnessError::Io`] when it cannot be
    /// spawned.
    pub fn start_again(&self) -> Result<(), HarnessError> {
        if !self.local {
            return Err(HarnessError::External(format!(
                "restart {}",
                self.describe()
            )));
        }
        self.kill_quietly();
        self.spawn("restart")
    }

    /// Kills the node and starts it with `launch` (same ports, same data dir), reached over
    /// `transport` from now on; later restarts use `launch` too. Does not wait until it serves.
    pub(crate) fn relaunch(
        &self,
        launch: Launch,
        transport: Transport,
    ) -> Result<(), HarnessError> {
        if !self.local {
            return Err(HarnessError::External(format!(
                "reconfigure {}",
                self.describe()
            )));
        }
        self.kill_quietly();
        *lock(&self.config) = Config {
            launch: Some(launch),
            transport,
        };
        append(&self.log, "---- reconfigured ----\n");
        self.spawn("reconfigure")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill_quietly();
    }
}

/// `, a port is taken (…)` when the server's output says it could not bind.
fn port_taken_hint(logs: &str) -> &'static str {
    if logs.to_ascii_lowercase().contains("address already in use") {
        ", a port is taken (\"address already in use\" in its output)"
    } else {
        ""
    }
}

fn append(log: &Mutex<String>, text: &str) {
    let mut log = lock(log);
    log.push_str(text);
    if log.len() > LOG_CAP {
        let mut cut = log.len() - LOG_CAP / 2;
        while !log.is_char_boundary(cut) {
            cut += 1;
        }
        log.replace_range(..cut, "[… earlier output dropped …]\n");
    }
}

fn capture(stream: impl Read + Send + 'static, log: Arc<Mutex<String>>) {
    let spawned = std::thread::Builder::new()
        .name("dlock-harness-log".into())
        .spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            while let Ok(n) = reader.read_until(b'\n', &mut line) {
                if n == 0 {
                    break;
                }
                append(&log, &String::from_utf8_lossy(&line));
                line.clear();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot capture server output: {e}");
    }
}
