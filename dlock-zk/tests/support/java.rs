//! A Curator peer for the interop tests: `tests/curator/CuratorPeer.java`, compiled once with
//! `javac` against the Debian Curator jars (`libcurator-recipes-java`) into the cargo target
//! dir, run with `java`, and driven over its stdin / stdout one line at a time.
//!
//! Java or the jars missing: the tests fail under `CI` and skip (printed) without it, as
//! [`super::shared`] does for the servers.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;

/// Where Debian installs the jars.
const JAVA_DIR: &str = "/usr/share/java";

/// The jars the peer cannot run without (Curator, the ZooKeeper client, what Curator links).
const REQUIRED_JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
];

/// Jars put on the class path when present: the netty pieces ZooKeeper's client names in its
/// manifest (for its optional Netty socket), and slf4j-nop so the peer's stderr carries no
/// logger warnings.
const OPTIONAL_JARS: &[&str] = &[
    "netty-common",
    "netty-buffer",
    "netty-resolver",
    "netty-transport",
    "netty-transport-native-unix-common",
    "netty-transport-native-epoll",
    "netty-codec",
    "netty-handler",
    "slf4j-nop",
];

/// The peer's source, in the crate.
const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/curator/CuratorPeer.java"
);

/// The compiled peer and its class path.
pub struct Curator {
    classpath: String,
}

/// The compiled peer, or `None` (printed) when Java or the Curator jars are missing outside
/// `CI`. Under `CI` a missing piece fails the test; a compile error always does.
pub fn curator() -> Option<&'static Curator> {
    static PEER: OnceLock<Result<Curator, String>> = OnceLock::new();
    match PEER.get_or_init(prepare) {
        Ok(c) => Some(c),
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "the Curator interop tests cannot run (CI must have them): {why}"
            );
            eprintln!("SKIP: {why}");
            None
        }
    }
}

/// Whether `tool -version` runs.
fn runs(tool: &str) -> bool {
    Command::new(tool)
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Finds the tools and jars, and compiles the peer unless an earlier run (of any process)
/// already did. `Err` only for what is missing.
fn prepare() -> Result<Curator, String> {
    for tool in ["java", "javac"] {
        if !runs(tool) {
            return Err(format!(
                "`{tool}` is not installed (Debian: openjdk-17-jdk-headless)"
            ));
        }
    }
    let mut jars = Vec::new();
    for name in REQUIRED_JARS {
        let jar = Path::new(JAVA_DIR).join(format!("{name}.jar"));
        if !jar.is_file() {
            return Err(format!(
                "{} is missing (Debian: libcurator-recipes-java)",
                jar.display()
            ));
        }
        jars.push(jar);
    }
    jars.extend(
        OPTIONAL_JARS
            .iter()
            .map(|name| Path::new(JAVA_DIR).join(format!("{name}.jar")))
            .filter(|jar| jar.is_file()),
    );
    let jars: Vec<String> = jars.iter().map(|j| j.display().to_string()).collect();
    let classpath = jars.join(":");
    let source = std::fs::read_to_string(SOURCE).expect("read CuratorPeer.java");

    // One directory per source and class path, so a changed peer is compiled again and
    // concurrent test processes never write into each other's output.
    let mut h = DefaultHasher::new();
    (&source, &classpath).hash(&mut h);
    let base = option_env!("CARGO_TARGET_TMPDIR")
        .map_or_else(std::env::temp_dir, PathBuf::from)
        .join("dlock-zk-curator-peer");
    let classes = base.join(format!("{:016x}", h.finish()));
    if !classes.join("CuratorPeer.class").is_file() {
        let scratch = base.join(format!("tmp-{}-{:016x}", std::process::id(), h.finish()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).expect("create the peer's class dir");
        let out = Command::new("javac")
            .args(["-encoding", "UTF-8", "-Xlint:-path", "-d"])
            .arg(&scratch)
            .arg("-cp")
            .arg(&classpath)
            .arg(SOURCE)
            .output()
            .expect("run javac");
        assert!(
            out.status.success(),
            "javac {SOURCE} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Another process may have finished first: its classes are the same.
        if std::fs::rename(&scratch, &classes).is_err() {
            let _ = std::fs::remove_dir_all(&scratch);
        }
        assert!(
            classes.join("CuratorPeer.class").is_file(),
            "no CuratorPeer.class in {}",
            classes.display()
        );
    }
    Ok(Curator {
        classpath: format!("{}:{classpath}", classes.display()),
    })
}

impl Curator {
    /// Starts `CuratorPeer <connect> <args…>` (e.g. `["latch", path]`) and waits until its
    /// Curator client is connected.
    pub async fn spawn(&self, connect: &str, args: &[&str]) -> Peer {
        let label = format!("CuratorPeer {}", args.join(" "));
        let mut child = Command::new("java")
            .args(["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmx128m"])
            .arg("-Dzookeeper.sasl.client=false")
            .arg("-cp")
            .arg(&self.classpath)
            .arg("CuratorPeer")
            .arg(connect)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start java");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&errors);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut buf) {
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        let mut peer = Peer {
            child,
            stdin,
            lines,
            errors,
            label,
        };
        let ready = peer.reply(Duration::from_secs(90)).await;
        assert_eq!(ready, "READY", "{}", peer.context());
        peer
    }
}

/// A running Curator peer; killed on drop.
pub struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    errors: Arc<Mutex<Vec<u8>>>,
    label: String,
}

impl Peer {
    /// What the peer is and the end of its stderr, for failure messages.
    fn context(&self) -> String {
        let errors = self.errors.lock().unwrap();
        let text = String::from_utf8_lossy(&errors);
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("{}; its stderr:\n{}", self.label, tail.join("\n"))
    }

    /// Sends one command line without waiting for its reply.
    pub fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("the peer's stdin is open");
        if let Err(e) = writeln!(stdin, "{command}").and_then(|()| stdin.flush()) {
            panic!("send {command:?}: {e}; {}", self.context());
        }
    }

    /// The next line the peer prints, within `within`; panics on a timeout, on the peer's exit
    /// and on an `ERROR` line.
    pub async fn reply(&mut self, within: Duration) -> String {
        let line = match tokio::time::timeout(within, self.lines.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("the peer exited; {}", self.context()),
            Err(_) => panic!(
                "no reply from the peer within {within:?}; {}",
                self.context()
            ),
        };
        assert!(!line.starts_with("ERROR"), "{line}; {}", self.context());
        line
    }

    /// Sends `command` and returns its reply (within `within`).
    pub async fn ask(&mut self, command: &str, within: Duration) -> String {
        self.send(command);
        self.reply(within).await
    }

    /// A line the peer printed that was not read yet, if any (does not wait).
    pub fn printed(&mut self) -> Option<String> {
        self.lines.try_recv().ok()
    }

    /// Asks the peer to close its recipes and its client, and waits until it exits.
    pub async fn quit(mut self, within: Duration) {
        let bye = self.ask("quit", within).await;
        assert_eq!(bye, "BYE", "{}", self.context());
        self.stdin = None;
        match tokio::time::timeout(within, self.lines.recv()).await {
            Ok(None) => {}
            Ok(Some(line)) => panic!("after BYE: {line}; {}", self.context()),
            Err(_) => panic!(
                "the peer did not exit within {within:?}; {}",
                self.context()
            ),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
