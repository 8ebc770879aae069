//! A private 3-node ZooKeeper ensemble whose peer links (quorum and election ports) each go
//! through their own proxy — one per (from, to) pair, so one member can be cut from another
//! while the rest keep their quorum — and whose members may have their own settings (e.g. a
//! lower `maxSessionTimeout`). The harness's ensembles connect their peers directly.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dlock_conformance::faults::{Mode, Proxy};
use dlock_conformance::servers::local::{ZK_JAR, zk_mode};
use tokio::time::Instant;

/// Server tick of the private ensemble.
pub const TICK_MS: u64 = 100;
/// Ticks a follower waits for its leader before it gives up on it (10 s): far longer than the
/// session timeout, as with common settings (syncLimit 5 × tickTime 2 s = 10 s vs 4–6 s
/// sessions).
pub const SYNC_LIMIT: u64 = 100;

/// One ZooKeeper server process of the private ensemble (killed on drop).
pub struct Server {
    child: Child,
    /// The member's client address.
    pub client: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A 3-node ensemble whose peer links go through per-pair proxies.
pub struct Ensemble {
    /// The members, in `server.N` order (N = index + 1).
    pub servers: Vec<Server>,
    /// `links[from][to]`: the (quorum, election) proxies `from` uses to reach `to`.
    pub links: Vec<Vec<Option<(Proxy, Proxy)>>>,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn installed() -> bool {
    Path::new(ZK_JAR).exists()
        && std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("java").is_file()))
}

impl Ensemble {
    /// Starts the ensemble (`None`, printed, when ZooKeeper is not installed outside CI).
    pub fn start() -> Option<Ensemble> {
        Self::start_with(|_| String::new())
    }

    /// As [`Ensemble::start`], with `extra(i)` appended to member `i`'s configuration (a later
    /// line overrides an earlier one).
    pub fn start_with(extra: impl Fn(usize) -> String) -> Option<Ensemble> {
        if !installed() {
            assert!(
                std::env::var_os("CI").is_none(),
                "ZooKeeper is not installed (CI must have it)"
            );
            eprintln!("SKIP: ZooKeeper is not installed");
            return None;
        }
        let n = 3;
        let dir = std::env::temp_dir().join(format!(
            "dlock-zk-partition-{}-{}",
            std::process::id(),
            free_port()
        ));
        let dir = TempDir(dir);
        // (client, quorum, election) per node.
        let ports: Vec<[u16; 3]> = (0..n)
            .map(|_| [free_port(), free_port(), free_port()])
            .collect();
        let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let links: Vec<Vec<Option<(Proxy, Proxy)>>> = (0..n)
            .map(|from| {
                (0..n)
                    .map(|to| {
                        (from != to).then(|| {
                            (
                                Proxy::start(addr(ports[to][1])).unwrap(),
                                Proxy::start(addr(ports[to][2])).unwrap(),
                            )
                        })
                    })
                    .collect()
            })
            .collect();
        let mut servers = Vec::new();
        for i in 0..n {
            let node = dir.0.join(format!("zk{i}"));
            let data = node.join("data");
            std::fs::create_dir_all(&data).unwrap();
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).unwrap();
            let mut cfg = format!(
                "tickTime={TICK_MS}\ninitLimit=50\nsyncLimit={SYNC_LIMIT}\ndataDir={}\n\
                 clientPort={}\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\n\
                 minSessionTimeout=200\nmaxSessionTimeout=60000\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=*\nforceSync=no\n",
                data.display(),
                ports[i][0]
            );
            for (j, p) in ports.iter().enumerate() {
                let (q, e) = match &links[i][j] {
                    None => (p[1], p[2]),
                    Some((q, e)) => (q.addr().port(), e.addr().port()),
                };
                cfg.push_str(&format!("server.{}=127.0.0.1:{q}:{e}\n", j + 1));
            }
            cfg.push_str(&extra(i));
            let cfg_path = node.join("zoo.cfg");
            std::fs::write(&cfg_path, cfg).unwrap();
            let mut cp = ZK_JAR.to_owned();
            if Path::new("/usr/share/java/slf4j-simple.jar").exists() {
                cp.push_str(":/usr/share/java/slf4j-simple.jar");
            }
            let child = Command::new("java")
                .args([
                    "-Xms32m",
                    "-Xmx256m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                    "-Dzookeeper.admin.enableServer=false",
                    "-cp",
                    &cp,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                ])
                .arg(&cfg_path)
                .current_dir(&node)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            servers.push(Server {
                child,
                client: addr(ports[i][0]),
            });
        }
        Some(Ensemble {
            servers,
            links,
            _dir: dir,
        })
    }

    /// Each member's mode (`leader`, `follower`), if serving.
    pub fn modes(&self) -> Vec<Option<String>> {
        self.servers.iter().map(|s| zk_mode(s.client)).collect()
    }

    /// Waits for one leader and two followers; returns the leader's index.
    pub async fn wait_ready(&self) -> usize {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let modes = self.modes();
            let leaders: Vec<usize> = (0..modes.len())
                .filter(|&i| modes[i].as_deref() == Some("leader"))
                .collect();
            let followers = modes
                .iter()
                .filter(|m| m.as_deref() == Some("follower"))
                .count();
            if leaders.len() == 1 && followers == modes.len() - 1 {
                return leaders[0];
            }
            assert!(Instant::now() < end, "ensemble not ready: {modes:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Cuts every peer link between `a` and `b` (both directions, quorum and election).
    pub fn cut(&self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            if let Some((q, e)) = &self.links[from][to] {
                q.set(Mode::Blackhole);
                e.set(Mode::Blackhole);
            }
        }
    }

    /// Heals every peer link.
    pub fn heal(&self) {
        for row in &self.links {
            for (q, e) in row.iter().flatten() {
                q.set(Mode::Pass);
                e.set(Mode::Pass);
            }
        }
    }
}
