//! Crash release: a holder in another PROCESS (this test binary, re-executed) is SIGKILLed.

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, LockName, drift};
use tokio::time::Instant;

use super::util::{mono_ns, name, within};
use super::{Ctx, Verdict, ensure};
use crate::servers::process::{self, Launch};
use crate::{ClientOptions, TestBackend};

/// The variable that turns the hidden `__crash_holder` test into the holder process:
/// `<namespace>|<lock name>|<ttl ms>`.
pub const CRASH_HOLDER_VAR: &str = "DLOCK_CRASH_HOLDER";
const GRANTED: &str = "DLOCK_CRASH_HOLDER granted";

/// A SIGKILLed holder process's lock becomes free no earlier than TTL − drift after its grant
/// request and no later than TTL + slack after the kill.
pub(crate) async fn crash_release(ctx: &Ctx) -> Result<(), Verdict> {
    if ctx.backend().node_addrs().is_empty() {
        return Err(Verdict::Skip(
            "in-process backend: its server lives in the test process, so a crashed holder process takes the server with it".into(),
        ));
    }
    let ttl = ctx.ttl();
    let lock = name("crash")?;
    let contender = ctx.client().await?;
    let caps = contender.capabilities();
    let exe = std::env::current_exe()
        .map_err(|e| Verdict::Fail(format!("cannot find the test binary: {e}")))?;
    let mut env = ctx.backend().child_env();
    env.push((
        CRASH_HOLDER_VAR.into(),
        format!("{}|{}|{}", ctx.ns(), lock, ttl.as_millis()),
    ));
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
    };
    let mut child = process::spawn(launch)
        .map_err(|e| Verdict::Fail(format!("cannot start the holder process: {e}")))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
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
    drop(tx);
    let mut output = Vec::new();
    let grant = within(Duration::from_secs(60), async {
        while let Some(line) = rx.recv().await {
            output.push(line.clone());
            // libtest may print "test …::__crash_holder ... " on the same line first.
            if let Some(at) = line.find(GRANTED) {
                return parse_grant(&line[at + GRANTED.len()..]);
            }
        }
        None
    })
    .await
    .flatten();
    let Some((holder_token, start_ns)) = grant else {
        process::kill_and_reap(&mut child);
        return Err(Verdict::Fail(format!(
            "the holder process never reported its grant; its output:\n{}",
            output.join("\n")
        )));
    };
    let l2 = lock.clone();
    let wait = ttl * 3 + caps.crash_release_slack + Duration::from_secs(5);
    let waiting = tokio::spawn(async move {
        let got = contender.acquire(&l2, AcquireOptions::wait(wait)).await;
        (Instant::now(), mono_ns(), got)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    if waiting.is_finished() {
        process::kill_and_reap(&mut child);
        return Err(Verdict::Fail(
            "the contender got the lock while the holder process was alive".into(),
        ));
    }
    let killed = Instant::now();
    process::kill_and_reap(&mut child);
    let (got_t, got_ns, got) = waiting
        .await
        .map_err(|e| Verdict::Fail(format!("the contender panicked: {e}")))?;
    let lease = got.map_err(|e| {
        Verdict::Fail(format!(
            "the lock was not released after the holder crashed: {e}"
        ))
    })?;
    let after_kill = got_t.saturating_duration_since(killed);
    let after_grant = Duration::from_nanos(got_ns.saturating_sub(start_ns));
    ctx.figure_ms("crash_release_ms", after_kill);
    ctx.figure_ms("since_holder_request_ms", after_grant);
    ctx.figure_ms(
        "bound_ms",
        caps.crash_release_within + caps.crash_release_slack,
    );
    let token = lease.token().get();
    lease.release().await?;
    let earliest = ttl.saturating_sub(drift(ttl));
    ensure!(
        after_grant >= earliest,
        "the lock was free {after_grant:?} after the crashed holder's request, before TTL − drift ({earliest:?})"
    );
    let latest = caps.crash_release_within + caps.crash_release_slack;
    ensure!(
        after_kill <= latest,
        "the lock became free {after_kill:?} after the crash, later than TTL + slack ({latest:?})"
    );
    if caps.fencing != dlock_core::FencingStrength::None {
        ensure!(
            token > holder_token,
            "the token after the crash ({token}) is not above the crashed holder's ({holder_token})"
        );
    }
    Ok(())
}

fn parse_grant(rest: &str) -> Option<(u64, u64)> {
    let mut token = None;
    let mut start = None;
    for part in rest.split_whitespace() {
        if let Some(v) = part.strip_prefix("token=") {
            token = v.parse().ok();
        } else if let Some(v) = part.strip_prefix("start_ns=") {
            start = v.parse().ok();
        }
    }
    Some((token?, start?))
}

/// The body of the hidden `__crash_holder` test: does nothing unless [`CRASH_HOLDER_VAR`] is
/// set; then acquires the named lock with a client of `factory`'s backend, prints its token and
/// the monotonic time of its request, and holds it until the process is killed.
///
/// # Panics
/// When the variable is malformed or the lock cannot be acquired (the parent reports the
/// output).
pub fn crash_holder_main(factory: fn() -> Arc<dyn TestBackend>) {
    let Ok(spec) = std::env::var(CRASH_HOLDER_VAR) else {
        return;
    };
    let mut parts = spec.splitn(3, '|');
    let (Some(ns), Some(lock), Some(ttl)) = (parts.next(), parts.next(), parts.next()) else {
        panic!("malformed {CRASH_HOLDER_VAR}={spec:?}");
    };
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
        let client = backend
            .client(ClientOptions::new(ns, ttl))
            .await
            .unwrap_or_else(|e| panic!("cannot build the holder's client: {e}"));
        let start_ns = mono_ns();
        let lease = client
            .acquire(&lock, AcquireOptions::wait(Duration::from_secs(30)))
            .await
            .unwrap_or_else(|e| panic!("the holder cannot acquire {lock}: {e}"));
        println!("{GRANTED} token={} start_ns={start_ns}", lease.token());
        use std::io::Write;
        let _ = std::io::stdout().flush();
        // Hold (renewing) until SIGKILLed.
        std::future::pending::<()>().await;
        drop(lease);
    });
}
