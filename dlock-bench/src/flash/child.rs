//! The client process of the flash sale (`dlock-bench __flash-client …`, hidden): one lock
//! client that loops over the hot names until the run's end, and reports every critical
//! section to the parent, which hosts the resource and is the observer.
//!
//! Protocol (lines over one TCP connection to the parent):
//!
//! ```text
//! → H <client> <pid>                                   hello; ← go <until_unix_ms>
//! → B <name> <token|-> <enter_unix_ns> <acquire_us>    the section began (a fenced read); ← ok
//! → W                                                  the section's write; ← A | R | -
//! → E <exit_unix_ns>                                   about to release
//! → F <acquire_errors> <release_errors>                done
//! ```
//!
//! The nemesis stops the process (SIGSTOP) before the parent answers a `B`: the holder is
//! paused inside its section, after its grant and before its write, as a process stalled by a
//! GC pause or a swap-in would be, and writes when it resumes. It does not check its lease
//! first: a check can always come right before the pause.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::contenders::{FlashLock, Spec};

/// A uniformly random number below `n` (xorshift, seeded by the pid and the clock): the
/// workload's choices need no quality beyond "not in step across processes".
pub fn random(n: u64) -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = now_ns() ^ (u64::from(std::process::id()) << 32) | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    x % n.max(1)
}

/// Real time, ns since the epoch (the clock every process of the machine shares).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What a child is told on its command line.
pub struct ChildArgs {
    pub spec: Spec,
    pub client: usize,
    pub names: usize,
    pub ttl: Duration,
    pub resource: String,
    pub at: Vec<String>,
    pub prefix: String,
}

impl ChildArgs {
    /// The arguments after `__flash-client`.
    ///
    /// # Errors
    /// A missing or malformed flag.
    pub fn parse(args: &[String]) -> Result<ChildArgs, String> {
        let get = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .cloned()
                .ok_or(format!("__flash-client needs {flag}"))
        };
        let num = |flag: &str| -> Result<u64, String> {
            get(flag)?.parse().map_err(|e| format!("{flag}: {e}"))
        };
        let id = get("--contender")?;
        Ok(ChildArgs {
            spec: Spec::by_id(&id).ok_or(format!("unknown contender {id}"))?,
            client: usize::try_from(num("--client")?).map_err(|e| e.to_string())?,
            names: usize::try_from(num("--names")?).map_err(|e| e.to_string())?,
            ttl: Duration::from_millis(num("--ttl-ms")?),
            resource: get("--resource")?,
            at: get("--at")?.split(',').map(str::to_string).collect(),
            prefix: get("--prefix")?,
        })
    }

    /// The command line of a child.
    pub fn to_args(&self) -> Vec<String> {
        [
            "__flash-client",
            "--contender",
            &self.spec.id(),
            "--client",
            &self.client.to_string(),
            "--names",
            &self.names.to_string(),
            "--ttl-ms",
            &self.ttl.as_millis().to_string(),
            "--resource",
            &self.resource,
            "--at",
            &self.at.join(","),
            "--prefix",
            &self.prefix,
        ]
        .map(str::to_string)
        .to_vec()
    }
}

/// Runs the child until the parent's end time; its errors end the process non-zero.
///
/// # Errors
/// When the parent or the servers cannot be reached at the start, or the parent hangs up.
pub async fn run(a: ChildArgs) -> Result<(), String> {
    let mut lock = FlashLock::connect(a.spec, &a.at, &a.prefix, a.ttl).await?;
    let stream = TcpStream::connect(&a.resource)
        .await
        .map_err(|e| format!("resource {}: {e}", a.resource))?;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    send(
        &mut write,
        format!("H {} {}\n", a.client, std::process::id()),
    )
    .await?;
    let go = reply(&mut lines).await?;
    let until: u64 = go
        .strip_prefix("go ")
        .and_then(|v| v.parse().ok())
        .ok_or(format!("expected `go <ms>`, got {go:?}"))?;
    let (mut acquire_errors, mut release_errors) = (0u64, 0u64);
    while now_ns() / 1_000_000 < until {
        let name = format!("item-{}", random(a.names as u64));
        let asked = Instant::now();
        let held = match lock.acquire(&name).await {
            Ok(h) => h,
            Err(e) => {
                // A client whose session or lease the pause killed: a new one, as an
                // application would make.
                acquire_errors += 1;
                eprintln!("  flash client {}: acquire failed: {e}", a.client);
                tokio::time::sleep(Duration::from_millis(100)).await;
                if let Ok(fresh) = FlashLock::connect(a.spec, &a.at, &a.prefix, a.ttl).await {
                    lock = fresh;
                }
                continue;
            }
        };
        let acquire_us = asked.elapsed().as_micros();
        let enter = now_ns();
        let token = match lock.token(&held).await {
            Ok(t) => t,
            Err(e) => {
                eprintln!("  flash client {}: no token: {e}", a.client);
                None
            }
        };
        let shown = token.map_or("-".to_string(), |t| t.to_string());
        send(
            &mut write,
            format!("B {name} {shown} {enter} {acquire_us}\n"),
        )
        .await?;
        reply(&mut lines).await?;
        send(&mut write, "W\n".to_string()).await?;
        reply(&mut lines).await?;
        send(&mut write, format!("E {}\n", now_ns())).await?;
        // After a pause the lease is gone: the release fails, as it would for a user.
        if lock.release(held).await.is_err() {
            release_errors += 1;
        }
    }
    send(&mut write, format!("F {acquire_errors} {release_errors}\n")).await?;
    write
        .shutdown()
        .await
        .map_err(|e| format!("to the resource: {e}"))
}

async fn send(w: &mut OwnedWriteHalf, line: String) -> Result<(), String> {
    w.write_all(line.as_bytes())
        .await
        .map_err(|e| format!("to the resource: {e}"))
}

async fn reply(lines: &mut Lines<BufReader<OwnedReadHalf>>) -> Result<String, String> {
    lines
        .next_line()
        .await
        .map_err(|e| format!("from the resource: {e}"))?
        .ok_or("the resource hung up".to_string())
}

/// `dlock-bench __flash-client …`: the process's whole life; exits 1 on an error.
pub fn main(args: &[String]) {
    let parsed = ChildArgs::parse(args);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let done = match (parsed, rt) {
        (Ok(a), Ok(rt)) => rt.block_on(run(a)),
        (Err(e), _) => Err(e),
        (_, Err(e)) => Err(format!("cannot build a runtime: {e}")),
    };
    if let Err(e) = done {
        eprintln!("dlock-bench __flash-client: {e}");
        std::process::exit(1);
    }
}
