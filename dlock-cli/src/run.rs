//! `dlock run`: hold a lock while a command runs.

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use dlock_core::{
    AcquireOptions, Error, FencingToken, Leadership, Lease, LockName, Locker, LossReason,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::{self, Failure};
use crate::target::{Source, Target};
use crate::{RunArgs, lock_name, runtime};

/// After how long a wait `dlock run` says on a terminal that it is waiting.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Runs `dlock run`; `Ok` carries the command's exit code.
pub(crate) fn main(source: &Source, args: RunArgs) -> Result<ExitCode, Failure> {
    let target = source.target(args.ttl)?;
    let name = lock_name(&args.name)?;
    // A name no route takes fails here, before any I/O.
    target.route(&name)?;
    let shown = target.shown();
    let rt = runtime()?;
    rt.block_on(run(target, &name, args))
        .map_err(|f| f.with("name", name.as_str()).with("url", shown))
}

/// The signals `dlock` forwards to the command instead of dying of them.
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> Result<Self, Failure> {
        let make = |kind| {
            signal(kind).map_err(|e| {
                Failure::new(
                    "unavailable",
                    exit::UNAVAILABLE,
                    format!("cannot handle signals: {e}"),
                )
            })
        };
        Ok(Signals {
            int: make(SignalKind::interrupt())?,
            term: make(SignalKind::terminate())?,
            hup: make(SignalKind::hangup())?,
        })
    }

    /// The next of SIGINT, SIGTERM, SIGHUP that `dlock` receives.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// The exit code of a signal's death: 128 + its number.
pub(crate) fn signal_code(sig: Signal) -> ExitCode {
    ExitCode::from(128u8.saturating_add(sig as u8))
}

/// A shell's view of a finished command: its code, or 128 + the signal that killed it.
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(127)),
        (None, None) => u8::MAX,
    }
}

/// Acquires `name`: forever without `wait`, one attempt with a zero wait. On a terminal, says
/// so when the wait lasts.
async fn acquire(
    locker: &dyn Locker,
    name: &LockName,
    wait: Option<Duration>,
) -> Result<Lease, Failure> {
    if wait == Some(Duration::ZERO) {
        return match locker.try_acquire(name).await {
            Ok(Some(lease)) => Ok(lease),
            Ok(None) => Err(Failure::new(
                "timeout",
                exit::TIMEOUT,
                format!("lock {name} is held by someone else (--wait 0)"),
            )),
            Err(e) => Err(Failure::from_error(&e)),
        };
    }
    let opts = match wait {
        Some(w) => AcquireOptions::wait(w),
        None => AcquireOptions::forever(),
    };
    let progress = async {
        tokio::time::sleep(PROGRESS_AFTER).await;
        if std::io::stderr().is_terminal() {
            match wait {
                Some(w) => eprintln!(
                    "dlock: waiting for lock {name} (at most {})…",
                    humantime::format_duration(w)
                ),
                None => eprintln!("dlock: waiting for lock {name}…"),
            }
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        r = locker.acquire(name, opts) => r.map_err(|e| {
            let f = Failure::from_error(&e);
            if f.code == exit::TIMEOUT {
                Failure::new("timeout", exit::TIMEOUT, format!("lock {name}: {e}"))
            } else {
                f
            }
        }),
        () = progress => unreachable!("progress never ends"),
    }
}

/// What `dlock` holds while the command runs: a mutex lease (`run`) or a leadership (`elect`).
pub(crate) enum Held {
    /// `dlock run`.
    Lease(Lease),
    /// `dlock elect`.
    Leader(Leadership),
}

impl Held {
    /// The fencing token (a leadership's term).
    fn token(&self) -> FencingToken {
        match self {
            Held::Lease(l) => l.token(),
            Held::Leader(l) => l.term(),
        }
    }

    /// Resolves when the lease (the leadership's lease) is lost.
    fn lost(&self) -> impl std::future::Future<Output = LossReason> + Send + 'static {
        match self {
            Held::Lease(l) => l.lost(),
            Held::Leader(l) => l.lease().lost(),
        }
    }

    /// Releases the lock (resigns the leadership).
    async fn release(self) -> Result<(), Error> {
        match self {
            Held::Lease(l) => l.release().await,
            Held::Leader(l) => l.resign().await,
        }
    }
}

/// What happens to the command: its arguments and the grace between SIGTERM and SIGKILL.
pub(crate) struct Job<'a> {
    pub(crate) command: &'a [std::ffi::OsString],
    pub(crate) grace: Duration,
}

async fn run(target: Target, name: &LockName, args: RunArgs) -> Result<ExitCode, Failure> {
    let mut signals = Signals::new()?;
    let locker = tokio::select! {
        r = target.connect() => r.map_err(|e| Failure::from_error(&e))?,
        sig = signals.recv() => return Ok(signal_code(sig)),
    };
    let lease = match or_signal(&mut signals, acquire(&*locker, name, args.wait)).await? {
        Ok(lease) => lease,
        Err(code) => {
            // Closing waits for the withdrawal of the dropped request's queue entry.
            let _ = locker.close().await;
            return Ok(code);
        }
    };
    let job = Job {
        command: &args.command,
        grace: args.grace,
    };
    let done = supervise(Held::Lease(lease), name, &job, &mut signals).await;
    // Ends the session now rather than at its TTL; under a tiered configuration this also
    // releases the drift guard, so a new configuration may start as soon as this exits.
    let _ = locker.close().await;
    done
}

/// Waits for a grant (`Ok`) or for a signal (`Err` with its exit code). Interrupted while
/// waiting, the request is dropped when this returns: its queue entry is withdrawn in a
/// background task of the locker, which the caller's `close()` waits for.
pub(crate) async fn or_signal<T>(
    signals: &mut Signals,
    request: impl std::future::Future<Output = Result<T, Failure>>,
) -> Result<Result<T, ExitCode>, Failure> {
    tokio::select! {
        r = request => r.map(Ok),
        sig = signals.recv() => Ok(Err(signal_code(sig))),
    }
}

/// Runs the job while `held` holds, and releases it after: the command's exit code, or a
/// `lost` failure after the command was stopped because the lease was lost.
pub(crate) async fn supervise(
    lease: Held,
    name: &LockName,
    job: &Job<'_>,
    signals: &mut Signals,
) -> Result<ExitCode, Failure> {
    let token = lease.token();
    let (program, rest) = job
        .command
        .split_first()
        .ok_or_else(|| Failure::usage("no command given after --"))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .env("DLOCK_TOKEN", token.to_string())
        .env("DLOCK_NAME", name.as_str())
        // Its own process group, so that a loss stops CMD's children too (a shell script's
        // `sleep`), not only CMD itself.
        .process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = lease.release().await;
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            return Err(Failure::new(
                "spawn",
                code,
                format!("cannot run {}: {e}", program.to_string_lossy()),
            ));
        }
    };
    let Some(pid) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
    else {
        return Err(Failure::new(
            "spawn",
            exit::CANNOT_EXECUTE,
            "the command has no process id",
        ));
    };

    let lost = lease.lost();
    tokio::pin!(lost);
    let reason = loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| {
                    Failure::new("spawn", exit::CANNOT_EXECUTE, format!("cannot wait for the command: {e}"))
                })?;
                if let Err(e) = lease.release().await {
                    eprintln!("dlock: warning: releasing lock {name} failed ({e}); it expires within its TTL");
                }
                return Ok(ExitCode::from(status_code(status)));
            }
            reason = &mut lost => break reason,
            sig = signals.recv() => {
                // Passed on to CMD, which decides; dlock releases when it exits.
                let _ = killpg(pid, sig);
            }
        }
    };

    eprintln!(
        "dlock: lock {name} lost ({reason}); sending SIGTERM to the command, SIGKILL in {}",
        humantime::format_duration(job.grace)
    );
    let _ = killpg(pid, Signal::SIGTERM);
    let status = tokio::select! {
        s = child.wait() => s,
        () = tokio::time::sleep(job.grace) => {
            let _ = killpg(pid, Signal::SIGKILL);
            child.wait().await
        }
    };
    // The lease is gone; a guarded release cannot touch a newer holder's entry.
    let _ = lease.release().await;
    let mut failure = Failure::new(
        "lost",
        exit::LOST,
        format!("lock {name} was lost while the command ran: {reason}"),
    )
    .with("reason", reason.to_string())
    .with("token", token.get());
    if let Ok(status) = status {
        failure = failure.with("command_exit", status_code(status));
    }
    Err(failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_follow_the_shell() {
        assert_eq!(status_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(status_code(ExitStatus::from_raw(3 << 8)), 3);
        // Killed by SIGTERM (15).
        assert_eq!(status_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(status_code(ExitStatus::from_raw(9)), 137);
    }
}
