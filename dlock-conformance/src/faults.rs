//! Fault tools: a TCP proxy that can pass, blackhole, reset or delay a client↔server link, per
//! direction, switchable while traffic flows.
//!
//! ```no_run
//! use dlock_conformance::faults::{Direction, Mode, Proxy};
//! let upstream = "127.0.0.1:6379".parse().expect("address");
//! let proxy = Proxy::start(upstream)?;
//! // connect the client to proxy.addr() ...
//! proxy.set(Mode::Blackhole); // a hung peer: connections stay open, nothing passes
//! proxy.set_direction(Direction::Downstream, Mode::Blackhole); // request arrives, reply is lost
//! proxy.set(Mode::Pass);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// What the proxy does with the bytes of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes as they come.
    Pass,
    /// Keep connections open and pass nothing (a hung peer or a silent partition). As TCP
    /// would retransmit them, bytes are held, not lost: they arrive if the direction returns to
    /// `Pass` or `Delay`, and are discarded by `Reset` (blackhole, then reset = a lost reply).
    Blackhole,
    /// Reset every open connection (RST) and every new one at once.
    Reset,
    /// Forward bytes this long after they were read: a latency, not a bandwidth limit (bytes
    /// in flight do not wait for each other).
    Delay(Duration),
}

/// One direction of a proxied link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server (requests).
    Upstream,
    /// Server to client (replies, watch events).
    Downstream,
}

struct State {
    up: watch::Sender<Mode>,
    down: watch::Sender<Mode>,
    connections: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    /// When bytes were forwarded upstream, the latest [`UPSTREAM_LOG`] times.
    up_log: std::sync::Mutex<VecDeque<Instant>>,
    upstream: SocketAddr,
}

/// How many upstream forwarding times a proxy keeps ([`Proxy::upstream_log`]).
const UPSTREAM_LOG: usize = 512;

/// One direction's byte count (and upstream, its log of forwarding times).
struct Tally<'a> {
    bytes: &'a AtomicU64,
    log: Option<&'a std::sync::Mutex<VecDeque<Instant>>>,
}

impl Tally<'_> {
    fn forwarded(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(log) = self.log {
            let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
            if log.len() == UPSTREAM_LOG {
                log.pop_front();
            }
            log.push_back(Instant::now());
        }
    }
}

/// A TCP proxy in front of one server address, running on a runtime thread of its own so it
/// works from sync and async tests alike. Dropping it closes every connection.
pub struct Proxy {
    served: Served,
    state: Arc<State>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.served.addr)
            .field("upstream", &self.state.upstream)
            .field("up", &*self.state.up.borrow())
            .field("down", &*self.state.down.borrow())
            .finish()
    }
}

impl Proxy {
    /// Listens on `127.0.0.1:<free port>` and forwards each accepted connection to `upstream`,
    /// in [`Mode::Pass`].
    ///
    /// # Errors
    /// When the listener or its runtime thread cannot be created.
    pub fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let state = Arc::new(State {
            up: watch::Sender::new(Mode::Pass),
            down: watch::Sender::new(Mode::Pass),
            connections: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            up_log: std::sync::Mutex::new(VecDeque::with_capacity(UPSTREAM_LOG)),
            upstream,
        });
        let st = Arc::clone(&state);
        let served = Served::start("proxy", move |listener, _| accept_loop(listener, st))
            .map_err(|(_, e)| e)?;
        Ok(Proxy { served, state })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.served.addr
    }

    /// The server address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.state.upstream
    }

    /// Sets both directions. Takes effect at once, also on open connections.
    pub fn set(&self, mode: Mode) {
        self.state.up.send_replace(mode);
        self.state.down.send_replace(mode);
    }

    /// Sets one direction. [`Mode::Reset`] resets the whole connection whichever direction it
    /// is set on.
    pub fn set_direction(&self, direction: Direction, mode: Mode) {
        match direction {
            Direction::Upstream => self.state.up.send_replace(mode),
            Direction::Downstream => self.state.down.send_replace(mode),
        };
    }

    /// The current mode of `direction`.
    pub fn mode(&self, direction: Direction) -> Mode {
        match direction {
            Direction::Upstream => *self.state.up.borrow(),
            Direction::Downstream => *self.state.down.borrow(),
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }

    /// Bytes forwarded so far in `direction` (bytes held by a blackhole count once delivered).
    pub fn bytes(&self, direction: Direction) -> u64 {
        match direction {
            Direction::Upstream => self.state.bytes_up.load(Ordering::Relaxed),
            Direction::Downstream => self.state.bytes_down.load(Ordering::Relaxed),
        }
    }

    /// When bytes were forwarded upstream (client to server), oldest first: the latest
    /// 512 times. Shows when a client talked to its server and how long it was silent.
    pub fn upstream_log(&self) -> Vec<Instant> {
        self.state
            .up_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect()
    }
}

/// The step of [`Served::start`] that failed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    Bind,
    NonBlocking,
    Address,
    Runtime,
    Thread,
}

/// A listener on `127.0.0.1:<free port>` served on a current-thread runtime of its own thread
/// (named `dlock-<label>-<port>`), so it works from sync and async code alike. Dropping it
/// stops the runtime, which drops every connection task and closes its sockets.
pub(crate) struct Served {
    pub(crate) addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    /// Binds, then runs `serve(listener, its address)` on the new thread until dropped.
    pub(crate) fn start<F, Fut>(label: &'static str, serve: F) -> Result<Served, (Step, io::Error)>
    where
        F: FnOnce(TcpListener, SocketAddr) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| (Step::Bind, e))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| (Step::NonBlocking, e))?;
        let addr = std_listener.local_addr().map_err(|e| (Step::Address, e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| (Step::Runtime, e))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("dlock-{label}-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!("{label} listener: {e}");
                            return;
                        }
                    };
                    tokio::select! {
                        _ = stopped => {}
                        () = serve(listener, addr) => {}
                    }
                });
            })
            .map_err(|e| (Step::Thread, e))?;
        Ok(Served {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn is_reset(st: &State) -> bool {
    *st.up.borrow() == Mode::Reset || *st.down.borrow() == Mode::Reset
}

async fn accept_loop(listener: TcpListener, st: Arc<State>) {
    loop {
        let client = match listener.accept().await {
            Ok((c, _)) => c,
            Err(e) => {
                tracing::warn!("proxy accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        st.connections.fetch_add(1, Ordering::Relaxed);
        let st = Arc::clone(&st);
        tokio::spawn(async move {
            if is_reset(&st) {
                abort(client);
                return;
            }
            let server = match TcpStream::connect(st.upstream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!("proxy upstream {}: {e}", st.upstream);
                    abort(client);
                    return;
                }
            };
            link(client, server, st).await;
        });
    }
}

/// Closes with RST rather than FIN.
fn abort(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}

async fn link(client: TcpStream, server: TcpStream, st: Arc<State>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let (a, b) = tokio::join!(
        pump(
            &mut cr,
            &mut sw,
            st.up.subscribe(),
            st.down.subscribe(),
            Tally {
                bytes: &st.bytes_up,
                log: Some(&st.up_log),
            },
        ),
        pump(
            &mut sr,
            &mut cw,
            st.down.subscribe(),
            st.up.subscribe(),
            Tally {
                bytes: &st.bytes_down,
                log: None,
            },
        ),
    );
    if a == End::Reset || b == End::Reset {
        if let Ok(c) = cr.reunite(cw) {
            abort(c);
        }
        if let Ok(s) = sr.reunite(sw) {
            abort(s);
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum End {
    Closed,
    Reset,
}

/// Bytes held (in flight or behind a blackhole) beyond which the proxy stops reading
/// (back-pressure, as a full TCP window would).
const HOLD_CAP: usize = 8 * 1024 * 1024;

/// Forwards one direction. Every read is queued with the time it is due (now, or now plus the
/// delay in [`Mode::Delay`]) and written in order once due, so bytes in flight do not wait for
/// each other: a delay is a latency, not one read per delay. Bytes are judged by the mode at
/// forwarding time: a blackhole holds them (delivered if the link heals), a reset discards them.
async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    mut other: watch::Receiver<Mode>,
    tally: Tally<'_>,
) -> End {
    let mut buf = vec![0u8; 16 * 1024];
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut queued = 0usize;
    let mut eof = false;
    loop {
        if *mode.borrow_and_update() == Mode::Reset || *other.borrow_and_update() == Mode::Reset {
            return End::Reset;
        }
        let blocked = *mode.borrow() == Mode::Blackhole;
        if !blocked {
            while queue.front().is_some_and(|(due, _)| *due <= Instant::now()) {
                let Some((_, bytes)) = queue.pop_front() else {
                    break;
                };
                if to.write_all(&bytes).await.is_err() {
                    return End::Closed;
                }
                queued -= bytes.len();
                tally.forwarded(bytes.len());
            }
        }
        if eof && queue.is_empty() {
            let _ = to.shutdown().await;
            return End::Closed;
        }
        let next_due = queue.front().map(|(due, _)| *due).filter(|_| !blocked);
        let can_read = !eof && queued < HOLD_CAP;
        tokio::select! {
            read = from.read(&mut buf), if can_read => {
                let n = match read {
                    Ok(0) | Err(_) => {
                        eof = true;
                        continue;
                    }
                    Ok(n) => n,
                };
                let due = match *mode.borrow() {
                    Mode::Delay(d) => Instant::now() + d,
                    _ => Instant::now(),
                };
                queued += n;
                queue.push_back((due, buf[..n].to_vec()));
            }
            () = sleep_until_due(next_due), if next_due.is_some() => {}
            _ = mode.changed() => {}
            _ = other.changed() => {}
        }
    }
}

async fn sleep_until_due(due: Option<Instant>) {
    if let Some(due) = due {
        tokio::time::sleep_until(due).await;
    }
}
