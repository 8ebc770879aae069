//! A lock holder in another PROCESS: this test binary re-executed as its hidden
//! `__crash_holder` test. Killing or pausing it (SIGKILL / SIGSTOP) really stops it, renewal
//! task included.
//!
//! Protocol: the child acquires the lock named in [`CRASH_HOLDER_VAR`] (in the [`Primitive`]
//! named there: a mutex lease, a leadership, a write or read lease, a semaphore's only
//! permit) and prints
//! `DLOCK_HOLDER granted token=<t> start_ns=<request start> at_ns=<reply>`; then it reads commands on stdin, one per line:
//! - `check` → `DLOCK_HOLDER state lost=<bool> deadline_ns=<ns> token=<t>`
//! - `release` → `DLOCK_HOLDER released ok=<bool>`
//!
//! and prints `DLOCK_HOLDER lost reason=<…> at_ns=<ns>` when `lost()` fires. All times are
//! CLOCK_MONOTONIC nanoseconds, comparable across processes on one host.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin};
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, Leadership, Lease, LockName};
use tokio::sync::mpsc::UnboundedReceiver;

use super::util::{mono_ns, within};
use super::{Ctx, Verdict};
use crate::servers::process::{self, Launch};
use crate::{ClientOptions, TestBackend};

/// The variable that turns the hidden `__crash_holder` test into a holder process:
/// `<namespace>|<lock name>|<ttl ms>|<primitive>`.
pub const CRASH_HOLDER_VAR: &str = "DLOCK_CRASH_HOLDER";
const TAG: &str = "DLOCK_HOLDER";

/// What a holder process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Primitive {
    /// A [`dlock_core::Locker`] lease.
    Mutex,
    /// A [`dlock_core::Election`] leadership.
    Leader,
    /// A [`dlock_core::RwLocker`] write lease.
    Write,
    /// The permit of a [`dlock_core::Semaphore`] of one.
    Permit,
}

impl Primitive {
    /// The primitive's name in [`CRASH_HOLDER_VAR`] and in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Primitive::Mutex => "mutex",
            Primitive::Leader => "election",
            Primitive::Write => "write",
            Primitive::Permit => "permit",
        }
    }

    fn parse(s: &str) -> Option<Primitive> {
        [
            Primitive::Mutex,
            Primitive::Leader,
            Primitive::Write,
            Primitive::Permit,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
}

/// What the holder process holds, as the process holds it.
enum Holding {
    Lease(Lease),
    Leader(Leadership),
}

impl Holding {
    fn lease(&self) -> &Lease {
        match self {
            Holding::Lease(l) => l,
            Holding::Leader(l) => l.lease(),
        }
    }

    async fn release(self) -> Result<(), dlock_core::Error> {
        match self {
            Holding::Lease(l) => l.release().await,
            Holding::Leader(l) => l.resign().await,
        }
    }
}

/// The holder process's request for `lock` in `kind`.
async fn hold(
    backend: &dyn TestBackend,
    opts: ClientOptions,
    kind: Primitive,
    lock: &LockName,
) -> Result<Holding, String> {
    let wait = AcquireOptions::wait(Duration::from_secs(30));
    let missing = || format!("the backend has no {}", kind.name());
    let built = |e: dlock_core::Error| format!("cannot build the holder's client: {e}");
    let held = match kind {
        Primitive::Mutex => {
            let c = backend.client(opts).await.map_err(built)?;
            Holding::Lease(c.acquire(lock, wait).await.map_err(|e| e.to_string())?)
        }
        Primitive::Leader => {
            let c = backend.election(opts).await.map_err(built)?;
            let c = c.ok_or_else(missing)?;
            Holding::Leader(
                c.campaign(lock, b"crashing", wait)
                    .await
                    .map_err(|e| e.to_string())?,
            )
        }
        Primitive::Write => {
            let c = backend.rw(opts).await.map_err(built)?.ok_or_else(missing)?;
            Holding::Lease(c.write(lock, wait).await.map_err(|e| e.to_string())?)
        }
        Primitive::Permit => {
            let c = backend.semaphore(opts).await.map_err(built)?;
            let c = c.ok_or_else(missing)?;
            Holding::Lease(
                c.acquire_permit(lock, 1, wait)
                    .await
                    .map_err(|e| e.to_string())?,
            )
        }
    };
    Ok(held)
}

/// The parent's handle on a holder process. Killed when dropped.
pub(crate) struct HolderProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: UnboundedReceiver<String>,
    output: Vec<String>,
    /// The token of the child's grant.
    pub token: u64,
    /// When the child's acquire request started (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    /// When the child's acquire returned its lease (CLOCK_MONOTONIC ns).
    pub granted_ns: u64,
}

impl HolderProcess {
    /// Starts a mutex holder and waits until it reports its grant.
    pub(crate) async fn start(ctx: &Ctx, lock: &LockName) -> Result<HolderProcess, Verdict> {
        HolderProcess::start_holding(ctx, lock, Primitive::Mutex).await
    }

    /// Starts a holder of `kind` and waits until it reports its grant.
    pub(crate) async fn start_holding(
        ctx: &Ctx,
        lock: &LockName,
        kind: Primitive,
    ) -> Result<HolderProcess, Verdict> {
        let mut holder = HolderProcess::spawn_holding(ctx, lock, kind)?;
        holder.granted().await?;
        Ok(holder)
    }

    /// Waits until the process reports its grant (60 s at most) and notes its token.
    pub(crate) async fn granted(&mut self) -> Result<(), Verdict> {
        let granted = self.expect("granted", Duration::from_secs(60)).await;
        let Some(rest) = granted else {
            return Err(Verdict::Fail(format!(
                "the holder process never reported its grant; its output:\n{}",
                self.output()
            )));
        };
        let (token, start_ns) = (field(&rest, "token"), field(&rest, "start_ns"));
        let (Some(token), Some(start_ns)) = (token, start_ns) else {
            return Err(Verdict::Fail(format!("unreadable grant line {rest:?}")));
        };
        self.token = token;
        self.start_ns = start_ns;
        self.granted_ns = field(&rest, "at_ns").unwrap_or_else(mono_ns);
        Ok(())
    }

    /// Starts a mutex holder process; it begins acquiring `lock` (and may wait in its queue).
    pub(crate) fn spawn(ctx: &Ctx, lock: &LockName) -> Result<HolderProcess, Verdict> {
        HolderProcess::spawn_holding(ctx, lock, Primitive::Mutex)
    }

    /// Starts a holder process of `kind`; it begins requesting `lock`.
    pub(crate) fn spawn_holding(
        ctx: &Ctx,
        lock: &LockName,
        kind: Primitive,
    ) -> Result<HolderProcess, Verdict> {
        let exe = std::env::current_exe()
            .map_err(|e| Verdict::Fail(format!("cannot find the test binary: {e}")))?;
        let mut env = ctx.backend().child_env();
        env.push((
            CRASH_HOLDER_VAR.into(),
            format!(
                "{}|{}|{}|{}",
                ctx.ns(),
                lock,
                ctx.ttl().as_millis(),
                kind.name()
            ),
        ));
        env.push(("RUST_BACKTRACE".into(), "0".into()));
        let launch = Launch {
            program: exe,
            args: [
                &format!("{}::__crash_holder", ctx.module),
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            cwd: None,
            env,
            stdin_piped: true,
        };
        let mut child = process::spawn(launch)
            .map_err(|e| Verdict::Fail(format!("cannot start the holder process: {e}")))?;
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel::<String>();
        let streams: [Option<Box<dyn std::io::Read + Send>>; 2] = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ];
        for stream in streams.into_iter().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let stdin = child.stdin.take();
        Ok(HolderProcess {
            child,
            stdin,
            lines,
            output: Vec::new(),
            token: 0,
            start_ns: 0,
            granted_ns: 0,
        })
    }

    /// Waits for the next line `DLOCK_HOLDER <event> …` and returns what follows the event.
    pub(crate) async fn expect(&mut self, event: &str, bound: Duration) -> Option<String> {
        let prefix = format!("{TAG} {event}");
        let lines = &mut self.lines;
        let output = &mut self.output;
        within(bound, async {
            while let Some(line) = lines.recv().await {
                output.push(line.clone());
                // libtest may print "test …::__crash_holder ... " on the same line first.
                if let Some(at) = line.find(&prefix) {
                    return Some(line[at + prefix.len()..].to_string());
                }
            }
            None
        })
        .await
        .flatten()
    }

    /// Sends one command line.
    pub(crate) fn send(&mut self, command: &str) -> Result<(), Verdict> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| Verdict::Fail("the holder's stdin is closed".into()))?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .map_err(|e| Verdict::Fail(format!("cannot send {command:?} to the holder: {e}")))
    }

    /// SIGSTOP.
    pub(crate) fn pause(&self) -> Result<(), Verdict> {
        process::signal(self.child.id(), libc::SIGSTOP)
            .map_err(|e| Verdict::Fail(format!("cannot pause the holder: {e}")))
    }

    /// SIGCONT.
    pub(crate) fn resume(&self) -> Result<(), Verdict> {
        process::signal(self.child.id(), libc::SIGCONT)
            .map_err(|e| Verdict::Fail(format!("cannot resume the holder: {e}")))
    }

    /// SIGKILL and reap.
    pub(crate) fn kill(&mut self) {
        process::kill_and_reap(&mut self.child);
    }

    /// The output seen so far (at most 30 lines).
    pub(crate) fn output(&self) -> String {
        let lines: Vec<&str> = self
            .output
            .iter()
            .map(String::as_str)
            .filter(|l| !l.trim().is_empty())
            .collect();
        let skip = lines.len().saturating_sub(30);
        lines[skip..].join("\n")
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `key=<u64>` from a protocol line.
pub(crate) fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// The body of the hidden `__crash_holder` test: does nothing unless [`CRASH_HOLDER_VAR`] is
/// set; then it is the holder process described in the module docs.
///
/// # Panics
/// When the variable is malformed or the lock cannot be acquired (the parent reports the
/// output).
pub fn crash_holder_main(factory: fn() -> Arc<dyn TestBackend>) {
    let Ok(spec) = std::env::var(CRASH_HOLDER_VAR) else {
        return;
    };
    let mut parts = spec.splitn(4, '|');
    let (Some(ns), Some(lock), Some(ttl), Some(kind)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        panic!("malformed {CRASH_HOLDER_VAR}={spec:?}");
    };
    let kind = Primitive::parse(kind).unwrap_or_else(|| panic!("bad primitive in {spec:?}"));
    let ttl = Duration::from_millis(
        ttl.parse()
            .unwrap_or_else(|e| panic!("bad ttl in {spec:?}: {e}")),
    );
    let lock = LockName::new(lock).unwrap_or_else(|e| panic!("bad lock name in {spec:?}: {e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a runtime: {e}"));
    runtime.block_on(async move {
        let backend = factory();
        let start_ns = mono_ns();
        let held = hold(&*backend, ClientOptions::new(ns, ttl), kind, &lock)
            .await
            .unwrap_or_else(|e| panic!("the holder cannot take {lock} ({}): {e}", kind.name()));
        let granted_ns = mono_ns();
        say(&format!(
            "granted token={} start_ns={start_ns} at_ns={granted_ns}",
            held.lease().token()
        ));
        let lost = held.lease().lost();
        tokio::spawn(async move {
            let reason = lost.await;
            say(&format!("lost at_ns={} reason={reason}", mono_ns()));
        });
        // Commands from stdin, read on a plain thread (stdin is blocking).
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lease = Some(held);
        while let Some(cmd) = rx.recv().await {
            match (cmd.trim(), lease.as_ref().map(Holding::lease)) {
                ("check", Some(l)) => {
                    let now = tokio::time::Instant::now();
                    let deadline = l.deadline();
                    let deadline_ns = if deadline >= now {
                        mono_ns() + (deadline - now).as_nanos() as u64
                    } else {
                        mono_ns().saturating_sub((now - deadline).as_nanos() as u64)
                    };
                    say(&format!(
                        "state lost={} deadline_ns={deadline_ns} token={}",
                        l.is_lost(),
                        l.token()
                    ));
                }
                ("release", Some(_)) => {
                    let ok = match lease.take() {
                        Some(l) => l.release().await.is_ok(),
                        None => false,
                    };
                    say(&format!("released ok={ok}"));
                }
                (other, _) => say(&format!("unknown command={other:?}")),
            }
        }
        // stdin closed (or never open): hold until killed.
        std::future::pending::<()>().await;
        drop(lease);
    });
}

fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{TAG} {text}");
    let _ = out.flush();
}
