//! Peer links behind fault proxies, so a test can cut one node of a cluster from another while
//! every client connection stays up (see [`Cluster::start_partitionable`](super::Cluster)).
//!
//! - **ZooKeeper**: each server's own `zoo.cfg` lists the addresses it dials to reach its
//!   peers, so every ordered pair (from, to) gets its own proxies for the quorum and the
//!   election port, and `from`'s config names them.
//! - **etcd**: every member dials the one peer URL a member advertises, so per-pair proxies
//!   cannot be named in any config. Each member instead advertises a *router*; the router finds
//!   which member dialed it (the process owning the connection's other end, from
//!   `/proc/net/tcp` and `/proc/<pid>/fd`) and forwards the connection through the proxy of
//!   that (from, to) pair. Connections from any other process go straight to the member.
//!
//! Cutting a pair blackholes its proxies in both directions (connections stay open, nothing
//! passes: a silent partition); healing passes the held bytes on.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;

use tokio::net::{TcpListener, TcpStream};

use super::HarnessError;
use crate::faults::{Mode, Proxy, Served, Step};

/// The proxies of one ordered pair (from, to): ZooKeeper quorum and election, or one etcd peer
/// link.
pub(crate) struct Link {
    pub(crate) proxies: Vec<Proxy>,
}

/// Every peer link of a partitionable cluster: `links[from][to]`, `None` on the diagonal.
pub(crate) struct Links {
    pub(crate) links: Vec<Vec<Option<Link>>>,
    /// etcd only: the router each member advertises, in member order.
    pub(crate) routers: Vec<Router>,
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn io_err(what: &str, e: &io::Error) -> HarnessError {
    HarnessError::Io(format!("partitionable cluster: cannot {what}: {e}"))
}

impl Links {
    /// Per-pair proxies to the ports `targets(to)` of each node (`n` nodes).
    pub(crate) fn start(
        n: usize,
        targets: impl Fn(usize) -> Vec<u16>,
    ) -> Result<Links, HarnessError> {
        let mut links = Vec::with_capacity(n);
        for from in 0..n {
            let mut row = Vec::with_capacity(n);
            for to in 0..n {
                if from == to {
                    row.push(None);
                    continue;
                }
                let proxies = targets(to)
                    .into_iter()
                    .map(|p| Proxy::start(loopback(p)))
                    .collect::<io::Result<Vec<_>>>()
                    .map_err(|e| io_err(&format!("start the proxy of link {from}→{to}"), &e))?;
                row.push(Some(Link { proxies }));
            }
            links.push(row);
        }
        Ok(Links {
            links,
            routers: Vec::new(),
        })
    }

    /// The ports `from` dials to reach `to` (its proxies'), in the order of `targets(to)`.
    pub(crate) fn dial_ports(&self, from: usize, to: usize) -> Vec<u16> {
        self.links[from][to]
            .as_ref()
            .map(|l| l.proxies.iter().map(|p| p.addr().port()).collect())
            .unwrap_or_default()
    }

    /// Sets every proxy of the pair (a, b), both directions of both links.
    pub(crate) fn set_pair(&self, a: usize, b: usize, mode: Mode) {
        for (from, to) in [(a, b), (b, a)] {
            if let Some(link) = &self.links[from][to] {
                link.proxies.iter().for_each(|p| p.set(mode));
            }
        }
    }

    /// Whether the pair (a, b) is cut (any of its proxies not passing).
    pub(crate) fn is_cut(&self, a: usize, b: usize) -> bool {
        [(a, b), (b, a)].iter().any(|&(from, to)| {
            self.links[from][to].as_ref().is_some_and(|l| {
                l.proxies.iter().any(|p| {
                    p.mode(crate::faults::Direction::Upstream) != Mode::Pass
                        || p.mode(crate::faults::Direction::Downstream) != Mode::Pass
                })
            })
        })
    }
}

/// Member pids, in member order (`None` while a member is down); shared with the routers.
pub(crate) type Pids = Arc<Mutex<Vec<Option<u32>>>>;

/// A listener in front of one etcd member's peer port that forwards each connection through
/// the proxy of the (dialer, member) link.
pub(crate) struct Router {
    served: Served,
}

impl Router {
    /// A router for member `to`: connections from member `i` go to `via[i]` (the proxy of link
    /// i→to), any other connection to `direct`.
    pub(crate) fn start(
        to: usize,
        via: Vec<Option<SocketAddr>>,
        direct: SocketAddr,
        pids: Pids,
    ) -> Result<Router, HarnessError> {
        let served = Served::start("router", move |listener, addr| {
            route(listener, addr, via, direct, pids)
        })
        .map_err(|(step, e)| {
            let what = match step {
                Step::Bind => format!("bind the router of member {to}"),
                Step::NonBlocking => "make the router non-blocking".into(),
                Step::Address => "read the router's address".into(),
                Step::Runtime => "build the router's runtime".into(),
                Step::Thread => "start the router's thread".into(),
            };
            io_err(&what, &e)
        })?;
        Ok(Router { served })
    }

    /// Where the member's peers connect (the member advertises this).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.served.addr
    }
}

async fn route(
    listener: TcpListener,
    me: SocketAddr,
    via: Vec<Option<SocketAddr>>,
    direct: SocketAddr,
    pids: Pids,
) {
    loop {
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("router accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let members = pids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let from = dialer(peer.port(), me.port(), &members);
        let target = from
            .and_then(|i| via.get(i).copied().flatten())
            .unwrap_or(direct);
        tracing::debug!(?from, %target, "router {me}: connection from {peer}");
        tokio::spawn(async move {
            let Ok(mut upstream) = TcpStream::connect(target).await else {
                let _ = conn.set_zero_linger();
                return;
            };
            let mut conn = conn;
            let _ = conn.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
        });
    }
}

/// The member whose process owns the loopback socket `127.0.0.1:local → 127.0.0.1:remote`.
fn dialer(local: u16, remote: u16, members: &[Option<u32>]) -> Option<usize> {
    let inode = socket_inode(local, remote)?;
    let wanted = format!("socket:[{inode}]");
    members.iter().position(|pid| {
        pid.is_some_and(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|dir| {
                dir.flatten().any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.as_os_str() == wanted.as_str())
                })
            })
        })
    })
}

/// The inode of the IPv4 TCP socket with local port `local` and remote port `remote`.
fn socket_inode(local: u16, remote: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    for line in table.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (Some(l), Some(r), Some(inode)) = (cols.get(1), cols.get(2), cols.get(9)) else {
            continue;
        };
        let port = |a: &str| {
            a.rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
        };
        if port(l) == Some(local) && port(r) == Some(remote) {
            // A closed socket (TIME_WAIT) has inode 0 and no owner.
            match inode.parse() {
                Ok(0) | Err(_) => continue,
                Ok(i) => return Some(i),
            }
        }
    }
    None
}
