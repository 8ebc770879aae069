//! Child processes the harness starts: spawned as direct children from one long-lived thread,
//! each in its own process group, and killed at process exit.
//!
//! Three layers make sure no server outlives the test process:
//! - [`Cluster`](super::Cluster) and [`Node`](super::Node) kill their processes when dropped;
//! - an `atexit` handler SIGKILLs every process still registered (shared clusters live in
//!   statics, which are never dropped);
//! - `PR_SET_PDEATHSIG(SIGKILL)` in each child, in case the test process is itself SIGKILLed.
//!   The kernel sends it when the *thread* that forked the child exits, so every child is
//!   forked by one dedicated thread that lives as long as the process.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, Once, OnceLock};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: Option<PathBuf>,
    pub env: Vec<(String, String)>,
    /// Pipe stdin (to send commands); otherwise it is /dev/null.
    pub stdin_piped: bool,
}

struct Request {
    launch: Launch,
    reply: mpsc::Sender<io::Result<Child>>,
}

#[derive(Default)]
struct Registry {
    pids: HashSet<i32>,
    dirs: Vec<PathBuf>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
static ATEXIT: Once = Once::new();

fn registry() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

extern "C" fn kill_all_at_exit() {
    // Never block at exit: if another thread holds the lock, PDEATHSIG is the backstop.
    let Ok(mut guard) = REGISTRY.try_lock() else {
        return;
    };
    let Some(reg) = guard.as_mut() else { return };
    for &pid in &reg.pids {
        // SAFETY: plain syscalls on pids this process started and has not reaped.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
    }
    for &pid in &reg.pids {
        // SAFETY: reaps our own child; a null status pointer is allowed.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
    reg.pids.clear();
    for dir in reg.dirs.drain(..) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn ensure_atexit() {
    ATEXIT.call_once(|| {
        // SAFETY: registers a plain extern "C" function with no captured state.
        unsafe {
            libc::atexit(kill_all_at_exit);
        }
    });
}

/// Registers a directory to remove at exit (data dirs of shared clusters).
pub(crate) fn register_dir(dir: PathBuf) {
    ensure_atexit();
    registry()
        .get_or_insert_with(Registry::default)
        .dirs
        .push(dir);
}

/// Forgets a pid once its process was reaped (so a recycled pid is never killed).
pub(crate) fn unregister(pid: u32) {
    if let Some(reg) = registry().as_mut() {
        reg.pids.remove(&(pid as i32));
    }
}

fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("dlock-harness-spawner".into())
            .spawn(move || {
                for req in rx {
                    let _ = req.reply.send(spawn_here(&req.launch));
                }
            })
            .map_or_else(
                |e| panic!("cannot start the harness spawner thread: {e}"),
                drop,
            );
        Mutex::new(tx)
    })
}

fn spawn_here(launch: &Launch) -> io::Result<Child> {
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args)
        .stdin(if launch.stdin_piped {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cwd) = &launch.cwd {
        cmd.current_dir(cwd);
    }
    for (k, v) in &launch.env {
        cmd.env(k, v);
    }
    let parent = std::process::id() as i32;
    // SAFETY: only async-signal-safe calls (setpgid, prctl, getppid, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    ensure_atexit();
    registry()
        .get_or_insert_with(Registry::default)
        .pids
        .insert(child.id() as i32);
    Ok(child)
}

/// Spawns `launch` as a direct child, from the long-lived spawner thread, in its own process
/// group, with stdout and stderr piped and `PR_SET_PDEATHSIG(SIGKILL)` set.
pub(crate) fn spawn(launch: Launch) -> io::Result<Child> {
    let (reply, rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(Request { launch, reply })
        .map_err(|_| io::Error::other("the harness spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the harness spawner thread is gone"))?
}

/// Sends `sig` to the process group of `pid` (and to `pid` itself).
pub(crate) fn signal(pid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: plain syscalls on a child we started and have not reaped.
    let rc = unsafe {
        libc::kill(-(pid as i32), sig);
        libc::kill(pid as i32, sig)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// SIGKILLs `child`'s process group and reaps it.
pub(crate) fn kill_and_reap(child: &mut Child) {
    let pid = child.id();
    let _ = signal(pid, libc::SIGCONT);
    let _ = signal(pid, libc::SIGKILL);
    let _ = child.wait();
    unregister(pid);
}
