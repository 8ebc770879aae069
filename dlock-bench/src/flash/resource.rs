//! The parent's side of the flash sale: the fenced resource the clients write to, the record
//! of every critical section (for the observer), and the pause nemesis, on one local TCP
//! listener (the protocol is in `child.rs`).
//!
//! The resource keeps two registers per name and gives every request to both:
//! - the unfenced one accepts every write (fencing off);
//! - the fenced one keeps the highest token any request of the name carried (a section's
//!   first request, its read, raises it too) and rejects a write whose token is below it
//!   (fencing on). A write without a token is not judged by it.
//!
//! A client's behaviour does not depend on the answer, so one run measures a contender with
//! fencing off and on, under the same grants and the same pauses.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

use super::child::now_ns;
use super::observer::Section;

/// What the resource recorded.
#[derive(Default)]
pub struct Record {
    /// The highest token per name (the fenced register).
    fence: HashMap<String, u64>,
    /// Every section, closed or not (the observer judges them).
    pub sections: Vec<Section>,
    /// Clients that said hello.
    pub hellos: usize,
    /// Per client that finished: acquire errors and release errors.
    pub finals: Vec<(u64, u64)>,
    /// Lines that broke the protocol, and pauses the nemesis failed to make or end.
    pub faults: Vec<String>,
}

impl Record {
    /// Raises `name`'s fence to `token`; whether `token` was at least the fence before.
    fn fenced(&mut self, name: &str, token: u64) -> bool {
        let fence = self.fence.entry(name.to_string()).or_insert(0);
        let ok = token >= *fence;
        *fence = (*fence).max(token);
        ok
    }
}

/// The pause nemesis: when armed, the next client to begin a section is stopped (SIGSTOP)
/// for `pause`, then continued.
pub struct Nemesis {
    armed: AtomicBool,
    pub pause: Duration,
    /// Pauses made and ended.
    pub pauses: AtomicU64,
    /// Told when a pause ended.
    pub ended: Notify,
}

impl Nemesis {
    pub fn new(pause: Duration) -> Arc<Nemesis> {
        Arc::new(Nemesis {
            armed: AtomicBool::new(false),
            pause,
            pauses: AtomicU64::new(0),
            ended: Notify::new(),
        })
    }

    /// The next section to begin will be paused.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// No more pauses.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }
}

/// The resource's shared state.
pub struct Resource {
    pub record: Mutex<Record>,
    pub nemesis: Arc<Nemesis>,
    /// The run's end (unix ms), sent to every client once all have said hello.
    go: watch::Sender<Option<u64>>,
    /// The children's pids: the only processes the nemesis may signal.
    pids: Mutex<Vec<u32>>,
    /// Told on every hello.
    pub hello: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Resource {
    /// Listens on a loopback port; serves every client in a task of its own.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(nemesis: Arc<Nemesis>) -> Result<(Arc<Resource>, SocketAddr), String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("resource bind: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let r = Arc::new(Resource {
            record: Mutex::new(Record::default()),
            nemesis,
            go: watch::Sender::new(None),
            pids: Mutex::new(Vec::new()),
            hello: Notify::new(),
        });
        let me = Arc::clone(&r);
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let me = Arc::clone(&me);
                tokio::spawn(async move {
                    if let Err(e) = Arc::clone(&me).serve(conn).await {
                        lock(&me.record).faults.push(e);
                    }
                });
            }
        });
        Ok((r, addr))
    }

    /// Clients that said hello.
    pub fn record_hellos(&self) -> usize {
        lock(&self.record).hellos
    }

    /// Clients that reported their end.
    pub fn finished(&self) -> usize {
        lock(&self.record).finals.len()
    }

    /// What was recorded (the record is left empty).
    pub fn take(&self) -> Record {
        std::mem::take(&mut *lock(&self.record))
    }

    /// A child the nemesis may signal.
    pub fn allow(&self, pid: u32) {
        lock(&self.pids).push(pid);
    }

    /// Lets every client start, until `until_ms` (unix ms).
    pub fn go(&self, until_ms: u64) {
        self.go.send_replace(Some(until_ms));
    }

    fn signal(&self, pid: u32, sig: Signal) -> Result<(), String> {
        if !lock(&self.pids).contains(&pid) {
            return Err(format!("pid {pid} is not one of the clients"));
        }
        let raw = i32::try_from(pid).map_err(|e| e.to_string())?;
        kill(Pid::from_raw(raw), sig).map_err(|e| format!("{sig} to {pid}: {e}"))
    }

    /// Stops `pid` now and continues it after the nemesis's pause, in the background.
    fn pause(self: &Arc<Self>, pid: u32) -> Result<(), String> {
        self.signal(pid, Signal::SIGSTOP)?;
        let me = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(me.nemesis.pause).await;
            if let Err(e) = me.signal(pid, Signal::SIGCONT) {
                lock(&me.record).faults.push(e);
            }
            me.nemesis.pauses.fetch_add(1, Ordering::SeqCst);
            me.nemesis.ended.notify_one();
        });
        Ok(())
    }

    async fn serve(self: Arc<Self>, conn: TcpStream) -> Result<(), String> {
        let (read, mut write) = conn.into_split();
        let mut lines = BufReader::new(read).lines();
        let (mut client, mut pid) = (0usize, 0u32);
        let mut open: Option<Section> = None;
        let bad = |line: &str| format!("resource: bad line {line:?}");
        while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
            let f: Vec<&str> = line.split(' ').collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
            let answer = match f[0] {
                "H" => {
                    client = num(1)
                        .and_then(|c| usize::try_from(c).ok())
                        .ok_or(bad(&line))?;
                    pid = num(2)
                        .and_then(|p| u32::try_from(p).ok())
                        .ok_or(bad(&line))?;
                    lock(&self.record).hellos += 1;
                    self.hello.notify_one();
                    let mut go = self.go.subscribe();
                    let until = go
                        .wait_for(Option::is_some)
                        .await
                        .map_err(|e| e.to_string())?;
                    Some(format!("go {}", until.unwrap_or(0)))
                }
                "B" => {
                    let name = f.get(1).ok_or(bad(&line))?.to_string();
                    let token = num(2);
                    let (enter_ns, acquire_us) = num(3).zip(num(4)).ok_or(bad(&line))?;
                    let mut s = Section {
                        name,
                        client,
                        token,
                        enter_ns,
                        acquire_us,
                        read_ns: Some(now_ns()),
                        ..Section::default()
                    };
                    {
                        let mut r = lock(&self.record);
                        if let Some(prev) = open.take() {
                            r.sections.push(prev);
                        }
                        if let Some(t) = token {
                            r.fenced(&s.name, t);
                        }
                    }
                    if self.nemesis.armed.swap(false, Ordering::SeqCst) {
                        s.paused = true;
                        // Stopped before it hears back: it writes once continued.
                        if let Err(e) = self.pause(pid) {
                            lock(&self.record).faults.push(e);
                            s.paused = false;
                        }
                    }
                    open = Some(s);
                    Some("ok".to_string())
                }
                "W" => {
                    let s = open.as_mut().ok_or(bad(&line))?;
                    let mut r = lock(&self.record);
                    s.write_ns = Some(now_ns());
                    s.fenced_accepted = s.token.map(|t| r.fenced(&s.name, t));
                    Some(
                        match s.fenced_accepted {
                            Some(true) => "A",
                            Some(false) => "R",
                            None => "-",
                        }
                        .to_string(),
                    )
                }
                "E" => {
                    let mut s = open.take().ok_or(bad(&line))?;
                    s.exit_ns = Some(num(1).ok_or(bad(&line))?);
                    lock(&self.record).sections.push(s);
                    None
                }
                "F" => {
                    let fin = num(1).zip(num(2)).ok_or(bad(&line))?;
                    lock(&self.record).finals.push(fin);
                    None
                }
                _ => return Err(bad(&line)),
            };
            if let Some(a) = answer {
                write
                    .write_all(format!("{a}\n").as_bytes())
                    .await
                    .map_err(|e| format!("resource: to client {client}: {e}"))?;
            }
        }
        if let Some(s) = open {
            lock(&self.record).sections.push(s);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fenced_register_rejects_a_lower_token_only() {
        let mut r = Record::default();
        assert!(r.fenced("a", 5));
        assert!(r.fenced("a", 5), "the holder's own write after its read");
        assert!(r.fenced("a", 7));
        assert!(!r.fenced("a", 5), "a late write of an older holder");
        assert!(r.fenced("b", 1), "names are independent");
        assert!(r.fenced("a", 8));
    }
}
